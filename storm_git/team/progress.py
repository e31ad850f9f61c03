"""What each engineer has done so far, read from storm's own refs.

Accepted writes are the shared ref's commits (``Storm-Agent``/``Storm-Path``
trailers) since the run's base; rejections are ``rejection`` events of
``refs/storm/log`` since the run started; reservations are the live ones; reads
are the agent's read set. An engineer is blocked on a reservation while a write of
it waits inside storm for another agent's reservation (the marks of
storm_git.core.waits), and after that write was refused for a reservation that
still holds. In worktree mode the writes are the commits of the engineer's branch.
Results are cached on the refs' targets (and the waits' folder), so a board
refreshed while nobody writes costs a few ref lookups.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..core import events, readsets, reservations, trailers, waits
from ..core.store import EVENTS_REF, WORKSPACE_REF, Store

MAX_WALK = 100_000


@dataclass
class Activity:
    writes: int = 0
    paths: list[str] = field(default_factory=list)  # every path written, first write first
    rejections: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    rejected_paths: list[str] = field(default_factory=list)
    reads: int = 0
    holds: list[str] = field(default_factory=list)  # reservations and leases held now
    blocked_by: dict[str, str] = field(default_factory=dict)  # path -> holder, for a 'reserved' rejection
    on: str | None = None  # the file it is on: its last write or rejection
    first: float | None = None  # time of its first write or rejection
    last: float | None = None  # time of its last write or rejection
    waiting_on: str | None = None  # blocked on this holder's reservation (see Progress.get)
    waiting_for: str | None = None  # ... of this path

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


class Progress:
    """Per-agent activity of one run, recomputed only when a ref it reads moved."""

    def __init__(self, store: Store, agents: list[str], *, since: float, base_workspace: str | None,
                 base_commit: str, mode: str, branches: dict[str, str] | None = None) -> None:
        self.store = store
        self.agents = agents
        self.since = since
        self.base_workspace = base_workspace
        self.base_commit = base_commit
        self.mode = mode
        self.branches = branches or {}
        self._key: Any = None
        self._last: dict[str, Activity] = {a: Activity() for a in agents}
        self._live: dict[str, str] = {}

    def _refs_key(self) -> Any:
        s = self.store
        names = [WORKSPACE_REF, EVENTS_REF, "refs/storm/reservations"] + \
            ["refs/heads/" + b for b in self.branches.values()]
        return tuple(str(s.ref_target(n)) for n in names) + tuple(_size(readsets.journal_path(s, a))
                                                                    for a in self.agents) + (waits.stamp(s),)

    def get(self, force: bool = False) -> dict[str, Activity]:
        key = self._refs_key()
        if key == self._key and not force:
            return self._last
        self._key = key
        acts = {a: Activity() for a in self.agents}
        if self.mode == "storm":
            self._writes(acts)
        else:
            self._branch_writes(acts)
        self._rejections(acts)
        self._holds(acts)
        for act in acts.values():
            still = act.waiting_on and act.rejected_paths and \
                self._live.get(act.rejected_paths[-1]) == act.waiting_on
            act.waiting_on = act.waiting_on if still else None
            act.waiting_for = act.rejected_paths[-1] if still else None
        for agent, w in waits.current(self.store, self.agents).items():  # a write waiting inside storm now
            act = acts[agent]
            act.waiting_on, act.waiting_for, act.on = w.holder, w.path, w.path
        for a in self.agents:
            try:
                acts[a].reads = len(readsets.load(self.store, a)) if self.mode == "storm" else 0
            except Exception:  # noqa: BLE001 - a board must not die on one unreadable read set
                acts[a].reads = 0
        self._last = acts
        return acts

    def _writes(self, acts: dict[str, Activity]) -> None:
        s = self.store
        oid = s.ref_target(WORKSPACE_REF)
        stop = self.base_workspace
        seen: list[tuple[str, list[str], float]] = []
        n = 0
        while oid is not None and str(oid) != stop and n < MAX_WALK:
            c = s.commit(oid)
            t = trailers.parse(c.message)
            if c.commit_time < self.since - 1 and stop is None:
                break
            who = (t.get("Storm-Agent") or [""])[0]
            if who in acts:
                seen.append((who, t.get("Storm-Path", []), float(c.commit_time)))
            oid = c.parent_ids[0] if c.parent_ids else None
            n += 1
        for who, paths, when in reversed(seen):  # oldest first
            a = acts[who]
            a.writes += 1
            a.paths.extend(p for p in paths if p not in a.paths)
            a.on = paths[-1] if paths else a.on
            a.first = a.first if a.first is not None else when
            a.last = when

    def _branch_writes(self, acts: dict[str, Activity]) -> None:
        s = self.store
        for agent, branch in self.branches.items():
            if agent not in acts:
                continue
            oid = s.ref_target("refs/heads/" + branch)
            n = 0
            while oid is not None and str(oid) != self.base_commit and n < 10_000:
                c = s.commit(oid)
                if c.commit_time < self.since - 1 or len(c.parents) != 1:
                    break
                diff = s.repo.diff(c.parents[0], c)
                a = acts[agent]
                a.writes += 1
                for d in diff.deltas:
                    if d.new_file.path not in a.paths:
                        a.paths.append(d.new_file.path)
                a.first = float(c.commit_time) if a.first is None else min(a.first, float(c.commit_time))
                oid = c.parent_ids[0]
                n += 1

    def _rejections(self, acts: dict[str, Activity]) -> None:
        if self.store.ref_target(EVENTS_REF) is None:
            return
        found = []
        for ev in events.read(self.store):
            if float(ev.get("time", 0)) < self.since:
                break
            if ev.get("type") == "rejection" and ev.get("agent") in acts:
                found.append(ev)
        for ev in reversed(found):
            a = acts[ev["agent"]]
            a.rejections += 1
            reason = str(ev.get("reason"))
            a.reasons[reason] = a.reasons.get(reason, 0) + 1
            path = ev.get("path")
            if isinstance(path, str):
                a.rejected_paths.append(path)
                a.on = path
                if reason == "reserved" and isinstance(ev.get("holder"), str):
                    a.blocked_by[path] = ev["holder"]
            t = float(ev.get("time", 0))
            a.first = t if a.first is None else min(a.first, t)
            if a.last is None or t >= a.last:
                a.last = t
                a.waiting_on = ev.get("holder") if reason == "reserved" and isinstance(ev.get("holder"), str) else None

    def _holds(self, acts: dict[str, Activity]) -> None:
        try:
            live = reservations.active(self.store)
        except Exception:  # noqa: BLE001 - an unreadable reservations ref: nothing shown as held
            live = []
        self._live = {r.path: r.holder for r in live}
        for r in live:
            if r.holder in acts:
                acts[r.holder].holds.append(r.path)
