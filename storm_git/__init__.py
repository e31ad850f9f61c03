"""git storm: several coding agents on one repository, on git itself.

The library behind ``git storm``: it returns data and raises typed errors
(:mod:`storm_git.core.errors`), never prints. Start with :func:`open_workspace`::

    from storm_git import open_workspace
    ws = open_workspace("path/to/repo")
    [r] = ws.read(["src/app.py"], agent="engineer_1")
    res = ws.write("src/app.py", r.content + b"# engineer_1: why\\n", agent="engineer_1")
    if not res.accepted:
        print(res.rejection.reason, res.rejection.target.diff)
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["open_workspace", "init", "Store", "StormError", "__version__"]

# Imported on first use: `git storm -h` must not pay for pygit2 (~40 ms).
_LAZY = {"open_workspace": "api", "init": "admin.setup", "Store": "core.store", "StormError": "core.errors"}


def __getattr__(name: str) -> object:  # no typing import: every hook call imports this
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
