"""Hook shims that ``git storm init`` installs.

The shims are tiny ``sh`` scripts (``shims/<hook>``) with the interpreter that
installed them written in, so they work with a minimal PATH; all logic lives in
:mod:`storm_git.admin.guard`. Installation, chaining of a hook that was already there
and uninstallation are :mod:`storm_git.admin.hooks_install`.
"""
from __future__ import annotations

from importlib import resources

SHIMS = ("pre-commit",)
MARKER = "# git-storm-shim"


def shim_template(name: str) -> str:
    """The text of shim ``name`` with placeholders @PYTHON@, @GUARD@, @REINSTALL@ and @CHAINED@."""
    if name not in SHIMS:
        raise KeyError(name)
    return resources.files(__name__).joinpath("shims", name).read_text(encoding="utf-8")
