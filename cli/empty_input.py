"""Whether a write of empty content would empty a file that holds some.

An agent's shell has a stdin that is not a terminal, so ``git storm write F``
with a forgotten ``<`` reads nothing and would empty ``F``. The command line
refuses that unless told (``--allow-empty``); this module says what the file
holds now, where the write would land, without recording a read.
"""
from __future__ import annotations

import os

import pygit2


def holds_content(ws: object, raw: str, agent: str | None) -> str | None:
    """"PATH holds N bytes" when the write's target has content now, else None
    (absent, or empty). Errors of a bad path or agent are the write's own."""
    from storm_git.core.paths import normalize
    from storm_git.storm.workspace import SharedWorkspace

    if isinstance(ws, SharedWorkspace):
        path = ws.path(raw, for_write=True)
        try:
            obj = ws.store.repo.revparse_single(f"{ws.head()}:{path}")
        except (KeyError, ValueError, pygit2.GitError):
            return None
        size = obj.size if isinstance(obj, pygit2.Blob) else 0
    else:
        from storm_git.core.agents import validate_agent

        top = ws.worktree(validate_agent(agent)).path  # type: ignore[attr-defined]
        path = normalize(raw, ws.store.prefix, top)  # type: ignore[attr-defined]
        try:
            size = os.lstat(os.path.join(top, path)).st_size
        except OSError:
            return None
    return f"{path} holds {size} bytes" if size else None
