"""A command's changes to the shared working tree, recorded as one write: ``begin_exec``
before it runs, ``finish_exec`` after (``exec`` is begin, run, finish).

``begin_exec`` takes one snapshot (bringing behind paths forward: they are not the
command's; what still differs is an edit already on disk, never to be credited to
the agent), then stamps a marker and waits for the file-system clock to tick (a few
ms). After the command, a path that differs from storm's disk record is the
command's change iff its ctime is later than the mark (a deletion: it was not
missing at the start and its directory was stamped after the mark). Edits from
before the command keep older stamps and stay unmediated. Where the clock cannot
be used (``.git`` on another file system, coarse timestamps, or
``storm.execClock=false``) the start's snapshot is compared by content instead.
The changes are one write validated against the versions at the start
(``expected``), so a path another agent wrote meanwhile is a direct conflict,
never overwritten. Both snapshots and the classification run under the
``worktree`` lock, the lock writers hold while they write the disk.

Between the two, the step is open (:mod:`storm_git.storm.steps`): a harness runs
them in two processes, and the shell-edit intake leaves alone what a running
command may still be writing.
"""
from __future__ import annotations

import os
import shlex
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import reservations
from ..core.agents import validate_agent
from ..core.errors import TooLarge, UnmediatedEdit, UsageError
from ..core.locks import flocked
from ..core.paths import quoted
from ..core.payloads import ExecResult
from ..core.store import Entry, Store, hex_
from ..disk import safe_fs
from . import attribution, steps
from .reverts import revert_targets
from .run import resolve, run
from .snapshot import (
    Snapshot,
    check_recordable,
    clock_mark,
    entry_at,
    read_disk_content,
    snapshot,
    version_at,
    with_mode,
)
from .validated_writer import OnWait, ValidatedWriter

EXEC_CLOCK = "storm.execClock"


def encode_state(v: Any) -> Any:
    """A DiskState as JSON: [blob hex, mode], None or False."""
    return [str(v[0]), v[1]] if isinstance(v, tuple) else v


def decode_state(v: Any) -> Any:
    return (pygit2.Oid(hex=v[0]), v[1]) if isinstance(v, list) else v


@dataclass
class ExecStart:
    """What storm knew when a command began; ``to_json``/``from_json`` carry it from a
    harness's pre hook to its post hook."""

    key: str  # the open step's key (steps module)
    start: str  # the disk record's tree when the command started
    mark: int | None  # the clock mark; None: compare with the snapshot ``before``
    before_head: str
    before_record: str
    edited: dict[str, Any]  # path -> DiskState: the edits on disk at the start (a person's)
    command: str = ""
    began: float = field(default_factory=time.time)
    cwd: str = ""  # the command's directory, as a repository path (what its relative names mean)

    def to_json(self) -> dict[str, Any]:
        return {"kind": steps.COMMAND, "key": self.key, "start": self.start, "mark": self.mark,
                "before_head": self.before_head, "before_record": self.before_record,
                "edited": {p: encode_state(v) for p, v in self.edited.items()}, "command": self.command,
                "time": self.began, "cwd": self.cwd}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ExecStart":
        raw = data.get("edited")
        edited: dict[str, Any] = raw if isinstance(raw, dict) else {}
        mark = data.get("mark")
        return cls(str(data["key"]), str(data["start"]), int(mark) if mark is not None else None,
                   str(data["before_head"]), str(data["before_record"]),
                   {p: decode_state(v) for p, v in edited.items()}, str(data.get("command") or ""),
                   float(data.get("time") or time.time()), str(data.get("cwd") or ""))


def begin_exec(ws: ValidatedWriter, agent: str, *, command: str = "", cwd: str = "",
               key: str | None = None) -> ExecStart:
    """Before a command runs in the shared working tree: its start, kept as an open step
    of ``agent`` under ``key`` (a fresh one by default). ``command``: its text, ``cwd``
    its directory as a repository path (storm_git.storm.attribution)."""
    store = ws.store
    dev = os.stat(store.main_workdir).st_dev
    ws.take_in_shell_edits(only_adopting=True)  # the shell's edits so far are not the command's
    with flocked(store.commondir, "worktree"):
        ws.head()  # not initialised: refuse before anything runs
        before = snapshot(store)
        use_clock = store.config_bool(EXEC_CLOCK, True)
        mark = clock_mark(store, dev) if use_clock else None
    started = ExecStart(key or uuid.uuid4().hex, str(before.record.id), mark, str(before.head),
                        str(before.record.id), dict(before.dirty), command, cwd=cwd)
    steps.save(store, agent, started.key, started.to_json())
    return started


def abandon_exec(ws: ValidatedWriter, agent: str, key: str) -> ExecStart | None:
    """Close the step without recording anything; its start, if it was open."""
    data = steps.take(ws.store, agent, key)
    return ExecStart.from_json(data) if data and data.get("kind") == steps.COMMAND else None


def open_exec(ws: ValidatedWriter, agent: str, key: str) -> ExecStart | None:
    """The start of the agent's command step ``key`` (closed now), None when none is open."""
    return abandon_exec(ws, agent, key)


@dataclass
class Classified:
    """What finish_exec found the command changed, before it is written."""

    changes: dict[str, Any]
    expected: dict[str, str | None]
    reverted: list[str]
    nested: list[str]
    left: list[str] = field(default_factory=list)  # leased by another agent's file tool meanwhile: its edit
    mixed: list[str] = field(default_factory=list)  # held someone's edit before, and the command changed it
    uncredited: list[str] = field(default_factory=list)  # changed meanwhile, not named by the command
    states: dict[str, Any] = field(default_factory=dict)  # path -> DiskState after the command


def finish_exec(ws: ValidatedWriter, agent: str, started: ExecStart, argv: list[str], *, returncode: int = 0,
                timed_out: bool = False, intent: str | None = None, wait: bool = True,
                on_wait: OnWait | None = None, refuse_mixed: bool = True,
                leave_leased: bool = False) -> ExecResult:
    """After the command: what it changed, recorded as one write by ``agent``.

    A command killed by a signal or a timeout records nothing (its changes may be
    half done; they stay on disk as unmediated edits). ``refuse_mixed``: a changed
    file that already held an edit made outside storm refuses the whole record
    (exec); otherwise it is left out and named (a harness's shell, which cannot be
    asked again). ``leave_leased`` (a harness's shell): a file another agent holds is
    that agent's (its own file tool's edit between its pre and post hooks) and is left
    to it; otherwise a reservation is validated as for any write ("reserved")."""
    agent = validate_agent(agent)
    store = ws.store
    steps.take(store, agent, started.key)
    with flocked(store.commondir, "worktree"):
        found = _classify(ws, agent, started, leave_leased=leave_leased)
        if timed_out or returncode < 0:
            return ExecResult(list(argv), returncode, timed_out, sorted(found.changes), None, found.nested)
        if found.mixed and refuse_mixed:
            _refuse_mixed(found.mixed, argv)
        for p in [*found.changes, *found.uncredited]:  # a name no door takes is refused, credited or not
            check_recordable(store, p, found.states.get(p), ws)
    changes, expected = found.changes, found.expected
    for p, change in changes.items():
        content = change[0] if isinstance(change, tuple) else None
        if content is not None and len(content) > ws.max_file_bytes:
            raise TooLarge(f"the command left {p} with {len(content)} bytes, over storm.maxFileBytes "
                           f"({ws.max_file_bytes}); nothing was recorded",
                           hint="raise git config storm.maxFileBytes, or remove the file")
    result = ExecResult(list(argv), returncode, False, sorted(changes), None, found.nested, found.reverted,
                        left=found.left, mixed=found.mixed, uncredited=found.uncredited)
    if not changes:
        return result
    command = started.command or shlex.join(argv)
    if len(command) > 120:
        command = command[:117] + "..."
    result.write = ws.apply(agent, changes, intent=intent or f"{agent} exec: {command}", deps=None, wait=wait,
                            op="exec", expected=expected, on_wait=on_wait)
    return result


def _classify(ws: ValidatedWriter, agent: str, started: ExecStart, *, leave_leased: bool = False) -> Classified:
    """The command's changes since ``started`` (caller holds the worktree lock)."""
    store = ws.store
    after = snapshot(store)
    start = store.repo[pygit2.Oid(hex=started.start)].peel(pygit2.Tree)
    if started.mark is not None:
        missing_before = {p for p, v in started.edited.items() if v is None}
        changes, expected = classify_since(store, start, started.mark, missing_before, after)
    else:
        before = Snapshot(pygit2.Oid(hex=started.before_head), after.tree,
                          store.repo[pygit2.Oid(hex=started.before_record)].peel(pygit2.Tree), dict(started.edited))
        changes, expected = classify(store, before, after)
    found = Classified(changes, expected, [], after.nested, states=after.dirty)
    now = reservations.clock()
    for p in list(changes):
        r = reservations.get(store, p, now) if leave_leased else None
        if r is not None and r.holder != agent:
            found.left.append(p)
            del changes[p], expected[p]
    for p in [p for p in changes if p in started.edited]:
        if after.dirty.get(p) != started.edited[p]:
            found.mixed.append(p)  # the command changed it too: its change cannot be told from that edit
        del changes[p]  # touched, not changed (sed -i without a match): not the command's
        expected.pop(p, None)
    found.mixed.sort()
    if started.command and attribution.mode(store) == attribution.NAMED:
        credited = attribution.named(started.command, list(changes), started.cwd)
        # a file that did not exist when the command started is the command's (a person's
        # save changes a file it has open; generators and builds make new ones)
        credited |= {p for p in changes if entry_at(store, start, p) is None and p not in started.edited}
        for p in sorted(p for p in changes if p not in credited):
            found.uncredited.append(p)  # maybe a person's save while the command ran: never the agent's
            del changes[p]
            expected.pop(p, None)
    found.reverted = revert_targets(store, after.head, start, after, expected, agent)
    return found


def classify(store: Store, before: Snapshot, after: Snapshot) -> tuple[dict[str, Any], dict[str, str | None]]:
    """Without a clock: the command's changes are the paths that differ from the
    disk record after it and whose state is not what it was before it."""
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with safe_fs.DirFds(store.main_workdir) as dirs:  # read only: each directory opened once
        for path in sorted(after.dirty):
            a = after.dirty[path]
            b = before.dirty[path] if path in before.dirty else _state_of(entry_at(store, before.record, path))
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
    content = read_disk_content(store, path, dirs) if a is not None else None
    changes[path] = with_mode(content, a, entry_at(store, start, path)) if a is not None else None
    expected[path] = hex_(version_at(store, start, path))


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


def _refuse_mixed(mixed: list[str], argv: list[str]) -> None:
    """Refuse to credit an agent with a file that already held someone's edit (an
    unmediated edit, listed by ``status``) when its command ran: the recorded file
    would carry that edit as the agent's. Nothing is recorded; the files stay as the
    command left them."""
    named = ", ".join(quoted(p) for p in mixed[:5]) + (f" and {len(mixed) - 5} more" if len(mixed) > 5 else "")
    raise UnmediatedEdit(
        f"exec: {named} held an edit made outside storm before {shlex.join(argv)[:60]} ran, and the command "
        "changed it too: its change cannot be told apart from that edit, so nothing was recorded "
        "(every file stays as the command left it)",
        hint="record the earlier edit as its author's first (git storm adopt PATH --agent NAME) or drop it "
             "(git storm checkout PATH), then run the command again")


def exec_(ws: ValidatedWriter, argv: list[str], *, agent: str | None, intent: str | None = None,
          timeout: float | None = None, wait: bool = True, on_wait: OnWait | None = None) -> ExecResult:
    """Run ``argv`` in the shared working tree and record what it changed as one write:
    begin, run, finish."""
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
    resolve(argv[0], cwd)
    started = begin_exec(ws, agent, command=shlex.join(argv), cwd=store.prefix.rstrip("/") if store.prefix else "")
    try:
        rc, timed_out = run(argv, cwd, timeout)
    except BaseException:
        abandon_exec(ws, agent, started.key)
        raise
    return finish_exec(ws, agent, started, argv, returncode=rc, timed_out=timed_out, intent=intent, wait=wait,
                       on_wait=on_wait)
