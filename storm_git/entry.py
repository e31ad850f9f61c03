"""The ``git-storm`` executable: ``harness hook`` goes straight to its own small
entry point, an agent verb (``read``, ``write``...) to the repository's resident
process when one serves it; everything else, and any call it cannot take, to the
click command line in this process.

A harness runs the hook around every tool call, and an agent the verbs, hundreds
of times a session, so neither may pay for importing click and every command's
module (nor may the hook fail because one of them cannot be imported): the hook
answers the harness itself, failing closed (storm_git.integrations.hook_main),
through the repository's hook daemon when one runs
(storm_git.integrations.hook_client); a verb is relayed to that daemon with the
standard library alone (storm_git.integrations.cli_client), which starts it for
the next call when none runs.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's own import would cost every relayed call
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import NoReturn


def leave(code: int) -> "NoReturn":
    """End a call the resident process answered, skipping the interpreter's
    teardown (a sixth of such a call's time): this process only relayed it, its
    output is written already and it registered nothing to run at exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing of ours was in it
    os._exit(code)


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["harness", "hook"] and not {"-h", "--help"} & set(args):
        from storm_git.integrations.hook_client import main as hook_main

        sys.exit(hook_main(args[2:], relayed=leave))
    from storm_git.integrations.cli_client import VERBS, via_daemon  # the standard library only

    if args and args[0] in VERBS:
        try:
            code = via_daemon(args)
        except KeyboardInterrupt:
            sys.exit(130)  # before the call was handed over: nothing ran
        except Exception:  # noqa: BLE001 - raised only before the hand-over: nothing ran, so it runs here
            code = None
        if code is not None:
            leave(code)
    cli_main = _load_frozen()
    cli_main()


def _load_frozen() -> "Callable[[], None]":
    """The command line, imported with the collector off and then frozen. What
    start-up imports lives as long as the process: a collection during the
    imports, during the command's own (the library's, inside each command) or at
    exit would walk all of it again: about an eighth of an in-process ``read``
    (docs/performance.md, the agent verbs)."""
    import gc

    gc.disable()
    try:
        from storm_git.cli.main import main as cli_main
    finally:
        gc.freeze()
        gc.enable()
    return cli_main
