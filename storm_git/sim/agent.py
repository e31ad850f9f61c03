"""One simulated agent: a real process, ``python -m storm_git.sim.agent SPEC.json``.

For each of its changes (tasks) the agent starts a fresh read set, reads what
the change needs (storm mode: at the shared head, recorded; worktree mode: in
its own worktree), waits at a barrier until every agent of that round has read
(and, when the scenario says who finishes first, until those have written),
computes its content and writes it. In storm mode a rejection makes it re-read
and re-apply its own change to the current content (three-way merge or the
scenario's program): that is the re-planning a rejection costs. In worktree
mode it commits each change to its branch; conflicts wait for the merge.

The report (JSON) lists every rejection (reason, and whether re-applying
changed what it writes), re-reads, reservation waits, merge hunks that needed
judgement, and per accepted write the content it was based on and what it
wrote, which the runner checks against the final tree for lost updates.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from typing import Any

from .scenarios import run_program
from .workload import Change, imports_of, merge3, module_index

MAX_ATTEMPTS = 8
BARRIER_TIMEOUT = 120.0
CLOSURE_DEPTH = 3


def b64(c: bytes | None) -> str | None:
    return None if c is None else base64.b64encode(c).decode()


def apply_change(change: Change, view: dict[str, bytes | None]) -> tuple[dict[str, bytes | None], int]:
    """What ``change`` writes on ``view``, and how many hunks needed judgement."""
    if change.program:
        return run_program(change, view), 0
    out, judged = {}, 0
    for p in change.targets:
        m = merge3(change.parent.get(p), view.get(p), change.post.get(p))
        out[p], judged = m.content, judged + m.conflicts
    return out, judged


class Barrier:
    """Marker files in a shared directory: every agent of a round reads before
    anyone writes, and ``order`` says who finishes first (deterministic runs)."""

    def __init__(self, path: str, agent: str) -> None:
        self.path, self.agent = path, agent

    def mark(self, what: str, rnd: int) -> None:
        open(os.path.join(self.path, f"{what}-{rnd}-{self.agent}"), "w").close()

    def wait(self, what: str, rnd: int, agents: list[str]) -> None:
        deadline = time.monotonic() + BARRIER_TIMEOUT
        names = [os.path.join(self.path, f"{what}-{rnd}-{a}") for a in agents]
        while not all(os.path.exists(n) for n in names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.agent}: waited {BARRIER_TIMEOUT:.0f}s for {what} of round {rnd}")
            time.sleep(0.005)


class Agent:
    def __init__(self, spec: dict[str, Any]) -> None:
        from storm_git.api import open_workspace

        self.spec = spec
        self.name: str = spec["agent"]
        self.mode: str = spec["mode"]
        self.ws: Any = open_workspace(spec["repo"])  # either mode: the agent calls what its mode has
        self.barrier = Barrier(spec["sync_dir"], self.name)
        self.deps = spec.get("deps", "full")
        self.report: dict[str, Any] = {"agent": self.name, "mode": self.mode, "tasks": []}

    # -- reading -----------------------------------------------------------------------
    def _listing(self) -> list[str]:
        if self.mode == "storm":
            cwd, rev = self.spec["repo"], "refs/storm/workspace"
        else:
            cwd, rev = self.ws.worktree(self.name).path, "HEAD"
        r = subprocess.run(["git", "ls-tree", "-r", "--name-only", "-z", rev], cwd=cwd, capture_output=True)
        return [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]

    def read(self, change: Change) -> dict[str, bytes | None]:
        """Read the change's files; scenario agents also follow their imports (the
        files a program looks at to decide), as far as they exist now."""
        want = list(dict.fromkeys(change.targets + change.reads))
        view: dict[str, bytes | None] = {}
        depth = CLOSURE_DEPTH if self.spec["kind"] == "scenario" else 0
        index = module_index(self._listing()) if depth else {}
        for level in range(depth + 1):
            todo = [p for p in want if p not in view]
            if not todo:
                break
            for r in self.ws.read(todo, agent=self.name):
                view[r.path] = r.content
            if level < depth:
                want = [m for p in todo for m in imports_of(p, view.get(p), index)]
        return view

    # -- writing -----------------------------------------------------------------------
    def _write(self, change: Change, content: dict[str, bytes | None], view: dict[str, bytes | None]) -> Any:
        writes = {p: c for p, c in content.items() if not (c is None and view.get(p) is None)}
        if not writes:
            return None
        if self.mode == "storm":
            from storm_git.storm.write import AUTO_DEPS

            deps: Any = None if self.deps == "full" else AUTO_DEPS  # the computed dependency scope
            return self.ws.apply(self.name, writes, intent=change.message, deps=deps, wait=True, op="write")
        for p, c in writes.items():
            if c is None:
                self.ws.rm(p, agent=self.name, intent=change.message)
            else:
                self.ws.write(p, c, agent=self.name, intent=change.message)
        return None

    def task(self, rnd: int, change: Change, plan: dict[str, int]) -> dict[str, Any]:
        if rnd:  # a round starts once every agent of the last one is done: what an agent
            # reads never depends on how far a slower agent got with its last write
            self.barrier.wait("done", rnd - 1, list(self.spec["plans"][rnd - 1]))
        t0 = time.monotonic()
        self.ws.forget(None, agent=self.name)  # a read set belongs to one task
        view = self.read(change)
        rec: dict[str, Any] = {"message": change.message, "rejections": [], "rereads": 0, "judgement": 0,
                               "reservation_waits": 0, "waited_s": 0.0, "accepted": False, "gave_up": False}
        self.barrier.mark("read", rnd)
        self.barrier.wait("read", rnd, list(plan))
        mine = plan[self.name]
        self.barrier.wait("done", rnd, [a for a, o in plan.items() if o < mine])
        content, judged = apply_change(change, view)
        last_judged = judged  # the judgement the content being written already took
        rec["judgement"] += judged
        for _attempt in range(MAX_ATTEMPTS):
            res = self._write(change, content, view)
            if res is not None:
                rec["waited_s"] += res.waited
                if res.reservation_wait is not None:
                    rec["reservation_waits"] += 1
            if res is None or res.accepted:
                rec["accepted"] = True
                rec["commit"] = getattr(res, "commit", None)
                break
            # rejected: re-read, re-apply the change to what is there now
            view = self.read(change)
            rec["rereads"] += 1
            again, judged = apply_change(change, view)
            rec["judgement"] += judged
            # needless: the change re-applied to the same content with no judgement beyond
            # what the first content already took. A re-application that needed new
            # judgement (a conflicting hunk, a delete of a changed file) is work the
            # rejection surfaced, even when the judgement kept the agent's own side
            rec["rejections"].append({"reason": res.rejection.reason, "path": res.rejection.path,
                                      "stale": [s.path for s in res.rejection.stale],
                                      "judged": judged,
                                      "unchanged": again == content and judged <= last_judged,
                                      # --deps auto: why each moved dependency still counted
                                      "moved": (res.rejection.scope or {}).get("moved")})
            content, last_judged = again, judged
        else:
            rec["gave_up"] = True
        if self.mode == "worktree":
            c = self.ws.commit(change.message, agent=self.name)
            rec["commit"] = c.commit
        rec["time"] = time.time()
        rec["writes"] = {p: {"base": b64(view.get(p)), "written": b64(c)} for p, c in content.items()
                         if c != view.get(p)}
        rec["task_s"] = round(time.monotonic() - t0, 4)
        self.barrier.mark("done", rnd)
        return rec

    def run(self) -> dict[str, Any]:
        for rnd, (change, plan) in enumerate(zip(self.spec["changes"], self.spec["plans"], strict=True)):
            self.report["tasks"].append(self.task(rnd, Change.from_json(change), plan))
        return self.report


def main(argv: list[str], cls: type[Agent] = Agent) -> int:
    """Run the agent ``cls`` of the spec file ``argv[0]``; its report goes to the spec's ``out``."""
    with open(argv[0]) as fh:
        spec = json.load(fh)
    agent = cls(spec)
    try:
        report = agent.run()
    except Exception as exc:  # noqa: BLE001 - the runner reports a failed agent, with this message
        report = dict(agent.report, error=f"{type(exc).__name__}: {exc}")
        # let the others pass the barriers: this agent is done
        for rnd in range(len(spec["changes"])):
            agent.barrier.mark("read", rnd)
            agent.barrier.mark("done", rnd)
    with open(spec["out"], "w") as fh:
        json.dump(report, fh)
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
