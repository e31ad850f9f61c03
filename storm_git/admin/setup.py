"""``git storm init``: create the shared ref and choose the mode.

Init also installs the pre-commit guard (:mod:`storm_git.admin.hooks_install`) and
reports it, since the guard changes what a plain ``git commit`` does; and it
warns when the working tree is dirty: agents read the shared head (the last
commit) while the person's edits stay on disk, unseen by them.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.errors import RepoStateError
from ..core.locks import flocked
from ..core.porcelain import parse_status_z
from ..core.store import WORKSPACE_REF, Store, git_env, resolve_commit
from ..core.workspace import MODES
from ..storm import branch


@dataclass
class InitResult:
    head: str
    created: bool
    mode: str
    hooks: list[str] = field(default_factory=list)  # hook shims installed (storm_git.admin.hooks_install)
    hooks_install: dict[str, Any] = field(default_factory=dict)  # HooksResult: where, why, how to commit
    dirty: list[dict[str, str]] = field(default_factory=list)  # {"status": XY, "path"} like git status --short
    warnings: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)  # with a dirty tree: what the person can do

    def to_dict(self) -> dict:
        return dict(self.__dict__)


DIRTY_CHOICES = [
    "keep them as a named agent's work (after init): git storm adopt PATH... --agent NAME",
    "set them aside before init: git stash -u (then git storm init; git stash pop later)",
    "start the shared workspace from another commit: git storm init --base REF",
]


def dirty_entries(store: Store) -> list[dict[str, str]]:
    """The main working tree's changes as ``git status --short`` lists them (ignored files not)."""
    r = subprocess.run(["git", "status", "--porcelain=v1", "-z"], cwd=store.main_workdir,
                       capture_output=True, env=git_env())
    if r.returncode != 0:
        return []
    return [{"status": xy, "path": p} for xy, p in parse_status_z(r.stdout, rename_sources=False)]


def _record_disk(store: Store) -> None:
    """What is on disk now is git's checkout of HEAD: record that (not the shared
    head, which --base may set elsewhere); the first sync brings clean files to
    the shared head and finds the person's own edits as unmediated."""
    from ..disk.record import reset

    with flocked(store.commondir, "worktree"):
        tree = (store.repo.head.peel(pygit2.Commit).tree.id if not store.repo.head_is_unborn
                else store.empty_tree())
        reset(store, tree, None)


def init(store: Store, base: str | None = None) -> InitResult:
    """Create ``refs/storm/workspace`` at ``base`` (default HEAD); idempotent."""
    if store.repo.head_is_unborn and base is None:
        raise RepoStateError("the repository has no commits yet",
                             hint="make a first commit, then run git storm init")
    mode = store.config_get("storm.mode")
    if mode is not None and mode not in MODES:
        raise RepoStateError(f"storm.mode is {mode!r}, not one of {', '.join(MODES)}",
                             hint="fix it with git config storm.mode storm")
    with flocked(store.commondir, "workspace"):
        existing = store.ref(WORKSPACE_REF)
        created = False
        if existing is None:
            commit = resolve_commit(store, base or "HEAD")
            created = store.cas(None, WORKSPACE_REF, commit.id, "storm: init")
            if created:
                _record_disk(store)
                branch.record(store, commit.id)
        head = store.ref_target(WORKSPACE_REF)
        if mode is None:
            mode = "storm"
            store.config_set("storm.mode", mode)
    from .hooks_install import install as install_hooks

    res = InitResult(str(head), created, mode)
    hooks = install_hooks(store)
    res.hooks, res.hooks_install = list(hooks.installed), hooks.to_dict()
    if hooks.skipped:
        res.warnings.append(f"pre-commit guard not installed: {hooks.skipped}")
    if created:
        res.dirty = dirty_entries(store)
        if res.dirty:
            res.warnings.append(
                f"the working tree has {len(res.dirty)} uncommitted change(s): agents read the shared head "
                f"({str(head)[:10]}), not these edits, which stay on disk unseen by them")
            res.choices = list(DIRTY_CHOICES)
    return res
