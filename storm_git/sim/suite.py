"""What ``git storm simulate`` runs: the plan (workloads x modes x validation
scopes) and the loop that runs it, one run at a time (a run already uses one
process per agent; running several at once would measure the machine's load)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UsageError
from . import runner, scenarios, workload
from .metrics import DEFINITIONS, RunMetrics

DEFAULT_AGENTS = (2, 4, 8)
DEFAULT_COUPLING = (0.0, 0.25, 0.5, 1.0)
QUICK_AGENTS = (2,)
QUICK_MAX_COMMITS = 8
DEFAULT_MAX_COMMITS = 40
DEPS = ("full", "auto", "both")


@dataclass
class Plan:
    repo: str | None = None
    rng: str | None = None
    scenarios: bool = False
    agents: tuple[int, ...] = ()
    coupling: tuple[float, ...] = ()
    test_cmd: str | None = None
    deps: str = "full"
    modes: tuple[str, ...] = runner.MODES
    quick: bool = False
    max_commits: int | None = None  # None: DEFAULT_MAX_COMMITS, or QUICK_MAX_COMMITS with quick
    only: tuple[str, ...] = ()  # scenario names (and/or "coupling"); empty: all
    seed: int | None = 0  # replay: the order a round's agents write in; None: a race

    def check(self) -> None:
        """Refuse what cannot run, before anything runs; fill in what was left to defaults:
        the effective number of commits, the current repository for a --range alone, and
        for a --repo alone the range of its last commits (as many as may be replayed)."""
        if self.max_commits is None:
            self.max_commits = QUICK_MAX_COMMITS if self.quick else DEFAULT_MAX_COMMITS
        if self.rng is not None and self.repo is None:
            self.repo = "."
        if not (self.repo or self.scenarios or self.quick):
            raise UsageError("nothing to simulate: give --quick, --scenarios, or --repo PATH [--range A..B]")
        if self.repo is not None and self.rng is None:
            self.rng = workload.last_commits(self.repo, self.max_commits)
        if self.deps not in DEPS:
            raise UsageError(f"--deps {self.deps!r} is not one of {', '.join(DEPS)}")
        for k in self.agents:
            if not 1 <= k <= 32:
                raise UsageError(f"--agents {k} is out of range; give 1 to 32")
        unknown = [n for n in self.only if n not in scenarios.NAMED + ["coupling"]]
        if unknown:
            raise UsageError(f"--only {unknown[0]}: no such scenario",
                             hint=f"choose from {', '.join(scenarios.NAMED)}, coupling")
        for f in self.coupling:
            if not 0.0 <= f <= 1.0:
                raise UsageError(f"--coupling {f} is not a fraction between 0 and 1")

    def workloads(self) -> list[workload.Workload]:
        out: list[workload.Workload] = []
        if self.repo:
            for k in self.agents or (4,):
                out.append(workload.replay(self.repo, self.rng or "", k, test_cmd=self.test_cmd,
                                           max_changes=self.max_commits, seed=self.seed))
        if self.scenarios or (self.quick and not self.repo):
            agents = self.agents or (QUICK_AGENTS if self.quick else DEFAULT_AGENTS)
            names = [n for n in scenarios.NAMED if not self.only or n in self.only]
            for k in agents:
                out += [scenarios.scenario(n, k) for n in names if k >= 2]
            # the coupling sweep: not in --quick (time), unless asked for
            coupling = self.coupling or (() if self.quick else DEFAULT_COUPLING)
            if not self.only or "coupling" in self.only:
                for k in agents:
                    out += [scenarios.coupling(k, f) for f in coupling]
        return out

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    plan: dict[str, Any]
    runs: list[RunMetrics] = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0
    # what each replay replayed ({"name", "kind", "params"}): the range given, the commits taken
    workloads: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "started": self.started, "seconds": round(self.seconds, 2),
                "definitions": DEFINITIONS, "workloads": self.workloads, "runs": [r.to_dict() for r in self.runs]}


def simulate(plan: Plan, on_run: Callable[[RunMetrics], None] | None = None,
             on_start: Callable[[str, int, str, str], None] | None = None) -> Report:
    """Run every workload of ``plan`` in each mode (and validation scope)."""
    plan.check()
    report = Report(plan.to_dict(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
    t0 = time.monotonic()
    scopes = ("full", "auto") if plan.deps == "both" else (plan.deps,)
    for w in plan.workloads():
        if w.kind == "replay":
            report.workloads.append({"name": w.name, "kind": w.kind, "params": w.params})
        for mode in plan.modes:
            for deps in (scopes if mode == "storm" else ("full",)):
                if on_start:
                    on_start(w.name, len(w.agents), mode, deps)
                try:
                    m = runner.run(w, mode, deps=deps, test_cmd=w.test_cmd)
                except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
                    if isinstance(exc, UsageError):
                        raise
                    m = runner.failed_run(w, mode, deps, f"{type(exc).__name__}: {exc}")
                report.runs.append(m)
                if on_run:
                    on_run(m)
    report.seconds = time.monotonic() - t0
    return report
