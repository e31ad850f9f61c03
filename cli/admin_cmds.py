"""Administration: ``doctor`` (find and repair what crashes leave) and
``maintenance`` (keep loose objects in check, never pruning)."""
from __future__ import annotations

import sys
import time

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option
from storm_git.core.errors import UsageError


@cli.command(context_settings=CONTEXT)
@click.option("--fix", is_flag=True, help="Repair what is safe to repair (default: only report).")
@click.option("--forget-agent", "forget_agents", multiple=True, metavar="ID",
              help="Declare agent ID gone: its read set is reported (and dropped with --fix). Repeatable.")
@json_option
def doctor(fix: bool, forget_agents: tuple[str, ...], as_json: bool) -> None:
    """Check storm's refs, locks and leftovers; repair them with --fix.

    Finds stale ref .lock files left by killed writers (removed only while no
    storm process holds the guarding lock), storm refs that do not resolve,
    read sets of agents that no longer exist, expired reservations, temporary
    files of killed writers in the working tree, files behind the shared head,
    storm's own files replaced by a directory (or the reverse; --fix moves them
    aside into .git/storm-moved-aside/) and orphaned worktree records.
    Without --fix nothing is changed; with --fix on a healthy repository
    nothing is changed either.

    Exit 0 when healthy (or everything found was repaired), 3 when problems remain.

    \b
    Example:
      git storm doctor
      git storm doctor --fix --json
      git storm doctor --fix --forget-agent engineer_7
    """
    from storm_git.admin.doctor import diagnose
    from storm_git.core.store import Store

    rep = diagnose(Store.discover(), fix=fix, forget_agents=list(forget_agents))
    if as_json:
        emit_json(rep.to_dict())
    else:
        for f in rep.findings:
            state = "fixed" if f.fixed else "harmless" if f.harmless else "fixable with --fix" if f.fixable else "needs you"
            click.echo(f"{f.kind}: {f.what}: {f.detail} [{state}]")
        click.echo("storm doctor: all is well" if not rep.findings else
                   f"storm doctor: {len(rep.findings)} finding(s), {sum(f.fixed for f in rep.findings)} fixed")
    if not rep.ok:
        sys.exit(3)


HISTORY_SHOWN = 20


@cli.command(context_settings=CONTEXT)
@json_option
@click.option("--auto", is_flag=True, help="Run only if the loose objects passed storm.autoMaintenance.")
@click.option("--history", "show_history", is_flag=True,
              help="Run nothing: show the recorded runs (when, how long, git's CPU, counts before and after).")
def maintenance(as_json: bool, auto: bool, show_history: bool) -> None:
    """Pack loose objects and refs, safely beside running writers.

    Runs git maintenance's loose-objects task twice (loose objects packed, then
    the packed loose copies deleted) and pack-refs, after folding the agents'
    read-set journals into their notes; then rolls the packs up with 'git repack
    -d --geometric=2' (a few packs however long the run; only what is in the new
    pack is deleted). It never prunes:
    never run 'git gc --prune=now' while agents may be writing (an object between
    its write and its ref update would be deleted).

    Writes start it by themselves in the background once the loose objects pass
    storm.autoMaintenance (default 6700, like git's gc.auto; 0 turns that off).
    --auto runs only when that bound is passed and no other maintenance runs; it
    rolls the packs up only when there are more than 4 and no roll-up runs.
    Every run is recorded in .git/storm/maintenance-runs; --history shows it.

    \b
    Example:
      git storm maintenance
      git storm maintenance --history --json
      git config storm.autoMaintenance 2000    # start it sooner
    """
    from storm_git.core.maintenance import history, run, run_auto
    from storm_git.core.store import Store

    store = Store.discover()
    if show_history:
        if auto:
            raise UsageError("--history runs nothing: it cannot be combined with --auto",
                             hint="git storm maintenance --history")
        runs = history(store)
        if as_json:
            emit_json({"runs": [r.to_dict() for r in runs]})
        elif not runs:
            click.echo("storm maintenance: no run recorded in this repository")
        for r in ([] if as_json else runs[-HISTORY_SHOWN:]):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
            click.echo(f"{when} {r.task}{' (auto)' if r.auto else ''}: {r.seconds:.2f} s, git's CPU {r.cpu_s:.2f} s; "
                       f"loose objects {r.before.loose} -> {r.after.loose}, packs {r.before.packs} -> {r.after.packs}")
        if not as_json and len(runs) > HISTORY_SHOWN:
            click.echo(f"({len(runs) - HISTORY_SHOWN} earlier run(s): --json shows all)")
        return
    res = run_auto(store) if auto else run(store)
    if res is None:
        if as_json:
            emit_json({"ran": False})
        else:
            click.echo("storm maintenance: not due (or already running)")
        return
    if as_json:
        emit_json(res.to_dict())
    else:
        b, a = res.before, res.after
        click.echo(f"storm maintenance: loose objects {b.loose} -> {a.loose}, packed {b.packed} -> {a.packed}, "
                   f"packs {b.packs} -> {a.packs} ({', '.join(res.tasks)})")


# -- what init and install-hooks report --------------------------------------------------
DIRTY_SHOWN = 20


def hooks_lines(h: dict) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) saying what was installed where, why and how a person
    commits; or, when storm wrote nothing, why not and the line to add instead."""
    if h.get("skipped"):
        return [], [f"git storm: warning: pre-commit guard not installed: {h['skipped']}.",
                    f"  To guard commits in this repository, add this line near the top of {h['add_to']}"
                    " (after its #! line; create the file, executable, if there is none):",
                    f"    {h['add_line']}",
                    "  (it does nothing where git storm is not installed or not initialised)"]
    out = []
    for path in h.get("paths", []):
        out.append(f"installed the pre-commit guard: {path}"
                   + (" (core.hooksPath)" if h.get("hooks_path_config") else ""))
    for name in h.get("chained", []):
        out.append(f"  the existing {name} hook is kept as {name}.storm-chained and runs after the guard")
    if out:
        out.append(f"  why: {h['why']}")
        out.append("  a person commits with: git storm commit -m MSG (as the manager),")
        out.append("  or removes the guard to commit with plain git: git storm uninstall-hooks")
    return out, []


def init_lines(res) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of git storm init."""
    what = "initialised" if res.created else "already initialised"
    out = [f"storm {what}: mode {res.mode}, shared head {res.head[:10]} (refs/storm/workspace)"]
    hout, err = hooks_lines(res.hooks_install)
    out += hout
    if res.dirty:
        err.append(f"git storm: warning: {res.warnings[-1]}:")
        for d in res.dirty[:DIRTY_SHOWN]:
            err.append(f"  {d['status']} {d['path']}")
        if len(res.dirty) > DIRTY_SHOWN:
            err.append(f"  and {len(res.dirty) - DIRTY_SHOWN} more (git status --short lists them)")
        err.append("  Choose one:")
        err += [f"  - {c}" for c in res.choices]
    return out, err


def echo_lines(out: list[str], err: list[str], as_json: bool) -> None:
    if not as_json:
        for line in out:
            click.echo(line)
    for line in err:
        click.echo(line, err=True)
