"""The audit log of what is not an accepted write: rejections, merges, mode switches.

Accepted writes are the shared ref's own history. Everything else that statistics
need is appended to ``refs/storm/log``: a chain of commits with the empty tree,
each message a one-line summary and a JSON body, so ``git log refs/storm/log``
reads it and the log survives like any other git history. Appends are CAS moves
made under the workspace lock.

Event types (``type``; every event also has ``agent``, ``time`` and, when read,
``summary`` and ``id``): ``rejection`` (storm_git.storm.write), ``release``,
``boundary`` (storm_git.coordination.assignments), ``intent_overwritten``
(storm_git.coordination.intents), ``assign``, ``mode`` (storm_git.admin.modes),
``commit`` (storm_git.storm.commit, and storm_git.worktree.workspace in worktree mode),
``commit_refused``, ``write`` (worktree mode only), ``merge``, ``spawn`` and
``cleanup`` (storm_git.worktree.worktrees). ``storm_git.render.log_entry`` renders each; a type
it does not know is printed from its summary.
"""
from __future__ import annotations

import heapq
import itertools
import json
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pygit2

from . import trailers
from .errors import UsageError
from .store import EVENTS_REF, Store, ref_oid


def append(store: Store, kind: str, agent: str, summary: str, data: dict[str, Any]) -> None:
    """Append one event; caller holds the workspace lock."""
    body = dict(data, type=kind, agent=agent, time=time.time())
    message = f"storm {kind}: {summary}\n\n{json.dumps(body, sort_keys=True)}\n"
    empty = store.empty_tree()
    while True:
        ref = store.ref(EVENTS_REF)
        commit = store.make_commit(empty, [ref_oid(ref)] if ref else [], agent, message)
        if store.cas(ref, EVENTS_REF, commit, f"storm {kind}"):
            return


def read(store: Store, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Events, newest first."""
    oid = store.ref_target(EVENTS_REF)
    n = 0
    while oid is not None and (limit is None or n < limit):
        c = store.commit(oid)
        _, _, body = c.message.partition("\n\n")
        try:
            event = json.loads(body)
        except ValueError:
            event = None
        first = c.message.split("\n", 1)[0]
        event = _sane(event, first, float(c.commit_time))
        event["id"] = str(c.id)
        yield event
        n += 1
        oid = c.parent_ids[0] if c.parent_ids else None


def _sane(event: Any, first: str, commit_time: float) -> dict[str, Any]:
    """An event as the renderers expect it: ``type``, ``agent`` and ``summary``
    strings and a numeric ``time``. The log is a ref anyone can move: an entry
    storm did not write (or wrote with other types) is shown as ``unreadable``
    with its first line, never a crash of ``log``."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str) \
            or not isinstance(event.get("agent", ""), str) or not isinstance(event.get("summary", ""), str):
        return {"type": "unreadable", "agent": "", "summary": first, "time": commit_time}
    t = event.get("time")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
        event["time"] = commit_time
    event.setdefault("summary", first.partition(": ")[2] or first)
    return event


def merge_newest_first(*chains: Iterable[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Merge chains that are each newest first by ``time``, keeping each chain's own
    order (its history is the truth even if a clock stepped back); ties keep the
    order of ``chains``."""
    if limit < 0:
        raise UsageError(f"a log limit of {limit} entries: give 0 or more")
    merged = heapq.merge(*chains, key=lambda e: float(e.get("time") or 0), reverse=True)
    return list(itertools.islice(merged, min(limit, sys.maxsize)))


# -- ``git storm log``'s entries: the accepted storm writes merged with the events
#
# Accepted writes are the shared ref's own history (a chain of commits with
# ``Storm-Agent`` trailers); everything else is in ``refs/storm/log``
# (:mod:`.events`). Both modes show both: a repository that worked in storm mode
# and then in worktree mode (or back) has one log.


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
        if prov is not None:  # what it was validated against (provenance.load expands it)
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
    return merge_newest_first(in_landing_order(writes), read(store, limit), limit=limit)
