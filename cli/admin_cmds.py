"""Administration: ``doctor`` (find and repair what crashes leave) and
``maintenance`` (keep loose objects in check, never pruning)."""
from __future__ import annotations

import sys

import click

from .main import CONTEXT, _emit_json, cli, json_option


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
    files of killed writers in the working tree and orphaned worktree records.
    Without --fix nothing is changed; with --fix on a healthy repository
    nothing is changed either.

    Exit 0 when healthy (or everything found was repaired), 3 when problems remain.

    \b
    Example:
      git storm doctor
      git storm doctor --fix --json
      git storm doctor --fix --forget-agent engineer_7
    """
    from storm_git.doctor import diagnose
    from storm_git.store import Store

    rep = diagnose(Store.discover(), fix=fix, forget_agents=list(forget_agents))
    if as_json:
        _emit_json(rep.to_dict())
    else:
        for f in rep.findings:
            state = "fixed" if f.fixed else "harmless" if f.harmless else "fixable with --fix" if f.fixable else "needs you"
            click.echo(f"{f.kind}: {f.what}: {f.detail} [{state}]")
        click.echo("storm doctor: all is well" if not rep.findings else
                   f"storm doctor: {len(rep.findings)} finding(s), {sum(f.fixed for f in rep.findings)} fixed")
    if not rep.ok:
        sys.exit(3)


@cli.command(context_settings=CONTEXT)
@json_option
def maintenance(as_json: bool) -> None:
    """Pack loose objects and refs, safely beside running writers.

    Runs git maintenance's loose-objects, incremental-repack and pack-refs
    tasks. It never prunes: never run 'git gc --prune=now' while agents may be
    writing (an object between its write and its ref update would be deleted).
    Run it every few thousand writes, e.g. from the manager's loop or cron.

    \b
    Example:
      git storm maintenance
      while sleep 600; do git storm maintenance; done
    """
    from storm_git.maintenance import run
    from storm_git.store import Store

    res = run(Store.discover())
    if as_json:
        _emit_json(res.to_dict())
    else:
        b, a = res.before, res.after
        click.echo(f"storm maintenance: loose objects {b.loose} -> {a.loose}, packed {b.packed} -> {a.packed}, "
                   f"packs {b.packs} -> {a.packs} ({', '.join(res.tasks)})")
