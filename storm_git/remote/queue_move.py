"""Moving queued writes onto a newer shared head: the one rule a clone and the server apply.

A clone queues writes validated at its copy of the server's head; by the time they
reach the server the head may have moved. Both sides then apply the same rule
(a clone when a fetch shows a newer head, ``queue.rebase_queue``; the server
when it orders the writes pushed to a clone's inbox, :mod:`.server_order`):

* a write already on the new head (its identity, :func:`identity`, is there) is
  *landed*: it is never applied twice;
* a write a target of which another agent's live reservation holds is *dropped*:
  the reservation may have been taken after the write was validated (a rejected
  agent holds the file for its retry), and its validation would refuse it now;
* a write validated at the head it now goes on lands as it is;
* a write whose scope (its ``Storm-Dep`` paths, or its whole read set) and targets
  have the same versions in the head it was validated at (its parent) and in the
  head it would now go on is *moved*: rebuilt there (its own changes on the new
  tree, ``Storm-Validated-At`` the new parent, ``Storm-Moved-From`` the commit it
  was first queued as), so it has exactly the versions it was validated against;
* any other write is *dropped*, with the paths that moved under it; its writer
  validates it again (a real conflict becomes the usual rejection).

The comparison is per write, between its own parent and its new parent, so a
write queued behind one that landed or was dropped is judged on what that one
left: a dropped write's versions are not on the new head, a landed one's are.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pygit2

from ..core import trailers
from ..core.errors import StormError
from ..core.objects import odb_retry, tree_with
from ..core.reservations import held_by_others
from ..core.tree_diff import changed_paths

MOVED_FROM = "Storm-Moved-From"
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

# (a queued write, its provenance) -> the paths of the whole read set it was validated
# against (asked only for a write that names no Storm-Dep): a clone resolves them from
# its journal and notes, the server from the notes ref pushed with the write.
ScopeOf = Callable[[pygit2.Commit, trailers.Provenance], frozenset[str]]


class _Objects:
    """What storm_git.core.tree_diff.changed_paths needs of a Store: ``.repo``."""

    def __init__(self, repo: pygit2.Repository) -> None:
        self.repo = repo


def identity(c: pygit2.Commit) -> pygit2.Oid:
    """The commit a write was first queued as: its ``Storm-Moved-From`` (read from its
    trailer block only, as every trailer: an intent's line is never one), or itself."""
    named = trailers.parse(c.message).get(MOVED_FROM, [])
    return pygit2.Oid(hex=named[0]) if len(named) == 1 and _HEX.fullmatch(named[0]) else c.id


def landed_since(repo: pygit2.Repository, head: pygit2.Oid,
                 old: pygit2.Oid | None) -> dict[pygit2.Oid, list[pygit2.Oid]]:
    """The writes on ``head`` above ``old``: identity -> the commits that name it (one,
    but for a commit whose trailers claim another's identity: :func:`same_write` decides)."""
    walker = repo.walk(head, pygit2.enums.SortMode.NONE)
    if old is not None:
        walker.hide(old)
    out: dict[pygit2.Oid, list[pygit2.Oid]] = {}
    for c in walker:
        out.setdefault(identity(c), []).append(c.id)
    return out


def same_write(repo: pygit2.Repository, queued: pygit2.Commit, landed: pygit2.Commit) -> bool:
    """Whether ``landed`` is ``queued`` as it was applied (itself, or rebuilt on a newer
    head): the same author and committer, the same message but for the two trailers a
    move rewrites, and the same content at every path it names. A write that names
    another's identity in its ``Storm-Moved-From`` (a push made by hand) is not taken
    for that one: it is answered for what it is."""
    if queued.id == landed.id:
        return True
    if _signed(queued.author) != _signed(landed.author) or _signed(queued.committer) != _signed(landed.committer):
        return False
    if _unmoved(queued.message) != _unmoved(landed.message):
        return False
    return all(_entry(queued.tree, p) == _entry(landed.tree, p)
               for p in trailers.parse(queued.message).get("Storm-Path", []))


def _signed(sig: pygit2.Signature) -> tuple[bytes, bytes, int, int]:
    return sig.raw_name, sig.raw_email, sig.time, sig.offset


def _unmoved(message: str) -> tuple[str, list[str]]:
    """The message without what a move rewrites (in storm's trailer block only)."""
    head, block = trailers.split(message)
    return head, [ln for ln in block if ln.partition(": ")[0] not in ("Storm-Validated-At", MOVED_FROM)]


def _entry(tree: pygit2.Tree, path: str) -> tuple[pygit2.Oid, int] | None:
    try:
        e = tree[path]
    except (KeyError, ValueError):
        return None
    return None if e.filemode == pygit2.GIT_FILEMODE_TREE else (e.id, e.filemode)


@dataclass
class Move:
    """What became of each queued write (in queue order) and the new tip."""

    tip: pygit2.Oid
    landed: list[tuple[pygit2.Oid, pygit2.Oid]] = field(default_factory=list)  # queued -> on the head as
    placed: list[tuple[pygit2.Oid, pygit2.Oid]] = field(default_factory=list)  # queued -> on the new tip as
    dropped: list[tuple[pygit2.Oid, list[str]]] = field(default_factory=list)  # queued, the paths that moved

    @property
    def moved(self) -> list[tuple[pygit2.Oid, pygit2.Oid]]:
        """The placed writes that had to be rebuilt (the others went on as they were)."""
        return [(q, n) for q, n in self.placed if q != n]


def move(repo: pygit2.Repository, writes: list[pygit2.Commit], onto: pygit2.Oid, scope_of: ScopeOf,
         landed: dict[pygit2.Oid, list[pygit2.Oid]] | None = None, drop_agents: frozenset[str] = frozenset(),
         reserved_ahead: float | None = None) -> Move:
    """Apply the rule (module docstring) to ``writes`` (oldest first) onto ``onto``.
    ``landed``: identity -> commits of the writes already on ``onto`` (``landed_since``);
    ``drop_agents``: agents whose writes are dropped whatever their scope;
    ``reserved_ahead`` (storm_git.core.reservations.max_ahead): the reservations in
    ``repo`` count (None: they are not looked at)."""
    landed = landed or {}
    objects = _Objects(repo)
    out = Move(onto)
    for c in writes:
        ident = identity(c)
        there = next((n for n in landed.get(ident, ()) if same_write(repo, c, repo[n].peel(pygit2.Commit))), None)
        if there is not None:
            out.landed.append((c.id, there))
            continue
        found = trailers.parse(c.message)
        targets = set(found.get("Storm-Path", []))
        agent = (found.get("Storm-Agent") or [""])[0]
        try:
            prov = trailers.provenance(found)
            scope = None if prov is None else (set(prov.deps) if prov.deps is not None else set(scope_of(c, prov)))
        except (StormError, ValueError, KeyError):
            prov = scope = None
        if prov is None or scope is None or len(c.parent_ids) != 1 or not agent or agent in drop_agents:
            out.dropped.append((c.id, []))  # not for a path that moved: nothing to name
            continue
        held = held_by_others(repo, sorted(targets), agent, reserved_ahead) if reserved_ahead is not None else []
        if held:
            out.dropped.append((c.id, held))
            continue
        parent = c.parent_ids[0]
        if parent == out.tip:  # validated at the head it goes on: it lands as it is
            out.placed.append((c.id, c.id))
            out.tip = c.id
            continue
        moved = set(changed_paths(objects, repo[parent].peel(pygit2.Commit).tree,  # type: ignore[arg-type]
                                  repo[out.tip].peel(pygit2.Commit).tree)) & (scope | targets)
        if moved:
            out.dropped.append((c.id, sorted(moved)))
            continue
        out.tip = _rebuild(repo, c, out.tip, targets, ident)
        out.placed.append((c.id, out.tip))
    return out


def _rebuild(repo: pygit2.Repository, c: pygit2.Commit, parent: pygit2.Oid, targets: set[str],
             ident: pygit2.Oid) -> pygit2.Oid:
    """``c``'s own changes on ``parent``: the same author, committer and message but
    for its ``Storm-Validated-At`` (the new parent) and its ``Storm-Moved-From``."""
    placed = {}
    for p in targets:
        try:
            e = c.tree[p]
            placed[p] = None if e.filemode == pygit2.GIT_FILEMODE_TREE else (e.id, e.filemode)
        except (KeyError, ValueError):
            placed[p] = None
    tree = tree_with(repo, repo[parent].peel(pygit2.Commit).tree, placed)
    message = trailers.rewrite(c.message, {"Storm-Validated-At": str(parent)}, {MOVED_FROM: str(ident)})
    return odb_retry(repo.create_commit, None, c.author, c.committer, message, tree, [parent])
