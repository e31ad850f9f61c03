"""Joining a git server's shared workspace: ``git storm init --remote`` and ``git storm join``.

Setting a clone up is administration: it takes storm's set-up (the refs, the
hooks) and the remote client's fetch, so it sits above both.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.errors import NotInitialised, RepoStateError, UsageError
from ..core.locks import flocked
from ..core.store import AGENTS_PREFIX, WORKSPACE_REF, Store
from ..remote import transport
from ..remote.branch_follow import follow
from ..remote.queue import tracked_head
from ..remote.transport import RemoteRefused, Unreachable
from ..remote.workspace import adopt_tracking, exchanging, learn_writers
from .hooks_install import install
from .setup import init


@dataclass
class JoinResult:
    remote: str
    head: str
    created: bool  # this clone created the shared workspace on the remote
    hooks: list[str] = field(default_factory=list)
    disk: dict[str, int] = field(default_factory=dict)  # outcome -> number of paths
    kept: list[str] = field(default_factory=list)  # local edits sync left in place
    warnings: list[str] = field(default_factory=list)
    branch: dict[str, Any] | None = None  # what following the server's branch did (branch_follow)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def init_remote(store: Store, remote: str, base: str | None = None) -> JoinResult:
    """``git storm init --remote NAME``: put this clone's shared workspace on ``remote``
    (created from HEAD or ``base``), or join the one already there."""
    transport.check_remote(store, remote)
    with exchanging(store):
        transport.fetch(store, remote)
    if tracked_head(store, remote) is not None:
        res = join(store, remote)
        if base is not None:
            res.warnings.append(f"{remote} already has a shared workspace: joined it, --base was not used")
        return res
    local = init(store, base)
    with exchanging(store):
        with flocked(store.commondir, "workspace"):
            head = store.ref_target(WORKSPACE_REF)
            updates = [(str(head), WORKSPACE_REF, "")]
            updates += [(str(store.ref_target(r)), r, None) for r in store.refs_under(AGENTS_PREFIX)]
        out = transport.push(store, remote, updates)
        if not out.ok and not out.stale(WORKSPACE_REF):
            if out.unreachable:
                raise Unreachable(f"cannot push the shared workspace to {remote}: {transport.describe_failure(out)}",
                                  hint="check that the server is up, then run git storm init --remote again")
            raise RemoteRefused(f"{remote} refused the shared workspace: {transport.describe_failure(out)}",
                                hint="the server must accept refs/storm/* (see docs/remote.md)")
    if not out.ok:  # another clone created it first: join that one
        return join(store, remote)
    store.config_set("storm.remote", remote)
    with exchanging(store):
        transport.fetch(store, remote)
    return JoinResult(remote, str(head), True, hooks=list(local.hooks), warnings=list(local.warnings))


def join(store: Store, remote: str) -> JoinResult:
    """``git storm join NAME``: fetch the storm refs, set the mode, and bring the
    working tree to the shared head through the disk record (local edits stay). A
    clone whose branch has no commit yet (the server's HEAD named a branch it lacks)
    is put on the server's branch first, before anything is written to disk."""
    from ..disk.record import record_path, reset
    from ..disk.sync import KEPT, sync

    transport.check_remote(store, remote)
    mode = store.config_get("storm.mode")
    if mode not in (None, "storm"):
        raise RepoStateError(f"this clone is in {mode} mode", hint="switch first: git storm mode storm")
    warnings = []
    unborn = store.repo.head_is_unborn
    chosen = _branch_for_unborn(store, remote) if unborn else None
    with exchanging(store), flocked(store.commondir, "workspace"):
        transport.fetch(store, remote)
        if tracked_head(store, remote) is None:
            raise NotInitialised(f"{remote} has no shared workspace ({WORKSPACE_REF})",
                                 hint=f"run git storm init --remote {remote} in a clone that has the code")
        mine = store.ref_target(WORKSPACE_REF)
        theirs = tracked_head(store, remote)
        if mine is not None and mine != theirs and not store.descends(theirs, mine):
            warnings.append(f"the local shared head {str(mine)[:10]} is not on {remote}: replaced by its "
                            f"{str(theirs)[:10]}; the local writes stay reachable as git log {mine}")
        learn_writers(store, remote)
        adopt_tracking(store, remote)
        head = store.ref_target(WORKSPACE_REF)
    if not os.path.exists(record_path(store)):
        # what is on disk is git's checkout of HEAD (or nothing in an empty clone)
        with flocked(store.commondir, "worktree"):
            tree = store.repo.head.peel(pygit2.Commit).tree.id if not unborn else store.empty_tree()
            reset(store, tree, None)
    if chosen is not None:
        _check_out_unborn(store, remote, chosen)
        warnings.append(f"this clone had no commit on its branch: now on {chosen}, as on {remote}")
    elif unborn:
        warnings.append(f"{remote} has no branch: the manager's first git storm commit starts one "
                        f"(push it with git push {remote} HEAD)")
    store.config_set("storm.mode", "storm")
    store.config_set("storm.remote", remote)
    hooks = install(store)
    outcomes = sync(store, full=True).outcomes
    res = JoinResult(remote, str(head), False, hooks=list(hooks.installed), warnings=warnings)
    for o in outcomes.values():
        res.disk[o] = res.disk.get(o, 0) + 1
    res.kept = sorted(p for p, o in outcomes.items() if o == KEPT)
    if hooks.skipped:
        res.warnings.append(f"pre-commit guard not installed: {hooks.skipped}")
    if not store.repo.head_is_unborn:
        res.branch = follow(store, remote).to_dict()
    return res


def _branch_for_unborn(store: Store, remote: str) -> str | None:
    """The server's branch a clone with no commit yet goes on: its own branch's name
    when the server has it, the only branch, or the one the server's HEAD names; None
    when the server has no branch. Several and none named: exit 2, nothing changed."""
    own = store.repo.lookup_reference("HEAD").target
    own = own[len("refs/heads/"):] if own.startswith("refs/heads/") else own
    heads = transport.list_heads(store, remote)
    if not heads.branches:
        return None
    chosen = next((n for n in (own, heads.head) if n in heads.branches), None)
    if chosen is None and len(heads.branches) == 1:
        chosen = next(iter(heads.branches))
    if chosen is not None:
        mine = store.ref_target(f"refs/heads/{chosen}")
        if mine is not None and str(mine) != heads.branches[chosen]:
            raise UsageError(f"this clone has no commit on {own}, and its own branch {chosen} is not "
                             f"{remote}'s {chosen}: joining would have to move it",
                             hint=f"check out the branch you mean to work on (git checkout {chosen}, or git "
                                  f"checkout -b NAME --track {remote}/{chosen}), then git storm join {remote} "
                                  "again; nothing was changed")
        return chosen
    names = ", ".join(sorted(heads.branches)[:5])
    raise UsageError(f"this clone has no commit on {own} and {remote}'s HEAD names "
                     f"{heads.head or 'no branch'}; {remote} has several branches ({names})",
                     hint=f"choose one: git checkout -b NAME --track {remote}/NAME (after git fetch {remote}), "
                          f"then git storm join {remote} again; nothing was changed")


def _check_out_unborn(store: Store, remote: str, name: str) -> None:
    """Put a clone with no commit on the server's branch ``name``: the branch, its
    upstream and git's index; the disk is storm's (synced next)."""
    from ..storm import index

    src, tracking = f"refs/heads/{name}", f"refs/remotes/{remote}/{name}"
    if not transport.fetch_branch(store, remote, src, tracking):
        raise RepoStateError(f"{remote} lost its branch {name} while joining", hint=f"run git storm join {remote} again")
    tip = store.ref_target(tracking)
    if store.ref_target(src) not in (None, tip):
        raise RepoStateError(f"{src} appeared while joining", hint=f"run git storm join {remote} again")
    store.repo.references.create(src, tip, force=True)
    store.config_set(f"branch.{name}.remote", remote)
    store.config_set(f"branch.{name}.merge", src)
    store.repo.set_head(src)
    with index.locked(store):
        index.reset(store, store.commit(tip).tree.id)
