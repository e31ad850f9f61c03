"""A file tool's edit in the shared working tree, in two steps a harness performs
around its own tool: ``begin_edit`` (validate and lease) and ``finish_edit``
(record what the tool left on disk). Plus ``note_disk_read``: what an agent saw
when its own tool read a file on disk.

* ``begin_edit``: the agent's read set is validated for the paths exactly as a
  write is, and a short *lease* (a reservation, ``storm.leaseSeconds``, default
  10 s) is taken on them, so no other agent's write lands between the check and
  the tool's own write; or the call is refused with the rejection (diff, current
  content), and, as with every storm rejection, what it showed now counts as
  read. A lease whose edit never ran (no end comes) is taken over by another
  agent after LEASE_GRACE (:func:`never_ran`).
* ``finish_edit``: the file now on disk is recorded as the agent's write,
  validated against the version checked before (``expected``) and the agent's
  whole read set again (a file read may have changed while the tool ran), which
  also ends the lease.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pygit2

from ..core import readsets, reservations
from ..core.convert import Conversions
from ..core.locks import flocked
from ..core.payloads import DIRECT_CONFLICT, Rejection, WriteResult
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..core.store import Store, hex_
from ..disk import record, safe_fs, sync as disk_sync
from . import rejection as rejection_payload, steps, validate
from .commands import encode_state
from .snapshot import check_recordable, read_disk_content, with_mode

if TYPE_CHECKING:  # pragma: no cover
    from .workspace import SharedWorkspace

DEFAULT_LEASE_SECONDS = 10.0
LEASE_GRACE = 1.0  # after this, a lease whose edit left the disk untouched is taken to have never run
DEFAULT_WAIT_SECONDS = 20.0  # a hook's whole run must stay well under the harness's timeout (60 s)
OP = "harness"


@dataclass
class EditStart:
    """``begin_edit``'s answer: leased (``rejection`` None), or refused with the rejection."""

    paths: list[str]
    rejection: Rejection | None = None


@dataclass
class DiskRead:
    """What ``note_disk_read`` recorded and what the agent should be told."""

    paths: list[str]
    news: list[str] = field(default_factory=list)  # what changed since the agent's previous read
    behind: list[str] = field(default_factory=list)  # the agent saw an older shared version
    edited: list[str] = field(default_factory=list)  # the disk held an edit made outside storm


def lease_seconds(store: Store) -> float:
    return store.config_float("storm.leaseSeconds", DEFAULT_LEASE_SECONDS)


# -- reads of the disk ---------------------------------------------------------------
def note_disk_read(ws: "SharedWorkspace", agent: str, paths: list[str]) -> DiskRead:
    """Record what the agent saw on disk.

    * the disk holds the shared head's version: a read at the head;
    * the disk holds the version storm last put there but the head moved on
      (*behind*): the agent saw that older shared version, which is recorded (its
      next write of the file is a direct conflict with the diff), and the disk is
      brought forward so that reading again shows the head;
    * the disk holds an edit made outside storm: the version that edit was made on
      is recorded, as ``adopt`` does; the agent built on the edit, so its write
      carries the edit along and is validated against that base (never undoing a
      newer accepted write).
    """
    store = ws.store
    ws.take_in_shell_edits(paths, only_adopting=True)  # what the shell changed is a write, then read
    top = store.main_workdir
    entries: list[ReadEntry] = []
    before = readsets.load(store, agent)
    out = DiskRead(list(paths))
    unmediated: list[str] = []
    with flocked(store.commondir, "worktree"):
        rtree, _ = disk_sync.record_tree(store)
        head = ws.head()
        tree = store.commit(head).tree
        conv = Conversions(store)
        for p in paths:
            have = safe_fs.disk_state(top, p, conv=conv)
            if have is False:
                continue  # a directory (or a path through a link): nothing storm versions
            cur = record.entry_or_none(store, tree, p)
            base = record.entry_or_none(store, rtree, p)
            if safe_fs.same(have, cur):
                entries.append(ReadEntry(p, hex_(cur.oid) if cur else None, str(head)))
                seen = before.get(p)
                if seen is not None and seen.blob != (hex_(cur.oid) if cur else None):
                    out.news.append(_news(ws, p, seen, cur, head))
            else:
                entries.append(ReadEntry(p, hex_(base.oid) if base else None, ""))
                (out.behind if safe_fs.same(have, base) else unmediated).append(p)
        if out.behind:
            disk_sync.sync_locked(store, out.behind)
    if entries:
        readsets.record(store, agent, entries, why="harness read")
    out.edited = [p for p in unmediated if p not in out.behind]
    return out


NEWS_MAX_CHARS = 6000


def _news(ws: "SharedWorkspace", path: str, seen: ReadEntry, cur: Any, head: Any) -> str:
    """What changed in ``path`` since the agent's previous read, and who changed it: the
    diff and the authors a rejection would have shown. The harness may have refused the
    agent's stale edit itself (Claude Code's "modified since read" check runs before any
    hook), so a re-read is where the agent learns what happened."""
    change = rejection_payload.file_change(ws, path, seen, cur, head)
    by = ", ".join(change.changed_by) or "another agent"
    versions = f"{change.versions_behind} version(s)" if change.versions_behind else "changed"
    diff = "(binary file)" if change.binary else change.diff
    if len(diff) > NEWS_MAX_CHARS:
        diff = diff[:NEWS_MAX_CHARS] + "\n… (diff cut; git storm log shows each write)"
    return (f"storm: {path} changed since your previous read ({versions}, by {by}); what they changed:\n"
            f"{diff}".rstrip())


def note_patch_context(ws: "SharedWorkspace", agent: str, paths: list[str]) -> None:
    """A patch's own context lines are its author's read of each target it has not read
    otherwise (an agent that reads through its shell, which storm cannot see)."""
    store = ws.store
    known = readsets.load(store, agent)
    head = ws.head()
    tree = store.commit(head).tree
    implicit = [ReadEntry(p, hex_(getattr(record.entry_or_none(store, tree, p), "oid", None)), str(head))
                for p in paths if p not in known]
    if implicit:
        readsets.record(store, agent, implicit, why="harness patch context")


# -- the edit ------------------------------------------------------------------------
def begin_edit(ws: "SharedWorkspace", agent: str, paths: list[str], *, key: str,
               change: Callable[[bytes | None], bytes | None] | None = None) -> EditStart:
    """Validate the agent's read set for ``paths`` and lease them, or refuse with the
    rejection. ``change``: what the tool would make of the version the agent read
    (for the rejection's rebased offer), when the door can tell."""
    store = ws.store
    ws.catch_up(agent)  # on a remote: validate and lease against the server's head
    ws.take_in_shell_edits(paths, only_adopting=True)  # a shell edit the agent did not read: a conflict
    reads = readsets.load(store, agent)
    lease = lease_seconds(store)
    hold = ws.reservation_seconds
    deadline = time.monotonic() + store.config_float("storm.harnessWaitSeconds", DEFAULT_WAIT_SECONDS)
    granted: Reservation | None = None
    while True:
        with flocked(store.commondir, "workspace"):
            head = ws.head()
            tree = store.commit(head).tree
            now = reservations.clock()
            chk = validate.check(store, agent, paths, now, _judge(store, tree, paths, reads),
                                 ignore=_ignore(store, now))
            verdict = chk.verdict
            if chk.blocked is None:
                assert verdict is not None  # validate.check judged: nothing blocked it
            if chk.blocked is None and verdict is not None and verdict.reason is None:
                reservations.update(store, {p: Reservation(p, agent, now + lease, now) for p in paths},
                                    agent=agent, message=f"storm: {agent} leases {', '.join(paths[:3])}")
                expected = {p: hex_(e.oid) if (e := verdict.current[p]) is not None else None for p in paths}
                steps.save(store, agent, key,
                           {"kind": steps.EDIT, "paths": paths, "expected": expected, "head": str(head),
                            "time": time.time(), "since": now,
                            "disk": {p: encode_state(safe_fs.disk_state(store.main_workdir, p)) for p in paths}})
                break
            if chk.blocked is None and verdict is not None:
                granted = validate.refuse(store, agent, OP, paths, verdict, head, now, hold)
                break
            blocked = chk.blocked
            assert blocked is not None
            if time.monotonic() >= deadline:
                verdict = validate.refuse_reserved(store, agent, OP, paths, blocked, head, tree)
                granted = blocked
                break
        time.sleep(min(0.1, max(0.01, blocked.remaining())))
    ws.publish_reservations()  # the lease, or the rejected agent's reservation
    assert verdict is not None  # every way out of the loop has one
    if verdict.reason is None:
        return EditStart(paths)
    mine = None
    if verdict.reason == DIRECT_CONFLICT and len(paths) == 1 and change is not None:
        seen = reads.get(verdict.conflicts[0])
        base = ws.agent_content(seen.path, pygit2.Oid(hex=seen.blob), None) if seen and seen.blob else None
        mine = change(base)
    return EditStart(paths, validate.reject(ws, agent, OP, verdict, head, reads, granted, mine))


def _judge(store: Store, tree: pygit2.Tree, paths: list[str], reads: dict[str, ReadEntry]) -> Callable[[], Any]:
    """The verdict at ``tree`` for the agent's whole read set (validate.check calls it under the lock)."""
    return lambda: validate.verdict(store, tree, paths, reads, dict(reads), None, {})


def _ignore(store: Store, now: float) -> Callable[[Reservation], bool]:
    """A lease whose edit never ran does not block (validate.check's ``ignore``)."""
    return lambda r: never_ran(store, r, now)


def never_ran(store: Store, lease: Reservation, now: float) -> bool:
    """A lease whose edit never ran: its step's record is over LEASE_GRACE old and every
    file it leased is still as it was on disk then. The harness sends no post hook
    when that happens (Codex after a failed ``apply_patch``; Claude Code when it
    refuses an edit its pre hook allowed), and the lease would hold another
    session's edit for the whole lease. Taking it over is safe even if the edit does
    run later: its end validates against the version checked before, so it is
    refused (with the diff) rather than undo the newer write. A reservation from a
    rejection has no such record and is always kept."""
    if now - lease.since < LEASE_GRACE:
        return False
    for rec in steps.of_agent(store, lease.holder):
        if (rec.get("kind") != steps.EDIT or lease.path not in (rec.get("paths") or [])
                or rec.get("since") != lease.since or not isinstance(rec.get("disk"), dict)):
            continue
        return all(encode_state(safe_fs.disk_state(store.main_workdir, p)) == rec["disk"].get(p, 0)
                   for p in rec["paths"])
    return False


def release_leases(ws: "SharedWorkspace", agent: str, paths: list[str]) -> bool:
    """End the agent's own leases on ``paths`` (never another agent's), and share that;
    whether any ended."""
    store = ws.store
    with flocked(store.commondir, "workspace"):
        mine = [p for p in paths if (r := reservations.get(store, p)) is not None and r.holder == agent]
        if mine:
            reservations.update(store, {p: None for p in mine}, agent=agent,
                                message=f"storm: {agent} lease ends on {', '.join(mine[:3])}")
    if mine:
        ws.publish_reservations()
    return bool(mine)


def abandon_edit(ws: "SharedWorkspace", agent: str, paths: list[str], *, key: str) -> None:
    """The tool failed: its leases end and its step closes."""
    release_leases(ws, agent, paths)
    steps.take(ws.store, agent, key)


def finish_edit(ws: "SharedWorkspace", agent: str, paths: list[str], *, key: str,
                intent: str) -> WriteResult | None:
    """Record the files the tool left on disk as the agent's write (None: nothing
    changed), validated against the versions checked before it ran (without a begun
    step: the disk record's, as adopt) and against the agent's whole read set again:
    a file it read may have changed while the tool ran (its lease covers only the
    files it edits), and a write built on a stale read must not land. Every lease
    of the edit ends, whatever happens."""
    try:
        res = _finish_edit(ws, agent, paths, key=key, intent=intent)
    except BaseException:
        release_leases(ws, agent, paths)  # the refusal goes to the agent; the lease must not outlive it
        raise
    rejected_at = getattr(res.rejection, "path", None) if res is not None and not res.accepted else None
    release_leases(ws, agent, [p for p in paths if p != rejected_at])
    return res


def _finish_edit(ws: "SharedWorkspace", agent: str, paths: list[str], *, key: str, intent: str) -> WriteResult | None:
    store = ws.store
    pending = steps.take(store, agent, key) or {}
    found = pending.get("expected")
    expected_before: dict[str, Any] = found if isinstance(found, dict) else {}
    top = store.main_workdir
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with flocked(store.commondir, "worktree"):
        rtree, _ = disk_sync.record_tree(store)
        tree = store.commit(ws.head()).tree
        conv = Conversions(store)
        for p in paths:
            have = safe_fs.disk_state(top, p, conv=conv)
            if safe_fs.same(have, record.entry_or_none(store, tree, p)) or have is False:
                continue  # nothing new (or a directory: not a file storm records)
            check_recordable(store, p, have, ws)
            content = read_disk_content(store, p) if have is not None else None
            if content is not None:
                ws.check_size(p, content)
            changes[p] = with_mode(content, have, record.entry_or_none(store, rtree, p))
            expected[p] = (expected_before[p] if p in expected_before
                           else hex_(getattr(record.entry_or_none(store, rtree, p), "oid", None)))
    if not changes:
        return None
    # deps=None: the whole read set, as begin_edit validated it (expected covers the targets)
    return ws.apply(agent, changes, intent=intent, deps=None, wait=True, op=OP, expected=expected)

