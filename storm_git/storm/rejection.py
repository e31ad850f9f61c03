"""What a refused writer is given: the current content, the diff from what it read,
who changed the file since, and the stale files, each as a diff."""
from __future__ import annotations

import pygit2

from ..core import trailers
from ..core.convert import Conversions
from ..core.diffs import is_binary, unified
from ..core.errors import BadPath
from ..core.payloads import DIRECT_CONFLICT, RESERVED, STALE_DEPENDENCY, UNREAD_TARGET, FileChange, Rejection
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..core.store import Entry, hex_
from .verdict import Verdict
from .writer import UNDO_OP, WriteHost

HISTORY_LIMIT = 256  # commits walked back to find who changed a file since it was read


def _entry(ws: WriteHost, tree: pygit2.Tree, path: str) -> Entry | None:
    try:
        return ws.store.entry(tree, path)
    except BadPath:
        return None


def file_history(ws: WriteHost, path: str, head: pygit2.Oid, since: str | None,
                 base: str | None = None) -> tuple[list[str], int | None]:
    """Agents that changed ``path`` between ``since`` and ``head`` (newest first), and
    how many times. Without ``since`` (an edit on disk has no head, only the version
    ``base`` it was made on) the walk stops where the path was ``base``."""
    c = ws.store.commit(head)
    by: list[str] = []
    behind = 0
    for _ in range(HISTORY_LIMIT):
        if since and str(c.id) == since:
            return list(dict.fromkeys(by)), behind
        if not since and hex_(getattr(_entry(ws, c.tree, path), "oid", None)) == base:
            return list(dict.fromkeys(by)), behind
        if not c.parent_ids:
            break
        parent = ws.store.commit(c.parent_ids[0])
        if _entry(ws, c.tree, path) != _entry(ws, parent.tree, path):
            behind += 1
            by.append(trailers.parse(c.message).get("Storm-Agent", [c.author.name])[0])
        c = parent
    return list(dict.fromkeys(by)), behind


def file_change(ws: WriteHost, path: str, seen: ReadEntry | None, current: Entry | None,
                head: pygit2.Oid, new: bytes | None = None) -> FileChange:
    """How ``path`` changed since the agent read it (``seen``): the diff and the authors.
    ``new``: the current content as agents see it, when the caller has it already."""
    conv = Conversions(ws.store)
    old = ws.agent_content(path, pygit2.Oid(hex=seen.blob), None, conv) if seen and seen.blob else None
    if new is None and current is not None:
        new = ws.agent_content(path, current.oid, current.mode, conv)
    by, behind = file_history(ws, path, head, seen.head if seen else None, seen.blob if seen else None)
    if seen is None:  # never read: no base to diff from or count versions since
        return FileChange(path, None, hex_(current.oid) if current else None, by, None, "",
                          is_binary(new), never_read=True)
    return FileChange(path, seen.blob, hex_(current.oid) if current else None,
                      by, behind, unified(path, old, new), is_binary(old) or is_binary(new))


def build(ws: WriteHost, agent: str, verdict: Verdict, head: pygit2.Oid, reads: dict[str, ReadEntry],
          reservation: Reservation | None, *, op: str = "write") -> Rejection:
    """The rejection payload for ``verdict`` at ``head``."""
    tree = ws.store.commit(head).tree
    target = verdict.conflicts[0] if verdict.conflicts else next(iter(verdict.current))
    cur = verdict.current.get(target)
    content = ws.agent_content(target, cur.oid, cur.mode) if cur else None  # once: a smudge may be a process
    change = file_change(ws, target, reads.get(target), cur, head, content)
    stale = [file_change(ws, g, reads[g], _entry(ws, tree, g), head) for g in verdict.stale]
    reason = verdict.reason or RESERVED
    text = {
        DIRECT_CONFLICT: (f"{target} changed since {agent} read it" if target in reads and reads[target].head
                          else _changed_meanwhile(target, agent, op, change.changed_by)
                          if target in reads and not change.never_read else
                          f"{target} was changed by another agent meanwhile; {agent} never read it: "
                          "its current content is attached and now counts as read"),
        UNREAD_TARGET: f"{agent} never read {target}; its current content is attached and now counts as read",
        STALE_DEPENDENCY: f"{len(stale)} file(s) {agent} read changed since: {', '.join(s.path for s in stale)}",
        RESERVED: (f"{target} is reserved by {reservation.holder} for {reservation.remaining():.1f}s more"
                   if reservation else f"{target} is reserved"),
    }[reason]
    if reason != RESERVED and reservation is not None:
        text += f"; {agent} holds {target} for {reservation.remaining():.0f}s to retry"
    return Rejection(reason, agent, target, str(head), hex_(cur.oid) if cur else None,
                     content, change, stale, reservation, text)


def _changed_meanwhile(target: str, agent: str, op: str, by: list[str]) -> str:
    """A conflict with a write checked against the version its edit started from (not a
    read), said in the terms of what ``agent`` did: an undo, a command, an edit on disk."""
    who = ", ".join(by) or "another agent"
    if op == UNDO_OP:
        return (f"{target} was changed by {who} after {agent}'s last edit of it; undoing that edit would "
                f"discard their change; the diff is from the version {agent}'s edit left")
    if op == "exec":
        return (f"{target} was changed by {who} while {agent}'s command ran; the diff is from the version "
                "the command started from")
    return (f"{target} was changed by {who} while {agent}'s edit of it on disk was made; the diff is from "
            "the version that edit started from")
