"""The loop of a team run and its sessions: start what is ready (its dependencies
done, at most ``parallel`` at once), notice each session's end by its exit file,
and look at the engineers' progress between (a quarter second; the figures at most
once a second): a team of thinking engineers costs ``team run`` next to no CPU.
Each session is started with its brief and environment, in the shared tree (storm
mode, after storm's hooks are installed and checked) or in its own worktree."""
from __future__ import annotations

import os
import subprocess
import time

from ..integrations.brief import brief as agent_brief
from . import land as landing, launcher
from .base import DONE, TeamBase
from .progress import Activity
from .state import Engineer

TICK = 0.25
PROGRESS_EVERY = 1.0


class Sessions(TeamBase):
    """The loop and the sessions of a run."""

    # -- the loop ---------------------------------------------------------------------------
    def work(self, only: list[str] | None = None) -> None:
        """Start and watch sessions until every engineer (of ``only``) has ended."""
        while not self.stopping:
            mine = [e for e in self.st.engineers if only is None or e.agent in only]
            changed = self.poll(mine)
            for e in self.ready(mine):
                self.launch(e)
                changed = True
            if changed:
                self.save()
            self.tick()
            if all(e.state in DONE for e in mine):
                return
            time.sleep(TICK)

    def ready(self, mine: list[Engineer]) -> list[Engineer]:
        running = sum(1 for e in self.st.engineers if e.state in ("running", "waiting"))
        out: list[Engineer] = []
        by_sub = {e.subtask: e for e in self.st.engineers}
        for e in [by_sub[s.id] for s in self.plan.order() if by_sub[s.id] in mine]:
            if e.state != "queued":
                continue
            deps = [by_sub[d] for d in self.subtasks[e.subtask].depends_on]
            bad = [d for d in deps if d.state in ("failed", "stopped")]
            if bad:
                e.state, e.why = "failed", f"its dependency {bad[0].subtask} ({bad[0].agent}) did not finish"
                self.emit("not_started", agent=e.agent, why=e.why)
                continue
            if all(d.state == "done" for d in deps) and running + len(out) < self.st.parallel:
                out.append(e)
        return out

    def tick(self) -> None:
        now = time.monotonic()
        changed = False
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            self.activity = self.progress.get()
            for e in self.st.engineers:
                a = self.activity.get(e.agent)
                if a is None:
                    continue
                if e.first_tool is None and a.first is not None and e.state in ("running", "waiting"):
                    e.first_tool = a.first
                if e.state in ("running", "waiting"):
                    was, e.state = e.state, "waiting" if a.waiting_on else "running"
                    if was != e.state:
                        self.emit("waiting" if a.waiting_on else "resumed_work", agent=e.agent,
                                  holder=a.waiting_on, path=a.waiting_for)
                        changed = True
        if changed:
            self.save()
        for f in self.ticks:
            f(self)

    # -- sessions ----------------------------------------------------------------------------
    def prompt(self, e: Engineer, round_: str, note: str = "") -> str:
        s = self.subtasks[e.subtask]
        deps = [self.subtasks[d] for d in s.depends_on]
        by_sub = {x.subtask: x for x in self.st.engineers}
        lines = [agent_brief("engineer", self.st.mode, e.agent).rstrip(), "", "# Your subtask", "",
                 f"Team task: {self.st.task}", f"Subtask {s.id}: {s.title}", "", s.brief.strip(), "",
                 "Your primary files (yours alone in this team): " + ", ".join(s.files)]
        if deps:
            self.activity = self.progress.get(force=True)  # what the subtasks it builds on wrote, as of now
            lines.append("It builds on: " + "; ".join(
                f"{d.id} ({d.title}, done by {by_sub[d.id].agent}: "
                f"{', '.join(self.activity.get(by_sub[d.id].agent, Activity()).paths) or 'no file'})"
                for d in deps))
        if self.st.mode == "storm":
            lines.append("Other engineers work in the same tree at the same time; storm checks every write "
                         "against what you read.")
        else:
            lines.append("You work in your own worktree and branch; commit there. The manager merges.")
        if note:
            lines += ["", note.strip()]
        lines += ["", "When your subtask is done, stop (end the session)."]
        return "\n".join(lines) + "\n"

    def env(self, e: Engineer, brief_file: str, round_: str, cwd: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STORM_TEAM_")}
        env.update(STORM_AGENT=e.agent, STORM_TEAM_SUBTASK=e.subtask, STORM_TEAM_BRIEF=brief_file,
                   STORM_TEAM_RUN=self.st.run, STORM_TEAM_MODE=self.st.mode, STORM_TEAM_ROUND=round_,
                   STORM_TEAM_REPO=self.store.main_workdir, STORM_TEAM_WORKDIR=cwd,
                   STORM_TEAM_ATTEMPT=str(e.attempts),
                   STORM_TEAM_FILES=" ".join(self.subtasks[e.subtask].files))
        return env

    def workdir(self, e: Engineer) -> str:
        if self.st.mode == "storm":
            return self.store.main_workdir
        from ..worktree.worktrees import spawn

        if e.cwd and os.path.isdir(e.cwd):
            return e.cwd
        res = spawn(self.store, e.agent, base=self.base_for(e), reuse=True, by=self.manager)
        self.emit("spawned", agent=e.agent, path=res.path, branch=res.branch, base=res.base)
        return res.path

    def base_for(self, e: Engineer) -> str | None:
        """Worktree mode: a subtask starts where its dependencies' branches are merged."""
        deps = self.subtasks[e.subtask].depends_on
        if not deps:
            return None
        by_sub = {x.subtask: x for x in self.st.engineers}
        tips = [str(self.store.ref_target("refs/heads/" + self._branches()[by_sub[d].agent])) for d in deps]
        if len(tips) == 1:
            return tips[0]
        top = self.store.main_workdir
        r = subprocess.run(["git", "merge-tree", "--write-tree", *tips[:2]], cwd=top, capture_output=True,
                           text=True, check=False)
        if r.returncode != 0 or len(tips) > 2:
            self.st.problems.append(f"{e.agent}: its dependencies' branches do not merge cleanly; it starts "
                                    f"from {deps[0]}'s")
            return tips[0]
        tree = r.stdout.split()[0]
        c = subprocess.run(["git", "commit-tree", tree, "-p", tips[0], "-p", tips[1], "-m",
                            f"storm team: {e.agent} starts from {', '.join(deps)}"], cwd=top, capture_output=True,
                           text=True, check=True)
        return c.stdout.strip()

    def launch(self, e: Engineer, round_: str = "work", note: str = "") -> None:
        harness = e.harness
        if harness != "cmd" and self.st.mode == "storm":
            if harness not in self.hooks:
                self.hooks[harness] = launcher.install_hooks(harness, self.store.main_workdir, dict(os.environ))
                self.emit("hooks", harness=harness, active=self.hooks[harness] is None,
                          why=self.hooks[harness] or "")
            why = self.hooks[harness]
            if why:
                e.state, e.why = "failed", f"not started: {why}"
                self.emit("not_started", agent=e.agent, why=e.why)
                return
        try:
            cwd = self.workdir(e)
        except Exception as exc:  # noqa: BLE001 - one engineer's worktree failing ends only that engineer
            e.state, e.why = "failed", f"not started: no worktree: {exc}"
            self.emit("not_started", agent=e.agent, why=e.why)
            return
        e.cwd = cwd
        e.attempts += 1
        brief_file = self.rd.file("briefs", f"{e.agent}.{e.attempts}.md")
        text = self.prompt(e, round_, note)
        with open(brief_file, "w", encoding="utf-8") as fh:
            fh.write(text)
        argv = launcher.argv_for(harness, text, cmd=self.st.harness_cmd,
                                 extra=list(self.extra.get("harness_args") or []))
        started = launcher.start(argv, cwd=cwd, env=self.env(e, brief_file, round_, cwd),
                                 out=self.transcript(e, "out"), err=self.transcript(e, "err"),
                                 exit_file=self.exit_file(e))
        self.procs[e.agent] = started.proc
        e.pid, e.pstart, e.state, e.started, e.ended, e.exit, e.why = \
            started.pid, started.pstart, "running", time.time(), None, None, ""
        self.save()
        self.emit("started", agent=e.agent, subtask=e.subtask, harness=harness, pid=e.pid, round=round_,
                  attempt=e.attempts, cwd=cwd, brief=brief_file)

    def poll(self, mine: list[Engineer]) -> bool:
        """Notice the sessions that ended: by their exit file, else by their process being gone."""
        changed = False
        timeout = self.extra.get("session_timeout")
        for e in mine:
            if e.state not in ("running", "waiting"):
                continue
            proc = self.procs.get(e.agent)
            code = proc.poll() if proc is not None else None
            status = launcher.exit_status(self.exit_file(e))
            if status is None:
                running = code is None if proc is not None else launcher.alive(e.pid, e.pstart)
                if running:
                    if timeout and e.started and time.time() - e.started > float(timeout) and e.pid:
                        launcher.end(e.pid, e.pstart)
                        e.why = f"stopped after {float(timeout):.0f} s (--session-timeout)"
                        self.ended(e, None)
                        changed = True
                    continue
            self.ended(e, status)
            changed = True
        return changed

    def ended(self, e: Engineer, status: int | None) -> None:
        e.exit, e.ended, e.pid = status, time.time(), e.pid
        self.procs.pop(e.agent, None)
        tokens, cost = launcher.usage(e.harness, self.transcript(e, "out"))
        e.tokens = tokens if tokens is not None else e.tokens
        e.cost = cost if cost is not None else e.cost
        if status == 0:
            e.state = "done"
            if self.st.mode == "worktree":
                res = landing.commit_worktree(e.cwd, e.agent, f"{self.subtasks[e.subtask].title} ({e.subtask})",
                                           self.env(e, "", "commit", e.cwd))
                if res.get("error"):
                    e.state, e.why = "failed", f"its work could not be committed: {res['error']}"
                elif res.get("commit"):
                    self.emit("committed", agent=e.agent, commit=res["commit"])
        else:
            e.state = "failed"
            e.why = e.why or (f"exit status {status}" if status is not None else "its session was killed")
        self.emit("ended", agent=e.agent, state=e.state, exit=status, why=e.why,
                  seconds=round(e.ended - (e.started or e.ended), 3))
