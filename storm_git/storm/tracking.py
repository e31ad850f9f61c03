"""The shared working tree as storm tracks it: ``exec``, unmediated edits, ``adopt``.

Storm does not keep git's own index in step with the shared head (that would
cost a full index write per accepted write at 100k files). To find what differs
on disk it keeps a *private* index, ``<common git dir>/storm/exec-index``, whose
entries are the shared head's tree and whose stat data git refreshes itself.
A snapshot is one ``git status`` run against that index (with git's untracked
cache, so unchanged directories are not re-read): the cost floor of finding
changed files by stat, without reading every file. When the shared head moves,
only the entries of the paths that changed are replaced (``update-index
--index-info``), so the stat data of everything else stays valid.

``exec`` takes one snapshot, after the command. Before it, storm stamps a
marker file and waits for the file-system clock to tick (a few ms): a path that
differs from the shared head afterwards is the command's change iff its ctime
is later than the mark (a deletion: it was not missing at the last snapshot and
its directory was stamped after the mark), and its content is not what the
shared head now holds (that is another agent's write, written to disk while the
command ran). Edits from before the command keep older stamps and stay
unmediated. Where the clock cannot be used (``.git`` on another file system,
coarse timestamps, or ``storm.execClock=false``) a full snapshot is taken before
the command as well and the two are compared by content. The changes are recorded with
:meth:`SharedWorkspace.apply` validated against the versions at the start of
the command (``expected``), so a path another agent wrote meanwhile is a direct
conflict, never overwritten. Both snapshots and the classification run under the
``worktree`` lock, which is the lock writers hold while they write the disk.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import trailers
from ..core.agents import validate_agent
from ..core.convert import ConversionFailed, Conversions
from ..core.diffs import is_binary, unified
from ..core.errors import BadPath, CorruptState, NotInitialised, TooLarge, UnmediatedEdit, UsageError
from ..core.files import read_own, replace_file
from ..core.gitcmd import GitFailed
from ..core.locks import flocked
from ..core.paths import check_on_disk, normalize, quoted, tree_entry_refusal
from ..core.payloads import ExecResult, WriteResult
from ..core.secret_files import likely_secret
from ..core.store import MODE_BLOB, MODE_LINK, WORKSPACE_REF, Entry, Store, git_env as store_git_env, hex_
from ..core.tree_diff import changed_paths, tree_changes
from ..disk import safe_fs, sync as disk_sync
from ..disk.record import entry_or_none
from ..disk.safe_fs import TEMP_PREFIX, DiskState, disk_state, same
from . import branch, private_index
from .private_index import INDEX_NAME, STATE_NAME
from .validated_writer import AS_WRITTEN, OnWait, ValidatedWriter

MISSING_NAME = "exec-index.missing"
CLOCK_NAME = "exec-clock"
CLOCK_PATIENCE_SECONDS = 0.05
# Above this many changed entries, re-reading the whole tree is cheaper than --index-info.
FULL_REREAD_THRESHOLD = 20000
KILL_GRACE_SECONDS = 2.0


class CommandNotFound(UsageError):
    """``exec`` of a program that does not exist: exit 127, as a shell does."""

    kind = "command_not_found"
    exit_code = 127


class CommandNotExecutable(UsageError):
    """``exec`` of a file that cannot be run: exit 126, as a shell does."""

    kind = "command_not_executable"
    exit_code = 126


@dataclass
class Snapshot:
    """Which paths differ on disk from storm's disk record (and their state), after
    every path that was merely behind the shared head ``head`` was brought forward."""

    head: pygit2.Oid
    tree: pygit2.Tree
    record: pygit2.Tree  # what storm last put on disk, as one tree
    dirty: dict[str, DiskState]
    nested: list[str] = field(default_factory=list)  # git repositories of their own (not recorded)


# -- the private index --------------------------------------------------------------
def _storm_dir(store: Store) -> str:
    d = os.path.join(store.commondir, "storm")
    os.makedirs(d, exist_ok=True)
    return d


def git_env(store: Store, index: str | None) -> dict[str, str]:
    """Environment for git commands on the main (shared) working tree."""
    env = store_git_env(GIT_DIR=store.commondir, GIT_WORK_TREE=store.main_workdir, LC_ALL="C")
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    return env


def _clear_index_lock(index: str | None) -> None:
    """Only storm uses its private index, always under the worktree flock, which the
    caller holds: a ``<index>.lock`` seen now was left by a killed process."""
    if index is not None:
        try:
            os.unlink(index + ".lock")
        except FileNotFoundError:
            pass


def _git(store: Store, args: list[str], *, index: str | None, input: bytes | None = None) -> bytes:
    _clear_index_lock(index)
    r = subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=store.main_workdir,
                       env=git_env(store, index), input=input, capture_output=True)
    if r.returncode != 0:
        if index is not None and index == private_index.index_path(store):
            bad = private_index.problem(store)
            if bad:
                raise CorruptState(f"storm's private index .git/storm/{INDEX_NAME} is corrupt: {bad}",
                                   hint=private_index.FIX_HINT)
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        sub = next(x for x in args if not x.startswith("-") and "=" not in x)
        raise GitFailed(f"git {sub} failed: {err[-1] if err else r.returncode}",
                        hint="run git storm doctor; storm's private index is "
                             f"{index or os.path.join(store.commondir, 'index')}")
    return r.stdout


def _sync_index(store: Store, tree: pygit2.Tree) -> str:
    """Make the private index hold ``tree``, keeping valid stat data. Caller holds
    the worktree lock. Returns the index path."""
    d = _storm_dir(store)
    index = os.path.join(d, INDEX_NAME)
    state = os.path.join(d, STATE_NAME)
    have = (read_own(state) or b"").decode("ascii", "replace").strip()
    if have == str(tree.id) and os.path.exists(index):
        return index
    old = None
    if have and os.path.exists(index):
        try:
            old = store.repo[pygit2.Oid(hex=have)]
        except (KeyError, ValueError):
            old = None
    changes = tree_changes(store, old, tree) if isinstance(old, pygit2.Tree) else None
    if changes is None or len(changes) > FULL_REREAD_THRESHOLD:
        # First use: start from git's own index (its stat data is valid for HEAD,
        # usually almost the shared tree), then a one-tree --reset keeps the stat
        # data of every entry whose content matches.
        main_index = os.path.join(store.commondir, "index")
        if changes is None and not os.path.exists(index) and os.path.exists(main_index):
            shutil.copyfile(main_index, index)
        if os.path.exists(index):
            _git(store, ["read-tree", "--reset", str(tree.id)], index=index)
        else:
            _git(store, ["read-tree", str(tree.id)], index=index)
    elif changes:
        lines = []
        for path, value in sorted(changes, key=lambda c: c[1] is not None):  # removals first
            if value is None:
                lines.append(b"0 " + b"0" * 40 + b"\t" + path.encode("utf-8") + b"\0")
            else:
                lines.append(f"{value[1]:o} {value[0]}\t".encode() + path.encode("utf-8") + b"\0")
        _git(store, ["update-index", "-z", "--index-info"], index=index, input=b"".join(lines))
    replace_file(state, f"{tree.id}\n".encode("ascii"), tmp=f"{state}.{os.getpid()}")
    return index


def snapshot(store: Store) -> Snapshot:
    """Bring behind paths forward, then find every path whose disk state differs
    from storm's disk record (tracked or untracked-not-ignored), with its disk
    state. Caller holds the worktree lock."""
    synced = disk_sync.sync_locked(store, full=True)
    if synced.head is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    head = synced.head
    tree = store.commit(head).tree
    rtree, _ = disk_sync.record_tree(store)
    index = _sync_index(store, rtree)
    raw = _git(store, ["-c", "core.untrackedCache=true", "-c", "core.fsmonitor=false",
                       "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=normal",
                       "--ignore-submodules=all"], index=index)
    candidates: list[str] = []
    untracked_dirs: list[str] = []
    for item in raw.split(b"\0"):
        if len(item) < 4:
            continue
        xy, path = item[:2], item[3:].decode("utf-8", "surrogateescape")
        if xy == b"??":
            if path.endswith("/"):
                untracked_dirs.append(path)
            else:
                candidates.append(path)
        elif xy[1:2] in (b"M", b"D", b"T"):
            candidates.append(path)
    dirty: dict[str, Any] = {}
    nested: list[str] = []
    top = store.main_workdir
    conv = Conversions(store)
    with safe_fs.DirFds(top) as dirs:  # read only: each directory opened once
        for path in candidates:
            have = disk_state(top, path, dirs, conv)
            if not same(have, entry_or_none(store, rtree, path)) or (have is False and _entry(store, rtree, path)):
                dirty[path] = have
                if have is False and os.path.isdir(os.path.join(top, path)):
                    untracked_dirs.append(path + "/")  # a directory where a recorded file was
        if untracked_dirs:
            more = _git(store, ["ls-files", "-z", "--others", "--exclude-standard", "--", *untracked_dirs],
                        index=index)
            for p in more.split(b"\0"):
                if p.endswith(b"/"):
                    # a directory holding a .git of its own (git init, git clone, cargo new run
                    # in the tree): git add would record it as a gitlink. Storm records files:
                    # it is reported, not taken for a deleted file.
                    nested.append(p[:-1].decode("utf-8", "surrogateescape"))
                elif p:
                    path = p.decode("utf-8", "surrogateescape")
                    dirty[path] = disk_state(top, path, dirs, conv)
    dirty = {p: v for p, v in dirty.items() if not _storm_temp(p)}
    _save_missing(store, [p for p, v in dirty.items() if v is None])
    return Snapshot(head, tree, rtree, dirty, nested)


def _storm_temp(path: str) -> bool:
    """Storm's own temporary file, mid-rename (or left by a killed writer: doctor)."""
    return path.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)


def _save_missing(store: Store, missing: list[str]) -> None:
    """Remember which paths were missing on disk at the last snapshot (caller
    holds the worktree lock): a deletion has no timestamp of its own."""
    path = os.path.join(_storm_dir(store), MISSING_NAME)
    replace_file(path, b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in missing),
                 tmp=f"{path}.{os.getpid()}")


def load_missing(store: Store) -> set[str] | None:
    data = read_own(os.path.join(_storm_dir(store), MISSING_NAME))
    if data is None:
        return None
    return {p.decode("utf-8", "surrogateescape") for p in data.split(b"\0") if p}


def clock_mark(store: Store, worktree_dev: int) -> int | None:
    """A file-system timestamp T such that files changed from now on get a ctime
    above T (and files changed before have one at most T), or None when this
    file system cannot give one (another device, coarse timestamps).

    The kernel stamps files with a coarse clock (a few ms per tick): touch a
    marker, then touch it again until its timestamp moves past the first one."""
    path = os.path.join(_storm_dir(store), CLOCK_NAME)

    def touch() -> os.stat_result:
        with open(path, "wb") as fh:
            fh.write(b"storm exec clock\n")
        return os.stat(path)

    first = touch()
    if first.st_dev != worktree_dev:
        return None
    deadline = time.monotonic() + CLOCK_PATIENCE_SECONDS
    while time.monotonic() < deadline:
        if touch().st_ctime_ns > first.st_ctime_ns:
            return first.st_ctime_ns
        time.sleep(0.0005)
    return None


def _entry(store: Store, tree: pygit2.Tree, path: str) -> Entry | None:
    return entry_or_none(store, tree, path)


def _version(store: Store, tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    e = _entry(store, tree, path)
    return e.oid if e else None


def read_disk_content(store: Store, path: str, dirs: safe_fs.DirFds | None = None) -> bytes | None:
    try:
        return safe_fs.read_disk(store.main_workdir, path, dirs=dirs)
    except (safe_fs.UnsafePath, OSError):  # OSError includes a FIFO or the like (files.NotRegularFile)
        return None


def _raise_failed_conversion(store: Store, conv: Conversions, path: str) -> None:
    """A regular file that disk_state could not compare because git's conversion of it
    failed (a required filter driver that fails): raise that failure, in git's words,
    rather than call the file "not a regular file"."""
    content = read_disk_content(store, path)
    if content is not None and not os.path.islink(os.path.join(store.main_workdir, path)) and conv.applies(path):
        conv.odb_id(path, content)


def _converted(conv: Conversions, path: str, data: bytes) -> bytes:
    try:
        return conv.to_odb(path, data)
    except ConversionFailed:
        return data


def with_mode(content: bytes | None, state: Any, base: Entry | None) -> Any:
    """What ``apply`` records: None (deleted), or (content, mode) so that the exec
    bit and symlinks reach the shared tree as git records them. ``base``: the
    version the disk held before; where the file system keeps no exec bit
    (core.fileMode=false) a file keeps its mode, and a new one is not executable,
    as ``git add`` does."""
    if content is None:
        return None
    if not isinstance(state, tuple):
        return content, MODE_BLOB
    return content, safe_fs.recorded_mode(state[1], base)


def check_recordable(store: Store, path: str, state: Any, ws: ValidatedWriter) -> None:
    """Every path that exec or adopt records passes the refusals of ``write``:
    a bad name, a link leading out, a file over the size limit (exit 2)."""
    try:
        normalize(path)
    except BadPath as exc:
        raise BadPath(f"the working tree has a file storm cannot record: {exc.message}",
                      hint="rename or remove it; nothing was recorded") from None
    if isinstance(state, tuple) and state[1] == MODE_LINK:
        top = store.main_workdir
        check_on_disk(path, top, for_write=False)  # refuses a link leading out
        why = tree_entry_refusal(path, MODE_LINK, link_target=os.fsencode(os.readlink(os.path.join(top, path))),
                                 links=lambda p: _disk_link(top, p))
        if why is not None:  # the rules a pushed tree obeys: no link into .git, none for .gitmodules
            raise BadPath(f"the working tree has a file storm cannot record: {why}",
                          hint="rename or remove it; nothing was recorded")


def _disk_link(top: str, path: str) -> bytes | None:
    """The target of the link at ``path`` in the working tree, None when it is not a link."""
    try:
        return os.fsencode(os.readlink(os.path.join(top, path)))
    except OSError:
        return None


# Searched for "reverted" content: the shared history this far back, plus git's HEAD.
REVERT_LOOKBACK = 100


def reverted_paths(store: Store, head: pygit2.Oid, states: dict[str, Any],
                   record: pygit2.Tree) -> set[str]:
    """Paths whose disk content is an *older* version storm had (a ``git stash``,
    ``git reset --hard``, an editor's stale buffer): never adopted by default.
    git's HEAD counts as older only while it holds nothing the shared workspace
    lacks: after a ``git pull`` its files are newer, not reverted (storm.branch)."""
    want = {p: s[0] for p, s in states.items() if isinstance(s, tuple)}
    want.update({p: None for p, s in states.items() if s is None})
    out: set[str] = set()
    pending = [(p, oid) for p, oid in want.items() if oid != _version(store, record, p)]
    if not pending:
        return out
    head_commit = store.commit(head)
    walked: list[pygit2.Commit] = []  # each leads from the next older searched tree to a newer one
    trees: list[pygit2.Oid] = []
    c = head_commit
    for _ in range(REVERT_LOOKBACK):
        if not c.parent_ids:
            break
        walked.append(c)
        c = store.commit(c.parent_ids[0])
        trees.append(c.tree_id)
    tip_tree: pygit2.Oid | None = None
    try:
        if not store.repo.head_is_unborn:
            tip = store.repo.head.peel(pygit2.Commit)
            if branch.in_step(store, head, tip.id):  # else it holds commits newer than the shared state
                tip_tree = tip.tree_id
                trees.append(tip_tree)
    except (pygit2.GitError, KeyError):
        pass
    searched: list[pygit2.Tree] = []
    for t in trees:
        try:
            searched.append(store.repo[t])
        except (pygit2.GitError, KeyError):
            pass  # a treeless partial clone (--filter=tree:0) lacks it: fetching 100 trees to spot a revert
            #       would cost a round trip each
    head_tree = head_commit.tree
    moved = _moved(store, walked, head_tree, tip_tree) if len(pending) > FEW_TO_LOOK_UP and searched else None
    for p, oid in pending:
        if moved is not None and p not in moved:  # every searched tree has head's version of it
            if oid == _version(store, head_tree, p):
                out.add(p)
            continue
        if any(_held_version(store, t, p) == oid for t in searched):
            out.add(p)
    return out


FEW_TO_LOOK_UP = 16


def _moved(store: Store, walked: list[pygit2.Commit], head_tree: pygit2.Tree,
           tip_tree: pygit2.Oid | None) -> set[str] | None:
    """Every path whose version differs between head and some searched tree: the
    paths each walked commit changed (a storm write names them in its trailers, the
    guard on a server checks they are all it changed; others are diffed) and those
    git's HEAD holds differently. One pass, instead of a lookup per path and tree (an
    exec creating 2,000 files paid 0.6 s for those); None where a partial clone
    lacks a tree (then each path is looked up)."""
    moved: set[str] = set()
    try:
        for x in walked:
            t = trailers.parse(x.message)
            if "Storm-Op" in t and "Storm-Path" in t and len(x.parent_ids) == 1:
                moved.update(t["Storm-Path"])
            else:
                moved.update(changed_paths(store, store.commit(x.parent_ids[0]).tree, x.tree))
        if tip_tree is not None:
            moved.update(changed_paths(store, head_tree, store.repo[tip_tree]))
    except (pygit2.GitError, KeyError):
        return None
    return moved


def _held_version(store: Store, tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    """``path``'s version in an older tree; None where a partial clone lacks a subtree."""
    try:
        return _version(store, tree, path)
    except (pygit2.GitError, KeyError):
        return None


def revert_targets(store: Store, head: pygit2.Oid, start: pygit2.Tree, after: Snapshot,
                   expected: dict[str, str | None]) -> list[str]:
    """The command's targets it set back to an older shared version, now validated as
    a write's targets (``AS_WRITTEN``: the agent must have read the current version).
    Other targets are validated against what was on disk when the command started,
    which the command read; a ``git checkout``, ``stash`` or ``reset --hard`` takes
    its content from git's history instead, so that is no evidence that the agent saw
    the work it undoes: ``exec -- git checkout -- .`` must not revert other agents'
    accepted writes that the agent never read."""
    states = {p: after.dirty.get(p) for p in expected}
    reverted = sorted(reverted_paths(store, head, states, start))
    for p in reverted:
        expected[p] = AS_WRITTEN
    return reverted


# -- unmediated edits ---------------------------------------------------------------
def unmediated(ws: ValidatedWriter, *, diffs: bool = True, untracked_content: bool = False,
               nested: list[str] | None = None) -> list[dict[str, Any]]:
    """Every path whose disk differs from what storm last put there, with the
    version it was made on (``base_version``) and, on request, its diff.
    ``nested``: receives the git repositories of their own found in the tree."""
    store = ws.store
    with flocked(store.commondir, "worktree"):
        snap = snapshot(store)
        if nested is not None:
            nested.extend(snap.nested)
        reverted = reverted_paths(store, snap.head, snap.dirty, snap.record)
        conv = Conversions(store)
        out = []
        for path in sorted(snap.dirty):
            have = snap.dirty[path]
            base = _entry(store, snap.record, path)
            cur = _version(store, snap.tree, path)
            if have is False:
                state = "not-a-file"
            elif path in reverted:
                state = "reverted"
            elif have is None:
                state = "deleted"
            elif base is None:
                state = "added"
            elif have[0] == base.oid:
                state = "mode-changed"
            else:
                state = "modified"
            item = {"path": path, "state": state, "shared_version": hex_(cur),
                    "base_version": hex_(base.oid) if base else None,
                    "behind": (base.oid if base else None) != cur,
                    "disk_version": hex_(have[0]) if isinstance(have, tuple) else None,
                    # an untracked .env, key…: for .gitignore, never for commit --adopt
                    "likely_secret": state == "added" and likely_secret(path)}
            show = diffs and have is not False and (state != "added" or untracked_content)
            if show:
                old = store.blob_bytes(base.oid) if base else None
                new = read_disk_content(store, path) if have is not None else None
                if new is not None and have[1] != MODE_LINK:
                    new = _converted(conv, path, new)  # as git diff shows it: the CRLF of a checkout is no change
                item["binary"] = is_binary(old) or is_binary(new)
                item["diff"] = unified(path, old, new)
            out.append(item)
    return out


# -- adopt ---------------------------------------------------------------------------
class RevertRefused(UsageError):
    """Adopting content that is an older shared version would undo accepted work."""

    kind = "reverted"


def adopt(ws: ValidatedWriter, paths: list[str], *, agent: str | None, intent: str | None = None,
          wait: bool = True, repo_relative: bool = False, allow_revert: bool = False,
          on_wait: OnWait | None = None) -> WriteResult:
    """Record the disk content of ``paths`` (edited outside storm) as ``agent``'s write.

    Validated against the version each edit was made on (the disk record), plus
    the agent's read set: an edit made on an older version than the shared head
    is a direct conflict with the diff, never a silent revert of a newer write.
    """
    agent = validate_agent(agent)
    store = ws.store
    prefix = "" if repo_relative else store.prefix
    norm = list(dict.fromkeys(normalize(p, prefix, store.top) for p in paths))
    if not norm:
        raise UsageError("no path given", hint="name the files to adopt (git storm status lists them)")
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with flocked(store.commondir, "worktree"):
        disk_sync.sync_locked(store, norm)  # a path that was only behind is brought forward, not adopted
        rtree, _ = disk_sync.record_tree(store)
        head = store.ref_target(WORKSPACE_REF)
        conv = Conversions(store)
        states = {}
        for p in norm:
            if os.path.lexists(os.path.join(store.main_workdir, p)):
                check_on_disk(p, store.main_workdir, for_write=False)  # a directory, a link out
            have = disk_state(store.main_workdir, p, conv=conv)
            base = _entry(store, rtree, p)
            if have is False:
                _raise_failed_conversion(store, conv, p)
                raise BadPath(f"{p} is not a regular file on disk (or lies beyond a symbolic link)",
                              hint="storm adopts regular files and symbolic links inside the repository")
            if same(have, base):
                cur = _entry(store, store.commit(head).tree, p)
                raise UsageError(f"{p} is not modified: the disk holds what storm put there"
                                 + ("" if same(have, cur) else " (it could not be brought up to date)"),
                                 hint="nothing to adopt; git storm status lists unmediated edits")
            check_recordable(store, p, have, ws)
            states[p] = have
        reverted = reverted_paths(store, head, states, rtree)
        if reverted and not allow_revert:
            names = ", ".join(sorted(reverted)[:5])
            raise RevertRefused(f"{names}: the disk holds an older shared version (a git stash or reset?); "
                                "adopting it would undo accepted writes",
                                hint="git storm checkout PATH restores the shared version; "
                                     "pass --allow-revert if the revert is intended")
        for p, have in states.items():
            content = read_disk_content(store, p) if have is not None else None
            if content is not None:
                ws.check_size(p, content)
            changes[p] = with_mode(content, have, _entry(store, rtree, p))
            expected[p] = hex_(_version(store, rtree, p))
    return ws.apply(agent, changes, intent=intent or f"storm: {agent} adopts {', '.join(norm[:3])}",
                    deps=None, wait=wait, op="adopt", expected=expected, on_wait=on_wait)


# -- exec ------------------------------------------------------------------------------
def _resolve(argv0: str, cwd: str) -> str:
    if "/" in argv0:
        full = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if not os.path.exists(full):
            raise CommandNotFound(f"command not found: {argv0}")
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            raise CommandNotExecutable(f"{argv0} is not executable",
                                       hint="chmod +x it, or run it through its interpreter")
        return full
    found = shutil.which(argv0)
    if found is None:
        raise CommandNotFound(f"command not found: {argv0}",
                              hint="check the name and PATH; git storm exec -- CMD ARGS...")
    return found


def _run(argv: list[str], cwd: str, timeout: float | None) -> tuple[int, bool]:
    """Run with inherited stdio; (returncode, timed_out).

    On a terminal the command stays in storm's (foreground) process group, so it
    can read the terminal and Ctrl-C reaches it directly; storm ignores SIGINT
    and SIGQUIT meanwhile and records nothing if the command dies of a signal.
    Otherwise the command gets its own process group, so a timeout or a signal to
    storm ends all of it."""
    foreground = _on_terminal()
    proc: subprocess.Popen | None = None
    pending: list[int] = []  # signals that came before the command existed

    def kill(sig: int) -> None:
        if proc is None:
            pending.append(sig)
            return
        try:
            if foreground:
                proc.send_signal(sig)
            else:
                os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def forward(signum: int, _frame: Any) -> None:
        kill(signum)

    # installed before the spawn: a Ctrl-C in the window between the two would
    # otherwise stop storm itself while the command goes on
    old = {}
    handlers = ({signal.SIGINT: signal.SIG_IGN, signal.SIGQUIT: signal.SIG_IGN, signal.SIGTERM: forward,
                 signal.SIGHUP: forward} if foreground else
                {signal.SIGINT: forward, signal.SIGTERM: forward, signal.SIGHUP: forward})
    for s, h in handlers.items():
        try:
            old[s] = signal.signal(s, h)
        except ValueError:  # not the main thread
            break
    # the command gets the dispositions storm was started with (ignored stays ignored,
    # as a shell keeps it; a handler becomes the default), not the ignore set just now
    inherit = [(s, signal.SIG_IGN if h == signal.SIG_IGN else signal.SIG_DFL)
               for s, h in old.items() if s in (signal.SIGINT, signal.SIGQUIT)]

    def restore() -> None:
        for s, h in inherit:
            signal.signal(s, h)

    try:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, process_group=None if foreground else 0,
                                    preexec_fn=restore if inherit else None)
        except PermissionError:
            raise CommandNotExecutable(f"{argv[0]} is not executable") from None
        except FileNotFoundError:
            raise CommandNotFound(f"command not found: {argv[0]}") from None
        for sig in pending:
            kill(sig)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
                kill(sig)
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            proc.wait()
            return proc.returncode, True
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _on_terminal() -> bool:
    """stdin is a terminal and storm is in its foreground process group."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def classify(store: Store, before: Snapshot, after: Snapshot) -> tuple[dict[str, Any], dict[str, str | None]]:
    """Without a clock: the command's changes are the paths that differ from the
    disk record after it and whose state is not what it was before it."""
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with safe_fs.DirFds(store.main_workdir) as dirs:  # read only: each directory opened once
        for path in sorted(after.dirty):
            a = after.dirty[path]
            b = before.dirty[path] if path in before.dirty else _state_of(_entry(store, before.record, path))
            if a == b:
                continue  # untouched by the command (maybe an unmediated edit from before)
            _add_change(store, before.record, path, a, changes, expected, dirs)
    return changes, expected


def _state_of(e: Entry | None) -> Any:
    return None if e is None else (e.oid, e.mode)


def _add_change(store: Store, start: pygit2.Tree, path: str, a: Any, changes: dict, expected: dict,
                dirs: safe_fs.DirFds | None = None) -> None:
    """Record the command's change of ``path``, validated against what was on disk
    when the command started (``start``, the disk record then): a path another
    agent wrote while the command ran is a direct conflict, never overwritten."""
    if a is False:
        a = None  # a file became a directory: the file is gone
    changes[path] = (with_mode(read_disk_content(store, path, dirs), a, _entry(store, start, path))
                     if a is not None else None)
    expected[path] = hex_(_version(store, start, path))


def _deleted_after(top: str, path: str, mark: int, known: dict[str, bool] | None = None) -> bool:
    """Was ``path`` (missing now) deleted after ``mark``? Removing a file stamps its
    directory; when the directory went too, its parent, and so on. ``known``: the
    answers of one classification by directory (2,000 files deleted from one
    directory ask about that directory once)."""
    d = os.path.dirname(path)
    if known is not None:
        if d not in known:
            known[d] = _deleted_after(top, path, mark)
        return known[d]
    while True:
        try:
            st = os.lstat(os.path.join(top, d) if d else top)
            return max(st.st_mtime_ns, st.st_ctime_ns) > mark
        except FileNotFoundError:
            if not d:
                return True
            d = os.path.dirname(d)
        except NotADirectoryError:  # a directory replaced by a file: stamped by the command
            d = os.path.dirname(d)


def classify_since(store: Store, start: pygit2.Tree, mark: int, missing_before: set[str] | None,
                   after: Snapshot) -> tuple[dict[str, Any], dict[str, str | None]]:
    """One-scan classification: a path differing from the disk record after the
    command is the command's change iff the file was stamped after ``mark`` (for a
    deletion: it was not already missing at the last snapshot and its directory
    was stamped after ``mark``). Edits from before the command keep their older
    stamps and stay unmediated."""
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    top = store.main_workdir
    stamped: dict[str, bool] = {}
    with safe_fs.DirFds(top) as dirs:  # read only: each directory opened once
        for path in sorted(after.dirty):
            a = after.dirty[path]
            if a is None or a is False:  # the file is gone (maybe a directory is there now)
                if missing_before is not None and path in missing_before:
                    continue  # already missing at the last snapshot
                if not _deleted_after(top, path + "/x" if a is False else path, mark, stamped):
                    continue
            else:
                try:
                    st = os.lstat(os.path.join(top, path))
                except OSError:
                    continue
                if st.st_ctime_ns <= mark:
                    continue  # changed before the command: an unmediated edit
            _add_change(store, start, path, a, changes, expected, dirs)
    return changes, expected


def _drop_earlier_edits(before: Snapshot, after: Snapshot, changes: dict[str, Any],
                        expected: dict[str, str | None]) -> None:
    """A path that held an edit made outside storm before the command and holds the
    same now (touched, not changed: ``sed -i`` without a match) is not the command's."""
    for p in [p for p in changes if p in before.dirty and after.dirty.get(p) == before.dirty[p]]:
        del changes[p]
        expected.pop(p, None)


def _refuse_mixed(before: Snapshot, changes: dict[str, Any], argv: list[str]) -> None:
    """Refuse to credit an agent with a file that already held someone's edit (an
    unmediated edit, listed by ``status``) when its command ran: the recorded file
    would carry that edit as the agent's. Nothing is recorded; the files stay as the
    command left them."""
    mixed = sorted(p for p in changes if p in before.dirty)
    if not mixed:
        return
    named = ", ".join(quoted(p) for p in mixed[:5]) + (f" and {len(mixed) - 5} more" if len(mixed) > 5 else "")
    raise UnmediatedEdit(
        f"exec: {named} held an edit made outside storm before {shlex.join(argv)[:60]} ran, and the command "
        "changed it too: its change cannot be told apart from that edit, so nothing was recorded "
        "(every file stays as the command left it)",
        hint="record the earlier edit as its author's first (git storm adopt PATH --agent NAME) or drop it "
             "(git storm checkout PATH), then run the command again")


def exec_(ws: ValidatedWriter, argv: list[str], *, agent: str | None, intent: str | None = None,
          timeout: float | None = None, wait: bool = True, on_wait: OnWait | None = None) -> ExecResult:
    """Run ``argv`` in the shared working tree and record what it changed as one write."""
    agent = validate_agent(agent)
    argv = list(argv)
    if not argv:
        raise UsageError("no command given", hint="git storm exec --agent A -- CMD ARGS...")
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--timeout {timeout} is not a positive number of seconds")
    store = ws.store
    cwd = os.path.join(store.main_workdir, store.prefix) if store.prefix else store.main_workdir
    if not os.path.isdir(cwd):
        cwd = store.main_workdir
    _resolve(argv[0], cwd)
    dev = os.stat(store.main_workdir).st_dev
    with flocked(store.commondir, "worktree"):
        ws.head()  # not initialised: refuse before running anything
        # behind paths forward (they are not the command's), and the edits already on
        # disk: a person's, never to be credited to the agent
        before = snapshot(store)
        start = before.record
        use_clock = str(store.config_get("storm.execClock", "true")).lower() not in ("false", "no", "off", "0")
        mark = clock_mark(store, dev) if use_clock else None
    rc, timed_out = _run(argv, cwd, timeout)
    with flocked(store.commondir, "worktree"):
        after = snapshot(store)
        if mark is not None:
            missing_before = {p for p, v in before.dirty.items() if v is None}
            changes, expected = classify_since(store, start, mark, missing_before, after)
        else:
            changes, expected = classify(store, before, after)
        _drop_earlier_edits(before, after, changes, expected)
        paths = list(changes)
        nested = after.nested  # each exec names them, as git status lists them, until ignored or a submodule
        if timed_out or rc < 0:
            # Killed: its changes may be half done. Record nothing; they stay on disk
            # and show as unmediated edits.
            return ExecResult(argv, rc, timed_out, paths, None, nested)
        _refuse_mixed(before, changes, argv)
        for p in paths:
            check_recordable(store, p, after.dirty.get(p), ws)
        reverted = revert_targets(store, after.head, start, after, expected)
    if not changes:
        return ExecResult(argv, rc, False, [], None, nested)
    for p, change in changes.items():
        content = change[0] if isinstance(change, tuple) else None
        if content is not None and len(content) > ws.max_file_bytes:
            raise TooLarge(f"the command left {p} with {len(content)} bytes, over storm.maxFileBytes "
                           f"({ws.max_file_bytes}); nothing was recorded",
                           hint="raise git config storm.maxFileBytes, or remove the file")
    command = shlex.join(argv)
    if len(command) > 120:
        command = command[:117] + "..."
    res = ws.apply(agent, changes, intent=intent or f"{agent} exec: {command}", deps=None, wait=wait,
                   op="exec", expected=expected, on_wait=on_wait)
    return ExecResult(argv, rc, False, paths, res, nested, reverted)
