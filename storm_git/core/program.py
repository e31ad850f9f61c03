"""How a shell runs this installation of git storm, whatever its PATH holds.

A harness gives its hooks and its agent's shell a PATH of its own (Codex's shell
is a login shell), which need not hold the virtualenv git storm is installed in:
commands storm writes into settings or tells an agent to run name it by path.
"""
from __future__ import annotations

import os
import shlex
import sys


def storm_program() -> str:
    """This installation's ``git-storm``, quoted for a shell (or its Python with ``-m storm_git``)."""
    script = os.path.join(os.path.dirname(sys.executable), "git-storm")
    return shlex.quote(script) if os.access(script, os.X_OK) else f"{shlex.quote(sys.executable)} -m storm_git"
