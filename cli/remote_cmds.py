"""Commands of the shared workspace on a git remote: join, push-reads, server-hook,
and what init --remote and sync (without AGENT) call (storm_git.remote)."""
from __future__ import annotations

import os
import sys

import click

from storm_git.cli.app import CONTEXT, agent_option, cli, emit_json, json_option


def open_store_here():
    from storm_git.core.store import Store

    return Store.discover()


def _require_remote(store) -> str:
    from storm_git.core.errors import NotInitialised
    from storm_git.remote.workspace import remote_of

    remote = remote_of(store)
    if remote is None:
        raise NotInitialised("this clone has no shared workspace on a remote (storm.remote is not set)",
                             hint="join one with git storm join NAME, or create it with git storm init --remote NAME")
    return remote


def branch_line(b: dict | None) -> str | None:
    """One line for what following the server's branch did (storm_git.remote.branch_follow)."""
    if not b:
        return None
    name, up, n = b["branch"], b["upstream"], b["commits"]
    if b["state"] == "fast_forward":
        held = "; the shared workspace holds it" if b["integrated"] else \
            "; the manager's next git storm commit brings it into the shared workspace"
        return f"branch {name}: fast-forwarded {n} commit(s) to {up} ({b['after'][:10]}){held}"
    if b["state"] == "ahead":
        return f"branch {name}: {n} commit(s) ahead of {up} (push them with git push)"
    if b["state"] == "diverged":
        return (f"branch {name}: diverged from {up} ({n} commit(s) here it lacks); "
                "merge or rebase it with git, then git storm sync")
    if b["state"] == "no_upstream":
        return f"branch {name}: not on the server (push it with git push -u NAME {name})"
    if b["state"] == "detached":
        return "HEAD is detached: no branch followed"
    return f"branch {name}: up to date with {up}"


def join_lines(res) -> list[str]:
    what = "created the shared workspace on" if res.created else "joined the shared workspace on"
    out = [f"storm {what} {res.remote}: shared head {res.head[:10]} (refs/storm/workspace)"]
    if res.disk:
        out.append("working tree: " + ", ".join(f"{n} {o}" for o, n in sorted(res.disk.items())))
    if res.kept:
        out.append(f"kept {len(res.kept)} local edit(s) storm did not make: {', '.join(res.kept[:5])}"
                   " (git storm status shows them)")
    if res.hooks:
        out.append(f"installed hooks: {', '.join(res.hooks)}")
    line = branch_line(res.branch)
    if line:
        out.append(line)
    return out


def report_join(res, as_json: bool) -> None:
    if as_json:
        emit_json(res.to_dict())
    else:
        for line in join_lines(res):
            click.echo(line)
    for w in res.warnings:
        click.echo(f"git storm: warning: {w}", err=True)


def init_remote(base: str | None, remote: str, as_json: bool) -> None:
    """``git storm init --remote NAME`` (called from verbs.init)."""
    from storm_git.admin.join import init_remote as do_init

    report_join(do_init(open_store_here(), remote, base), as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("remote", metavar="NAME")
@json_option
def join(remote: str, as_json: bool) -> None:
    """Join the shared workspace that lives on the git remote NAME.

    Fetches refs/storm/* and refs/notes/storm/* from NAME, puts a clone with
    no commit yet on the server's branch (its own name there, the only one, or
    the one the server's HEAD names), sets storm.mode=storm and storm.remote=NAME, installs the pre-commit guard
    and brings the working tree to the shared head; files edited here without
    storm are kept and listed. Every write then pushes with a lease (the server
    does the compare-and-swap) and fetches the storm refs when another machine
    wrote first; reads and writes fetch no other agent's notes ref, status and
    log fetch them all. The checked-out branch then follows the server's, as
    in sync. Exit 3 when NAME is unreachable or has no shared workspace; exit 2
    when the clone has no commit and the server's branch to take is ambiguous.

    \b
    Example:
      git clone ssh://host/project.git && cd project && git storm join origin
    """
    from storm_git.admin.join import join as do_join

    report_join(do_join(open_store_here(), remote), as_json)


def sync_remote(as_json: bool) -> None:
    """``git storm sync`` without AGENT in a clone with storm.remote (from worktree_cmds.sync)."""
    from storm_git.core.errors import UsageError
    from storm_git.disk.sync import FAILED, KEPT, WRITTEN
    from storm_git.remote.workspace import remote_of, sync_remote as do_sync

    store = open_store_here()
    remote = remote_of(store)
    if remote is None:
        raise UsageError("git storm sync needs AGENT here (this clone has no storm.remote)",
                         hint="worktree mode: git storm sync AGENT; a shared workspace on a remote: "
                              "git storm join NAME first")
    res = do_sync(store, remote)
    if as_json:
        emit_json(res.to_dict())
    else:
        written = [p for p, o in res.outcomes.items() if o == WRITTEN]
        kept = [p for p, o in res.outcomes.items() if o == KEPT]
        moved = "" if res.before == res.head else f" (was {res.before[:10]})"
        click.echo(f"synced with {res.remote}: shared head {res.head[:10]}{moved}; "
                   f"{len(written)} file(s) written on disk")
        if kept:
            click.echo(f"kept {len(kept)} local edit(s) storm did not make: {', '.join(sorted(kept)[:5])}")
        line = branch_line(res.branch)
        if line:
            click.echo(line)
        for p, why in res.errors.items():
            click.echo(f"git storm: could not write {p}: {why}", err=True)
    if any(o == FAILED for o in res.outcomes.values()):
        sys.exit(3)


@cli.command("push-reads", context_settings=CONTEXT)
@agent_option
@json_option
def push_reads(agent: str | None, as_json: bool) -> None:
    """Push the agent's read set (its notes ref) to the remote now.

    Reads are recorded locally and travel with the agent's next write anyway;
    this makes them visible to other machines' status before that.

    \b
    Example:
      git storm push-reads --agent engineer_1
    """
    from storm_git.core.agents import validate_agent
    from storm_git.remote.workspace import push_reads as do_push

    store = open_store_here()
    remote = _require_remote(store)
    res = do_push(store, remote, validate_agent(agent or os.environ.get("STORM_AGENT")))
    if as_json:
        emit_json(res)
    else:
        click.echo(f"pushed the reads of {res['agent']} to {remote}" if res["pushed"]
                   else f"{remote} already has the reads of {res['agent']}: nothing to push")


@cli.group("server-hook", context_settings=CONTEXT)
def server_hook() -> None:
    """The guard on the server's bare repository (a pre-receive hook).

    \b
    Example:
      git storm server-hook install /srv/git/project.git
      git storm server-hook check /srv/git/project.git
    """


@server_hook.command("check", context_settings=CONTEXT)
@click.argument("path", required=False, default=".", metavar="[BARE_REPO]")
@json_option
def server_hook_check(path: str, as_json: bool) -> None:
    """Whether git will run storm's guard on the next push to BARE_REPO (default: .).

    Exit 0 when storm's pre-receive hook is where git runs the repository's hooks
    (hooks/, or core.hooksPath), executable, and its interpreter imports git storm;
    exit 3 saying which is not. A guard stops running without a word when
    core.hooksPath is set after install, and refuses every push to storm's refs
    when its virtualenv is removed: run this after changing the server.

    \b
    Example:
      git storm server-hook check /srv/git/project.git
    """
    from storm_git.remote.server_hook import check_installed

    res = check_installed(path)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(f"storm's guard is active: {res.hook} (runs {res.python})")
        click.echo("clones' writes are ordered here (refs/storm/inbox/, proc-receive)" if res.ordering else
                   "clones' writes are not ordered here: they push to refs/storm/workspace with a lease")


@server_hook.command("install", context_settings=CONTEXT)
@click.argument("path", required=False, default=".", metavar="[BARE_REPO]")
@click.option("--no-order", "no_order", is_flag=True,
              help="Install the guard only: clones push to refs/storm/workspace with a lease, "
                   "and a busy team's clones race for it (docs/remote.md).")
@json_option
def server_hook_install(path: str, no_order: bool, as_json: bool) -> None:
    """Install storm's pre-receive guard in the bare repository BARE_REPO (default: .).

    The guard refuses a push that moves refs/storm/workspace other than forward
    by validated writes: a non-fast-forward, a commit without storm's trailers,
    a commit without provenance (its Storm-Read-Set trailers, resolved from its
    agent's notes ref; or, written before those, a provenance note), or one
    whose provenance contradicts the parent. The hook runs with this interpreter; a
    pre-receive hook already there is kept and chained. It goes where git runs the
    repository's hooks: hooks/, or the directory core.hooksPath names.

    It also makes the server order the clones' writes: a proc-receive hook
    (receive.procReceiveRefs = refs/storm/inbox) applies the writes each clone
    pushes to its inbox in the order they arrive, with the guard's checks, and
    refs/storm/ordering tells clones to push there instead of racing for a lease
    on refs/storm/workspace. --no-order leaves that out.

    \b
    Example:
      git storm server-hook install /srv/git/project.git
    """
    from storm_git.remote.server_hook import install

    res = install(path, ordering=not no_order)
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(f"installed storm's guard: {res.hook} (runs {res.python})")
        if res.ordering:
            click.echo("the server orders clones' writes: they push to refs/storm/inbox/<clone>/ (proc-receive)")
        elif res.ordering_skipped:
            click.echo(f"the server does not order writes: {res.ordering_skipped}", err=True)
        if res.shared:
            click.echo(f"core.hooksPath sends this repository's hooks to {os.path.dirname(res.hook)}, outside it: "
                       "every repository using that directory now runs the guard too (it acts only on "
                       "pushes to refs/storm/* and refs/notes/storm/agents/*)", err=True)
        if not res.precompiled:
            click.echo("storm's modules could not all be compiled to bytecode for it (a read-only install?): "
                       "each push then pays for compiling them", err=True)
        if res.chained:
            click.echo(f"the hook that was there runs after it: {res.chained}")
