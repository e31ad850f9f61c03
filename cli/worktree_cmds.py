"""Commands of worktree mode and mode switching: mode, spawn, merge, assign, cleanup."""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option, open_store_here, require_worktree_mode
from storm_git.core.paths import quoted


def _by(agent: str | None) -> str:
    from storm_git.core.agents import validate_agent

    return validate_agent(agent or os.environ.get("STORM_AGENT") or "manager")


def _manager_option(f):
    return click.option("--agent", "-a", metavar="ID", default=None,
                        help="Who does this, for the log (default: $STORM_AGENT, else 'manager').")(f)


# -- mode -------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("new", required=False, type=click.Choice(["storm", "worktree"]), metavar="[storm|worktree]")
@click.option("--force", is_flag=True, help="Switch even though the current mode has work not integrated.")
@click.option("--into", metavar="BRANCH", default=None,
              help="The target branch 'integrated' refers to (default: storm.target, else the checked-out branch).")
@_manager_option
@json_option
def mode(new: str | None, force: bool, into: str | None, agent: str | None, as_json: bool) -> None:
    """Show or switch storm.mode for this repository.

    storm: one shared workspace, validated writes. worktree: one worktree and
    branch per agent, merged at the end. A switch is refused (exit 3) while the
    current mode has work not integrated into the target branch (storm: the
    shared head differs from the branch; worktree: unmerged agent branches or
    uncommitted changes in their worktrees), naming it, unless --force. The
    switch is recorded in the log.

    \b
    Example:
      git storm mode                 # show, with anything not integrated
      git storm mode worktree
      git storm mode storm --force
      git storm mode --into main     # with a detached HEAD: name the target
    """
    from storm_git.admin import modes

    store = open_store_here()
    res = modes.show(store, into=into) if new is None else modes.switch(store, new, force=force, by=_by(agent),
                                                                         into=into)
    if as_json:
        emit_json(res.to_dict())
        return
    if new is None:
        click.echo(f"mode: {res.mode} (target branch {res.target})")
        if res.unintegrated:
            click.echo("not integrated:")
            for line in res.unintegrated:
                click.echo(f"  {line}")
        else:
            click.echo(f"everything is integrated into {res.target}")
    elif not res.changed:
        click.echo(f"already in {res.mode} mode")
    else:
        forced = f" (forced past: {'; '.join(res.unintegrated)})" if res.forced else ""
        synced = f"; shared workspace continues from {res.target} ({res.synced[:10]})" if res.synced else ""
        click.echo(f"mode: {res.previous} -> {res.mode}{forced}{synced}")


# -- spawn ------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("agent_id", metavar="AGENT")
@click.option("--base", metavar="REF", default=None,
              help="Start the branch from REF (default: the target branch, the integrated state).")
@click.option("--reuse", is_flag=True,
              help="Use an existing branch or worktree of AGENT (after a crash, or one checked out elsewhere).")
@_manager_option
@json_option
def spawn(agent_id: str, base: str | None, reuse: bool, agent: str | None, as_json: bool) -> None:
    """Create AGENT's worktree and branch (worktree mode). Idempotent.

    The branch is storm/AGENT (storm.branchPrefix) from the target branch;
    the worktree goes to .git/storm/worktrees/AGENT (storm.worktreeDir), never
    among the main working tree's files. Untracked files matching
    storm.copyUntracked globs (e.g. .env) are copied in. A branch checked out
    elsewhere, a leftover directory or a stale worktree record is refused with
    the way out (--reuse, git storm cleanup).

    \b
    Example:
      git config --add storm.copyUntracked .env
      git storm spawn engineer_1
      cd "$(git storm spawn engineer_1 --json | jq -r .path)"
    """
    from storm_git.worktree.worktrees import spawn as do_spawn

    store = open_store_here()
    require_worktree_mode(store)
    res = do_spawn(store, agent_id, base=base, reuse=reuse, by=_by(agent))
    if as_json:
        emit_json(res.to_dict())
        return
    what = "created" if res.created else "exists"
    copied = f"; copied {', '.join(res.copied)}" if res.copied else ""
    click.echo(f"{res.agent}: {what} {res.branch} @ {res.head[:10]} at {res.path}{copied}")


# -- merge ------------------------------------------------------------------------------
def _indent(text: str | None, prefix: str = "      ") -> list[str]:
    if text is None:
        return [prefix + "(binary)"]
    if text == "":
        return [prefix + "(nothing)"]
    return [prefix + line for line in text.rstrip("\n").split("\n")]


def render_merge(rep: Any) -> str:
    out = [f"merge into {rep.target} ({rep.strategy}): {rep.before[:10]} -> {rep.after[:10]}"
           + (" [dry run: target not moved]" if rep.dry_run else "")]
    if not rep.results:
        out.append("  nothing to merge")
    for r in rep.results:
        if r.status == "up_to_date":
            out.append(f"  up to date  {r.agent} ({r.branch} {r.tip[:10]})")
            continue
        if r.status == "merged":
            files = ", ".join(f"{c['status']} {c['path']}" for c in r.files_changed[:10])
            more = f" (+{len(r.files_changed) - 10})" if len(r.files_changed) > 10 else ""
            tested = f", test passed in {r.test['seconds']:.1f}s" if r.test else ""
            out.append(f"  merged      {r.agent} ({r.branch} {r.tip[:10]}) as {r.commit[:10]}: "
                       f"{len(r.files_changed)} file(s) {files}{more}{tested}")
        elif r.status == "test_failed":
            from storm_git.cli.radar_cmds import test_failure_lines

            out.extend(test_failure_lines(r, rep.target))
        else:
            out.append(f"  conflicted  {r.agent} ({r.branch} {r.tip[:10]}): {len(r.conflicts)} path(s); "
                       f"merge aborted, {rep.target} not changed by it")
        for c in r.conflicts:
            how = f", resolved: {c.resolution}" if c.resolution else ""
            out.append(f"    {quoted(c.path)} ({c.kind}{how}): {len(c.hunks)} hunk(s)")
            for h in c.hunks:
                lost = f" [{h.overridden} side overridden]" if h.overridden else ""
                out.append(f"    @@ line {h.ours_line}{lost}")
                out.append("      ancestor:")
                out.extend(_indent(h.ancestor, "        "))
                out.append(f"      ours ({rep.target}):")
                out.extend(_indent(h.ours, "        "))
                out.append(f"      theirs ({r.branch}):")
                out.extend(_indent(h.theirs, "        "))
    if rep.queue:
        deps = "; ".join(f"{a} after {', '.join(d)}" for a, d in rep.queue["depends_on"].items())
        out.insert(1, f"  order ({rep.queue['ordered_by']}): {', '.join(rep.queue['order']) or '-'}"
                      + (f" [{deps}]" if deps else "") + f"; each candidate tested with: {rep.queue['command']}")
    if rep.updated:
        out.append(f"{rep.target} is now {rep.after[:10]} (updated {rep.updated})")
    if rep.conflicted:
        out.append(f"{len(rep.conflicted)} agent(s) not merged: {', '.join(r.agent for r in rep.conflicted)}. "
                   f"Bring each up to {rep.target} in its worktree, resolve there, commit, and merge again:")
        for r in rep.conflicted:
            out.append(f"  git storm sync {r.agent}" + (f" --onto {rep.target}" if rep.target else ""))
        out.append("  (or merge anyway with --strategy ours|theirs, overriding one side's hunks)")
    return "\n".join(out)


@cli.command(context_settings=CONTEXT)
@click.argument("agents", nargs=-1, metavar="[AGENT...]")
@click.option("--into", metavar="BRANCH", default=None,
              help="Target branch (default: storm.target, else the main working tree's branch).")
@click.option("--strategy", type=click.Choice(["abort", "ours", "theirs"]), default="abort", show_default=True,
              help="On conflict: abort that agent's merge, or resolve hunks as git merge -X ours|theirs.")
@click.option("--dry-run", is_flag=True, help="Compute and report every merge; move nothing.")
@click.option("--test", "test_cmd", metavar="CMD", default=None,
              help="Test-gated queue: run CMD (sh -c) on each candidate merge in a scratch worktree; merge only "
                   "agents whose candidate passes, in dependency order (docs/worktree-mode.md).")
@click.option("--test-timeout", metavar="SECONDS", type=float, default=None,
              help="With --test: stop CMD after SECONDS (the agent counts as failed).")
@_manager_option
@json_option
def merge(agents: tuple[str, ...], into: str | None, strategy: str, dry_run: bool, test_cmd: str | None,
          test_timeout: float | None, agent: str | None, as_json: bool) -> None:
    """Merge agent branches into the target branch, one by one (the manager).

    Default order: order of completion (each agent's last commit). Every merge
    is computed in memory first (git merge-tree --write-tree), so under
    --strategy abort a conflicting agent is skipped and the target branch, its
    index and working tree are untouched. The report lists per agent: merged /
    conflicted, files changed, and each conflicting path with its hunks
    (ancestor / ours / theirs). Exit 1 if any agent conflicted. Results go to
    the log ('merge' events).

    With --test CMD the merge is a queue: agents go one at a time, each after
    the agents whose files its changed Python files import (ties by name;
    named agents keep the order given), CMD runs on each candidate merge in a
    scratch worktree (removed afterwards, also on failure or Ctrl-C), and an
    agent whose candidate fails stays unmerged ('test_failed', exit 1) with the
    tail of CMD's output in the report and the log.

    \b
    Example:
      git storm merge                        # every agent with new commits
      git storm merge engineer_2 engineer_1 --into main --json
      git storm merge engineer_3 --strategy theirs   # CAID's fallback
      git storm merge --test 'python -m pytest -q' --test-timeout 600
    """
    from storm_git.worktree.merge import merge as do_merge

    store = open_store_here()
    require_worktree_mode(store)
    if test_cmd is not None:
        from storm_git.cli.radar_cmds import sigterm_as_interrupt
        from storm_git.worktree.queue import merge_tested

        with sigterm_as_interrupt():
            rep = merge_tested(store, list(agents) or None, test_cmd, into=into, strategy=strategy, by=_by(agent),
                               dry_run=dry_run, timeout=test_timeout)
    else:
        rep = do_merge(store, list(agents) or None, into=into, strategy=strategy, by=_by(agent), dry_run=dry_run)
    if as_json:
        emit_json(rep.to_dict())
    else:
        click.echo(render_merge(rep))
    if not rep.ok:
        sys.exit(1)


# -- sync -------------------------------------------------------------------------------
def render_sync(res: Any) -> str:
    if res.status == "up_to_date":
        return f"{res.agent}: {res.branch} already contains {res.target} ({res.target_tip[:10]}): nothing to sync"
    if res.status in ("merged", "fast_forward"):
        how = "fast-forwarded to" if res.status == "fast_forward" else "merged"
        return (f"{res.agent}: {res.branch} {how} {res.target} ({res.target_tip[:10]}): "
                f"{res.before[:10]} -> {res.after[:10]}, no conflict; merge it with: git storm merge {res.agent}")
    out = [f"{res.agent}: merging {res.target} ({res.target_tip[:10]}) into {res.branch} stopped on "
           f"{len(res.conflicts)} conflicting path(s), left in {res.path}:"]
    for c in res.conflicts:
        out.append(f"  {quoted(c.path)} ({c.kind}): {len(c.hunks)} hunk(s)")
        for h in c.hunks:
            out.append(f"  @@ line {h.ours_line}")
            out.append("      ancestor:")
            out.extend(_indent(h.ancestor, "        "))
            out.append(f"      ours ({res.branch}):")
            out.extend(_indent(h.ours, "        "))
            out.append(f"      theirs ({res.target}):")
            out.extend(_indent(h.theirs, "        "))
    out.append(f"Next ({res.agent}): edit those files in {res.path} (remove the conflict markers), then")
    out.append(f"  git storm commit --agent {res.agent} -m 'sync with {res.target}'")
    out.append(f"and the manager merges: git storm merge {res.agent}   (to give up: git -C {res.path} merge --abort)")
    return "\n".join(out)


@cli.command(context_settings=CONTEXT)
@click.argument("agent_id", metavar="[AGENT]", required=False)
@click.option("--onto", metavar="BRANCH", default=None,
              help="The branch to bring AGENT up to (default: storm.target, else the main working tree's branch).")
@_manager_option
@json_option
def sync(agent_id: str | None, onto: str | None, agent: str | None, as_json: bool) -> None:
    """Bring AGENT's branch up to the target: merge it in AGENT's worktree (worktree mode).

    Without AGENT, in a clone whose shared workspace lives on a remote
    (storm.remote, docs/remote.md): fetch the storm refs and bring the working
    tree to the shared head, keeping files edited here without storm; then
    fast-forward the checked-out branch and git's index to the server's branch
    (the manager's commit made in another clone), leaving the disk to storm.

    What to do when 'git storm merge' reports AGENT as conflicted. The target
    branch is merged into storm/AGENT inside AGENT's worktree with git merge:
    a clean result is committed (or fast-forwarded); conflicts are left in the
    worktree for the agent to resolve, listed with their hunks (ancestor, ours
    = the agent's branch, theirs = the target), exit 1. The agent resolves
    them and runs 'git storm commit --agent AGENT -m MSG'; the manager's next
    'git storm merge AGENT' is then clean. Refused (exit 3, nothing changed)
    when the worktree has uncommitted changes or a merge in progress.

    \b
    Example:
      git storm sync engineer_2
      git storm sync engineer_2 --onto main --json
      git storm sync    # storm mode on a remote: fetch and bring the working tree to the shared head
    """
    if agent_id is None:  # storm mode on a git remote (docs/remote.md)
        from storm_git.cli.remote_cmds import sync_remote

        return sync_remote(as_json)
    from storm_git.worktree.sync import sync as do_sync

    store = open_store_here()
    require_worktree_mode(store)
    res = do_sync(store, agent_id, onto=onto, by=_by(agent))
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(render_sync(res))
    if not res.ok:
        sys.exit(1)


# -- assign -----------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("assignee", required=False, metavar="[AGENT]")
@click.argument("globs", nargs=-1, metavar="[GLOB...]")
@click.option("--files", "-f", multiple=True, metavar="PATH_OR_GLOB",
              help="More primary files (repeatable; same as GLOB arguments).")
@click.option("--task", "-t", metavar="TEXT", default=None,
              help="What the agent is to do; a new task also resets its read set.")
@click.option("--allow-overlap", is_flag=True, help="Accept files that another agent's primary set covers.")
@click.option("--clear", is_flag=True, help="Remove the agent's assignment.")
@_manager_option
@json_option
def assign(assignee: str | None, globs: tuple[str, ...], files: tuple[str, ...], task: str | None,
           allow_overlap: bool, clear: bool, agent: str | None, as_json: bool) -> None:
    """Record AGENT's primary file set (GLOBs, and task); without AGENT, list assignments.

    GLOBs are paths or .gitignore-style patterns (quote them so the shell
    does not expand them); --files/-f adds more, one per option.

    Primary sets of different agents must be disjoint (refused, exit 3, naming
    the overlap, unless --allow-overlap). storm.restricted globs name files no
    engineer may change. In worktree mode a commit outside the assignment or
    touching a restricted file is refused; in storm mode a write outside it is
    accepted but flagged "outside_assignment" and logged.

    \b
    Example:
      git storm assign engineer_1 'src/api/**' --task 'add retries to fetch'
      git storm assign engineer_2 src/client.py 'tests/test_client*.py'
      git storm assign engineer_3 -f docs/ -f README.md
      git config --add storm.restricted __init__.py
      git storm assign --json
    """
    from storm_git.core import assignments as scope
    from storm_git.core.errors import UsageError

    files = tuple(globs) + tuple(files)
    store = open_store_here()
    if assignee is None:
        if files or task or clear:
            raise UsageError("name the agent to assign", hint="git storm assign AGENT GLOB…")
        allv = scope.load_all(store)
        restricted = scope.restricted_globs(store)
        if as_json:
            emit_json({"assignments": {a: s.to_dict() for a, s in allv.items()}, "restricted": restricted})
            return
        if not allv:
            click.echo("no assignments")
        for a, s in allv.items():
            click.echo(f"{a}: {', '.join(s.files)}" + (f"  -- {s.task}" if s.task else ""))
        click.echo(f"restricted: {', '.join(restricted) if restricted else 'none'}")
        return
    if clear and files:
        raise UsageError("--clear and files (GLOB or --files) do not go together")
    if not clear and not files:
        raise UsageError("no files given", hint="git storm assign AGENT GLOB… (or --clear)")
    res = scope.assign(store, assignee, None if clear else list(files), task=task, allow_overlap=allow_overlap,
                       by=_by(agent), integrated_tree=_integrated_tree(store))
    if as_json:
        emit_json(res.to_dict())
        return
    if res.assignment is None:
        click.echo(f"{assignee}: assignment cleared" if res.previous else f"{assignee} had no assignment")
        return
    click.echo(f"{assignee}: {', '.join(res.assignment.files)}" + (f" -- {task}" if task else ""))
    for other, paths in res.overlaps.items():
        click.echo(f"  overlaps {other} on {', '.join(paths[:5])} (allowed)")
    if res.reads_reset:
        click.echo(f"  new task: the read set of {assignee} was reset")


def _integrated_tree(store):
    """The tree overlaps are checked against: the shared head (storm) or the target branch."""
    from storm_git.core.errors import StormError
    from storm_git.core.store import WORKSPACE_REF
    from storm_git.worktree.worktrees import target_branch

    if store.config_get("storm.mode") == "storm" and store.ref_target(WORKSPACE_REF) is not None:
        return store.commit(store.ref_target(WORKSPACE_REF)).tree_id
    try:
        return store.commit(store.ref_target("refs/heads/" + target_branch(store))).tree_id
    except StormError:
        return None


# -- cleanup ----------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.option("--merged", is_flag=True,
              help="Also remove worktrees and branches of agents fully merged into the target (and clean).")
@click.option("--all", "all_", is_flag=True,
              help="Remove every agent worktree and branch, merged or not (their tips are printed).")
@click.option("--into", metavar="BRANCH", default=None, help="Target branch that 'merged' refers to.")
@_manager_option
@json_option
def cleanup(merged: bool, all_: bool, into: str | None, agent: str | None, as_json: bool) -> None:
    """Prune stale worktree records and leftover directories; remove merged agents.

    \b
    Example:
      git storm cleanup              # stale records and leftovers only
      git storm cleanup --merged     # and agents whose work is in the target
      git storm cleanup --all --json
    """
    from storm_git.worktree.worktrees import cleanup as do_cleanup

    store = open_store_here()
    res = do_cleanup(store, merged=merged, all_=all_, into=into, by=_by(agent))
    if as_json:
        emit_json(res.to_dict())
        return
    for r in res.removed:
        state = "merged" if r["merged"] else "NOT merged, tip kept in the log"
        click.echo(f"removed {r['agent']}: {r['branch']} @ {r['head'][:10]} ({state})"
                   + (f", worktree {r['path']}" if r["path"] else ""))
    for p in res.pruned:
        click.echo(f"pruned stale worktree record {p}")
    for p in res.leftovers:
        click.echo(f"removed leftover directory {p}")
    for k in res.kept:
        click.echo(f"kept {k.get('agent') or k.get('path')}: {k['reason']}")
    if not (res.removed or res.pruned or res.leftovers or res.kept):
        click.echo("nothing to clean up")
