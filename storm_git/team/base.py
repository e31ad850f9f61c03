"""The state a team run is driven with, and its end.

:class:`TeamBase` holds one run as this process drives it: the store, the run's
folder and state, the plan, the sessions it started, the listeners of its events and
the callbacks of its ticks (``ticks``), the engineers' progress; it saves the state,
emits events, and ends the run (:meth:`TeamBase.finish` writes the report,
:meth:`TeamBase.stop` ends every session). The loop and the sessions are
:mod:`.sessions`', landing is :mod:`.lander`'s, starting and resuming a run
:mod:`.runner`'s.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import pygit2

from ..core.store import Store
from . import land as landing, report
from .plan import Plan
from .progress import Activity, Progress
from .state import Engineer, RunDir, RunState
from .stop import end_sessions

DONE = ("done", "failed", "stopped")
EXIT_NOT_LANDED = 1
EXIT_NOT_PUSHED = 4
EXIT_STOPPED = 143

Listener = Callable[[dict[str, Any]], None]


def tree_paths(store: Store, oid: pygit2.Oid | None) -> list[str]:
    """Every file path of a commit's tree."""
    if oid is None:
        return []
    out: list[str] = []
    stack: list[tuple[pygit2.Tree, str]] = [(store.commit(oid).tree, "")]
    while stack:
        tree, prefix = stack.pop()
        for e in tree:
            name = prefix + (e.name or "")
            if e.type_str == "tree":
                stack.append((store.repo[e.id], name + "/"))  # type: ignore[arg-type]
            else:
                out.append(name)
    return sorted(out)


class TeamBase:
    """One run being driven by this process."""

    def __init__(self, store: Store, rd: RunDir, st: RunState, plan: Plan, extra: dict[str, Any]) -> None:
        self.store = store
        self.rd = rd
        self.st = st
        self.plan = plan
        self.subtasks = plan.by_id()
        self.extra = extra
        self.manager = str(extra.get("manager") or "manager")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.listeners: list[Listener] = []
        self.ticks: list[Callable[[Any], None]] = []  # each called with the team after every look
        self.on_finish: list[Callable[[Any], None]] = []  # each called with the team before the report
        self.stopping = False
        self.hooks: dict[str, str | None] = {}
        self.progress = Progress(store, [e.agent for e in st.engineers], since=st.started,
                                 base_workspace=st.base_workspace, base_commit=st.base_commit, mode=st.mode,
                                 branches=self._branches())
        self.activity: dict[str, Activity] = {e.agent: Activity() for e in st.engineers}  # at the first tick
        self._last_progress = 0.0
        self.test_runs: list[landing.TestRun] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def _branches(self) -> dict[str, str]:
        if self.st.mode != "worktree":
            return {}
        from ..worktree.worktrees import branch_for

        return {e.agent: branch_for(self.store, e.agent) for e in self.st.engineers}

    def emit(self, kind: str, **data: Any) -> None:
        ev = self.rd.event(kind, **data)
        for f in self.listeners:
            f(ev)

    def save(self) -> None:
        with self.rd.locked():
            self.rd.save(self.st)

    def exit_file(self, e: Engineer) -> str:
        return self.rd.file("transcripts", f"{e.agent}.{e.attempts}.exit")

    def transcript(self, e: Engineer, which: str = "out") -> str:
        return self.rd.file("transcripts", f"{e.agent}.{e.attempts}.{which}")

    # -- the end -----------------------------------------------------------------------------
    def finish(self, phase: str, why: str) -> int:
        for f in self.on_finish:
            f(self)
        self.st.phase = phase
        self.st.ended = time.time()
        if why:
            self.st.problems.append(why)
        self.save()
        rep = report.build(self.st, self.plan, self.writes_detail())
        report.write(self.rd, rep)
        self.emit("report", phase=phase, why=why, json=self.rd.file("report.json"), markdown=self.rd.file("report.md"))
        if phase == "landed":
            return EXIT_NOT_PUSHED if self.st.pushed and not self.st.pushed.get("ok") else 0
        return EXIT_NOT_LANDED

    def writes_detail(self) -> dict[str, dict[str, Any]]:
        self.activity = self.progress.get(force=True)
        return {a: act.to_dict() for a, act in self.activity.items()}

    def stop(self) -> int:
        """End every session of the run and leave the shared state consistent."""
        end_sessions(self.store, self.st, self.emit)
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        self.finish("stopped", "stopped")
        return EXIT_STOPPED
