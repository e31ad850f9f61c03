"""git storm: several coding agents on one repository, on git itself.

The library behind ``git storm``: it returns data and raises typed errors
(:mod:`storm_git.errors`), never prints. Start with :func:`open_workspace`::

    from storm_git import open_workspace
    ws = open_workspace("path/to/repo")
    [r] = ws.read(["src/app.py"], agent="engineer_1")
    res = ws.write("src/app.py", r.content + b"# engineer_1: why\\n", agent="engineer_1")
    if not res.accepted:
        print(res.rejection.reason, res.rejection.target.diff)
"""
from __future__ import annotations

__version__ = "0.1.0"

from .api import open_workspace
from .errors import StormError
from .setup import init
from .store import Store

__all__ = ["open_workspace", "init", "Store", "StormError", "__version__"]
