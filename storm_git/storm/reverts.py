"""Disk content that is an *older* shared version (a ``git stash``, ``git reset
--hard``, an editor's stale buffer): recording it would undo accepted writes."""
from __future__ import annotations

from typing import Any

import pygit2

from ..core import trailers
from ..core.store import Store
from ..core.tree_diff import changed_paths
from . import branch
from .snapshot import Snapshot, version_at
from .validated_writer import AS_WRITTEN

REVERT_LOOKBACK = 100


def reverted_paths(store: Store, head: pygit2.Oid, states: dict[str, Any],
                   record: pygit2.Tree) -> set[str]:
    """Paths whose disk content is an *older* version storm had (a ``git stash``,
    ``git reset --hard``, an editor's stale buffer): never adopted by default.
    git's HEAD counts as older only while it holds nothing the shared workspace
    lacks: after a ``git pull`` its files are newer, not reverted (storm.branch)."""
    want = {p: s[0] for p, s in states.items() if isinstance(s, tuple)}
    want.update({p: None for p, s in states.items() if s is None})
    out: set[str] = set()
    pending = [(p, oid) for p, oid in want.items() if oid != version_at(store, record, p)]
    if not pending:
        return out
    head_commit = store.commit(head)
    walked: list[pygit2.Commit] = []  # each leads from the next older searched tree to a newer one
    trees: list[pygit2.Oid] = []
    c = head_commit
    for _ in range(REVERT_LOOKBACK):
        if not c.parent_ids:
            break
        walked.append(c)
        c = store.commit(c.parent_ids[0])
        trees.append(c.tree_id)
    tip_tree: pygit2.Oid | None = None
    try:
        if not store.repo.head_is_unborn:
            tip = store.repo.head.peel(pygit2.Commit)
            if branch.in_step(store, head, tip.id):  # else it holds commits newer than the shared state
                tip_tree = tip.tree_id
                trees.append(tip_tree)
    except (pygit2.GitError, KeyError):
        pass
    searched: list[pygit2.Tree] = []
    for t in trees:
        try:
            searched.append(store.tree(t))
        except (pygit2.GitError, KeyError):
            pass  # a treeless partial clone (--filter=tree:0) lacks it: fetching 100 trees to spot a revert
            #       would cost a round trip each
    head_tree = head_commit.tree
    moved = _moved(store, walked, head_tree, tip_tree) if len(pending) > FEW_TO_LOOK_UP and searched else None
    for p, oid in pending:
        if moved is not None and p not in moved:  # every searched tree has head's version of it
            if oid == version_at(store, head_tree, p):
                out.add(p)
            continue
        if any(_held_version(store, t, p) == oid for t in searched):
            out.add(p)
    return out


FEW_TO_LOOK_UP = 16


def _moved(store: Store, walked: list[pygit2.Commit], head_tree: pygit2.Tree,
           tip_tree: pygit2.Oid | None) -> set[str] | None:
    """Every path whose version differs between head and some searched tree: the
    paths each walked commit changed (a storm write names them in its trailers, the
    guard on a server checks they are all it changed; others are diffed) and those
    git's HEAD holds differently. One pass, instead of a lookup per path and tree (an
    exec creating 2,000 files paid 0.6 s for those); None where a partial clone
    lacks a tree (then each path is looked up)."""
    moved: set[str] = set()
    try:
        for x in walked:
            t = trailers.parse(x.message)
            if "Storm-Op" in t and "Storm-Path" in t and len(x.parent_ids) == 1:
                moved.update(t["Storm-Path"])
            else:
                moved.update(changed_paths(store, store.commit(x.parent_ids[0]).tree, x.tree))
        if tip_tree is not None:
            moved.update(changed_paths(store, head_tree, store.tree(tip_tree)))
    except (pygit2.GitError, KeyError):
        return None
    return moved


def _held_version(store: Store, tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    """``path``'s version in an older tree; None where a partial clone lacks a subtree."""
    try:
        return version_at(store, tree, path)
    except (pygit2.GitError, KeyError):
        return None


def revert_targets(store: Store, head: pygit2.Oid, start: pygit2.Tree, after: Snapshot,
                   expected: dict[str, str | None], agent: str) -> list[str]:
    """The command's targets it set back to an older shared version, now validated as
    a write's targets (``AS_WRITTEN``: the agent must have read the current version).
    Other targets are validated against what was on disk when the command started,
    which the command read; a ``git checkout``, ``stash`` or ``reset --hard`` takes
    its content from git's history instead, so that is no evidence that the agent saw
    the work it undoes: ``exec -- git checkout -- .`` must not revert other agents'
    accepted writes that the agent never read. A revert that undoes only the agent's
    own writes (:func:`undoes_only_own`) loses no one's work and stays validated like
    the command's other targets, whatever its read set holds (a new session of the
    agent starts with an empty one)."""
    states = {p: after.dirty.get(p) for p in expected}
    reverted = sorted(reverted_paths(store, head, states, start))
    for p in reverted:
        if not undoes_only_own(store, head, p, _oid_of(states[p]), agent):
            expected[p] = AS_WRITTEN
    return reverted


def _oid_of(state: Any) -> pygit2.Oid | None:
    return state[0] if isinstance(state, tuple) else None


def undoes_only_own(store: Store, head: pygit2.Oid, path: str, restored: pygit2.Oid | None, agent: str) -> bool:
    """Whether every shared commit that changed ``path`` since a version equal to
    ``restored`` was a write of ``agent`` (``Storm-Agent``), walking back from ``head``
    along first parents (at most ``REVERT_LOOKBACK`` commits): then setting it back
    undoes the agent's own work and no one else's."""
    try:
        c = store.commit(head)
        version = version_at(store, c.tree, path)
        for _ in range(REVERT_LOOKBACK):
            if version == restored:
                return True
            if not c.parent_ids:
                return False
            parent = store.commit(c.parent_ids[0])
            older = version_at(store, parent.tree, path)
            if older != version and trailers.parse(c.message).get("Storm-Agent") != [agent]:
                return False
            c, version = parent, older
    except (pygit2.GitError, KeyError):
        return False  # a partial clone lacks a tree: the read set decides
    return False
