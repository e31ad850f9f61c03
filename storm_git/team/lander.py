"""Landing a team run: storm mode tests the shared head (with fix rounds) and makes
the manager's commit; worktree mode merges the engineers' branches in dependency
order, handing a conflict back once; then the push (``--push``). The verbs are
:mod:`.land`'s and :mod:`.publish`'s."""
from __future__ import annotations

import os
import time
from typing import Any

from ..core.errors import RepoStateError
from ..core.store import WORKSPACE_REF
from . import land as landing, publish
from .base import tree_paths
from .progress import Activity
from .sessions import Sessions
from .state import Engineer


class Lander(Sessions):
    """The landing of a run whose engineers are done."""

    # -- landing -----------------------------------------------------------------------------
    def writes(self) -> dict[str, list[str]]:
        self.activity = self.progress.get(force=True)
        return {e.agent: list(self.activity.get(e.agent, Activity()).paths) for e in self.st.engineers}

    def land(self) -> int:
        self.st.phase = "landing"
        self.save()
        self.emit("landing", mode=self.st.mode)
        if self.st.mode == "storm":
            return self.land_storm()
        return self.land_worktree()

    def test_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}
        env["STORM_TEAM_RUN"] = self.st.run
        return env

    def test(self, round_: int) -> landing.TestRun:
        head = self.store.ref_target(WORKSPACE_REF)
        commit = str(head) if head is not None else self.st.base_commit
        self.emit("testing", commit=commit, round=round_)
        res = landing.run_tests(self.store.main_workdir, commit, str(self.st.test), env=self.test_env(),
                             timeout=self.extra.get("test_timeout"), round_=round_)
        self.st.tests.append(res.to_dict())
        self.test_runs.append(res)
        self.save()
        self.emit("tested", passed=res.passed, code=res.code, round=round_, seconds=res.seconds,
                  commit=commit)
        return res

    def hand_back(self, rounds: dict[str, tuple[str, str]]) -> None:
        """Start these engineers again, each for its round with its note ({agent: (round, note)}),
        and wait for them: a fix round, a merge conflict handed back."""
        self.st.phase = "fixing"
        for a in rounds:
            e = self.st.engineer(a)
            e.fix_rounds += 1
            e.state = "queued"
        self.save()
        for a, (round_, note) in rounds.items():
            self.launch(self.st.engineer(a), round_, note)
        self.work(only=list(rounds))

    def land_storm(self) -> int:
        if self.st.test:
            res = self.test(0)
            rounds = 0
            while not res.passed and rounds < self.st.fix_rounds and not self.stopping:
                rounds += 1
                tracked = tree_paths(self.store, self.store.ref_target(WORKSPACE_REF))
                agents, files = landing.fix_targets(res.output, tracked, self.writes())
                self.emit("fix_round", round=rounds, agents=agents, files=files)
                note = ("# Fix round\n\nThe team's tests fail on the shared head. The test command "
                        f"`{self.st.test}` said:\n\n```\n{res.output[-3000:]}\n```\n\nFix your part so they pass.")
                self.hand_back({a: ("fix", note) for a in agents})
                if self.stopping:
                    return self.stop()
                if any(self.st.engineer(a).state != "done" for a in agents):
                    return self.finish("failed", "an engineer of the fix round did not finish")
                res = self.test(rounds)
            if self.stopping:
                return self.stop()
            if not res.passed:
                return self.finish("failed", f"the tests fail on the shared head after {rounds} fix round(s)")
        message = self.commit_message()
        target = self.target()
        try:
            if target != self.st.branch:
                publish.switch_to(self.store, self.store.main_workdir, target)
        except RepoStateError as exc:
            return self.finish("failed", exc.message)
        data = landing.manager_commit(self.store.main_workdir, message, self.manager, self.test_env())
        # a resumed run whose commit had landed before it was killed: nothing new to commit, the tip has it
        tip = data.get("commit") or str(self.store.ref_target("refs/heads/" + target))
        self.st.landed = {"commit": tip, "branch": data.get("branch") or target, "agents": data.get("agents"),
                          "writes": data.get("writes"), "paths": data.get("paths")}
        self.emit("landed", **self.st.landed)
        return self.published()

    def target(self) -> str:
        """The branch the run lands on (``--branch``, else the one it started on)."""
        return self.st.land_branch or self.st.branch

    def published(self) -> int:
        """After landing: the push (``--push``), then the end of the run."""
        if not self.st.push:
            return self.finish("landed", "")
        res = publish.push(self.store.main_workdir, self.st.push, str(self.st.landed["branch"]),
                           str(self.st.landed["commit"]), self.test_env())
        self.st.pushed = res.to_dict()
        self.emit("pushed" if res.ok else "push_failed", **self.st.pushed)
        return self.finish("landed", "" if res.ok else f"landed, not pushed to {res.remote}: {res.error}")

    def commit_message(self) -> str:
        w = self.writes()
        lines = [f"{self.st.task}", "", f"storm team run {self.st.run}: {len(self.st.engineers)} engineer(s)."]
        for e in self.st.engineers:
            s = self.subtasks[e.subtask]
            a = self.activity.get(e.agent, Activity())
            paths = w.get(e.agent) or []
            lines.append(f"- {e.agent} ({s.id}: {s.title}): {a.writes} write(s)"
                         + (f" to {', '.join(paths)}" if paths else ""))
        return "\n".join(lines)

    def land_worktree(self) -> int:
        order = [self.by_sub(s.id).agent for s in self.plan.order()]
        rep = self.merge(order)
        handed: list[str] = []
        bad = [r for r in rep.get("results", []) if r.get("status") in ("conflicted", "test_failed")]
        if bad and not self.stopping:
            for r in bad:
                e = self.st.engineer(r["agent"])
                if r["status"] == "conflicted" or e.fix_rounds < self.st.fix_rounds:
                    handed.append(e.agent)
            if handed:
                target = rep.get("target") or self.target()
                notes = {r["agent"]: self.handback_note(r, target) for r in bad}
                self.emit("handed_back", agents=handed,
                          why={r["agent"]: r["status"] for r in bad if r["agent"] in handed})
                self.hand_back({r["agent"]: ("conflict" if r["status"] == "conflicted" else "fix", notes[r["agent"]])
                                for r in bad if r["agent"] in handed})
                if self.stopping:
                    return self.stop()
                rep = self.merge([a for a in order if a in handed])
                bad = [r for r in rep.get("results", []) if r.get("status") in ("conflicted", "test_failed")]
        if self.stopping:
            return self.stop()
        if bad:
            return self.finish("failed", "not merged: " + ", ".join(f"{r['agent']} ({r['status']})" for r in bad))
        tip = self.store.ref_target("refs/heads/" + self.target())
        self.st.landed = {"commit": str(tip), "branch": self.target(),
                          "agents": [e.agent for e in self.st.engineers]}
        self.emit("landed", **self.st.landed)
        return self.published()

    def by_sub(self, sid: str) -> Engineer:
        return next(e for e in self.st.engineers if e.subtask == sid)

    def merge(self, agents: list[str]) -> dict[str, Any]:
        self.emit("merging", agents=agents)
        rep = landing.merge(self.store.main_workdir, agents, self.st.test, self.manager, self.test_env(),
                            self.extra.get("test_timeout"), into=self.st.land_branch or None)
        results = [{"agent": r.get("agent"), "status": r.get("status"), "commit": r.get("commit"),
                    "conflicts": [c.get("path") for c in r.get("conflicts") or []],
                    "test": (r.get("test") or {}).get("passed") if r.get("test") else None}
                   for r in rep.get("results", [])]
        self.st.merges.append({"time": time.time(), "results": results})
        for r in rep.get("results", []):
            if r.get("test"):
                self.st.tests.append({"passed": bool(r["test"].get("passed")), "agent": r.get("agent"),
                                      "output": str(r["test"].get("output") or r["test"].get("tail") or "")[-2000:],
                                      "commit": r.get("commit") or r.get("tip")})
        self.save()
        self.emit("merged", results=results)
        return rep

    def handback_note(self, r: dict[str, Any], target: str) -> str:
        if r.get("status") == "conflicted":
            files = ", ".join(c.get("path", "?") for c in r.get("conflicts") or [])
            return ("# Merge conflict handed back\n\nYour branch conflicts with the integrated branch "
                    f"{target} in: {files}. In your worktree, run `git merge {target}`, resolve the conflicts "
                    "keeping both sides' intent, commit, and stop.")
        t = r.get("test") or {}
        return ("# Fix round\n\nThe tests fail on the merge of your branch:\n\n```\n"
                f"{str(t.get('output') or t.get('tail') or '')[-3000:]}\n```\n\nFix your part, commit, and stop.")
