"""A team run: engineers started in dependency order, watched, and their work landed.

:func:`prepare` makes a run from a validated plan (its folder, the engineers'
assignments through ``assign``), :func:`resume` takes a run up again after
``team run`` was killed or stopped, and :meth:`Team.run` drives it to the end:
start what is ready (its dependencies done, at most ``parallel`` at once), notice
each session's end by its exit file, then land (:mod:`.land`) and report
(:mod:`.report`). Every step is written to the run's state before the next one,
so a run killed anywhere continues from there. The loop sleeps between looks (a
quarter second; the board's figures at most once a second): a team of thinking
engineers costs ``team run`` next to no CPU.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..coordination import assignments
from ..core.errors import NotInitialised, RepoStateError, UsageError
from ..core.store import WORKSPACE_REF, Store
from ..integrations.brief import brief as agent_brief
from . import head_tests, land as landing, launcher, report
from .plan import Plan, load_file, validate
from .progress import Activity, Progress
from .state import Engineer, RunDir, RunState, new_run_id
from .stop import end_sessions, orphaned

TICK = 0.25
PROGRESS_EVERY = 1.0
DONE = ("done", "failed", "stopped")
EXIT_NOT_LANDED = 1
EXIT_STOPPED = 143

Listener = Callable[[dict[str, Any]], None]


@dataclass
class Options:
    harness: str = "cmd"  # claude | codex | cmd (a subtask's own "harness" wins)
    harness_cmd: str | None = None
    mode: str | None = None
    test: str | None = None
    parallel: int = 4
    fix_rounds: int = 1
    test_timeout: float | None = None
    session_timeout: float | None = None
    harness_args: list[str] = field(default_factory=list)
    manager: str | None = None
    watch_test: str | None = None  # git storm watch's runner on the shared head (storm mode)


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


def current_mode(store: Store) -> str:
    """``storm.mode`` (the repository must be initialised); read here rather than through
    storm_git.admin.modes, whose import would cost every run's start a fifth of a second."""
    mode = store.config_get("storm.mode")
    if mode is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    return str(mode)


def plan_tree(store: Store, mode: str) -> pygit2.Oid | None:
    """The commit a plan's globs are expanded against: the shared head (storm mode),
    else the branch's."""
    if mode == "storm" and store.ref_target(WORKSPACE_REF) is not None:
        return store.ref_target(WORKSPACE_REF)
    if store.repo.head_is_unborn:
        return None
    oid = store.repo.head.target
    return oid if isinstance(oid, pygit2.Oid) else None


def check_plan(store: Store, data: Any, mode: str, where: str = "the plan") -> Plan:
    return validate(data, store.main_workdir, tree_paths(store, plan_tree(store, mode)), where)


def prepare(store: Store, data: Any, opts: Options, *, where: str = "the plan") -> Team:
    """A new run of ``data`` (a plan, validated here): its folder, state and the engineers'
    assignments. Nothing is started."""
    mode = current_mode(store)
    if opts.mode and opts.mode != mode:
        raise RepoStateError(f"the repository is in {mode} mode, the run asks for {opts.mode}",
                             hint=f"switch first with git storm mode {opts.mode}, or drop --mode")
    plan = check_plan(store, data, mode, where)
    if opts.parallel < 1:
        raise UsageError("--parallel must be at least 1")
    head_tests.check(mode, opts.watch_test)
    harnesses = {s.harness or opts.harness for s in plan.subtasks}
    if "cmd" in harnesses and not opts.harness_cmd:
        raise UsageError("the cmd harness needs --harness-cmd 'SHELL COMMAND'")
    for h in harnesses - {"cmd"}:
        launcher.harness_bin(h)
    if store.repo.head_is_unborn or store.repo.head_is_detached:
        raise RepoStateError("the team lands on a branch: HEAD must be a branch with a commit")
    run = new_run_id()
    rd = RunDir(store.commondir, run)
    rd.create()
    manager = opts.manager or str(store.config_get("storm.manager", "manager") or "manager")
    st = RunState(run=run, task=plan.task, mode=mode, harness=opts.harness, harness_cmd=opts.harness_cmd,
                  test=opts.test, parallel=opts.parallel, fix_rounds=opts.fix_rounds,
                  branch=store.repo.head.shorthand, base_commit=str(store.repo.head.target),
                  base_workspace=str(store.ref_target(WORKSPACE_REF)) if store.ref_target(WORKSPACE_REF) else None)
    st.engineers = [Engineer(f"engineer_{i}", s.id, s.harness or opts.harness)
                    for i, s in enumerate(plan.subtasks, 1)]
    extra = {"test_timeout": opts.test_timeout, "session_timeout": opts.session_timeout,
             "harness_args": opts.harness_args, "manager": manager, "watch_test": opts.watch_test}
    with open(rd.file("plan.json"), "w", encoding="utf-8") as fh:
        import json

        json.dump(plan.to_dict(), fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    with open(rd.file("options.json"), "w", encoding="utf-8") as fh:
        import json

        json.dump(extra, fh)
    for e, s in zip(st.engineers, plan.subtasks, strict=True):
        assignments.assign(store, e.agent, s.files, task=f"{run} {s.id}: {s.title}", by=manager,
                           allow_overlap=True)
    rd.save(st)
    return Team(store, rd, st, plan, extra)


def resume(store: Store, run: str, listeners: list[Listener] | None = None) -> Team:
    """Take a run up again: sessions still running are waited for, sessions that were
    killed or stopped start again, then the run lands as usual."""
    import json

    rd = RunDir(store.commondir, run)
    st = rd.load()
    if launcher.alive(st.runner_pid, st.runner_pstart) and st.runner_pid != os.getpid():
        raise RepoStateError(f"team run {run} is still running (pid {st.runner_pid})",
                             hint=f"watch it (git storm team watch {run}) or stop it (git storm team stop {run})")
    if st.phase == "landed":
        raise UsageError(f"team run {run} has landed already", hint=f"git storm team status {run}")
    plan = validate(load_file(rd.file("plan.json")), store.main_workdir,
                    tree_paths(store, plan_tree(store, st.mode)) + [p for s in _raw_plan(rd) for p in s],
                    rd.file("plan.json"))
    with open(rd.file("options.json"), encoding="utf-8") as fh:
        extra = json.load(fh)
    team = Team(store, rd, st, plan, extra)
    team.listeners.extend(listeners or [])
    for e in st.engineers:
        if e.state in ("running", "waiting"):
            status = launcher.exit_status(team.exit_file(e))
            if status is not None:
                team.ended(e, status)
            elif launcher.alive(e.pid, e.pstart):
                team.emit("adopted", agent=e.agent, pid=e.pid)  # left running by the killed run: waited for
            else:
                e.state, e.why = "queued", "its session was ended with the run"
                team.emit("requeued", agent=e.agent, why=e.why)
        elif e.state in ("failed", "stopped"):
            e.state, e.why, e.exit = "queued", "", None
            team.emit("requeued", agent=e.agent, why="resumed")
    st.problems = []
    return team


def _raw_plan(rd: RunDir) -> list[list[str]]:
    """The plan's literal paths (new files the run may have made since are fine)."""
    data = load_file(rd.file("plan.json"))
    return [[f for f in s.get("files", []) if isinstance(f, str) and not any(c in f for c in "*?[")]
            for s in data.get("subtasks", []) if isinstance(s, dict)]


class Team:
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
        self.ticks: list[Callable[[Team], None]] = []
        self.on_finish: list[Callable[[Team], None]] = []  # before the report is built
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

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        """Drive the run to its end; the exit code of ``team run``."""
        self.st.runner_pid, self.st.runner_pstart = os.getpid(), launcher.proc_start(os.getpid())
        self.st.phase = "running"
        self.save()
        self.emit("run", task=self.st.task, mode=self.st.mode, engineers=len(self.st.engineers),
                  parallel=self.st.parallel)
        for o in orphaned(self.store.commondir, skip=self.st.run):  # found; `team stop RUN` ends them
            self.emit("orphan", **o, hint=f"git storm team stop {o['run']}")
        head_tests.attach(self)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            self.work()
            if self.stopping:
                return self.stop()
            if any(e.state != "done" for e in self.st.engineers):
                return self.finish("failed", "not every subtask was done")
            return self.land()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True

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
                                  holder=a.waiting_on, path=a.on)
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
        data = landing.manager_commit(self.store.main_workdir, message, self.manager, self.test_env())
        # a resumed run whose commit had landed before it was killed: nothing new to commit, the tip has it
        tip = data.get("commit") or str(self.store.ref_target("refs/heads/" + self.st.branch))
        self.st.landed = {"commit": tip, "branch": data.get("branch") or self.st.branch, "agents": data.get("agents"),
                          "writes": data.get("writes"), "paths": data.get("paths")}
        self.emit("landed", **self.st.landed)
        return self.finish("landed", "")

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
                target = rep.get("target") or self.st.branch
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
        tip = self.store.ref_target("refs/heads/" + self.st.branch)
        self.st.landed = {"commit": str(tip), "branch": self.st.branch,
                          "agents": [e.agent for e in self.st.engineers]}
        self.emit("landed", **self.st.landed)
        return self.finish("landed", "")

    def by_sub(self, sid: str) -> Engineer:
        return next(e for e in self.st.engineers if e.subtask == sid)

    def merge(self, agents: list[str]) -> dict[str, Any]:
        self.emit("merging", agents=agents)
        rep = landing.merge(self.store.main_workdir, agents, self.st.test, self.manager, self.test_env(),
                         self.extra.get("test_timeout"))
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
        return 0 if phase == "landed" else EXIT_NOT_LANDED

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
