"""The audit log of what is not an accepted write: rejections, merges, mode switches.

Accepted writes are the shared ref's own history. Everything else that statistics
need is appended to ``refs/storm/log``: a chain of commits with the empty tree,
each message a one-line summary and a JSON body, so ``git log refs/storm/log``
reads it and the log survives like any other git history. Appends are CAS moves
made under the workspace lock.

Event types (``type``; every event also has ``agent``, ``time`` and, when read,
``summary`` and ``id``): ``rejection`` (storm_git.storm.write), ``release``,
``boundary`` (storm_git.core.assignments), ``intent_overwritten``
(storm_git.core.intents), ``assign``, ``mode`` (storm_git.admin.modes),
``commit`` (storm_git.storm.manager, and storm_git.worktree.isolated in worktree mode),
``commit_refused``, ``write`` (worktree mode only), ``merge``, ``spawn`` and
``cleanup`` (storm_git.worktree.worktrees). ``storm_git.core.render.log_entry`` renders each; a type
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
