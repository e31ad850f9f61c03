"""The conflict radar of worktree mode: ``git storm radar [AGENT]`` (storm_git.worktree.radar)."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option


def commit_radar_lines(res: Any) -> str:
    """The warning ``git storm commit`` prints (stderr) after an agent's commit in worktree mode."""
    from storm_git.worktree.radar import format_warning

    agent = res.agents[0] if res.agents else "the agent"
    return format_warning(agent, res.radar).rstrip("\n")


@cli.command(context_settings=CONTEXT)
@click.argument("agent_id", required=False, metavar="[AGENT]")
@click.option("--short", "-s", is_flag=True, help="One line per file, without diffs and hunks.")
@json_option
def radar(agent_id: str | None, short: bool, as_json: bool) -> None:
    """Which files an agent read or wrote another agent's branch changed (worktree mode).

    For AGENT (default: every agent with a branch): each file in its read set,
    changed on its branch or uncommitted in its worktree, that another agent's
    branch changed (commits not yet on the target) or that the target gained
    since AGENT forked. Each hit shows the other side's diff from the merge base
    and whether an in-memory three-way merge conflicts on it, with the conflict
    hunks. Advisory: nothing is merged or changed, exit 0. The same warning is
    printed at an agent's commit, and 'git storm status' has a short section.

    \b
    Example:
      git storm radar engineer_1
      git storm radar --short
      git storm radar --json
    """
    from storm_git.cli.app import open_store_here, require_worktree_mode
    from storm_git.core.agents import validate_agent
    from storm_git.worktree.radar import render_hit, scan

    store = open_store_here()
    require_worktree_mode(store)
    rep = scan(store, [validate_agent(agent_id)] if agent_id else None)
    if as_json:
        emit_json(rep.to_dict())
        return
    if not rep.hits:
        who = agent_id or ", ".join(rep.agents) or "no agent"
        click.echo(f"radar: nothing {who} read or wrote was changed by another agent")
        return
    current = None
    for h in rep.hits:
        if h.agent != current:
            current = h.agent
            n = sum(1 for x in rep.hits if x.agent == current)
            click.echo(f"{current}: {n} file(s) changed elsewhere")
        d = h.to_dict()
        click.echo("\n".join(render_hit(d)[:1] if short else render_hit(d)))


def test_failure_lines(r: Any, target: str) -> list[str]:
    """A merge-queue agent whose candidate failed its test: status line and output tail."""
    t = r.test or {}
    how = "timed out" if t.get("timed_out") else f"exit {t.get('returncode')}"
    out = [f"  test failed {r.agent} ({r.branch} {r.tip[:10]}): {t.get('command')} ({how}, "
           f"{t.get('seconds', 0):.1f}s); not merged, {target} not changed by it"]
    tail = (t.get("tail") or "").rstrip("\n")
    if tail:
        out.append("    output (tail):")
        out.extend(f"      {line}" for line in tail.split("\n"))
    return out


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops storm like Ctrl-C, so a running merge queue removes its scratch worktree."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
