"""Storm's private git index, ``<common git dir>/storm/exec-index``: whether git
can read it, and discarding one it cannot.

The index is a cache of stat data for the disk record's tree (tracking's
snapshots run ``git status`` against it). Losing it loses nothing: the next
snapshot rebuilds it from git's own index and that tree. A corrupt one (a torn
copy, a full disk, a hand edit) would fail every snapshot, so it is named as
corrupt state and ``git storm doctor --fix`` discards it.
"""
from __future__ import annotations

import os
import subprocess

from ..core.store import Store, git_env

INDEX_NAME = "exec-index"
STATE_NAME = "exec-index.tree"  # the tree the index holds
FIX_HINT = "run git storm doctor --fix: it discards storm's private index, and the next command rebuilds it"


def index_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", INDEX_NAME)


def problem(store: Store) -> str | None:
    """Why git cannot read the private index (its own words), or None: it can, or
    there is none."""
    index = index_path(store)
    if not os.path.lexists(index):
        return None
    if not os.path.isfile(index):
        return "it is not a file"
    r = subprocess.run(["git", "ls-files", "-z"], cwd=store.main_workdir, capture_output=True, check=False,
                       env=git_env(GIT_DIR=store.commondir, GIT_WORK_TREE=store.main_workdir, GIT_INDEX_FILE=index,
                                   LC_ALL="C"))
    if r.returncode == 0:
        return None
    lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return f"git exited {r.returncode}"
    return lines[0].removeprefix("fatal: ").removeprefix("error: ").removeprefix(index + ": ")


def discard(store: Store) -> None:
    """Remove the private index and its record of the tree it held. Caller holds
    the worktree lock (every user of the index does)."""
    d = os.path.join(store.commondir, "storm")
    for name in (INDEX_NAME, STATE_NAME, INDEX_NAME + ".lock"):
        try:
            os.unlink(os.path.join(d, name))
        except FileNotFoundError:
            pass
