"""Bring a clone's branch to the server's: the manager's commit reaches every clone.

In storm mode the working tree is the shared workspace, not a checkout of the
branch, so git's own ``git merge --ff-only origin/main`` refuses ("untracked working
tree files would be overwritten") and a manager's ``git storm commit`` made in another
clone would diverge from the server's branch. ``git storm sync`` (and ``join``) do
what a fast-forward means here: the branch ref and git's index move to the server's
commit; the disk is storm's and is not touched. A manager's commit names the shared
head it holds (``Storm-Workspace``): when the shared workspace holds that head, the
clone records the commit as integrated and the head as committed, so its own next
manager's commit lists only the writes made since. A commit the shared workspace
does not hold (a person's push) stays branch news, which the next manager's commit
merges in (storm_git.storm.branch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pygit2

from ..core import trailers
from ..core.errors import RepoStateError
from ..core.locks import flocked
from ..core.store import WORKSPACE_REF, Store
from ..storm import branch as storm_branch, index
from ..storm.manager import COMMITTED_REF
from . import transport

UP_TO_DATE, FAST_FORWARD, AHEAD, DIVERGED, NO_UPSTREAM, DETACHED = (
    "up_to_date", "fast_forward", "ahead", "diverged", "no_upstream", "detached")


@dataclass
class BranchFollow:
    """What following the server's branch did."""

    branch: str | None
    upstream: str | None  # the remote-tracking ref followed
    state: str
    before: str | None = None
    after: str | None = None
    commits: int = 0  # how many commits the branch moved forward (or how many it is ahead / apart)
    integrated: bool = False  # the shared workspace holds the new tip (a manager's commit of it)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _upstream(store: Store, remote: str, name: str) -> tuple[str, str]:
    """(the server's ref, the local remote-tracking ref) that branch ``name`` follows:
    its configured upstream when that is on ``remote``, else the same name there."""
    merge = store.config_get(f"branch.{name}.merge")
    if merge and store.config_get(f"branch.{name}.remote") == remote and str(merge).startswith("refs/heads/"):
        src = str(merge)
    else:
        src = f"refs/heads/{name}"
    return src, f"refs/remotes/{remote}/{src[len('refs/heads/'):]}"


def follow(store: Store, remote: str) -> BranchFollow:
    """Fast-forward the checked-out branch (and the index) to the server's, when the
    server's is ahead; report otherwise (a clone's own commits are never rewritten)."""
    repo = store.repo
    if repo.head_is_detached:
        return BranchFollow(None, None, DETACHED)
    name = repo.lookup_reference("HEAD").target
    short = name[len("refs/heads/"):] if name.startswith("refs/heads/") else name
    src, tracking = _upstream(store, remote, short)
    if not transport.fetch_branch(store, remote, src, tracking):
        return BranchFollow(short, None, NO_UPSTREAM)
    theirs = store.ref_target(tracking)
    mine = None if repo.head_is_unborn else repo.head.target
    out = BranchFollow(short, tracking, UP_TO_DATE, str(mine) if mine else None, str(theirs))
    if theirs is None or mine == theirs:
        return out
    if mine is not None and repo.descendant_of(mine, theirs):
        out.state, out.after = AHEAD, str(mine)
        out.commits = _count(repo, mine, theirs)
        return out
    if mine is not None and not repo.descendant_of(theirs, mine):
        out.state, out.after = DIVERGED, str(mine)
        out.commits = _count(repo, mine, theirs)
        return out
    with index.locked(store):  # before the branch moves, held until the index has its tree
        with flocked(store.commondir, "workspace"):
            current = None if repo.head_is_unborn else repo.head.target
            if current != mine:
                raise RepoStateError(f"{short} moved while storm was following {tracking}; nothing was changed",
                                     hint="run git storm sync again")
            ref = repo.references.get(name)
            if not store.cas(ref, name, theirs, f"storm sync: fast-forward to {tracking}"):
                raise RepoStateError(f"{short} moved while storm was following {tracking}; nothing was changed",
                                     hint="run git storm sync again")
            out.integrated = _record_if_held(store, theirs)
        index.reset(store, store.commit(theirs).tree.id)
    out.state = FAST_FORWARD
    out.commits = _count(repo, theirs, mine)
    return out


def _record_if_held(store: Store, tip: pygit2.Oid) -> bool:
    """A manager's commit whose shared head the workspace holds: record it as
    integrated and its head as committed (workspace lock held)."""
    named = trailers.parse(store.commit(tip).message).get("Storm-Workspace")
    head = store.ref_target(WORKSPACE_REF)
    if not named or head is None:
        return False
    try:
        shared = pygit2.Oid(hex=named[0])
        held = shared == head or store.descends(head, shared)
    except (ValueError, KeyError, pygit2.GitError):
        return False
    if not held:
        return False
    storm_branch.record(store, tip)
    committed = store.ref(COMMITTED_REF)
    if committed is None or store.descends(shared, committed.target):
        store.cas(committed, COMMITTED_REF, shared, "storm: committed (by the manager of another clone)")
    return True


def _count(repo: pygit2.Repository, tip: pygit2.Oid, hide: pygit2.Oid | None) -> int:
    walker = repo.walk(tip, pygit2.enums.SortMode.NONE)
    if hide is not None:
        walker.hide(hide)
    return sum(1 for _ in walker)
