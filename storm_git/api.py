"""Opening a repository's workspace in the mode its config names.

``storm.mode`` decides what the verbs mean; callers (the CLI, the
MCP server, scripts) use :func:`open_workspace` and the same verbs in both modes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .core.errors import CorruptState, NotInitialised
from .core.store import Store
from .core.workspace import MODES
from .storm.workspace import SharedWorkspace

if TYPE_CHECKING:
    from .worktree.isolated import WorktreeWorkspace


def open_workspace(path: str | None = None, *, store: Store | None = None) -> "SharedWorkspace | WorktreeWorkspace":
    """The workspace of the repository containing ``path`` (default: cwd)."""
    store = store or Store.discover(path)
    mode = store.config_get("storm.mode")
    if mode is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    if mode == "storm":
        remote = store.config_get("storm.remote")
        if remote:  # the shared workspace lives on a git remote (storm_git.remote)
            from .remote.workspace import RemoteWorkspace

            return RemoteWorkspace(store, str(remote))
        return SharedWorkspace(store)
    if mode == "worktree":
        from .worktree.isolated import WorktreeWorkspace

        return WorktreeWorkspace(store)
    raise CorruptState(f"storm.mode is {mode!r}, not one of {', '.join(MODES)}",
                       hint="fix it with git config storm.mode storm")
