"""The resident process as the command line starts it: the hook daemon
(:mod:`storm_git.integrations.hookd`), serving the command line's agent verbs
too. Its child runs a verb through this very command line, ``main``, so the
output and the exit code are those of ``git storm`` in its own process."""
from __future__ import annotations

from storm_git.integrations import hookd

# what the agent verbs import inside their commands, loaded once in the daemon
PRELOAD = ("storm_git.cli.main", "storm_git.render", "storm_git.testwatch.notices", "storm_git.testwatch.report",
           "storm_git.admin.modes", "click")


def run(args: list[str]) -> None:
    from storm_git.cli.main import main

    main(args)


def main(argv: list[str]) -> None:
    """``COMMON_DIR SOCKET_PATH``, as the client starts the daemon."""
    hookd.main(argv, cli=run, preload_more=PRELOAD)
