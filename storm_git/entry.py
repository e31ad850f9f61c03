"""The ``git-storm`` executable: ``harness hook`` goes straight to its own small
entry point; everything else to the click command line.

A harness runs the hook around every tool call, hundreds of times a session, so
the hook must not pay for importing click and every command's module, nor fail
because one of them cannot be imported: it answers the harness itself, failing
closed (storm_git.integrations.hook_main), through the repository's hook daemon
when one runs (storm_git.integrations.hook_client).
"""
from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["harness", "hook"] and not {"-h", "--help"} & set(args):
        from storm_git.integrations.hook_client import main as hook_main

        sys.exit(hook_main(args[2:]))
    from storm_git.cli.main import main as cli_main

    cli_main()
