"""``git storm log``'s entries: the accepted storm writes merged with the events.

Accepted writes are the shared ref's own history (a chain of commits with
``Storm-Agent`` trailers); everything else is in ``refs/storm/log``
(:mod:`.events`). Both modes show both: a repository that worked in storm mode
and then in worktree mode (or back) has one log.
"""
from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

import pygit2

from . import events, trailers
from .store import Store


def storm_writes(store: Store, head: pygit2.Oid | None) -> Iterator[dict[str, Any]]:
    """The writes on the shared ref's first-parent chain from ``head``, newest first;
    it ends at the first commit storm did not write (the branch it started from)."""
    oid = head
    while oid is not None:
        c = store.commit(oid)
        t = trailers.parse(c.message)
        if "Storm-Agent" not in t:
            return
        item = {"type": "write", "commit": str(c.id), "agent": t["Storm-Agent"][0],
                "op": t.get("Storm-Op", ["write"])[0], "intent": trailers.subject(c.message),
                "paths": t.get("Storm-Path", []),
                "time": trailers.precise_time(c.message, c.commit_time)}
        try:
            prov = trailers.provenance(t)
        except ValueError:
            prov = None
        if prov is not None:  # what it was validated against (readsets.load_provenance expands it)
            item["validated"] = {"at": prov.validated_at, "scope": prov.scope,
                                 "read_set": f"{prov.base} {prov.reads}", "deps": prov.deps}
        yield item
        oid = c.parent_ids[0] if c.parent_ids else None


def in_landing_order(writes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chain's order (newest first) is the order writes landed in. A write queued on
    one machine and moved onto a head another machine wrote meanwhile carries the time
    it was validated, earlier than its new parent's: it is shown at its parent's time
    (when it landed, at the earliest), its own kept as ``written``."""
    latest = float("-inf")
    for item in reversed(writes):
        if item["time"] < latest:
            item["written"], item["time"] = item["time"], latest
        latest = item["time"]
    return writes


def log(store: Store, head: pygit2.Oid | None, limit: int) -> list[dict[str, Any]]:
    """Writes from ``head`` and recorded events, newest first, at most ``limit``."""
    writes = list(itertools.islice(storm_writes(store, head), min(max(limit, 0), sys.maxsize)))
    return events.merge_newest_first(in_landing_order(writes), events.read(store, limit), limit=limit)
