"""``git storm``: the click shell around :mod:`storm_git`.

Parses arguments, calls the library, prints human text or ``--json``, and maps
the library's typed errors to exit codes: 0 ok, 1 rejected, 2 bad
input, 3 repository state, 4 internal error (a bug). The library (and pygit2)
is imported inside the commands so ``-h`` stays instant.
"""
from __future__ import annotations

import sys

import click

from storm_git.cli import (  # noqa: F401 - they register
    admin_cmds,
    agents_cmds,
    mcp_cmd,
    radar_cmds,
    remote_cmds,
    sim_cmds,
    tree_cmds,
    verbs,
    worktree_cmds,
)
from storm_git.cli.app import cli, fail, non_utf8_argument, usage_error, wait_with_a_deadline


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn library errors into one line and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args:  # like `git storm --help`, multi-line on stdout, exit 0 (not a usage error)
        args = ["--help"]
    as_json = "--json" in args
    bad = non_utf8_argument(args)
    if bad is not None:
        from storm_git.core.errors import UsageError

        sys.exit(fail(UsageError(f"{bad} is not valid UTF-8",
                                  hint="storm records intents, paths and commands as UTF-8 text in git; "
                                       "nothing was run or changed"), as_json))
    wait_with_a_deadline()
    try:
        cli.main(args=args, prog_name="git storm", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        sys.exit(usage_error(exc, as_json))
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - the one place errors become exit codes
        sys.exit(fail(exc, as_json))
    sys.exit(0)
