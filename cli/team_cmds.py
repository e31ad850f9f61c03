"""``git storm team``: plan, run, watch and stop a team of engineer sessions."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option, open_store_here


def _plan_problems(exc: Any, as_json: bool) -> None:
    """A bad plan: one line per problem on stderr (and --json), exit 2."""
    if as_json:
        emit_json({"error": {"kind": "bad_plan", "message": exc.message, "problems": exc.problems,
                             "exit_code": 2}})
    for p in exc.problems:
        click.echo(f"git storm: bad plan: {p}", err=True)
    sys.exit(2)


@cli.group(context_settings=CONTEXT)
def team() -> None:
    """A manager and its engineers in one command: plan, run, watch, stop.

    'plan' asks one read-only manager session of Claude Code or Codex for a
    plan (subtasks with disjoint primary files and dependencies); 'run' starts
    one engineer session per subtask (engineer_1, ...), in dependency order,
    watches them on a board, runs the tests with one fix round, and lands the
    work (storm mode: the manager's commit; worktree mode: the merge in
    dependency order). State, transcripts and the report are kept in
    .git/storm/team/RUN/. See docs/team.md.

    \b
    Example:
      git storm team plan "add retries to the client" --agents 3 --harness claude
      git storm team run --plan plan.json --harness claude --test 'pytest -q'
      git storm team run --plan plan.json --harness-cmd './agent.sh' --mode worktree
      git storm team status --json; git storm team stop
    """


@team.command("plan", context_settings=CONTEXT)
@click.argument("task", required=False)
@click.option("--agents", "-n", type=click.IntRange(1, 64), default=3, show_default=True,
              help="How many engineers the plan is for (at most that many subtasks).")
@click.option("--harness", type=click.Choice(["claude", "codex"]), default="claude", show_default=True,
              help="The harness of the manager's read-only planning session.")
@click.option("--check", "check_file", metavar="FILE", default=None,
              help="Only validate a plan file written by hand (no session).")
@click.option("--timeout", type=float, default=900, show_default=True, help="Seconds the session may take.")
@click.option("--harness-arg", "harness_args", multiple=True, metavar="ARG",
              help="An extra argument for the harness's command line (repeatable).")
@json_option
def team_plan(task: str | None, agents: int, harness: str, check_file: str | None, timeout: float,
              harness_args: tuple[str, ...], as_json: bool) -> None:
    """Make (or check) a plan: subtasks, their primary files and dependencies.

    The manager session reads the repository as the agent team_planner, which
    storm.readOnly names while it runs (storm's hooks refuse its writes), in
    the harness's read-only mode. The plan goes to .git/storm/team/RUN/plan.json,
    to read and edit before 'git storm team run --plan' uses it.

    \b
    Example:
      git storm team plan "split the parser from the CLI" --agents 2 --harness codex
      git storm team plan --check plan.json
    """
    from storm_git.core.errors import UsageError
    from storm_git.team.plan import PlanError, load_file

    store = open_store_here()
    try:
        if check_file:
            from storm_git.team.runner import check_plan, current_mode

            plan = check_plan(store, load_file(check_file), current_mode(store), check_file)
            out = {"ok": True, "path": check_file, "plan": plan.to_dict()}
        else:
            if not task:
                raise UsageError("team plan needs the TASK", hint='git storm team plan "what to do" --agents 3')
            from storm_git.team.planner import plan as make_plan

            made = make_plan(store, task, agents, harness, timeout=timeout, extra=list(harness_args))
            plan, out = made.plan, {"ok": True, "run": made.run, "path": made.path, "plan": made.plan.to_dict(),
                                    "transcript": made.transcript}
    except PlanError as exc:
        _plan_problems(exc, as_json)
        return
    if as_json:
        emit_json(out)
        return
    for s in plan.subtasks:
        deps = f" (after {', '.join(s.depends_on)})" if s.depends_on else ""
        click.echo(f"{s.id}: {s.title}{deps}\n    files: {', '.join(s.files)}")
    click.echo(f"plan: {out['path']}" if "run" in out else f"{out['path']}: a valid plan")


class Board:
    """Prints a run as it goes: JSON event lines, plain event lines, or a live table."""

    def __init__(self, as_json: bool, quiet: bool = False) -> None:
        self.as_json = as_json
        self.quiet = quiet
        self.live = not as_json and not quiet and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self.drawn = 0
        self.recent: list[str] = []
        self.last = 0.0

    def event(self, ev: dict[str, Any]) -> None:
        from storm_git.team.board import event_line

        if self.as_json:
            click.echo(json.dumps(ev, ensure_ascii=False))
        elif self.live:
            self.recent = (self.recent + [event_line(ev)])[-6:]
        elif not self.quiet:
            click.echo(event_line(ev))

    def tick(self, team: Any, force: bool = False) -> None:
        if not self.live or (not force and time.monotonic() - self.last < 1.0):
            return
        from storm_git.team.board import snapshot, table

        self.last = time.monotonic()
        lines = table(snapshot(team.store, team.st, team.activity)) + [""] + self.recent
        out = (f"\x1b[{self.drawn}F" if self.drawn else "") + "".join(f"\x1b[2K{line}\n" for line in lines)
        click.echo(out, nl=False)
        self.drawn = len(lines)


def _options(harness: str | None, harness_cmd: str | None, **kw: Any) -> Any:
    from storm_git.team.runner import Options

    return Options(harness="cmd" if harness_cmd and not harness else (harness or "claude"), harness_cmd=harness_cmd,
                   **kw)


@team.command("run", context_settings=CONTEXT)
@click.argument("plan_or_task", required=False, metavar="[PLAN | TASK]")
@click.option("--plan", "plan_file", metavar="FILE", default=None, help="The plan (JSON) to run.")
@click.option("--harness", type=click.Choice(["claude", "codex", "cmd"]), default=None,
              help="The engineers' harness (default: claude; cmd with --harness-cmd). A subtask's own "
                   "'harness' key wins (a mixed team).")
@click.option("--harness-cmd", metavar="'SHELL COMMAND'", default=None,
              help="Any agent program, run with sh -c in the engineer's working tree, with STORM_AGENT, "
                   "STORM_TEAM_SUBTASK, STORM_TEAM_BRIEF (its prompt's file) and STORM_TEAM_RUN set.")
@click.option("--mode", type=click.Choice(["storm", "worktree"]), default=None,
              help="Must be the repository's mode (git storm mode switches it).")
@click.option("--test", "test_cmd", metavar="CMD", default=None,
              help="The test gate on the integrated result (sh -c).")
@click.option("--watch-test", "watch_test", metavar="CMD", default=None,
              help="Storm mode: run git storm watch's test runner with CMD on the shared head while the "
                   "engineers work (the tests it picks are appended to CMD, as pytest takes them); a semantic "
                   "conflict or break it finds is told to the engineers involved and is in the board and report.")
@click.option("--parallel", "-j", type=click.IntRange(1, 64), default=4, show_default=True,
              help="At most this many sessions at once.")
@click.option("--fix-rounds", type=click.IntRange(0, 5), default=1, show_default=True,
              help="Rounds in which a test failure goes back to the engineers whose files it names.")
@click.option("--test-timeout", type=float, default=None, metavar="SECONDS", help="Stop the tests after this.")
@click.option("--session-timeout", type=float, default=None, metavar="SECONDS",
              help="End a session that runs longer (it counts as failed).")
@click.option("--harness-arg", "harness_args", multiple=True, metavar="ARG",
              help="An extra argument for Claude Code's or Codex's command line (repeatable).")
@click.option("--agents", "-n", type=click.IntRange(1, 64), default=3, show_default=True,
              help="With a TASK: engineers the manager plans for.")
@click.option("--resume", "resume_run", metavar="RUN", default=None,
              help="Continue a run that was killed or stopped.")
@click.option("--branch", "-b", "land_branch", metavar="NAME", default=None,
              help="Land on this branch (new, or at the start's commit) instead of the current one: storm "
                   "mode switches to it for the manager's commit, worktree mode merges into it.")
@click.option("--push", "push_remote", is_flag=False, flag_value="origin", default=None, metavar="[REMOTE]",
              help="After landing, push the branch it landed on to REMOTE (default origin); exit 4 if refused.")
@click.option("--quiet", "-q", is_flag=True, help="No board; only the final line.")
@json_option
def team_run(plan_or_task: str | None, plan_file: str | None, harness: str | None, harness_cmd: str | None,
             mode: str | None, test_cmd: str | None, watch_test: str | None, parallel: int, fix_rounds: int,
             test_timeout: float | None, session_timeout: float | None, harness_args: tuple[str, ...], agents: int,
             resume_run: str | None, land_branch: str | None, push_remote: str | None, quiet: bool,
             as_json: bool) -> None:
    """Run a plan: one engineer session per subtask, then the tests, then land.

    Exit 0 when every subtask is done, the tests pass and the work has landed
    (storm mode: the manager's commit on the branch; worktree mode: every
    engineer's branch merged in dependency order); 1 when it did not land (the
    report says why); 2 a bad plan or option; 4 landed but the push was
    refused; 143 stopped.

    \b
    Example:
      git storm team run --plan plan.json --harness-cmd 'python3 agent.py' --test 'pytest -q'
      git storm team run --plan plan.json --harness claude --test 'pytest -q' --watch-test 'pytest -q'
      git storm team run --plan plan.json --harness claude --parallel 3
      git storm team run "add a --verbose flag" --agents 2 --harness codex
      git storm team run --plan plan.json --harness claude --branch team/retries --push
      git storm team run --resume 20261201-101500-ab12
    """
    from storm_git.core.errors import UsageError
    from storm_git.team import runner
    from storm_git.team.plan import PlanError, load_file

    store = open_store_here()
    board = Board(as_json, quiet)
    try:
        if resume_run:
            from storm_git.team.state import check_run_id

            t = runner.resume(store, check_run_id(resume_run), [board.event])
        else:
            path = plan_file
            if path is None and plan_or_task and os.path.isfile(plan_or_task):
                path = plan_or_task
            if path is None:
                if not plan_or_task:
                    raise UsageError("team run needs --plan FILE or a TASK",
                                     hint="git storm team run --plan plan.json --harness claude")
                if harness not in (None, "claude", "codex") or harness_cmd:
                    raise UsageError("a TASK is planned by a Claude Code or Codex manager session",
                                     hint="write a plan for --harness-cmd, or pick --harness claude|codex")
                from storm_git.team.planner import plan as make_plan

                made = make_plan(store, plan_or_task, agents, harness or "claude", extra=list(harness_args))
                path = made.path
                board.event({"time": time.time(), "event": "planned", "path": path, "run": made.run})
            opts = _options(harness, harness_cmd, mode=mode, test=test_cmd, parallel=parallel, fix_rounds=fix_rounds,
                            test_timeout=test_timeout, session_timeout=session_timeout,
                            harness_args=list(harness_args), branch=land_branch, push=push_remote,
                            watch_test=watch_test)
            t = runner.prepare(store, load_file(path), opts, where=path)
    except PlanError as exc:
        _plan_problems(exc, as_json)
        return
    if board.event not in t.listeners:
        t.listeners.append(board.event)
    t.ticks.append(board.tick)
    code = t.run()
    board.tick(t, force=True)
    if not as_json:
        click.echo(f"team run {t.st.run}: {t.st.phase}" + (f" ({'; '.join(t.st.problems)})" if t.st.problems else "")
                   + f"; report: {t.rd.file('report.md')}", err=code != 0)
    sys.exit(code)


def _which(store: Any, run: str | None) -> str:
    from storm_git.team.state import check_run_id, latest

    return check_run_id(run) if run else latest(store.commondir)


@team.command("status", context_settings=CONTEXT)
@click.argument("run", required=False)
@click.option("--all", "all_", is_flag=True, help="List every run of this repository.")
@json_option
def team_status(run: str | None, all_: bool, as_json: bool) -> None:
    """A run's engineers, their subtasks, states and progress (default: the latest run).

    A session still alive while its 'team run' is not is marked orphaned:
    'git storm team stop' ends it, 'git storm team run --resume' waits for it.

    \b
    Example:
      git storm team status
      git storm team status 20261201-101500-ab12 --json
      git storm team status --all
    """
    from storm_git.team.board import snapshot, table
    from storm_git.team.progress import Progress
    from storm_git.team.state import RunDir, runs

    store = open_store_here()
    if all_:
        from storm_git.team.stop import orphaned

        left = orphaned(store.commondir)
        rows: list[dict[str, Any]] = []
        for r in runs(store.commondir):
            st = RunDir(store.commondir, r).load()
            rows.append({"run": r, "task": st.task, "mode": st.mode, "phase": st.phase,
                         "engineers": len(st.engineers),
                         "orphaned": [o["agent"] for o in left if o["run"] == r]})
        if as_json:
            emit_json({"runs": rows})
        else:
            for row in rows:
                orphans = f"  orphaned: {', '.join(map(str, row['orphaned']))}" if row["orphaned"] else ""
                click.echo(f"{row['run']}  {row['phase']:<8} {row['mode']:<8} {row['engineers']} engineer(s)  "
                           f"{row['task']}{orphans}")
        return
    rd = RunDir(store.commondir, _which(store, run))
    st = rd.load()
    branches = {}
    if st.mode == "worktree":
        from storm_git.worktree.worktrees import branch_for

        branches = {e.agent: branch_for(store, e.agent) for e in st.engineers}
    acts = Progress(store, [e.agent for e in st.engineers], since=st.started, base_workspace=st.base_workspace,
                    base_commit=st.base_commit, mode=st.mode, branches=branches).get()
    snap = snapshot(store, st, acts)
    snap["dir"] = rd.path
    if as_json:
        emit_json(snap)
    else:
        click.echo("\n".join(table(snap)))
        for e in snap["engineers"]:
            if e["orphaned"]:
                click.echo(f"{e['agent']}: session pid {e['pid']} outlived its run (git storm team stop {st.run})")
        click.echo(f"state: {rd.path}")


@team.command("watch", context_settings=CONTEXT)
@click.argument("run", required=False)
@json_option
def team_watch(run: str | None, as_json: bool) -> None:
    """Follow a run from another terminal until it ends: its events as they come.

    \b
    Example:
      git storm team watch
      git storm team watch 20261201-101500-ab12 --json
    """
    from storm_git.team import launcher
    from storm_git.team.board import event_line
    from storm_git.team.state import RunDir

    store = open_store_here()
    rd = RunDir(store.commondir, _which(store, run))
    offset = 0
    while True:
        evs, offset = rd.events(offset)
        for ev in evs:
            click.echo(json.dumps(ev, ensure_ascii=False) if as_json else event_line(ev))
        st = rd.load()
        if not launcher.alive(st.runner_pid, st.runner_pstart):
            evs, offset = rd.events(offset)
            for ev in evs:
                click.echo(json.dumps(ev, ensure_ascii=False) if as_json else event_line(ev))
            if not as_json:
                click.echo(f"team run {st.run}: {st.phase}")
            return
        time.sleep(0.5)


@team.command("stop", context_settings=CONTEXT)
@click.argument("run", required=False)
@json_option
def team_stop(run: str | None, as_json: bool) -> None:
    """End a run's sessions by their process ids and leave the shared state consistent.

    Its 'team run' is asked to stop first; sessions that outlived a killed run
    are ended too (their process groups: SIGTERM, then SIGKILL), and the
    reservations they held are released. Transcripts are kept; 'git storm team
    run --resume RUN' continues the run.

    \b
    Example:
      git storm team stop
      git storm team stop 20261201-101500-ab12 --json
    """
    from storm_git.team.state import RunDir
    from storm_git.team.stop import stop_run

    store = open_store_here()
    rid = _which(store, run)
    rd = RunDir(store.commondir, rid)

    def emit(kind: str, **data: Any) -> None:
        rd.event(kind, **data)

    res = stop_run(store, rid, emit)
    if as_json:
        emit_json(res)
    else:
        click.echo(f"team run {rid}: {res['phase']}; ended {', '.join(res['ended']) or 'no session'}")
