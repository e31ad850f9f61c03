"""``git storm simulate``: the same work in storm mode and in worktree mode, measured."""
from __future__ import annotations

import sys

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option


def _numbers(kind: type, text: str | None, option: str) -> tuple:
    if not text:
        return ()
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers", param_hint=option) from None


def _seed(text: str) -> int | None:
    if text.strip().lower() == "race":
        return None
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a whole number nor 'race'", param_hint="--seed") from None


@cli.command(context_settings=CONTEXT)
@click.option("--repo", metavar="PATH", default=None,
              help="Replay this repository's history (default with --range: the current one).")
@click.option("--range", "rng", metavar="A..B", default=None,
              help="The commits to replay: first-parent commits of A..B, dealt round-robin to the agents "
                   "(default: HEAD's last --max-commits commits).")
@click.option("--scenarios", is_flag=True,
              help="Run the scenario suite: signature, rename, rename-late, fields, registry, cycle, ripple, "
                   "disjoint (control) and the coupling sweep.")
@click.option("--only", metavar="NAME[,NAME...]", default=None,
              help="Run only these scenarios (names as listed above; 'coupling' for the sweep).")
@click.option("--agents", metavar="K[,K...]", default=None,
              help="Number(s) of agents, e.g. 4 or 2,4,8 (default: replay 4; scenarios 2,4,8; --quick 2).")
@click.option("--coupling", metavar="F[,F...]", default=None,
              help="Coupling sweep: fraction of agents that also edit one shared file (default 0,0.25,0.5,1).")
@click.option("--test-cmd", metavar="CMD", default=None,
              help="Shell command that tests a replay's integrated result (run in an export of it). "
                   "Scenarios bring their own test.")
@click.option("--deps", type=click.Choice(["full", "auto", "both"]), default="full", show_default=True,
              help="Storm mode's validation scope: the whole read set, the computed dependency scope, or both "
                   "side by side.")
@click.option("--mode", "modes", type=click.Choice(["storm", "worktree", "both"]), default="both",
              show_default=True, help="Which mode(s) to run.")
@click.option("--max-commits", type=click.IntRange(1, 1000), default=None,
              help="Replay at most this many commits, the first of the range (default 40; --quick: 8).")
@click.option("--seed", metavar="N|race", default="0", show_default=True,
              help="Replay: the agents of a round write one after another in an order shuffled with N "
                   "(reproducible: compare scopes or versions on the same interleaving); 'race': all at once.")
@click.option("--out", metavar="DIR", default=None,
              help="Write report.json, report.md and PNG plots (matplotlib) into DIR.")
@click.option("--quick", is_flag=True,
              help="A small run (under a minute on 2 cores): the scenarios with 2 agents, no coupling sweep; "
                   "with --repo, 8 commits (unless --max-commits says otherwise).")
@click.option("--pairs", "pairs_dir", metavar="DIR", default=None,
              help="Replay feature pairs (CooperBench's layout: task folders with setup.sh naming BASE_COMMIT, "
                   "feature<K>/feature.patch and tests.patch) on --repo: each pair by two agents working "
                   "through the git storm CLI, in worktree mode, storm mode, and storm mode accepting rebased "
                   "changes.")
@click.option("--tasks", metavar="NAME[,NAME...]", default=None,
              help="With --pairs: only these task folders (task2800 or 2800).")
@click.option("--features", metavar="K[,K...]", default=None,
              help="With --pairs: only pairs among these feature numbers.")
@click.option("--shard", metavar="I/N", default="1/1", show_default=True,
              help="With --pairs: only the I-th of every N pairs (a long run split over processes).")
@click.option("--run-tests", is_flag=True,
              help="With --pairs: run each feature's tests (its tests.patch applied, pytest on the files it "
                   "touches) on every result integrated without a conflicting hunk, and on the feature alone.")
@json_option
def simulate(repo: str | None, rng: str | None, scenarios: bool, only: str | None, agents: str | None, coupling: str | None,
             test_cmd: str | None, deps: str, modes: str, max_commits: int | None, seed: str, out: str | None,
             quick: bool, pairs_dir: str | None, tasks: str | None, features: str | None, shard: str,
             run_tests: bool, as_json: bool) -> None:
    """Run the same work in storm mode and in worktree mode, and measure both.

    One real process per agent, a fresh temporary repository per run. Storm
    mode: agents read and write through the shared workspace; a rejected agent
    re-reads and re-applies its change (three-way merge). Worktree mode: each
    agent commits on its own branch; the manager merges, and a conflicted agent
    syncs and re-applies its change. Measured: conflicts caught at write, at
    merge, by tests; paths that differ from the reference (a replay: the
    history's end) with no test failing; lost updates (checked against the final tree; must
    be 0); needed and needless rejections; re-reads; reservation waits; wall
    time; the final test.

    \b
    Example:
      git storm simulate --quick --out sim-report
      git storm simulate --scenarios --agents 2,4,8 --out sim-reports/scenarios
      git storm simulate --repo . --range HEAD~20..HEAD --agents 4 \\
          --test-cmd 'python -m compileall -q .' --out sim-replay
      git storm simulate --repo . --quick   # HEAD~8..HEAD
      git storm simulate --pairs cooperbench-click --repo click --run-tests --out sim-pairs

    With --pairs, --test-cmd runs in an export of each result after the feature's
    tests.patch is applied, $STORM_TEST_FILES naming the test files it touches.
    """
    if pairs_dir is not None:
        _simulate_pairs(pairs_dir, repo, tasks, features, modes, run_tests, test_cmd, _shard(shard), out, as_json)
        return
    from storm_git.sim import report as rep
    from storm_git.sim.suite import Plan, simulate as run_plan

    plan = Plan(repo=repo, rng=rng, scenarios=scenarios, agents=_numbers(int, agents, "--agents"),
                coupling=_numbers(float, coupling, "--coupling"), test_cmd=test_cmd, deps=deps,
                modes=("storm", "worktree") if modes == "both" else (modes,), quick=quick,
                max_commits=max_commits, only=tuple(x.strip() for x in (only or "").split(",") if x.strip()),
                seed=_seed(seed))

    def started(name: str, agents: int, mode: str, scope: str) -> None:
        click.echo(f"simulate: {name}, {agents} agents, in {mode} mode" + (f" (deps {scope})" if mode == "storm" else "") + " …",
                   err=True, nl=False)

    def finished(m) -> None:
        tests = "" if m.test_passed is None else (" tests pass" if m.test_passed else " tests FAIL")
        click.echo(f" {m.wall_s:.1f}s, {m.rejections} rejection(s), {m.caught_at_merge} merge conflict(s),"
                   f"{tests}" + (f"; agent errors: {m.agent_errors}" if m.agent_errors else ""), err=True)

    result = run_plan(plan, on_run=finished, on_start=started)
    data = result.to_dict()
    _finish(data, rep.write(data, out) if out else None, out, as_json,
            rep.markdown(data).split("## Definitions", 1)[0].rstrip(),
            sum(r.lost_updates for r in result.runs), sum(len(r.agent_errors) for r in result.runs), "agent error(s)")


def _finish(data: dict, written: dict | None, out: str | None, as_json: bool, summary: str, lost: int,
            errors: int, errors_are: str) -> None:
    """Print the report (JSON or its Markdown summary); exit 1 on lost updates or agent errors."""
    if written and written["plots_skipped"]:
        click.echo(f"simulate: {written['plots_skipped']}", err=True)
    if as_json:
        emit_json(dict(data, written=written))
    else:
        click.echo(summary)
        if written:
            click.echo(f"\nreport: {', '.join(written['files'])} in {out}")
    if lost or errors:
        click.echo(f"git storm: {lost} lost update(s), {errors} {errors_are} in the simulation "
                   "(a bug in storm or the simulator: report it with the JSON)", err=True)
        sys.exit(1)


def _shard(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    if not (i.strip().isdigit() and n.strip().isdigit()) or not 1 <= int(i) <= int(n):
        raise click.BadParameter(f"{text!r} is not I/N with 1 <= I <= N, e.g. 2/3", param_hint="--shard")
    return int(i), int(n)


def _simulate_pairs(pairs_dir: str, repo: str | None, tasks: str | None, features: str | None, modes: str,
                    run_tests: bool, test_cmd: str | None, shard: tuple[int, int], out: str | None,
                    as_json: bool) -> None:
    from storm_git.sim import pairs, pairs_report

    if repo is None:
        raise click.UsageError("--pairs needs --repo: the repository holding the tasks' base commits")
    chosen = pairs.MODES if modes == "both" else tuple(m for m in pairs.MODES if m.split("+")[0] == modes)

    if out:  # each pair as it is done: a run cut short keeps what it measured
        import os

        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, pairs_report.PROGRESS), "w").close()

    def done(pr) -> None:
        if out:
            pairs_report.append_pair(out, pr)
        cells = ", ".join(f"{m}: {r.caught}" + (f" ({r.rebased_accepted} rebased)" if r.rebased_accepted else "")
                          + (" SEMANTIC" if r.semantic else "") + (f" ERROR {r.errors[0]}" if r.errors else "")
                          for m, r in pr.modes.items())
        click.echo(f"simulate: {pr.task} f{pr.f1}+f{pr.f2}: {cells}", err=True)

    result = pairs.simulate(pairs_dir, repo, tasks=tuple(x.strip() for x in (tasks or "").split(",") if x.strip()),
                            features=_numbers(int, features, "--features"), modes=chosen, run_tests=run_tests,
                            test_cmd=test_cmd, shard=shard, on_pair=done)
    data = result.to_dict()
    totals = data["totals"].values()
    _finish(data, pairs_report.write(data, out) if out else None, out, as_json,
            pairs_report.markdown(data).split("## Every pair", 1)[0].rstrip(),
            int(sum(t["lost_updates"] for t in totals)), int(sum(t["errors"] for t in totals)), "run(s) with agent errors")
