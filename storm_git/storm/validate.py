"""The one validation rule of storm mode, and what a refused write leaves behind.

A write by agent ``a`` of targets ``T`` is valid at head ``H`` iff every target
still has the version ``a`` read (or, for an edit made on disk or by a command,
the version that edit started from: ``expected``) and every other file of the
validation scope still has the version ``a`` read. Versions are blob ids.

Every door that accepts a write asks here: the CLI, the MCP server and the API
through ``storm.write``, the harness pre-hook before it leases, and the server
guard (``moved``, the same rule over a commit's recorded provenance).

* ``check`` (workspace lock held): reservations in the way, then the verdict;
* ``refuse`` (workspace lock held): log the rejection, grant the re-plan reservation;
* ``reject`` (after the lock): the payload, and what it showed in full counts as read.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import events, readsets, reservations
from ..core.errors import BadPath
from ..core.payloads import DIRECT_CONFLICT, RESERVED, STALE_DEPENDENCY, UNREAD_TARGET, Rejection
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..core.store import Entry, Store, hex_
from ..core.tree_diff import changed_paths
from . import rejection as payloads
from .verdict import Verdict
from .writer import AS_WRITTEN, WriteHost

# Rejections the agent must re-plan around: these reserve the target, and so does
# an unread_target rejection that also lists stale dependencies (the agent built on
# files that changed). A plain unread_target only hands over the content; reserving
# then would make an agent that did read the file wait for one that merely had not.
RESERVING_REASONS = (DIRECT_CONFLICT, STALE_DEPENDENCY)


@dataclass
class Check:
    """``check``'s answer: a reservation in the way (``blocked``), or the verdict;
    ``held``: targets the agent itself holds a reservation on."""

    blocked: Reservation | None = None
    held: list[str] = field(default_factory=list)
    verdict: Verdict | None = None


def moved(pairs: Iterable[tuple[str, str | None]], version_at: Callable[[str], str | None]) -> list[str]:
    """The paths of ``(path, version read)`` pairs whose version is no longer the one
    read: the rule itself, over any way of looking a path up (a tree here, a bare
    repository's commit in the server guard)."""
    return [p for p, blob in pairs if version_at(p) != blob]


def entry_or_none(store: Store, tree: pygit2.Tree, path: str) -> Entry | None:
    """The entry at ``path``, None when absent or not a file (a path under a file)."""
    try:
        return store.entry(tree, path)
    except BadPath:
        return None


def target_entry(store: Store, tree: pygit2.Tree, path: str, changes: dict[str, Any]) -> Entry | None:
    """The target's current entry; a path under a file is refused unless the same
    write deletes that file (a command that turned a file into a directory)."""
    try:
        return store.entry(tree, path)
    except BadPath:
        parts = path.split("/")
        if any(changes.get("/".join(parts[:i]), b"") is None for i in range(1, len(parts))):
            return None
        # a directory replaced by a file: only if the same write deletes all of it
        obj = tree[path] if path in tree else None
        if isinstance(obj, pygit2.Tree) and all(changes.get(f"{path}/{f}", b"") is None for f in _files(obj)):
            return None
        raise


def verdict(store: Store, tree: pygit2.Tree, paths: list[str], reads: dict[str, ReadEntry],
            scope: dict[str, ReadEntry], expected: dict[str, str | None] | None,
            changes: dict[str, Any] | None = None) -> Verdict:
    """The rule at ``tree``: targets against what was read (or ``expected``), then the
    rest of ``scope``."""
    current = {p: target_entry(store, tree, p, changes or {}) for p in paths}
    conflicts, unread = [], []
    for p in paths:
        cur = hex_(current[p].oid) if current[p] else None
        exp = expected.get(p, AS_WRITTEN) if expected is not None else AS_WRITTEN
        if exp != AS_WRITTEN:
            if exp != cur:
                conflicts.append(p)
        elif p in reads:
            if reads[p].blob != cur:
                conflicts.append(p)
        elif current[p] is not None or (expected is not None and p in expected):
            unread.append(p)  # the last: a revert re-creating a file deleted since
    stale = moved(((g, e.blob) for g, e in scope.items() if g not in current),
                  lambda g: hex_(getattr(entry_or_none(store, tree, g), "oid", None)))
    reason = (DIRECT_CONFLICT if conflicts else UNREAD_TARGET if unread
              else STALE_DEPENDENCY if stale else None)
    return Verdict(reason, current, conflicts + unread, stale)


# A verdict computed before the lock: (h0, verdict at h0 or None when the whole scope
# was valid at h0, the paths re-read since).
Pre = tuple[pygit2.Oid, Verdict | None, list[str]]


def advance(store: Store, h1: pygit2.Oid, h0: pygit2.Oid, reread: list[str], paths: list[str],
            reads: dict[str, ReadEntry], scope: dict[str, ReadEntry], expected: dict[str, str | None] | None,
            changes: dict[str, Any]) -> Pre:
    """Before the lock: the whole scope was valid at ``h0``; check the paths that moved
    since against ``h1``, so that under the lock only the writes made meanwhile are
    diffed (with 8 writers the diff from ``h0`` grows to several directories, diffed
    while every other writer waits for the lock)."""
    if h1 == h0:
        return h0, None, reread
    tree = store.commit(h1).tree
    since = changed_paths(store, store.commit(h0).tree, tree)
    narrow = {p: scope[p] for p in (*since, *reread) if p in scope}
    try:
        valid = verdict(store, tree, paths, reads, narrow, expected, changes).reason is None
    except BadPath:
        valid = False
    # not valid: the lock's full check writes the rejection with every stale file
    return (h1, None, []) if valid else (h0, None, reread)


def verdict_at(store: Store, head: pygit2.Oid, tree: pygit2.Tree, pre: Pre | None, paths: list[str],
               reads: dict[str, ReadEntry], scope: dict[str, ReadEntry],
               expected: dict[str, str | None] | None, changes: dict[str, Any]) -> Verdict:
    """The verdict at ``head``, using ``pre``: a verdict computed before the lock stands
    when no path it depends on changed since; with None, the whole scope was valid at
    h0, so only the paths re-read since and those that moved since can be stale."""
    if pre is not None:
        h0, known, reread = pre
        if known is not None and h0 == head:
            return known
        since = changed_paths(store, store.commit(h0).tree, tree) if h0 != head else []
        if known is not None:
            if set(since).isdisjoint(paths) and set(since).isdisjoint(scope):
                return known
        else:
            narrow = {p: scope[p] for p in (*since, *reread) if p in scope}
            found = verdict(store, tree, paths, reads, narrow, expected, changes)
            if found.reason is None:
                return found
            # a rejection: its payload lists every stale file, so look at them all
    return verdict(store, tree, paths, reads, scope, expected, changes)


def check(store: Store, agent: str, paths: list[str], now: float, judge: Callable[[], Verdict],
          *, ignore: Callable[[Reservation], bool] | None = None) -> Check:
    """Under the workspace lock: another agent's reservation on a target stops the
    write (``ignore`` may pass over one, a harness lease whose edit never ran);
    otherwise ``judge`` gives the verdict at the locked head."""
    live = reservations.live_on(store, paths, now)  # one ref lookup for the batch
    held = []
    for p in paths:
        r = live.get(p)
        if r is None:
            continue
        if r.holder == agent:
            held.append(p)
        elif ignore is None or not ignore(r):
            return Check(blocked=r, held=held)
    return Check(held=held, verdict=judge())


def refuse(store: Store, agent: str, op: str, paths: list[str], found: Verdict, head: pygit2.Oid,
           now: float, secs: float) -> Reservation | None:
    """Under the workspace lock: log the rejection and, for a conflict to re-plan around
    (RESERVING_REASONS, or stale files), grant the rejected agent its reservation."""
    target = found.conflicts[0] if found.conflicts else paths[0]
    replan = found.reason in RESERVING_REASONS or bool(found.stale)
    granted = Reservation(target, agent, now + secs, now) if replan else None
    if granted is not None and secs > 0:
        reservations.update(store, {target: granted}, agent=agent,
                            message=f"storm: {agent} reserves {target} after a rejection")
    events.append(store, "rejection", agent, f"{agent} {op} {target}: {found.reason}",
                  {"reason": found.reason, "path": target, "paths": paths, "op": op,
                   "stale": found.stale, "head": str(head)})
    return granted


def refuse_reserved(store: Store, agent: str, op: str, paths: list[str], blocked: Reservation,
                    head: pygit2.Oid, tree: pygit2.Tree) -> Verdict:
    """Under the workspace lock: the write gave up waiting for ``blocked``; logged."""
    events.append(store, "rejection", agent, f"{agent} {op} {blocked.path}: reserved",
                  {"reason": RESERVED, "path": blocked.path, "paths": paths, "op": op,
                   "holder": blocked.holder, "head": str(head)})
    return Verdict(RESERVED, {p: store.entry(tree, p) for p in paths}, [], [])


def reject(ws: WriteHost, agent: str, op: str, found: Verdict, head: pygit2.Oid,
           seen: dict[str, ReadEntry], reservation: Reservation | None, change: Any = None) -> Rejection:
    """After the lock: the rejection the agent is given (current content, diff from what
    it read, the authors, the stale files, the annotated lines, a rebased offer for a
    conflict on text ``change``), and what it showed in full counts as read (the
    target's current content; stale files are shown as diffs and stay stale)."""
    from ..core import intents  # only a rejection pays for it

    store = ws.store
    rejection = payloads.build(ws, agent, found, head, seen, reservation, op=op)
    rejection.intents_in_diff = intents.in_rejection(store, rejection)
    if found.reason == DIRECT_CONFLICT:
        rejection.rebased = ws.offer_rebased(agent, rejection, seen.get(rejection.path), change)
    if found.reason != RESERVED:
        e = entry_or_none(store, store.commit(head).tree, rejection.path)
        readsets.record(store, agent, [ReadEntry(rejection.path, hex_(e.oid) if e else None, str(head))],
                        why="was shown")
    return rejection


def _files(tree: pygit2.Tree, prefix: str = "") -> Iterable[str]:
    for e in tree:
        if isinstance(e, pygit2.Tree):
            yield from _files(e, f"{prefix}{e.name}/")
        else:
            yield prefix + e.name
