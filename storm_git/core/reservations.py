"""Reservations: after a conflict, the rejected agent holds the file briefly.

So that two agents cannot keep invalidating each other, STORM gives a writer
rejected for a conflict it must re-plan around (``direct_conflict``,
``stale_dependency``; not ``unread_target``) a short exclusive claim on the target. They are kept in one commit chain
at ``refs/storm/reservations`` (a tree of small JSON blobs, one per reserved
path), moved by CAS under the workspace lock, so the check and the write are one
atomic step for storm's writers. Expired entries are pruned on the next change.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import pygit2

from .errors import CorruptState
from .objects import blob_at
from .readsets import path_key
from .store import MODE_BLOB, RESERVATIONS_REF, Store, ref_oid

CLOCK_ENV = "STORM_TEST_NOW"
# A reservation lasts storm.reservationSeconds (default 30). One that ends further
# ahead than this was made with a skewed clock (one was seen lasting 73 years):
# writers treat it as expired, doctor reports and removes it.
MAX_AHEAD_SECONDS = 3600.0
MAX_AHEAD_FACTOR = 10


def clock() -> float:
    """The clock reservations are measured with: ``time.time()``.

    For deterministic tests only, ``$STORM_TEST_NOW`` (seconds since the epoch)
    pins it, so a model-based test (and the CLI processes it starts) decides
    exactly when a reservation expires. Agents are not authenticated anyway
    (see docs/reliability.md), so this gives no one a power they lacked.
    """
    fake = os.environ.get(CLOCK_ENV)
    if fake:
        try:
            return float(fake)
        except ValueError:
            pass
    return time.time()


@dataclass(frozen=True)
class Reservation:
    path: str
    holder: str
    expires: float
    since: float

    def remaining(self, now: float | None = None) -> float:
        return max(0.0, self.expires - (clock() if now is None else now))

    def skewed(self, now: float, max_ahead: float) -> bool:
        """Made with a clock far ahead of ours: it would hold the path for good."""
        return self.expires - now > max_ahead

    def live(self, now: float, max_ahead: float) -> bool:
        return self.remaining(now) > 0 and not self.skewed(now, max_ahead)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["expires_in"] = round(self.remaining(), 3)
        return d


def max_ahead(store: Store) -> float:
    """How far ahead a reservation may end before it counts as made with a skewed clock."""
    return max(MAX_AHEAD_SECONDS, MAX_AHEAD_FACTOR * store.config_float("storm.reservationSeconds", 30.0))


def _tree(store: Store) -> tuple[pygit2.Reference | None, pygit2.Tree | None]:
    ref = store.ref(RESERVATIONS_REF)
    return ref, (store.commit(ref_oid(ref)).tree if ref is not None else None)


def _decode(data: bytes) -> Reservation:
    d = json.loads(data)
    return Reservation(str(d["path"]), str(d["holder"]), float(d["expires"]), float(d["since"]))


def readable_blob(data: bytes) -> bool:
    """Whether ``data`` is one reservation as storm writes it (the server's guard asks)."""
    try:
        _decode(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _parse(store: Store, oid: pygit2.Oid, name: str = "") -> Reservation:
    """One entry of the reservations tree; an entry storm cannot read (not storm's
    JSON, not a blob) is corrupt state: the next reservation change, or
    ``git storm doctor --fix``, drops it."""
    try:
        return _decode(store.blob_bytes(oid))
    except (ValueError, KeyError, TypeError, AttributeError, pygit2.GitError) as e:
        raise CorruptState(f"{RESERVATIONS_REF} holds an unreadable entry {name or oid} "
                           f"({type(e).__name__})", hint="git storm doctor --fix removes it") from None


def readable(store: Store, e: pygit2.Object) -> Reservation | None:
    try:
        return _parse(store, e.id, e.name or "")
    except CorruptState:
        return None


def get(store: Store, path: str, now: float | None = None) -> Reservation | None:
    """The live reservation on ``path``, if any."""
    _ref, tree = _tree(store)
    if tree is None:
        return None
    try:
        entry = tree[path_key(path)]
    except KeyError:
        return None
    r = _parse(store, entry.id, entry.name or "")
    return r if r.live(clock() if now is None else now, max_ahead(store)) else None


def live_on(store: Store, paths: list[str], now: float | None = None) -> dict[str, Reservation]:
    """The live reservations on ``paths``, as get gives each: with one ref lookup for
    the batch (a write of 2,000 paths looked the ref up 2,000 times under the lock)."""
    _ref, tree = _tree(store)
    if tree is None:
        return {}
    now = clock() if now is None else now
    ahead: float | None = None
    out: dict[str, Reservation] = {}
    for p in paths:
        try:
            entry = tree[path_key(p)]
        except KeyError:
            continue
        if ahead is None:
            ahead = max_ahead(store)
        r = _parse(store, entry.id, entry.name or "")
        if r.live(now, ahead):
            out[p] = r
    return out


def held_by_others(repo: pygit2.Repository, paths: list[str], agent: str, max_ahead_seconds: float,
                   now: float | None = None) -> list[str]:
    """Which of ``paths`` a live reservation of another agent holds, read from a
    repository (a server's bare one too): a queued write moved onto a newer head is
    not validated again, so the move asks this instead (storm_git.remote.queue_move).
    An entry that cannot be read holds nothing."""
    ref = repo.references.get(RESERVATIONS_REF)
    if ref is None:
        return []
    try:
        tree = repo[ref.target].peel(pygit2.Commit).tree
    except (KeyError, ValueError, pygit2.GitError):
        return []
    now = clock() if now is None else now
    out = []
    for p in paths:
        try:
            r = _decode(blob_at(repo, tree[path_key(p)].id).data)
        except (KeyError, ValueError, TypeError, AttributeError, pygit2.GitError, CorruptState):
            continue
        if r.holder != agent and r.live(now, max_ahead_seconds):
            out.append(p)
    return out


def active(store: Store, now: float | None = None) -> list[Reservation]:
    _ref, tree = _tree(store)
    if tree is None:
        return []
    out = [_parse(store, e.id, e.name or "") for e in tree]
    now, ahead = clock() if now is None else now, max_ahead(store)
    return sorted((r for r in out if r.live(now, ahead)), key=lambda r: r.path)


def update(store: Store, changes: dict[str, Reservation | None], *, agent: str, message: str) -> None:
    """Set/clear reservations by path; caller holds the workspace lock."""
    now, ahead = clock(), max_ahead(store)
    while True:
        ref, tree = _tree(store)
        tb = store.repo.TreeBuilder(tree) if tree is not None else store.repo.TreeBuilder()
        if tree is not None:
            for e in tree:
                r = readable(store, e)
                if r is None or not r.live(now, ahead):  # expired, from a skewed clock, or unreadable
                    tb.remove(str(e.name))
        for path, res in changes.items():
            key = path_key(path)
            if res is None:
                if tb.get(key) is not None:
                    tb.remove(key)
            else:
                blob = store.write_blob(json.dumps(asdict(res), sort_keys=True).encode())
                tb.insert(key, blob, MODE_BLOB)
        new_tree = store.write_tree(tb)
        if tree is not None and new_tree == tree.id:
            return
        commit = store.make_commit(new_tree, [ref_oid(ref)] if ref else [], agent, message)
        if store.cas(ref, RESERVATIONS_REF, commit, message):
            return

