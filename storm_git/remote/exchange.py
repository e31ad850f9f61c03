"""A clone's exchanges with the server: the locks they hold, and the fetched values
copied onto the local refs.

Lock order (storm_git.remote.workspace): ``write-<agent>``, then ``remote`` (fetches,
pushes, the tracking refs), then ``workspace`` (the local refs), then an agent's lock.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pygit2

from ..core import readsets, trailers
from ..core.agents import record_seen
from ..core.errors import NotInitialised

# REMOTE_LOCK: taken around every exchange with the server (fetch, push) and before the
# workspace lock, never inside it: the tracking refs only move under it, and a network
# round trip never holds up this clone's local validation.
from ..core.locks import LANDING_LOCK, REMOTE_LOCK, flocked, try_flocked
from ..core.readsets import agent_lock
from ..core.store import AGENTS_PREFIX, WORKSPACE_REF, Store
from .transport import SHARED_REFS, tracking_ref
from .write_queue import force, tracked_head


def write_lock(agent: str) -> str:
    """The lock one remote write of ``agent`` holds from its snapshot to its end."""
    return f"write-{agent}"


@contextmanager
def exchanging(store: Store, *, wait: bool = True) -> Iterator[bool]:
    """Hold the remote lock and the landing lock for a fetch or a push (see
    storm_git.core.locks). ``wait=False``: yield False at once if another process
    holds the remote lock."""
    if wait:
        with flocked(store.commondir, REMOTE_LOCK), flocked(store.commondir, LANDING_LOCK):
            yield True
        return
    with try_flocked(store.commondir, REMOTE_LOCK) as taken:
        if not taken:
            yield False
            return
        with flocked(store.commondir, LANDING_LOCK):
            yield True


def learn_writers(store: Store, remote: str) -> None:
    """Record the agents whose writes the fetched head brought: the tracked head's
    commits that the local ref has not taken yet (workspace lock held, before the queue
    moves and the local ref is adopted). The clone does not fetch their notes refs, and
    intent comments are recognised by agent id (storm_git.core.agents.record_seen).
    Counted from the local ref, not from the tracked head before the fetch: a process
    killed between its fetch and this leaves the local ref behind, and the next fetch
    learns what it missed."""
    new, local = tracked_head(store, remote), store.ref_target(WORKSPACE_REF)
    if new is None or local is None or new == local:
        return
    try:
        walker = store.repo.walk(new, pygit2.enums.SortMode.NONE)
        walker.hide(local)
        names = {a for c in walker for a in trailers.parse(c.message).get("Storm-Agent", [])}
    except (KeyError, ValueError, pygit2.GitError):
        return  # the local ref names a commit that is gone (a hand-made repair): nothing to learn from
    record_seen(store.commondir, names)


def adopt_tracking(store: Store, remote: str) -> None:
    """Copy the fetched values onto the local refs (workspace lock held). The shared
    refs take the server's value; an agent's notes ref only moves forward (local
    folds not yet pushed stay: they travel with that agent's next push)."""
    for name in SHARED_REFS:
        theirs = store.ref_target(tracking_ref(remote, name))
        mine = store.ref_target(name)
        if theirs is None:
            if name == WORKSPACE_REF:
                raise NotInitialised(f"{remote} has no shared workspace ({WORKSPACE_REF})",
                                     hint=f"run git storm init --remote {remote} in a clone that has the code")
            if mine is not None:
                store.repo.references.delete(name)
        elif mine != theirs:
            if name == WORKSPACE_REF and mine is not None and store.descends(mine, theirs):
                continue  # writes queued here on top of the server's head: they wait for their push
            force(store, name, theirs)
    prefix = tracking_ref(remote, AGENTS_PREFIX)
    for tracked in store.refs_under(prefix):
        name = AGENTS_PREFIX + tracked[len(prefix):]
        theirs = store.ref_target(tracked)
        mine = store.ref_target(name)
        if theirs is None or mine == theirs:  # None: gone since it was listed
            continue
        if mine is None or store.descends(theirs, mine):
            with flocked(store.commondir, agent_lock(name[len(AGENTS_PREFIX):])):
                force(store, name, theirs)
                readsets.drop_cached(store, name[len(AGENTS_PREFIX):])
