"""The wire: ``git`` subprocesses that fetch only the storm refs and push atomically.

libgit2's push has no lease and over ``file://`` checks no old value,
so pushes go through the git CLI, whose ``--force-with-lease=REF:<oid>`` is a
real compare-and-swap done by the server under its ref lock. Fetched values land
in a tracking namespace (:func:`tracking_ref`); :mod:`.client` copies them onto
the local refs under storm's workspace lock, so a fetch never races a local write.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.errors import NoSpace, RepoStateError, Unreachable, UsageError
from ..core.files import NO_SPACE_TEXT
from ..core.store import AGENTS_PREFIX, REMOTE_TRACKING_PREFIX, RESERVATIONS_REF, WORKSPACE_REF, Store, git_env

ZERO = "0" * 40
# Connection failures: nothing reached the server (the write did not happen).
_UNREACHABLE = ("could not read from remote", "unable to connect", "connection refused", "could not resolve",
                "does not appear to be a git repository", "no such file or directory", "unable to look up",
                "connection timed out", "network is unreachable", "not a git repository")
# What receive-pack answers when a ref moved between its advertisement and its update.
_RACE = ("atomic transaction failed", "failed to update ref", "failed to lock", "cannot lock ref",
         "incorrect old value")
FETCH_TIMEOUT = 60.0
# ``storm.remoteProtocol``: the wire protocol of storm's fetches. Over ``git://``,
# protocol v2 (git's default) stalls each fetch ~40 ms on TCP's delayed ACK (the
# server sends an ls-refs answer in two segments, and the daemon's socket has Nagle
# on): 60 ms a fetch on loopback against 16 ms with v0 (benchmarks/bench_remote.py).
# v0 advertises every ref of the server, which costs more only on servers with very
# many refs; "auto" (the default) uses v0 for git:// and git's default elsewhere.
PROTOCOL_KEY = "storm.remoteProtocol"
LOCAL_LOCK_TRIES = 5
PUSH_TIMEOUT = 120.0


class RemoteRefused(RepoStateError):
    """The server's guard (or its configuration) refused a push (exit 3)."""

    kind = "remote_refused"


def tracking_ref(remote: str, ref: str) -> str:
    """Where the remote's ``ref`` (``refs/storm/…`` or ``refs/notes/storm/…``) is kept locally."""
    return f"{REMOTE_TRACKING_PREFIX}{remote}/{ref[len('refs/'):]}"


def check_remote(store: Store, remote: str) -> str:
    """The URL of the configured remote ``remote`` (exit 2 when there is none)."""
    url = store.config_get(f"remote.{remote}.url")
    if not remote or url is None:
        raise UsageError(f"no git remote named {remote!r} in this repository",
                         hint=f"add it with git remote add {remote or 'NAME'} URL, or name one of git remote -v")
    return str(url)


def protocol_args(store: Store, url: str) -> list[str]:
    """``-c protocol.version=N`` for storm's fetches (see PROTOCOL_KEY), or nothing."""
    value = str(store.config_get(PROTOCOL_KEY) or "auto").strip().lower()
    if value == "auto":
        return ["-c", "protocol.version=0"] if url.startswith("git://") else []
    if value not in ("0", "1", "2"):
        raise UsageError(f"{PROTOCOL_KEY} is {value!r}, not auto, 0, 1 or 2",
                         hint=f"fix it with git config {PROTOCOL_KEY} auto")
    return ["-c", f"protocol.version={value}"]


def ssh_env(store: Store) -> dict[str, str]:
    """The environment of storm's fetches and pushes: never a prompt, and ssh in batch
    mode unless the user chose how git reaches ssh servers (``GIT_SSH_COMMAND``,
    ``GIT_SSH``, ``core.sshCommand``: a deploy key, a jump host) -- setting
    ``GIT_SSH_COMMAND`` would override that choice."""
    env = git_env(GIT_TERMINAL_PROMPT="0")
    if not (env.get("GIT_SSH_COMMAND") or env.get("GIT_SSH") or store.config_get("core.sshCommand")):
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    return env


def _git(store: Store, args: list[str], timeout: float, pre: list[str] | None = None) -> subprocess.CompletedProcess:
    env = ssh_env(store)
    try:
        return subprocess.run(["git", *(pre or []), *args], cwd=store.main_workdir, capture_output=True, env=env,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"git {args[0]} {args[-1] if args[0] == 'ls-remote' else ''}".strip()
                          + f" took more than {timeout:.0f}s",
                          hint="check the network and the server, then retry") from None


def _first_line(raw: bytes) -> str:
    lines = [ln.strip() for ln in raw.decode("utf-8", "replace").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    return (fatal or lines or ["no output"])[0]


# The refs storm defines on a server besides the agents' notes: a clone copies them.
SHARED_REFS = (WORKSPACE_REF, RESERVATIONS_REF)


def fetch(store: Store, remote: str, agents: Iterable[str] | None = None) -> None:
    """Copy the remote's ``refs/storm/*`` and agents' notes refs into the tracking
    namespace (forced: the server is the truth; pruned: gone there, gone here).

    ``agents`` None: every agent's notes ref (``refs/notes/storm/*``), for the
    commands that show or check other agents' read sets (status, log, sync, join);
    otherwise only the notes refs of those agents, which the server may lack (a new
    agent: left out, not an error). Reads and writes fetch none but their own agent's:
    a clone that holds every agent's notes ref makes each of its fetches and pushes
    walk them all (docs/remote.md, "Cost")."""
    url = check_remote(store, remote)
    specs = [f"+refs/storm/*:{REMOTE_TRACKING_PREFIX}{remote}/storm/*"]
    if agents is None:
        specs.append(f"+refs/notes/storm/*:{REMOTE_TRACKING_PREFIX}{remote}/notes/storm/*")
    else:
        specs += [f"+{AGENTS_PREFIX}{a}:{tracking_ref(remote, AGENTS_PREFIX + a)}" for a in dict.fromkeys(agents)]
    while True:
        r = _fetch_once(store, remote, url, specs)
        missing = _missing_ref(r.stderr) if r.returncode else None
        spec = next((sp for sp in specs[1:] if missing and sp.startswith(f"+{missing}:")), None)
        if spec is None:
            break
        specs.remove(spec)  # an agent with no notes on the server yet: fetch the rest
    if r.returncode != 0:
        if _local_disk_full(r.stderr):  # not the server: this disk could not take the objects
            raise NoSpace(f"cannot fetch the shared workspace from {remote}: this disk refused the objects "
                          f"({_first_line(r.stderr)})")
        raise Unreachable(f"cannot fetch the shared workspace from {remote} ({url}): {_first_line(r.stderr)}",
                          hint="check that the server is up and reachable, then retry; nothing was changed")


def fetch_branch(store: Store, remote: str, src: str, dst: str) -> bool:
    """Fetch the server's branch ``src`` into the remote-tracking ref ``dst``, as
    ``git fetch`` would; False when the server has no such branch."""
    url = check_remote(store, remote)
    r = _git(store, ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
                     "--no-auto-gc", remote, f"+{src}:{dst}"], FETCH_TIMEOUT, protocol_args(store, url))
    if r.returncode == 0:
        return True
    if _missing_ref(r.stderr):
        return False
    raise Unreachable(f"cannot fetch {src} from {remote} ({url}): {_first_line(r.stderr)}",
                      hint="check that the server is up and reachable, then retry; nothing was changed")


@dataclass
class ServerHeads:
    """The server's branches and what its HEAD names (``git ls-remote --symref``)."""

    branches: dict[str, str]  # short name -> oid
    head: str | None  # the branch the server's HEAD names (it may not exist)


def list_heads(store: Store, remote: str) -> ServerHeads:
    url = check_remote(store, remote)
    r = _git(store, ["ls-remote", "--symref", remote, "HEAD", "refs/heads/*"], FETCH_TIMEOUT,
             protocol_args(store, url))
    if r.returncode != 0:
        raise Unreachable(f"cannot list the branches of {remote} ({url}): {_first_line(r.stderr)}",
                          hint="check that the server is up and reachable, then retry; nothing was changed")
    out = ServerHeads({}, None)
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        left, _tab, name = line.partition("\t")
        if left.startswith("ref: ") and name == "HEAD":
            target = left[len("ref: "):]
            out.head = target[len("refs/heads/"):] if target.startswith("refs/heads/") else target
        elif name.startswith("refs/heads/"):
            out.branches[name[len("refs/heads/"):]] = left
    return out


def _missing_ref(stderr: bytes) -> str | None:
    """The ref a fetch failed on because the server does not have it."""
    m = re.search(rb"couldn't find remote ref (\S+)", stderr)
    return m.group(1).decode("utf-8", "replace") if m else None


def _fetch_once(store: Store, remote: str, url: str, specs: list[str]) -> subprocess.CompletedProcess:
    # --no-filter: a partial clone's fetches inherit its filter (blob:none), which left out
    # the blobs other machines wrote and the read sets (storm_git.core.promisor)
    args = ["fetch", "--quiet", "--no-tags", "--prune", "--no-write-fetch-head", "--no-recurse-submodules",
            "--no-auto-gc", "--no-filter", remote, *specs]
    for attempt in range(LOCAL_LOCK_TRIES):
        r = _git(store, args, FETCH_TIMEOUT, protocol_args(store, url))
        if r.returncode == 0 or b"cannot lock ref" not in r.stderr:
            break
        # every fetch runs under storm's remote flock: an old <ref>.lock here was left by a
        # killed fetch (a young one may be git's own pack-refs or gc, which waits it out)
        for ref in _locked_tracking_refs(store, remote):
            store.clear_stale_ref_lock(ref)
        time.sleep(0.05 * (attempt + 1))
    else:
        raise RepoStateError(f"cannot update the local copies of {remote}'s storm refs: {_first_line(r.stderr)}",
                             hint="another git fetch may be running here; retry (git storm doctor if it stays)")
    return r


def _local_disk_full(stderr: bytes) -> bool:
    """Whether git's fetch failed because the local disk (a quota, ``ulimit -f``:
    git's unpack-objects then dies of SIGXFSZ) refused to store what it received."""
    text = stderr.decode("utf-8", "replace")
    return any(t in text for t in NO_SPACE_TEXT) or f"died of signal {int(signal.SIGXFSZ)}" in text


def _locked_tracking_refs(store: Store, remote: str) -> list[str]:
    """The tracking refs of ``remote`` that have a ``<ref>.lock`` file."""
    base = os.path.join(store.commondir, *f"{REMOTE_TRACKING_PREFIX}{remote}".split("/"))
    out = []
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith(".lock"):
                full = os.path.join(dirpath, name)
                out.append(os.path.relpath(full, store.commondir).replace(os.sep, "/")[:-len(".lock")])
    return out


@dataclass
class PushOutcome:
    """What ``git push --porcelain`` said, per destination ref: (flag, summary)."""

    returncode: int
    refs: dict[str, tuple[str, str]] = field(default_factory=dict)
    stderr: str = ""
    # every line (flag, source, destination, summary), in the server's order: a
    # server that orders writes answers one line per write, all for one destination
    lines: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and all(f != "!" for f, _ in self.refs.values())

    def status(self, ref: str) -> str:
        return self.refs.get(ref, ("", ""))[1]

    def stale(self, ref: str) -> bool:
        """The lease on ``ref`` failed: the server's value was not the expected one."""
        s = self.status(ref)
        return "stale info" in s or "fetch first" in s

    @property
    def lost_race(self) -> bool:
        """The server found the old value changed under its ref lock (a push that
        landed between our fetch and ours): the same as a stale lease."""
        return any(any(m in s for m in _RACE) for _f, s in self.refs.values())

    def non_fast_forward(self, ref: str) -> bool:
        return "non-fast-forward" in self.status(ref)

    def remote_rejected(self) -> str | None:
        """The server's own refusal (a hook, a protected ref), if any."""
        for ref, (_f, s) in self.refs.items():
            if "remote rejected" in s:
                return f"{ref}: {s}"
        return None

    @property
    def unreachable(self) -> bool:
        """No ref was even considered: the connection failed."""
        low = self.stderr.lower()
        return not self.refs and any(u in low for u in _UNREACHABLE)


def push(store: Store, remote: str, updates: list[tuple[str, str, str | None]], *,
         atomic: bool = True) -> PushOutcome:
    """One ``git push --atomic --porcelain``: ``updates`` are (source oid, destination
    ref, lease). A lease is the oid the server must still have ("" = must be absent);
    None pushes without force (the server refuses a non-fast-forward). ``atomic``
    False: a push to an inbox, whose hook answers for all its refs at once anyway."""
    check_remote(store, remote)
    # --quiet keeps the lines of refs that failed only; an inbox's answers are all needed
    args = ["push", *(["--atomic", "--quiet"] if atomic else []), "--porcelain", "--no-verify"]
    args += [f"--force-with-lease={dst}:{lease}" for _src, dst, lease in updates if lease is not None]
    args.append(remote)
    args += [f"{src}:{dst}" for src, dst, _lease in updates]
    # an inbox's answers name commits this clone may not have: whole ids (git >= 2.31)
    r = _git(store, args, PUSH_TIMEOUT, [] if atomic else ["-c", "core.abbrev=no"])
    return read_push(r.returncode, r.stdout, r.stderr)


def read_push(returncode: int, stdout: bytes, stderr: bytes) -> PushOutcome:
    """What ``git push --porcelain`` said (its exit status, its output and errors)."""
    out = PushOutcome(returncode, stderr=stderr.decode("utf-8", "replace"))
    for line in stdout.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and ":" in parts[1]:
            src, dst = parts[1].split(":", 1)
            out.refs[dst] = (parts[0], parts[2])
            out.lines.append((parts[0], src, dst, parts[2]))
    return out


def describe_failure(out: PushOutcome) -> str:
    """One line naming why a push failed."""
    if out.refs:
        refused = "; ".join(f"{ref}: {s}" for ref, (f, s) in out.refs.items() if f == "!")
        return refused or _first_line(out.stderr.encode())
    return _first_line(out.stderr.encode())
