"""The ``git storm`` command group and what its commands share: options, JSON output,
the exit-code mapping of the library's typed errors, lock waits. The library (and
pygit2) is imported inside the commands so ``-h`` stays instant."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import click

from storm_git.cli.sections import SectionedGroup

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False))


def open_workspace_here():
    from storm_git.api import open_workspace

    return open_workspace()


def agent_option(f: Callable) -> Callable:
    return click.option("--agent", "-a", metavar="ID", default=None,
                        help="Agent id (default: $STORM_AGENT). Letters, digits, _ . -")(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")(f)


def write_options(f: Callable) -> Callable:
    f = click.option("--no-wait", is_flag=True,
                     help="Reject at once (reason 'reserved') instead of waiting for another agent's reservation.")(f)
    f = click.option("--deps", multiple=True, metavar="PATH",
                     help="Validate only these read files (plus the target) instead of the whole read set. "
                          "Repeatable. 'auto': the read files the new content depends on (Python imports, "
                          "name definitions, importers, own writes; storm.deps=auto makes it the default); "
                          "'all': the whole read set.")(f)
    f = click.option("--intent", "-m", metavar="TEXT", default=None,
                     help="Why: becomes the commit message of the write.")(f)
    return f


def report_write(res: Any, as_json: bool, sizes: dict[str, int | None] | None = None) -> None:
    from storm_git import render

    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(render.write_result(res, sizes))
    if not res.accepted:
        sys.exit(1)


@click.group(cls=SectionedGroup, context_settings=CONTEXT)
@click.version_option(package_name="git-storm", prog_name="git storm")
def cli() -> None:
    """Let several coding agents work on one git repository at once.

    \b
    storm mode (shared workspace): every read returns a file and its version;
    a write is accepted only if the file and everything the agent read are
    unchanged since; a rejected writer gets the current content, a diff and a
    short reservation to retry.

    \b
    Quick start:
      git storm init
      export STORM_AGENT=engineer_1
      git storm read src/app.py
      git storm edit src/app.py --old 'x = 1' --new 'x = 2  # engineer_1: why'
      git storm status; git storm log

    \b
    Exit codes:
      0  ok (also: this help, shown when no command is given)
      1  write rejected: re-plan from the payload and retry
      2  bad input (unknown option, bad path, missing content)
      3  repository state (not a repository, not initialised, corrupt)
      4  internal error: a bug in git storm (rerun with STORM_DEBUG=1, report it)
    """


def lock_timeout(commondir: str, *, cap: float | None = None) -> float | None:
    """``storm.lockTimeout`` (storm_git.core.locks), imported when a lock is waited for."""
    from storm_git.core.locks import lock_timeout as configured

    return configured(commondir, cap=cap)


def say_waiting(w) -> None:
    click.echo(f"git storm: waiting for storm's {w.name} lock, held by {w.who()} for {w.seconds:.0f}s "
               "(storm.lockTimeout gives up)", err=True)


def wait_with_a_deadline(cap: float | None = None) -> None:
    """Commands say who holds a lock they wait for and give up after storm.lockTimeout."""
    from storm_git.core.locks import WaitPolicy, set_wait_policy

    set_wait_policy(WaitPolicy(timeout=lambda commondir: lock_timeout(commondir, cap=cap), on_wait=say_waiting))


def non_utf8_argument(args: list[str]) -> str | None:
    """Name the first argument holding bytes that are not UTF-8 (Python carries them
    as lone surrogates), or None. Checked before any command runs: an intent, an
    --old/--new text or an exec command line ends up in a commit message, and
    failing there (after `exec` ran its command) would lose the change. A --file
    name is exempt: any bytes name a file on disk."""
    command = next((a for a in args if not a.startswith("-")), "")
    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
            continue
        except UnicodeEncodeError:
            pass
        prev = args[i - 1] if i else ""
        if arg.startswith("--file=") or prev == "--file" or (prev == "-f" and command == "write"):
            continue
        name, value = arg.split("=", 1) if arg.startswith("--") and "=" in arg else ("", arg)
        shown = "'" + value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace") + "'"
        if "--" in args[:i] and command == "exec":
            return f"the command argument {shown}"
        if name or (prev.startswith("-") and prev != "--"):
            return f"the value of {name or prev} ({shown})"
        return f"argument {shown}"
    return None


def usage_error(exc: click.ClickException, as_json: bool) -> int:
    """click's own usage errors, as one line (and --json) like every other error: exit 2."""
    ctx = getattr(exc, "ctx", None)
    hint = f"see {ctx.command_path if ctx is not None else 'git storm'} --help"
    message = " ".join(exc.format_message().split())
    if as_json:
        emit_json({"error": {"kind": "usage", "message": message, "hint": hint, "exit_code": 2}})
    click.echo(f"git storm: {message} ({hint})", err=True)
    return 2


def fail(exc: Exception, as_json: bool) -> int:
    from storm_git.core.errors import classify

    known = classify(exc)
    if known is not None:
        code, kind, message, hint = known
    else:
        if os.environ.get("STORM_DEBUG"):
            raise exc
        code, kind = 4, "internal"
        message, hint = f"internal error {type(exc).__name__}: {exc}", "a bug: rerun with STORM_DEBUG=1 and report it"
    if as_json:
        emit_json({"error": {"kind": kind, "message": message, "hint": hint, "exit_code": code}})
    line = f"git storm: {message}" + (f" ({hint})" if hint else "")
    click.echo(line.replace("\n", " "), err=True)
    return code


# Commands register themselves on `cli` when their module is imported.


def open_store_here():
    from storm_git.core.store import Store

    return Store.discover()


def require_worktree_mode(store) -> None:
    from storm_git.admin.modes import current
    from storm_git.core.errors import RepoStateError

    mode = current(store)
    if mode != "worktree":
        raise RepoStateError(f"this repository is in {mode} mode", hint="switch with git storm mode worktree")
