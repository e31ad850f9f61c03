"""``git storm watch``: the shared head's tests as writes land (storm_git.testwatch)."""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option, open_store_here


@cli.command(context_settings=CONTEXT)
@click.option("--test", "test_cmd", metavar="CMD", default=None,
              help="The test command, run by the shell in an export of the head (storm.watch.test). The tests "
                   "to run are appended to it, or given in $STORM_TESTS when it names that variable.")
@click.option("--quiet", "quiet_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Test once writes have been quiet this long (storm.watch.quietSeconds, default 3).")
@click.option("--every", type=click.IntRange(min=1), default=None, metavar="K",
              help="...or after K writes, however busy (storm.watch.every, default 10).")
@click.option("--full-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Every N-th round runs every test (storm.watch.fullEvery, default 10).")
@click.option("--tests", "tests_glob", default=None, metavar="GLOBS",
              help="Which files are tests, space-separated globs (storm.watch.tests); a full run then names "
                   "every one. Default: test_*.py *_test.py, and a full run is the command as given.")
@click.option("--once", is_flag=True, help="Test the head now if it is untested, then exit.")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Exit after this many rounds.")
@click.option("--status", "show", is_flag=True, help="Print the head's test state and the notices, then exit.")
@click.option("--while-pid", "while_pid", type=click.IntRange(min=1), default=None, metavar="PID",
              help="Run only while process PID does: when it ends, stop the round's tests and exit (git storm "
                   "team run starts its runner so).")
@json_option
def watch(test_cmd: str | None, quiet_s: float | None, every: int | None, full_every: int | None,
          tests_glob: str | None, once: bool, rounds: int | None, show: bool, while_pid: int | None,
          as_json: bool) -> None:
    """Run the tests on the shared head as writes land, and tell the agents who broke one.

    Each round exports the head (never the shared working tree) and runs the
    tests the changed files can affect (the Python import graph), everything
    every N-th round or when no graph applies. A test that passed and fails
    now is re-run (passing again: flaky, blamed on nobody), then traced by
    bisection to the first write that makes it fail: with that write alone it
    fails (a break), or it passes with each of two writes alone and fails with
    both (a semantic conflict). The agents involved hear it once, on their next
    call (hook, MCP, command line); 'git storm status' and 'log' show it. A test
    red before any agent wrote is never blamed. Takes none of storm's locks:
    run it beside the agents (another terminal, or '&'). One line per round.
    SIGTERM stops the round's tests and exits 143.

    \b
    Example:
      git storm watch --test 'python -m pytest -q -x'
      git storm watch --test 'python -m pytest -q' --quiet 5 --every 20 &
      git storm watch --once --json
      git storm watch --status
    """
    from storm_git.testwatch import report
    from storm_git.testwatch.watcher import WatchConfig, Watcher, tether

    store = open_store_here()
    commondir = store.commondir
    if show:
        data = report.head_test_state(commondir)
        if as_json:
            emit_json(data)
        else:
            click.echo(report.status_text(commondir) or "tests: no round yet (git storm watch --test CMD)")
        return
    given: dict[str, Any] = {"quiet_s": quiet_s, "every": every, "full_every": full_every}
    if tests_glob:
        given.update(tests=tuple(tests_glob.split()), universe=True)
    cfg = WatchConfig.from_git(store.repo, test_cmd, **given)
    w = Watcher(store.repo, commondir, cfg)

    def stop(signum: int, _frame: Any) -> None:
        w.tests.kill()  # the tests run in a session of their own: they would outlive the runner
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if while_pid is not None:
        tether(while_pid, lambda: os.kill(os.getpid(), signal.SIGTERM))

    def said(rep) -> None:
        if as_json:
            click.echo(json.dumps(rep.to_dict()))
        else:
            kinds = ", ".join(f"{f['kind']} {f['test']}" for f in rep.findings)
            click.echo(f"round {rep.round} on {rep.head[:10]}: {'full' if rep.full else 'affected'} "
                       f"({rep.why}), {rep.ran} tests, {len(rep.failed)} failing"
                       + (f", flaky {', '.join(rep.flaky)}" if rep.flaky else "")
                       + (f"; {kinds}" if kinds else "") + f" [{rep.seconds:.1f}s]")
        sys.stdout.flush()

    try:
        w.loop(once=once, rounds=rounds, on_round=said)
    except KeyboardInterrupt:
        pass
