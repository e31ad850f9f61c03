"""``git storm init``: create the shared ref and choose the mode."""
from __future__ import annotations

from dataclasses import dataclass, field

import pygit2

from .errors import RepoStateError, UsageError
from .locks import flocked
from .store import WORKSPACE_REF, Store

MODES = ("storm", "worktree")


@dataclass
class InitResult:
    head: str
    created: bool
    mode: str
    hooks: list[str] = field(default_factory=list)  # hook shims installed (storm_git.hooks_install)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def resolve_commit(store: Store, rev: str) -> pygit2.Commit:
    try:
        obj = store.repo.revparse_single(rev)
        return obj.peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
        raise UsageError(f"{rev!r} does not name a commit", hint="give a branch, tag or commit id") from None


def _record_disk(store: Store) -> None:
    """What is on disk now is git's checkout of HEAD: record that (not the shared
    head, which --base may set elsewhere); the first sync brings clean files to
    the shared head and finds the person's own edits as unmediated."""
    from .disk import reset

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
        head = store.ref_target(WORKSPACE_REF)
        if mode is None:
            mode = "storm"
            store.config_set("storm.mode", mode)
    from .hooks_install import install as install_hooks

    hooks = install_hooks(store).installed
    return InitResult(str(head), created, mode, hooks)
