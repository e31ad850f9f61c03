"""The STORM paper's manager, on git storm: a drop-in for ``multiagent_sync``'s Manager.

The paper's OpenHands harness sends every ``file_editor`` call to an in-memory
manager: integer versions, a per-write snapshot of what the agent read, and a
30-second reservation for the agent a conflict rejected. This class has the same
coroutines and payloads, backed by a storm-mode workspace: the files are the
shared head (``refs/storm/workspace``), every accepted write is a commit by its
agent, read sets and reservations are storm's, and the integer versions are
numbered in git (:mod:`storm_git.paper.versions`), so all of it survives a restart
and is the same for every process on the repository.

What a write is validated against: the ``snapshot`` when the harness sends one
(each path at the version the agent's cached view holds), else the agent's read set
as storm recorded it. The snapshot is what the edit was computed from; the
recorded read set can be newer than it (a rejection counts the current content as
read, before the agent has looked at it) and would hide a change the edit never
saw. Either way the target is validated at ``expected_version``. The snapshot is
written into the agent's read set first, so the write's provenance names it.

All git work runs in threads (``asyncio.to_thread``), with one repository handle
per agent, so many agents can be tasks on one event loop; a writer that meets
another agent's reservation waits for it on the loop, not in a thread.
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from ..api import open_workspace
from ..core.agents import validate_agent
from ..core.diffs import unified
from ..core.errors import BadPath, RepoStateError, UnmediatedEdit
from ..core.files import read_own
from ..core.paths import normalize
from ..core.payloads import RESERVED, STALE_DEPENDENCY, Rejection, WriteResult
from ..core.store import Store, hex_
from ..storm.rejection import author_of, last_author, last_authors
from ..storm.shell_edits import ADOPT
from ..storm.workspace import ReadEntry, Reservation, SharedWorkspace
from . import versions
from .manager_payloads import CommandRecord, CommandResponse, FileState

DEFAULT_RESERVATION_WAIT = 30.0  # seconds a writer waits for another agent's reservation
POLL_SECONDS = 0.1  # how often a waiting writer looks whether the reservation is gone
DEFAULT_COMMAND_TIMEOUT = 600.0
EXECUTE_TIMEOUT = 30.0  # execute_command's limit, the reference manager's (it raises TimeoutError past it)
MAX_OUTPUT_CHARS = 16_000  # a command's output returned (its tail)
ENCODING = "utf-8"
ERRORS = "surrogateescape"  # bytes that are not UTF-8 survive a read -> write round trip


@dataclass
class ReadResponse:
    content: str
    version: int


@dataclass
class StaleFile:
    """A file the write depended on that changed since the agent's version of it."""

    path: str
    expected_version: int
    current_version: int
    changed_by: str | None  # the agent that made the current version


@dataclass
class WriteResponse:
    success: bool
    new_version: int | None = None
    current_version: int | None = None
    changed_by: str | None = None  # on a conflict: the agent that made the current version
    diff: str | None = None  # on a conflict: from the agent's version to the current one
    current_content: str | None = None
    has_reservation: bool = False  # the agent now holds the file for a while to redo its edit
    stale_files: list[StaleFile] = field(default_factory=list)
    # beyond the paper's payload: storm's reason (direct_conflict, stale_dependency,
    # unread_target, reserved; None when accepted) and its one-line explanation
    reason: str | None = None
    message: str = ""


@dataclass
class CommandResult:
    """A shell command run through storm's ``exec``: its changes are one write by the agent."""

    output: str
    exit_code: int
    timed_out: bool
    versions: dict[str, int]  # path (relative to the workspace) -> its version after the command; 0: deleted
    rejected: WriteResponse | None = None  # the changes were not recorded: why (they stay on disk)
    commit: str | None = None  # the commit that recorded them
    stderr: str = ""  # execute_command keeps the two apart; run_command merges them into output
    affected: list[str] = field(default_factory=list)  # the paths it changed, recorded or not


@dataclass
class _Handle:
    """One agent's repository handle: a pygit2 repository is not shared across threads."""

    ws: SharedWorkspace
    lock: threading.Lock = field(default_factory=threading.Lock)


class Manager:
    """The paper's Manager interface on a storm-mode workspace (``git storm init`` done)."""

    def __init__(self, workspace: str | os.PathLike[str], *,
                 reservation_wait: float = DEFAULT_RESERVATION_WAIT) -> None:
        self.workspace = Path(workspace)
        self.reservation_wait = float(reservation_wait)
        self._handles: dict[str, _Handle] = {}
        self._guard = threading.Lock()
        self._reader = self._open()  # refuses a repository that is not in storm mode, now
        versions.begin(self._reader.ws.store)  # the files as they are now are version 1
        # the reference manager's command tracking: every execute_command, in order, kept
        # by this manager (commands of other doors are writes in storm's log, not here)
        self.command_log: list[CommandRecord] = []
        self.command_seq = 0
        self.agent_last_cmd_seq: dict[str, int] = {}
        self._commands = threading.Lock()
        self._contexts: dict[str, Any] = {}

    # -- handles --------------------------------------------------------------------
    def _open(self) -> _Handle:
        store = Store.discover(str(self.workspace))
        ws = open_workspace(store=store)
        if not isinstance(ws, SharedWorkspace):
            raise RepoStateError(f"{self.workspace} is in {ws.mode} mode; the manager needs storm mode",
                                 hint="switch with git storm mode storm")
        # the paper's terminal changes the workspace without the manager: its edits are
        # writes (by storm.shellAgent), unless storm.shellEdits says keep
        ws.shell_edits = ADOPT
        return _Handle(ws)

    @contextmanager
    def _agent(self, agent_id: str) -> Iterator[SharedWorkspace]:
        agent = validate_agent(agent_id)
        with self._guard:
            h = self._handles.get(agent)
        if h is None:
            h = self._open()
            with self._guard:
                h = self._handles.setdefault(agent, h)
        with h.lock:
            yield h.ws

    @contextmanager
    def _any(self) -> Iterator[SharedWorkspace]:
        with self._reader.lock:
            yield self._reader.ws

    # -- the paper's interface ----------------------------------------------------------
    @property
    def files(self) -> dict[str, FileState]:
        """{path: FileState} of every file of the shared head (not under a hidden
        directory, as the reference manager scans the workspace): its version, the md5
        of its content and who made it (read from git, the same for every process)."""
        with self._any() as ws:
            ws.take_in_shell_edits(only_adopting=True)  # a file the shell made exists, one it removed is gone
            return _file_states(ws)

    def register_context(self, agent_id: str, ctx: Any) -> None:
        """Keep the agent's context (the paper's AgentContext: ``file_views`` and
        ``invalidate_file``) to tell it when another agent's write through this manager
        changes a file it holds."""
        self._contexts[validate_agent(agent_id)] = ctx

    async def read_file(self, agent_id: str, path: str) -> ReadResponse:
        """The file at the shared head and its version; the read is recorded in the agent's read set."""
        return await asyncio.to_thread(self._read, agent_id, path)

    async def list_dir(self, path: str, max_depth: int = 2) -> list[str]:
        """The entries under ``path`` (not hidden ones) down to ``max_depth`` levels, as
        ``path/name``; directories end in ``/``. Not a read: nothing is recorded."""
        return await asyncio.to_thread(self._list, path, max_depth)

    async def write_file(self, agent_id: str, path: str, content: str, expected_version: int,
                         snapshot: dict[str, int] | None = None,
                         base_content: str | None = None) -> WriteResponse:
        """A validated write of ``content`` made on version ``expected_version`` (0: create)."""
        deadline = time.monotonic() + self.reservation_wait
        while True:
            held = await asyncio.to_thread(self._held_by_other, agent_id, path)
            left = deadline - time.monotonic()
            if held is not None and left > 0:
                await asyncio.sleep(max(0.01, min(POLL_SECONDS, held.remaining(), left)))
                continue
            res = await asyncio.to_thread(self._write, agent_id, path, content, expected_version, snapshot,
                                          base_content)
            if res.reason == RESERVED and deadline - time.monotonic() > 0:
                await asyncio.sleep(POLL_SECONDS)  # reserved between the look and the write: wait on
                continue
            return res

    async def release_reservation(self, agent_id: str, path: str) -> bool:
        """End the agent's reservation on ``path``; False when it held none."""
        return await asyncio.to_thread(self._release, agent_id, path)

    async def execute_command(self, agent_id: str, command: str) -> CommandResponse:
        """The reference manager's terminal: the commands other agents ran through this
        manager since this agent's last one, then the command itself through storm's
        ``exec`` (its changes one validated write by the agent), logged with the files it
        changed. Past EXECUTE_TIMEOUT the command is killed and TimeoutError raised."""
        agent = validate_agent(agent_id)
        with self._commands:
            missed = [r for r in self.command_log if r.seq > self.agent_last_cmd_seq.get(agent, 0)]
        res = await asyncio.to_thread(self._run, agent, command, EXECUTE_TIMEOUT, split=True)
        affected = sorted(res.versions) if res.rejected is None else res.affected
        with self._commands:
            self.command_seq += 1
            self.command_log.append(CommandRecord(self.command_seq, agent, command, res.output, res.stderr,
                                                  res.exit_code, affected_files=affected))
            self.agent_last_cmd_seq[agent] = self.command_seq
        for path, n in res.versions.items():
            self._notify(path, n, agent)
        if res.timed_out:
            raise TimeoutError(f"the command ran past {EXECUTE_TIMEOUT:.0f}s and was killed: {command[:100]}")
        return CommandResponse(res.output, res.stderr, res.exit_code, missed, affected, res.rejected)

    def _notify(self, path: str, version: int, changed_by: str) -> None:
        """Tell every other registered context holding ``path`` that it changed."""
        for aid, ctx in list(self._contexts.items()):
            views = getattr(ctx, "file_views", {})
            if aid != changed_by and path in views:
                ctx.invalidate_file(path, version, changed_by)

    async def run_command(self, agent_id: str, command: str, *,
                          timeout: float | None = DEFAULT_COMMAND_TIMEOUT) -> CommandResult:
        """Run a shell command in the workspace through storm's ``exec``: the files it
        changes become one write by the agent (validated, attributed, versions bumped).
        The paper's terminal tool bypasses the manager; route it here to keep shell edits."""
        return await asyncio.to_thread(self._run, agent_id, command, timeout)

    # -- in threads ---------------------------------------------------------------------
    def _read(self, agent_id: str, path: str) -> ReadResponse:
        with self._agent(agent_id) as ws:
            p = _file(ws, path)
            ws.take_in_shell_edits(only_adopting=True)  # the whole tree: what the shell did elsewhere too
            [r] = ws.read([p], agent=agent_id)
            if r.content is None:
                raise FileNotFoundError(errno.ENOENT, "No such file in the shared workspace", path)
            return ReadResponse(r.content.decode(ENCODING, ERRORS), versions.number(ws.store, p, r.head, r.version))

    def _list(self, path: str, max_depth: int) -> list[str]:
        with self._any() as ws:
            p = self._dir_path(ws, path)
            ws.take_in_shell_edits(only_adopting=True)  # a listing shows what is on disk
            tree = ws.store.commit(ws.head()).tree
            if p:
                try:
                    node = tree[p]
                except KeyError:
                    raise FileNotFoundError(errno.ENOENT, "No such directory in the shared workspace", path) from None
                if not isinstance(node, pygit2.Tree):
                    raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            else:
                node = tree
            base = path.rstrip("/") if path.rstrip("/") not in ("", ".") else ""
            out: list[str] = []
            _walk(node, base, max_depth, out)
            return out

    def _dir_path(self, ws: SharedWorkspace, raw: str) -> str:
        store = ws.store
        if not isinstance(raw, str):
            raise BadPath("path must be a string")
        if os.path.isabs(raw) and os.path.realpath(raw) == os.path.realpath(store.top):
            return ""
        if raw.rstrip("/") in ("", "."):
            return store.prefix
        return normalize(raw.rstrip("/"), store.prefix, store.top)

    def _held_by_other(self, agent_id: str, path: str) -> Reservation | None:
        with self._agent(agent_id) as ws:
            r = ws.reservation(_file(ws, path, for_write=True))
            return r if r is not None and r.holder != agent_id else None

    def _write(self, agent_id: str, path: str, content: str, expected_version: int,
               snapshot: dict[str, int] | None, base_content: str | None) -> WriteResponse:
        if not isinstance(content, str):
            raise TypeError("content must be a str")
        with self._agent(agent_id) as ws:
            store = ws.store
            p = _file(ws, path, for_write=True)
            ws.take_in_shell_edits(only_adopting=True)  # the whole tree: the disk and the shared head one truth
            shown = {p: path}
            too_old: list[tuple[str, int]] = []
            found = _version(store, p, expected_version, path)
            if found is None:
                too_old.append((p, expected_version))
            target = found or versions.ABSENT
            snap: dict[str, tuple[int, versions.Version]] | None = None
            if snapshot is not None:
                snap = {}
                for raw, n in snapshot.items():
                    if _directory(ws, raw):
                        continue  # a viewed directory: a listing, no content the edit can rest on
                    q = ws.path(raw)
                    shown.setdefault(q, raw)
                    if q != p:  # the target is validated at expected_version
                        v = _version(store, q, n, raw)
                        if v is None:
                            too_old.append((q, n))
                        else:
                            snap[q] = (n, v)
            if too_old:
                return _stale_read(ws, agent_id, p, too_old, shown, base_content)
            # the versions this write was made on become the agent's read set for it
            made_on = [(p, target.blob, target.commit)]
            made_on += [(q, v.blob, v.commit) for q, (_, v) in (snap or {}).items()]
            ws.note_reads(agent_id, made_on, why="snapshot")
            before = ws.read_set(agent_id)
            try:
                res = ws.write(p, content.encode(ENCODING, ERRORS), agent=agent_id,
                               deps=None if snap is None else sorted(snap), wait=False)
            except UnmediatedEdit as exc:  # an edit on disk storm may not take in yet: said, not raised
                return WriteResponse(False, reason=exc.kind, message=exc.message)
            return self._answer(ws, agent_id, p, res, shown, snap, before, base_content)

    def _answer(self, ws: SharedWorkspace, agent_id: str, p: str, res: WriteResult, shown: dict[str, str],
                snap: dict[str, tuple[int, versions.Version]] | None, before: dict[str, ReadEntry],
                base_content: str | None) -> WriteResponse:
        """The paper's payload for a write's result, every outcome kept: an accepted write
        an edit on disk replaced at once is no success (the file holds that edit, now the
        shared version), and what the disk step could not do is in ``message``."""
        store = ws.store
        if not res.accepted:
            return self._rejected(store, agent_id, res, shown, snap, before, base_content)
        said = "; ".join([*res.warnings, *(f"{q}: {e}" for q, e in res.disk_errors.items())])
        if p in res.displaced:
            head = ws.head()
            cur = store.entry(store.commit(head).tree, p)
            text = ws.agent_content(p, cur.oid, cur.mode).decode(ENCODING, ERRORS) if cur else None
            n = versions.number(store, p, str(head), str(cur.oid) if cur else None)
            written = res.versions.get(p)
            mine = _blob(store, written) if written else None
            return WriteResponse(False, current_version=n, current_content=text, reason="displaced", message=said,
                                 diff=unified(p, mine, text.encode(ENCODING, ERRORS) if text is not None else None))
        n = versions.number(store, p, res.commit or res.head, res.versions[p])
        self._notify(shown[p], n, agent_id)
        return WriteResponse(True, new_version=n, current_version=n, message=said)

    def _rejected(self, store: Store, agent_id: str, res: WriteResult, shown: dict[str, str],
                  snap: dict[str, tuple[int, versions.Version]] | None, before: dict[str, ReadEntry],
                  base_content: str | None) -> WriteResponse:
        r = res.rejection
        assert r is not None
        current = r.current_content
        diff = r.target.diff if r.target is not None else ""
        if base_content is not None and current is not None and r.reason != RESERVED:
            base = base_content.encode(ENCODING, ERRORS)
            seen = before.get(r.path)
            if seen is None or seen.blob is None or base != _blob(store, seen.blob):
                diff = unified(r.path, base, current)  # from what the agent's edit was really made on
        stale = []
        for s in r.stale:
            if snap is not None and s.path in snap:
                expected = snap[s.path][0]
            else:
                e = before.get(s.path)
                expected = versions.number(store, s.path, (e.head if e and e.head else r.head), s.read_version)
            stale.append(StaleFile(shown.get(s.path, s.path), expected,
                                   versions.number(store, s.path, r.head, s.current_version),
                                   s.changed_by[0] if s.changed_by else None))
        by = r.target.changed_by if r.target is not None and r.reason != RESERVED else []
        return WriteResponse(
            False, new_version=None, current_version=versions.number(store, r.path, r.head, r.current_version),
            changed_by=by[0] if by else None, diff=diff if r.reason != RESERVED else "",
            current_content=current.decode(ENCODING, ERRORS) if current is not None else None,
            has_reservation=_holds(r, agent_id), stale_files=stale, reason=r.reason, message=r.message)

    def _release(self, agent_id: str, path: str) -> bool:
        with self._agent(agent_id) as ws:
            p = _file(ws, path, for_write=True)
            r = ws.reservation(p)
            if r is None or r.holder != agent_id:
                return False
            return ws.release(p, agent=agent_id) is not None

    def _run(self, agent_id: str, command: str, timeout: float | None, *, split: bool = False) -> CommandResult:
        if not isinstance(command, str) or not command.strip():
            raise ValueError("no command given")
        with self._agent(agent_id) as ws:
            fd, out = tempfile.mkstemp(prefix="storm-command-", suffix=".out")  # outside the working tree
            os.close(fd)
            fd, err = tempfile.mkstemp(prefix="storm-command-", suffix=".err")
            os.close(fd)
            try:
                # the command's output goes to the files, not to this process's stdout
                redirect = 'exec >"$1" 2>"$2" </dev/null' if split else 'exec >"$1" 2>&1 </dev/null'
                argv = ["sh", "-c", redirect + '; exec sh -c "$3"', "sh", out, err, command]
                res = ws.exec(argv, agent=agent_id, intent=f"{agent_id} terminal: {command[:100]}",
                              timeout=timeout)
                output = (read_own(out) or b"").decode(ENCODING, "replace")
                errors = (read_own(err) or b"").decode(ENCODING, "replace")
            finally:
                os.unlink(out)
                os.unlink(err)
            output, errors = _clip(output), _clip(errors)
            store = ws.store
            result = CommandResult(output, res.returncode, res.timed_out, {}, stderr=errors,
                                   affected=sorted(_relative(store, q) for q in res.paths))
            w = res.write
            if w is None:
                return result
            if not w.accepted:
                result.rejected = self._rejected(store, agent_id, w, {}, None, {}, None)
                return result
            result.commit = w.commit
            result.versions = {_relative(store, p): versions.number(store, p, w.commit or w.head, b)
                               for p, b in w.versions.items()}
            return result


# -- helpers -------------------------------------------------------------------------------
def _version(store: Store, path: str, n: Any, shown: str) -> versions.Version | None:
    """The state version ``n`` of ``path`` names; None: a number handed out once but
    older than the versions kept (a stale read); a number never handed out is refused."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"version of {shown} must be an integer >= 0, not {n!r}")
    v = versions.lookup(store, path, n)
    if v is None:
        if n <= versions.highest(store, path):
            return None
        raise ValueError(f"{shown} has no version {n}: read it again (read_file) for its current version")
    return v


def _stale_read(ws: SharedWorkspace, agent: str, target: str, old: list[tuple[str, int]], shown: dict[str, str],
                base_content: str | None) -> WriteResponse:
    """A write made on versions older than those kept: rejected as a stale read, each
    such file named with its current version and author, the target's content attached."""
    store = ws.store
    head = ws.head()
    stale = []
    for q, n in old:
        blob = _blob_at(store, head, q)
        stale.append(StaleFile(shown.get(q, q), n, versions.number(store, q, head, blob),
                               last_author(ws, q, head)))
    blob = _blob_at(store, head, target)
    content = store.blob_bytes(pygit2.Oid(hex=blob)) if blob else None
    current = versions.number(store, target, head, blob)
    diff = unified(target, base_content.encode(ENCODING, ERRORS), content) \
        if base_content is not None and content is not None else ""
    names = ", ".join(f"{shown.get(q, q)} (version {n})" for q, n in old)
    return WriteResponse(
        False, current_version=current, changed_by=last_author(ws, target, head), diff=diff,
        current_content=content.decode(ENCODING, ERRORS) if content is not None else None,
        stale_files=stale, reason=STALE_DEPENDENCY,
        message=f"{agent} made this write on {names}, older than the {versions.KEEP} versions kept of a file: "
                "read the file again (view) and redo the edit")


def _blob_at(store: Store, head: pygit2.Oid, path: str) -> str | None:
    try:
        e = store.entry(store.commit(head).tree, path)
    except BadPath:
        return None
    return hex_(e.oid) if e is not None else None


def _file_states(ws: SharedWorkspace) -> dict[str, FileState]:
    store = ws.store
    head = ws.head()
    out: dict[str, FileState] = {}
    tree = store.commit(head).tree
    base = store.prefix
    found: list[tuple[str, pygit2.Oid, versions.Version, str | None]] = []
    for p, oid in _files_under(tree, ""):
        if base and not p.startswith(base + "/"):
            continue
        v = versions.current_version(store, p, head, str(oid))
        commit = _commit_of(store, v.commit)
        found.append((p, oid, v, author_of(commit) if commit is not None and v.number > 1 else None))
    # a file unchanged since the table began: who made it, for all of them in one walk
    older = last_authors(ws, {p for p, _, _, by in found if by is None}, head)
    for p, oid, v, by in found:
        shown = _relative(store, p)
        out[shown] = FileState(shown, v.number, hashlib.md5(store.blob_bytes(oid)).hexdigest(),
                               by or older.get(p, ""))
    return out


def _files_under(tree: pygit2.Tree, base: str) -> Iterator[tuple[str, pygit2.Oid]]:
    for e in tree:
        part = e.name or ""
        if part.startswith("."):
            continue
        name = f"{base}/{part}" if base else part
        if isinstance(e, pygit2.Tree):
            yield from _files_under(e, name)
        elif e.filemode in (pygit2.GIT_FILEMODE_BLOB, pygit2.GIT_FILEMODE_BLOB_EXECUTABLE):
            yield name, e.id


def _commit_of(store: Store, hexid: str) -> pygit2.Commit | None:
    try:
        return store.commit(pygit2.Oid(hex=hexid)) if hexid else None
    except (KeyError, ValueError, pygit2.GitError):
        return None


def _clip(text: str) -> str:
    if len(text) > MAX_OUTPUT_CHARS:
        return "<output clipped: its last part follows>\n" + text[-MAX_OUTPUT_CHARS:]
    return text


def _blob(store: Store, hexid: str) -> bytes | None:
    try:
        return store.blob_bytes(pygit2.Oid(hex=hexid))
    except (KeyError, ValueError):
        return None


def _holds(r: Rejection, agent: str) -> bool:
    """Whether the rejection left ``agent`` holding the file (storm.reservationSeconds 0: never)."""
    return (r.reason != RESERVED and r.reservation is not None and r.reservation.holder == agent
            and r.reservation.remaining() > 0)


def _file(ws: SharedWorkspace, raw: str, *, for_write: bool = False) -> str:
    """The repository path of the file ``raw`` names; a directory is IsADirectoryError,
    as the harness's own file access would raise."""
    if _directory(ws, raw):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", raw)
    return ws.path(raw, for_write=for_write)


def _directory(ws: SharedWorkspace, raw: str) -> bool:
    """Whether ``raw`` names a directory of the shared head or on disk."""
    store = ws.store
    if not isinstance(raw, str):
        return False
    try:
        p = normalize(raw.rstrip("/") or raw, store.prefix, store.top)
    except BadPath:
        return False
    try:
        if isinstance(store.commit(ws.head()).tree[p], pygit2.Tree):
            return True
    except KeyError:
        pass
    full = os.path.join(store.main_workdir, p)
    return os.path.isdir(full) and not os.path.islink(full)


def _relative(store: Store, p: str) -> str:
    """A repository path as seen from the workspace directory (the store's prefix)."""
    return os.path.relpath(p, store.prefix) if store.prefix else p


def _walk(tree: pygit2.Tree, base: str, depth: int, out: list[str]) -> None:
    if depth < 1:
        return
    for e in sorted(tree, key=lambda e: str(e.name)):
        entry = str(e.name)
        if entry.startswith("."):
            continue
        name = f"{base}/{entry}" if base else entry
        if isinstance(e, pygit2.Tree):
            out.append(name + "/")
            _walk(e, name, depth - 1, out)
        else:
            out.append(name)
