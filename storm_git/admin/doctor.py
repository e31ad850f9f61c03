"""``git storm doctor``: find (and with ``fix=True`` repair) what crashes leave behind.

Report first, repair on request: ``diagnose`` looks and changes nothing;
``diagnose(fix=True)`` repairs what is safe to repair and says what it did.
When all is well neither changes anything (not a ref, not a file).

What it looks for:

* ``stale_ref_lock``: a ``<ref>.lock`` under storm's refs (``refs/storm/``,
  ``refs/notes/storm/``, and a remote's copies in ``refs/storm-remote/``, which
  a killed ``git fetch`` can leave) left by a writer that died between locking and
  renaming. It is removed only while doctor itself holds the storm flock that
  guards the ref (so no storm writer is mid-update: the kernel drops a dead
  holder's flock), and only when older than ``STALE_REF_LOCK_SECONDS`` (git's own
  ``pack-refs``/``gc`` hold ref locks for moments). Writers clear such locks
  themselves too (``Store.cas``); doctor is for when no writer comes by.
* ``server_stale_ref_lock``: the same on the server of a remote workspace, when the
  server is on this machine (``file://`` or a path): a storm ref's lock left there by
  a git update killed mid-commit (storm_git.remote.ref_locks). The fix removes it;
  on the server, ``git storm server-hook check`` reports it for any transport.
* ``stale_temp_file``: a ``*.storm-tmp-<pid>`` file in the working tree left by
  a writer killed while materialising a file, removed under the worktree flock
  when process ``<pid>`` no longer runs.
* ``broken_ref``: a storm ref that does not resolve to an object of the right
  type (or cannot be parsed). Not repaired automatically: the message says what
  to do (``git fsck``, restore the ref from a backup or ``git reflog``).
* ``orphan_read_set``: the read-set notes ref of an agent that no longer exists.
  Agent ids are declared, not registered, so "no longer exists" is decided from
  what the repository shows: in worktree mode an agent whose worktree and branch
  are both gone (``git storm cleanup`` ran), and in any mode any agent the
  operator names with ``forget_agents`` (``--forget-agent ID``). Storm mode has
  no registry of agents, so it never guesses. The fix empties the read set;
  the folded journals in the same notes ref (which the agent's writes'
  provenance trailers point into) and any old provenance notes are history and
  are kept.
* ``corrupt_read_set``: an agent's read-set note that cannot be parsed. Every
  command of that agent refuses (naming it) until it is reset; the fix empties
  it (``forget --agent A`` does the same), the journals its writes' provenance
  points into stay.
* ``expired_reservations``: reservations past their expiry still stored in
  ``refs/storm/reservations`` (harmless; pruned by the next reservation change).
* ``skewed_reservation``: a reservation ending further ahead than
  ``reservations.max_ahead`` (made with a clock far ahead). Writers already
  ignore it; the fix removes it.
* ``unreadable_reservation``: an entry of ``refs/storm/reservations`` that is
  not storm's JSON (a hand edit, another tool). Commands that meet it refuse
  with exit 3 naming it; the fix removes it (as any reservation change does).
* ``stale_ref_lock`` also covers a ``<ref>.lock`` dated in the future (by more
  than ``FUTURE_REF_LOCK_SECONDS``): no live git process made it just now.
* ``storm_path_wrong_type``: one of storm's own paths under ``<git dir>/storm``
  that is not what storm makes there (a directory where a lock file, a journal,
  the disk record, the seen-agents record or a remote clone's state file goes --
  ``remote-gate``, ``remote-rebased``, ``remote-queue``, named in
  storm_git.remote.state_files; a file where the ``locks`` or ``journal`` directory
  goes).
  Every command that needs it refuses with exit 3 naming it. The fix moves it
  aside, into ``<git dir>/storm-moved-aside/`` (nothing is deleted); the other
  checks wait until it is fixed.
* ``stale_index_lock``: git's ``index.lock`` left by a ``git storm commit`` that
  was killed holding it (its content names storm and a pid that no longer runs;
  git's own locks are never touched). Every git command that writes the index
  refuses until it goes. When the branch had already moved to the commit the lock
  names, the index still holds the old tree, and the person's next ``git commit``
  would record a revert of the agents' work: the fix resets the index to the
  branch's tree (keeping stat data), then removes the lock.
* ``codex_hooks_untrusted``: ``.codex/hooks.json`` holds storm's hooks but the
  user's Codex config does not trust the project or a hook's current hash, so
  Codex silently never runs them. Not fixed here: trusting hooks is the user's
  decision (``git storm harness install codex --trust`` writes the entries).
* ``corrupt_private_index``: storm's private index (``<git dir>/storm/exec-index``,
  a cache of stat data for ``status``, ``exec`` and a harness's Bash door) that git
  cannot read (truncated, garbage, a bad checksum): each of those commands
  refuses with exit 3 naming it. The fix discards it (and its record of the tree
  it held) under the worktree flock; the next command rebuilds it from git's own
  index, as on first use.
* ``tree_watch_unavailable``: the resident process runs without its inotify watch
  of the working tree (the user's inotify watches are all taken,
  ``fs.inotify.max_user_watches``; no inotify): every snapshot walks the tree, as
  without the resident process. Not fixed here: raising a kernel limit is the
  administrator's call.
* ``orphaned_worktree``: git worktree records whose directory is gone
  (``git worktree prune`` semantics; only the records under ``.git/worktrees``
  are removed, never a directory that exists).
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import readsets, reservations
from ..core.agents import SEEN_FILE, validate_agent
from ..core.convert import Conversions
from ..core.errors import CorruptState, StormError
from ..core.locks import REMOTE_LOCK, flocked, is_locked, pid_alive
from ..core.store import (
    AGENTS_PREFIX,
    EVENTS_REF,
    FUTURE_REF_LOCK_SECONDS,
    REMOTE_TRACKING_PREFIX,
    RESERVATIONS_REF,
    STALE_REF_LOCK_SECONDS,
    WORKSPACE_REF,
    Store,
    git_env,
    ref_oid,
)
from ..remote import ref_locks
from ..remote.state_files import FILES as REMOTE_FILES
from ..storm import index as git_index, private_index, tree_watch
from . import harness_install

STORM_REF_ROOTS = ("refs/storm", "refs/notes/storm", REMOTE_TRACKING_PREFIX.rstrip("/"))
TEMP_RE = re.compile(r"\.storm-tmp-([0-9]+)\Z")  # \Z: "$" also matches before a final newline


@dataclass
class Finding:
    kind: str
    what: str
    detail: str
    fixable: bool
    fixed: bool = False
    harmless: bool = False  # worth tidying, not a problem: does not make the report fail

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DoctorReport:
    findings: list[Finding] = field(default_factory=list)
    fix: bool = False

    @property
    def ok(self) -> bool:
        """Healthy now: nothing found but harmless leftovers, or everything was repaired."""
        return all(f.fixed or f.harmless for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "fix": self.fix, "findings": [f.to_dict() for f in self.findings],
                "fixed": sum(f.fixed for f in self.findings)}


def guard_of(ref: str) -> str | None:
    """The storm flock that serialises storm's updates of ``ref`` (None: unknown)."""
    if ref in (WORKSPACE_REF, RESERVATIONS_REF, EVENTS_REF):
        return "workspace"
    if ref.startswith(AGENTS_PREFIX):
        return readsets.agent_lock(ref[len(AGENTS_PREFIX):])
    if ref.startswith(REMOTE_TRACKING_PREFIX):
        return REMOTE_LOCK  # the copies of a server's refs move only in storm's fetches and pushes
    return None


# -- the checks ----------------------------------------------------------------------
def _ref_locks(store: Store, fix: bool, out: list[Finding]) -> None:
    for root in STORM_REF_ROOTS:
        base = os.path.join(store.commondir, *root.split("/"))
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if not name.endswith(".lock"):
                    continue
                full = os.path.join(dirpath, name)
                ref = os.path.relpath(full, store.commondir).replace(os.sep, "/")[:-len(".lock")]
                guard = guard_of(ref)
                _one_ref_lock(store, ref, full, guard, fix, out)


def _one_ref_lock(store: Store, ref: str, full: str, guard: str | None, fix: bool, out: list[Finding]) -> None:
    try:
        age = time.time() - os.stat(full).st_mtime
    except FileNotFoundError:
        return  # a writer finished meanwhile
    if guard is not None and is_locked(store.commondir, guard):
        return  # a live storm process holds the lock: the .lock is its own, in use
    if -FUTURE_REF_LOCK_SECONDS <= age < STALE_REF_LOCK_SECONDS:
        return  # may be git's own pack-refs/gc at work right now
    when = f"{age:.0f}s old" if age >= 0 else f"dated {-age:.0f}s in the future"
    f = Finding("stale_ref_lock", ref, f"{os.path.relpath(full, store.commondir)} is {when} and no "
                f"storm process holds {guard or 'a lock on it'}", True)
    out.append(f)
    if not fix:
        return
    if guard is None:
        f.fixed = store.clear_stale_ref_lock(ref)
        return
    with flocked(store.commondir, guard):
        f.fixed = store.clear_stale_ref_lock(ref)


def _server_ref_locks(store: Store, fix: bool, out: list[Finding]) -> None:
    """``server_stale_ref_lock``: a storm ref's lock on the server, left by an update that
    died mid-commit (storm_git.remote.ref_locks), when the server is on this machine."""
    remote = store.config_get("storm.remote")
    url = store.config_get(f"remote.{remote}.url") if remote else None
    gitdir = ref_locks.local_server(str(url)) if url else None
    if gitdir is None:
        return
    for lock in ref_locks.stale(gitdir):
        f = Finding("server_stale_ref_lock", lock.ref, f"on {remote}: {lock.describe()}; every push that moves "
                    f"it fails until it goes", True)
        out.append(f)
        if fix:
            f.fixed = bool(ref_locks.clear_stale(gitdir, [lock.ref]))


def _broken_refs(store: Store, out: list[Finding]) -> None:
    """Storm refs that do not resolve to a commit."""
    names = [r for r in store.repo.references if r.startswith(tuple(root + "/" for root in STORM_REF_ROOTS))]
    for name in names:
        try:
            ref = store.repo.lookup_reference(name)
            obj = store.repo.get(ref.target)
        except (KeyError, ValueError, pygit2.GitError) as exc:
            out.append(Finding("broken_ref", name, f"cannot be read: {exc}", False))
            continue
        if obj is None:
            out.append(Finding("broken_ref", name, f"points to missing object {ref.target}", False))
        elif not isinstance(obj, pygit2.Commit):
            out.append(Finding("broken_ref", name, f"points to a {type(obj).__name__.lower()}, not a commit", False))
        else:
            try:
                obj.tree  # noqa: B018 - resolving the tree is the check
            except (KeyError, pygit2.GitError):
                out.append(Finding("broken_ref", name, f"commit {ref.target} has no tree object", False))


def _worktree_mode_agents(store: Store) -> set[str] | None:
    """Agents that still have a worktree or a branch (None: not in worktree mode)."""
    if store.config_get("storm.mode") != "worktree":
        return None
    try:
        from ..worktree import worktrees
    except ImportError:  # pragma: no cover - worktree mode not installed
        return None
    alive = set(worktrees.storm_branches(store))
    for w in worktrees.list_worktrees(store):
        if w.agent and not w.prunable:
            alive.add(w.agent)
    return alive


def _orphan_read_sets(store: Store, forget_agents: list[str], fix: bool, out: list[Finding]) -> None:
    alive = _worktree_mode_agents(store)
    for agent in readsets.agents(store):
        why = None
        if agent in forget_agents:
            why = "named with --forget-agent"
        elif alive is not None and agent not in alive:
            why = "worktree mode: its worktree and branch are gone"
        if why is None:
            continue
        try:
            if not readsets.peek(store, agent):
                continue  # nothing to drop (its folded journals are history and stay)
        except StormError:
            continue  # reported as broken_ref
        f = Finding("orphan_read_set", agent, f"{AGENTS_PREFIX}{agent} (read set): {why}", True)
        out.append(f)
        if fix:
            f.fixed = _drop_read_set(store, agent)


def _corrupt_read_sets(store: Store, fix: bool, out: list[Finding]) -> None:
    for agent in readsets.agents(store):
        try:
            readsets.peek(store, agent)
            continue
        except readsets.CorruptReadSet as exc:
            detail = exc.message
        except StormError:
            continue  # a broken ref: reported as broken_ref
        f = Finding("corrupt_read_set", agent, f"{AGENTS_PREFIX}{agent}: {detail}; the fix empties it "
                    f"(its writes' provenance stays)", True)
        out.append(f)
        if fix:
            f.fixed = _drop_read_set(store, agent)


def _drop_read_set(store: Store, agent: str) -> bool:
    """Empty the agent's read set (its folded journals stay: its writes' provenance points into them)."""
    readsets.forget(store, agent, None)
    return not readsets.load(store, agent)


def _expired_reservations(store: Store, fix: bool, out: list[Finding]) -> None:
    ref = store.ref(RESERVATIONS_REF)
    if ref is None:
        return
    tree = store.commit(ref_oid(ref)).tree
    now, ahead = reservations.clock(), reservations.max_ahead(store)
    expired, skewed, unreadable = [], [], []
    for e in tree:
        r = reservations.readable(store, e)
        if r is None:
            unreadable.append(Finding("unreadable_reservation", RESERVATIONS_REF,
                                      f"entry {e.name} is not a reservation storm can read; the fix removes it", True))
            continue
        if r.remaining(now) <= 0:
            expired.append(r.path)
        elif r.skewed(now, ahead):
            skewed.append(Finding("skewed_reservation", r.path,
                                  f"held by {r.holder} until "
                                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r.expires))}"
                                  f" UTC, {(r.expires - now) / 3600:.0f}h ahead (more than {ahead:.0f}s: a skewed"
                                  f" clock); writers ignore it, the fix removes it", True))
    out.extend(unreadable)
    out.extend(skewed)
    skewed += unreadable  # the same fix: one reservation change drops both
    if skewed and fix:
        with flocked(store.commondir, "workspace"):
            reservations.update(store, {}, agent="storm-doctor",
                                message="storm doctor: remove unreadable reservations and ones from a skewed clock")
        for f in skewed:
            f.fixed = True
        if expired:
            out.append(Finding("expired_reservations", RESERVATIONS_REF,
                               f"{len(expired)} expired reservation(s) pruned", True, fixed=True, harmless=True))
        return
    if not expired:
        return
    f = Finding("expired_reservations", RESERVATIONS_REF,
                f"{len(expired)} expired reservation(s) still stored: {', '.join(sorted(expired)[:5])}", True,
                harmless=True)
    out.append(f)
    if fix:
        with flocked(store.commondir, "workspace"):
            reservations.update(store, {}, agent="storm-doctor", message="storm doctor: prune expired reservations")
        f.fixed = True


def _temp_files(store: Store, fix: bool, out: list[Finding]) -> None:
    top = store.main_workdir
    found = []
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            m = TEMP_RE.search(name)
            if m and not pid_alive(int(m.group(1))):
                found.append(os.path.join(dirpath, name))
    if not found:
        return
    for full in found:
        rel = os.path.relpath(full, top).replace(os.sep, "/")
        f = Finding("stale_temp_file", rel, "left by a storm writer that died while writing the working tree", True)
        out.append(f)
        if fix:
            with flocked(store.commondir, "worktree"):
                try:
                    if os.path.islink(full) or os.path.isfile(full):
                        os.unlink(full)
                    f.fixed = True
                except FileNotFoundError:
                    f.fixed = True


def _index_lock(store: Store, fix: bool, out: list[Finding]) -> None:
    stale = git_index.stale_index_lock(store)
    if stale is None:
        return
    pid, new = stale
    moved = new is not None and str(store.repo.lookup_reference("HEAD").resolve().target) == new
    f = Finding("stale_index_lock", os.path.relpath(os.path.join(store.gitdir, "index.lock"), store.top),
                f"left by git storm commit (pid {pid}), killed "
                + ("after the branch moved: the index still holds the old tree" if moved
                   else "before the branch moved"), True)
    out.append(f)
    if fix:
        git_index.repair_index(store, new)
        f.fixed = not os.path.exists(os.path.join(store.gitdir, "index.lock"))


def _harness_hooks(store: Store, fix: bool, out: list[Finding]) -> None:
    trust = harness_install.codex_state(store)
    if trust is not None and not trust.ok:  # never written by --fix: trusting hooks is the user's call
        out.append(Finding("codex_hooks_untrusted", harness_install.TARGETS["codex"],
                           "Codex will not run storm's hooks: " + "; ".join(trust.missing())
                           + " (git storm harness install codex --trust writes the entries and shows them)", False))


def _tree_watch(store: Store, out: list[Finding]) -> None:
    """The resident process runs without its watch of the working tree: every
    snapshot (the shell door, exec, status) walks the tree."""
    st = tree_watch.read_state(store.commondir)
    if st is None or st.watching:
        return
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as fh:
            limit = f" (fs.inotify.max_user_watches is {fh.read().strip()})"
    except OSError:
        limit = ""
    out.append(Finding("tree_watch_unavailable", os.path.join(".git", "storm", tree_watch.STATE_NAME),
                       f"the resident process (pid {st.pid}) has no watch of the working tree: {st.why}{limit}; "
                       "each snapshot walks the tree (correct, slower at many files): raise the limit "
                       "(sysctl fs.inotify.max_user_watches=N), then stop the process to let the next call "
                       "start a new one", False))


def _worktrees(store: Store, fix: bool, out: list[Finding]) -> None:
    env = git_env()
    r = subprocess.run(["git", "--git-dir", store.commondir, "worktree", "prune", "--dry-run", "-v"],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("Removing ")]
    if not lines:
        return
    found = [Finding("orphaned_worktree", ln[len("Removing "):].split(":", 1)[0].strip(),
                     ln.split(":", 1)[1].strip() if ":" in ln else ln, True) for ln in lines]
    out.extend(found)
    if fix:
        with flocked(store.commondir, "worktrees"):  # the lock worktree mode's spawn/cleanup take
            done = subprocess.run(["git", "--git-dir", store.commondir, "worktree", "prune"],
                                  capture_output=True, env=env, stdin=subprocess.DEVNULL).returncode == 0
        for f in found:
            f.fixed = done


def diagnose(store: Store, *, fix: bool = False, forget_agents: list[str] | None = None) -> DoctorReport:
    """Check storm's state; with ``fix`` repair what is safe. See the module docstring."""
    forget = [validate_agent(a) for a in forget_agents or []]
    rep = DoctorReport(fix=fix)
    _layout(store, fix, rep.findings)
    if not rep.ok:  # the other checks open these paths: they would fail on them, not report
        return rep
    _ref_locks(store, fix, rep.findings)
    _server_ref_locks(store, fix, rep.findings)
    _broken_refs(store, rep.findings)
    broken = {f.what for f in rep.findings if f.kind == "broken_ref"}
    if not broken & {RESERVATIONS_REF}:
        _expired_reservations(store, fix, rep.findings)
    _corrupt_read_sets(store, fix, rep.findings)
    _orphan_read_sets(store, forget, fix, rep.findings)
    _temp_files(store, fix, rep.findings)
    if not broken & {WORKSPACE_REF} and store.ref(WORKSPACE_REF) is not None \
            and store.config_get("storm.mode", "storm") == "storm":
        _disk_record(store, fix, rep.findings)
    _private_index(store, fix, rep.findings)
    _index_lock(store, fix, rep.findings)
    _harness_hooks(store, fix, rep.findings)
    _tree_watch(store, rep.findings)
    _worktrees(store, fix, rep.findings)
    return rep


# storm's own paths under <git dir>/storm: what each must be when it exists
_DIRS = ("locks", "journal")  # and every entry in them a regular file
_FILES = ("disk-record", private_index.INDEX_NAME, SEEN_FILE, *REMOTE_FILES)
MOVED_ASIDE = "storm-moved-aside"


def _layout(store: Store, fix: bool, out: list[Finding]) -> None:
    """Paths under ``<git dir>/storm`` of the wrong type (module docstring)."""
    import stat as stat_mod

    root = os.path.join(store.commondir, "storm")
    wrong: list[tuple[str, str]] = []

    def kind(path: str) -> int | None:
        try:
            return os.lstat(path).st_mode
        except FileNotFoundError:
            return None

    mode = kind(root)
    if mode is not None and not stat_mod.S_ISDIR(mode):
        wrong.append((root, "a directory"))
    else:
        for name in _DIRS:
            full = os.path.join(root, name)
            mode = kind(full)
            if mode is not None and not stat_mod.S_ISDIR(mode):
                wrong.append((full, "a directory"))
            elif mode is not None:
                for entry in sorted(os.listdir(full)):
                    m = kind(os.path.join(full, entry))
                    if m is not None and not stat_mod.S_ISREG(m):
                        wrong.append((os.path.join(full, entry), "a file"))
        for name in _FILES:
            full = os.path.join(root, name)
            mode = kind(full)
            if mode is not None and not stat_mod.S_ISREG(mode):
                wrong.append((full, "a file"))
    for full, should in wrong:
        rel = os.path.relpath(full, store.commondir).replace(os.sep, "/")
        f = Finding("storm_path_wrong_type", rel, f"storm keeps {should} there; it is not one", True)
        out.append(f)
        if fix:
            aside = os.path.join(store.commondir, MOVED_ASIDE)
            os.makedirs(aside, exist_ok=True)
            dest = os.path.join(aside, f"{rel.replace('/', '_')}.{time.time_ns()}")
            os.rename(full, dest)
            f.detail += f"; moved to {os.path.relpath(dest, store.commondir)}"
            f.fixed = True


def _private_index(store: Store, fix: bool, out: list[Finding]) -> None:
    """Storm's private index (a cache of stat data) that git cannot read: every
    snapshot (status, exec, a harness's Bash) would fail on it. The fix discards
    it under the worktree flock; the next snapshot rebuilds it."""
    bad = private_index.problem(store)
    if bad is None:
        return
    f = Finding("corrupt_private_index", f"storm/{private_index.INDEX_NAME}",
                f"git cannot read storm's private index: {bad}", True)
    out.append(f)
    if fix:
        with flocked(store.commondir, "worktree"):
            private_index.discard(store)
        f.detail += "; discarded (the next command rebuilds it)"
        f.fixed = True


def _disk_record(store: Store, fix: bool, out: list[Finding]) -> None:
    """The working tree against storm's disk record: an unreadable record, and
    paths left behind the shared head (a writer killed between its CAS and its
    disk write, when no command has come by since). Unmediated edits are not a
    fault: status lists them."""
    from ..core import tree_diff
    from ..disk import record, safe_fs, sync as disk_sync

    with flocked(store.commondir, "worktree"):
        try:
            rec = record.load(store)
        except CorruptState as exc:
            f = Finding("corrupt_disk_record", record.record_path(store), exc.message, True)
            out.append(f)
            if fix:  # what is on disk now is taken as what storm put there; differences show as edits
                head = store.ref_target(WORKSPACE_REF)
                if head is not None:  # the caller saw it; gone since, there is nothing to reset to
                    record.reset(store, store.commit(head).tree.id, head)
                    f.fixed = True
            return
        head = store.ref_target(WORKSPACE_REF)
        if head is None:
            return  # gone since the caller saw it: no shared head to compare the disk with
        htree = store.commit(head).tree
        # read-only: the record's base tree plus its journal, nothing folded or written
        candidates = dict.fromkeys([*tree_diff.changed_paths(store, store.tree(rec.base), htree), *rec.overlay,
                                    *rec.pending])
        behind = []
        conv = Conversions(store)
        for p in candidates:
            want = record.entry_or_none(store, htree, p)
            if rec.get(store, p) == want:
                continue
            have = safe_fs.disk_state(store.main_workdir, p, conv=conv)
            if not safe_fs.same(have, want) and rec.is_storms(store, p, have):
                behind.append(p)
        if not behind:
            return
        names = ", ".join(behind[:5]) + (" …" if len(behind) > 5 else "")
        f = Finding("disk_behind", names, f"{len(behind)} file(s) on disk are older than the shared head "
                    "(a writer died before its disk write, or the disk refused it); "
                    "any storm command brings them forward", True)
        out.append(f)
        if fix:
            res = disk_sync.sync_locked(store, behind, full=True)
            f.fixed = all(res.outcomes.get(p) in (disk_sync.WRITTEN, disk_sync.CURRENT) for p in behind)
