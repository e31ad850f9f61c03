"""Commands for the shared working tree: exec, adopt, commit, and the hooks
(install-hooks, uninstall-hooks, and ``hook``, which the shims call)."""
from __future__ import annotations

import json
import os
import signal
import sys

import click

from storm_git.cli.app import CONTEXT, agent_option, cli, emit_json, json_option, open_workspace_here, report_write
from storm_git.core.errors import UsageError
from storm_git.core.paths import quoted


def _agent(agent: str | None) -> str | None:
    return agent or os.environ.get("STORM_AGENT")


EXEC_CONTEXT = dict(CONTEXT, ignore_unknown_options=True, allow_interspersed_args=False)


@cli.command("exec", context_settings=EXEC_CONTEXT)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS...]")
@agent_option
@click.option("--intent", "-m", metavar="TEXT", default=None,
              help="Why: the commit message of the write (default: the command line).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Stop the command (SIGTERM, then SIGKILL) after SECONDS; nothing is recorded. Exit 124.")
@click.option("--no-wait", is_flag=True,
              help="Reject at once (reason 'reserved') instead of waiting for another agent's reservation.")
@json_option
def exec_cmd(argv: tuple[str, ...], agent: str | None, intent: str | None, timeout: float | None,
             no_wait: bool, as_json: bool) -> None:
    """Run a command in the shared working tree and record the files it changed.

    Every file the command created, changed or deleted (tracked, or untracked
    and not ignored) becomes one write by the agent (trailer Storm-Op: exec),
    validated against the versions the files had when the command started: if
    another agent wrote one of them meanwhile, the write is rejected (exit 1,
    with the payload) and the command's version stays on disk as an unmediated
    edit. Files that differed from the shared head before the command and that
    it did not touch are not recorded. A file the command set back to an older
    shared version (git checkout, stash, reset --hard) is validated as a write
    is: unless the agent read its current version, the write is rejected with
    that version attached, so no agent undoes work it has not seen.

    The command's stdin, stdout and stderr pass through and its exit status is
    storm's (124 on --timeout, 128+N when killed by signal N, 127 not found;
    a command killed or timed out records nothing). With --json, one JSON line
    is printed on stdout after the command's own output.

    \b
    Example:
      git storm exec --agent engineer_2 -- black src/
      git storm exec -a engineer_1 --timeout 600 --json -- pytest -q
    """
    from storm_git import render

    if argv and argv[0] == "--":
        argv = argv[1:]
    from storm_git.cli.verbs import wait_kw

    ws = open_workspace_here()
    res = ws.exec(list(argv), agent=_agent(agent), intent=intent, timeout=timeout, wait=not no_wait,
                  **wait_kw(ws))
    rc = res.returncode
    if res.timed_out:
        click.echo(f"git storm: {argv[0]} timed out after {timeout:g}s and was stopped; nothing recorded"
                   + (f" (left on disk, unrecorded: {', '.join(map(quoted, res.paths))})" if res.paths else ""),
                   err=True)
        code = 124
    elif rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        click.echo(f"git storm: {argv[0]} was killed by {name}; nothing recorded"
                   + (f" (left on disk, unrecorded: {', '.join(map(quoted, res.paths))})" if res.paths else ""),
                   err=True)
        code = 128 - rc
    else:
        code = rc if rc != 0 else (0 if res.accepted else 1)
        if not as_json:
            if res.write is None:
                click.echo("storm exec: the command changed no file", err=True)
            else:
                click.echo("storm exec: " + render.write_result(res.write), err=True)
                if not res.write.accepted and res.reverted:
                    click.echo(render.reverted_by_command(res.reverted), err=True)
    if res.uncredited and not as_json:
        click.echo(f"storm exec: not recorded: {', '.join(quoted(p) for p in res.uncredited[:10])} changed while "
                   "the command ran, but the "
                   "command does not name it (a person's save?); git storm adopt PATH --agent NAME records it",
                   err=True)
    if res.nested_repositories and not as_json:
        names = ", ".join(quoted(f"{p}/") for p in res.nested_repositories[:10])
        click.echo(f"storm exec: not recorded: {names} (a git repository of its own; storm records files: "
                   "make it a submodule with git, or list it in .gitignore)", err=True)
    if as_json:
        sys.stdout.flush()
        click.echo(json.dumps(res.to_dict(), ensure_ascii=False))
    sys.exit(code)


@cli.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@agent_option
@click.option("--intent", "-m", metavar="TEXT", default=None, help="Why: becomes the commit message of the write.")
@click.option("--no-wait", is_flag=True,
              help="Reject at once (reason 'reserved') instead of waiting for another agent's reservation.")
@click.option("--allow-revert", is_flag=True,
              help="Adopt even a file whose content is an older shared version (undoes accepted writes).")
@json_option
def adopt(paths: tuple[str, ...], agent: str | None, intent: str | None, no_wait: bool,
          allow_revert: bool, as_json: bool) -> None:
    """Record files edited outside storm (editor, sed, a formatter) as the agent's write.

    The disk content of each PATH becomes one validated write, checked against
    the version the edit was made on (what storm last put on disk) and the
    agent's read set: an edit made on a version another agent has replaced
    since is rejected with the diff, never written over the newer work. The
    exec bit and symbolic links inside the repository are recorded too. A file
    that holds an OLDER shared version (after git stash or reset --hard) is
    refused unless --allow-revert ('checkout' restores it instead). A
    directory (. for everything) means every edit under it, new files
    included, as git add DIR (a reverted file there is left out unless
    --allow-revert). The 'status' command lists the unmediated edits (-v
    for diffs).

    \b
    Example:
      git storm adopt src/app.py --agent engineer_1 -m 'engineer_1: fix typo in editor'
      git storm adopt gen/ --agent engineer_1
    """
    from storm_git.cli.verbs import wait_kw

    ws = open_workspace_here()
    res = ws.adopt(list(paths), agent=_agent(agent), intent=intent, wait=not no_wait,
                   allow_revert=allow_revert, **wait_kw(ws))
    report_write(res, as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@json_option
def checkout(paths: tuple[str, ...], as_json: bool) -> None:
    """Restore PATHs on disk from the shared head (storm mode), discarding edits there.

    The way back after a git stash, git reset --hard or a stray editor left a
    file behind or different ('reverted', 'modified' in git storm status). Like
    git checkout -- PATH, what was on disk is overwritten; it changes no ref. A
    directory (. for everything) restores every edited or deleted file of the
    shared state under it; files the shared state does not have stay, as git
    leaves untracked files.

    \b
    Example:
      git storm checkout src/app.py
      git storm checkout src/
    """
    ws = open_workspace_here()
    if ws.mode != "storm":
        raise UsageError("git storm checkout restores the shared working tree (storm mode)",
                         hint="in worktree mode use git checkout inside the agent's worktree")
    out = ws.checkout(list(paths))
    if as_json:
        emit_json({"paths": out})
    elif not out:
        click.echo("nothing to restore: the disk holds the shared state there")
    else:
        for p, what in out.items():
            click.echo(f"{quoted(p)}: {'restored from the shared head' if what == 'written' else what}")


@cli.command(context_settings=CONTEXT)
@click.option("--message", "-m", required=True, metavar="MSG", help="The commit message (trailers are added).")
@agent_option
@click.option("--adopt", "adopt_", is_flag=True,
              help="Storm mode: record unmediated edits as the manager's write first (never a reverted file, "
                   "nor an untracked file named like a secret: .env, keys; those belong in .gitignore).")
@click.option("--strict", is_flag=True,
              help="Storm mode: refuse (exit 3) while unmediated edits remain on disk.")
@click.option("--gpg-sign/--no-gpg-sign", "sign", default=None,
              help="Sign the commit as git commit -S does (default: as commit.gpgSign says).")
@click.option("--no-verify", is_flag=True,
              help="Skip the repository's commit-msg and post-commit hooks "
                   "(storm mode; git commit's hooks in worktree mode).")
@click.option("--keep-shared", is_flag=True,
              help="Storm mode: where the branch's new commits and the agents changed the same path, "
                   "the shared workspace's version is the resolution.")
@json_option
def commit(message: str, agent: str | None, adopt_: bool, strict: bool, sign: bool | None, no_verify: bool,
           keep_shared: bool, as_json: bool) -> None:
    """Commit the shared state to the current branch (storm mode: the manager only).

    Storm mode: the commit's tree is the shared head's tree, its parent the
    branch tip, and its trailers (Storm-Agents, Storm-Agent, Storm-Workspace,
    Storm-Writes) name the agents whose writes it contains since the previous
    such commit; the index is reset. Files on disk that storm did not put
    there (unmediated edits, untracked files not ignored) are not part of the
    shared state: they are listed as a warning and stay on disk; --adopt
    records them first as the manager's write (not an untracked .env, key or
    other file named like a secret: the warning says to add it to .gitignore;
    git storm adopt PATH records one on purpose), --strict refuses instead.
    Commits the branch gained outside storm (a git pull, merge or commit by a
    person) are first merged into the shared workspace as the manager's write,
    so the commit never undoes them; where they and the agents changed the same
    path differently it is refused (exit 3, branch_conflict) until the shared
    version is what it should be and --keep-shared is given.
    Worktree mode: the agent commits its own worktree to its branch. Both
    sign the commit when commit.gpgSign is set (git's signing settings:
    gpg.format, user.signingKey); a signature that cannot be made is exit 3
    and the branch does not move. The repository's commit-msg hook may rewrite
    or refuse the message and its post-commit hook runs after, as for git
    commit (--no-verify skips them).

    \b
    Example:
      STORM_AGENT=manager git storm commit -m 'Integrate retries and timeouts'
      git storm commit -m 'Integrate' --adopt --json
    """
    res = open_workspace_here().commit(message, agent=_agent(agent), adopt=adopt_, strict=strict, sign=sign,
                              verify=not no_verify, **({"keep_shared": True} if keep_shared else {}))
    if as_json:
        emit_json(res.to_dict())
    elif res.commit is None:
        click.echo(f"nothing committed on {res.branch}: {res.message}")
    else:
        click.echo(f"committed {res.commit[:10]} on {res.branch}: {res.summary()}")
    news = getattr(res, "branch_news", None)
    if not as_json and news:
        changed = f"changing {len(news['paths'])} path(s)" if news["paths"] else "no file it did not have"
        click.echo(f"merged first into the shared workspace: {news['count']} commit(s) {res.branch} gained "
                   f"outside storm ({news['commits'][0]}), {changed}")
    if not as_json and res.adopted:
        click.echo(f"adopted first as the manager's write: {', '.join(res.adopted[:10])}")
    if not as_json and getattr(res, "radar", None):
        from storm_git.cli.radar_cmds import commit_radar_lines

        click.echo(commit_radar_lines(res), err=True)
    if not as_json and res.unmediated:
        from storm_git import render

        click.echo(render.left_on_disk(res.unmediated, adopt_=adopt_), err=True)


@cli.command("install-hooks", context_settings=CONTEXT)
@json_option
def install_hooks(as_json: bool) -> None:
    """Install storm's hook shims (git storm init does it too).

    Installs into the directory git uses (core.hooksPath if set, which is
    respected, not changed). A hook already there is kept as
    <hook>.storm-chained and still runs after storm's guard. Hooks inside the
    working tree (tracked) or set by the global/system config are not
    written: the line to add to them is printed instead (exit 0).

    \b
    Example:
      git storm install-hooks
    """
    from storm_git.admin.hooks_install import install
    from storm_git.cli.admin_cmds import echo_lines, hooks_lines
    from storm_git.core.store import Store

    res = install(Store.discover())
    if as_json:
        emit_json(res.to_dict())
    echo_lines(*hooks_lines(res.to_dict()), as_json)


@cli.command("uninstall-hooks", context_settings=CONTEXT)
@json_option
def uninstall_hooks(as_json: bool) -> None:
    """Remove storm's hook shims and restore the hooks they chained.

    \b
    Example:
      git storm uninstall-hooks
    """
    from storm_git.admin.hooks_install import uninstall
    from storm_git.core.store import Store

    res = uninstall(Store.discover())
    if as_json:
        emit_json(res.to_dict())
        return
    click.echo(f"removed {', '.join(res.removed) or 'nothing'} from {res.directory}"
               + (f"; restored {', '.join(res.restored)}" if res.restored else ""))


@cli.command(context_settings=CONTEXT)
@click.argument("name", type=click.Choice(["pre-commit"]))
@json_option
def hook(name: str, as_json: bool) -> None:
    """Run a hook's check (what the installed shims and the pre-commit framework call).

    pre-commit: in storm mode refuses a commit by an engineer (STORM_AGENT set
    to anyone but storm.manager) and a commit whose staged content differs from
    the shared head. Exit 0 allows the commit, 1 refuses it.

    \b
    Example:
      git storm hook pre-commit   # in .pre-commit-config.yaml: id storm-guard
      git storm hook pre-commit --json
    """
    if not as_json:
        from storm_git.admin.guard import main as guard_main

        sys.exit(guard_main([name]))
    from storm_git.admin.guard import check_pre_commit

    code, message = check_pre_commit()
    emit_json({"hook": name, "allowed": code == 0, "exit_code": code, "message": message.rstrip("\n")})
    sys.exit(code)
