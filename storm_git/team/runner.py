"""A team run: engineers started in dependency order, watched, and their work landed.

:func:`prepare` makes a run from a validated plan (its folder, the engineers'
assignments through ``assign``), :func:`resume` takes a run up again after
``team run`` was killed or stopped, and :meth:`Team.run` drives it to the end: the
loop and the sessions (:mod:`.sessions`), then landing (:mod:`.lander`) and the
report (:mod:`.base`). Every step is written to the run's state before the next
one, so a run killed anywhere continues from there.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..coordination import assignments
from ..core.errors import NotInitialised, RepoStateError, UsageError
from ..core.store import WORKSPACE_REF, Store
from . import head_tests, launcher, publish
from .base import EXIT_NOT_LANDED, EXIT_NOT_PUSHED, EXIT_STOPPED, Listener, tree_paths
from .lander import Lander
from .plan import Plan, load_file, validate
from .state import Engineer, RunDir, RunState, new_run_id
from .stop import orphaned

__all__ = ["EXIT_NOT_LANDED", "EXIT_NOT_PUSHED", "EXIT_STOPPED", "Options", "Team", "check_plan", "current_mode",
           "plan_tree", "prepare", "resume", "tree_paths"]


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
    branch: str | None = None  # land here instead of the branch the run starts on
    push: str | None = None  # push the landed branch to this remote
    watch_test: str | None = None  # git storm watch's runner on the shared head (storm mode)


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
    start = str(store.repo.head.target)
    if opts.branch:
        publish.check_branch(store, opts.branch, start)
    if opts.push:
        publish.check_remote(store, opts.push)
    run = new_run_id()
    rd = RunDir(store.commondir, run)
    rd.create()
    manager = opts.manager or str(store.config_get("storm.manager", "manager") or "manager")
    st = RunState(run=run, task=plan.task, mode=mode, harness=opts.harness, harness_cmd=opts.harness_cmd,
                  test=opts.test, parallel=opts.parallel, fix_rounds=opts.fix_rounds,
                  branch=store.repo.head.shorthand, base_commit=str(store.repo.head.target),
                  base_workspace=str(store.ref_target(WORKSPACE_REF)) if store.ref_target(WORKSPACE_REF) else None,
                  land_branch=opts.branch or "", push=opts.push)
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
    if mode == "worktree" and opts.branch:
        publish.create_branch(store.main_workdir, opts.branch, start)  # the merges' target, from the start
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


class Team(Lander):
    """One run being driven by this process: started, watched, landed, ended."""

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
