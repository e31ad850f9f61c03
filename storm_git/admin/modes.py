"""``git storm mode``: show or switch ``storm.mode``, refusing to strand work.

A switch is refused (nothing changes) while the current mode has work that is
not integrated into the target branch, unless forced:

* storm mode: the shared head's tree differs from the target branch's tree
  (accepted writes the manager has not committed);
* worktree mode: an agent branch has commits not merged into the target, or an
  agent worktree has uncommitted changes.

Switching to storm mode starts the shared workspace from the integrated state:
when the target branch's tree differs from the shared head (merges happened in
worktree mode), a ``sync`` commit with the target's tree and both heads as
parents is put on ``refs/storm/workspace``, so storm mode continues from the
merged work and its history stays one chain. Every switch is an event in the log.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import events
from ..core.errors import NotInitialised, RepoStateError, UsageError
from ..core.locks import flocked
from ..core.store import WORKSPACE_REF, Store
from ..core.workspace import MODES
from ..storm import branch
from ..worktree.worktrees import agent_worktree, ahead_behind, dirty_paths, storm_branches, target_branch


class Unintegrated(RepoStateError):
    kind = "unintegrated_work"


@dataclass
class ModeResult:
    mode: str
    previous: str
    changed: bool
    forced: bool = False
    target: str | None = None
    unintegrated: list[str] = field(default_factory=list)
    synced: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def current(store: Store) -> str:
    mode = store.config_get("storm.mode")
    if mode is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    return str(mode)


def _changed_paths(store: Store, a, b, limit: int = 5) -> list[str]:
    diff = store.repo.diff(store.repo[a], store.repo[b])
    return [d.new_file.path for d in list(diff.deltas)[:limit]]


def unintegrated(store: Store, mode: str, target: str) -> list[str]:
    """What the mode holds that is not on the target branch, one line per item."""
    target_oid = store.ref_target("refs/heads/" + target)
    out: list[str] = []
    if mode == "storm":
        ws = store.ref_target(WORKSPACE_REF)
        if ws is not None and target_oid is not None:
            a, b = store.commit(target_oid).tree_id, store.commit(ws).tree_id
            if a != b:
                paths = _changed_paths(store, a, b)
                out.append(f"{WORKSPACE_REF} ({str(ws)[:10]}) differs from {target} in "
                           f"{', '.join(paths)}{' …' if len(paths) == 5 else ''}")
        return out
    for agent, branch in storm_branches(store).items():
        tip = store.ref_target("refs/heads/" + branch)
        ahead, _ = ahead_behind(store, str(tip), target_oid)
        if ahead:
            out.append(f"{branch}: {ahead} commit(s) not merged into {target}")
        w = agent_worktree(store, agent)
        if w is not None and not w.prunable and not w.main:
            dirty = dirty_paths(store, w.path)
            if dirty:
                out.append(f"{branch}: {len(dirty)} uncommitted change(s) in {w.path} ({', '.join(dirty[:3])})")
    return out


def show(store: Store, *, into: str | None = None) -> ModeResult:
    mode = current(store)
    target = target_branch(store, into)
    return ModeResult(mode, mode, False, target=target, unintegrated=unintegrated(store, mode, target))


def switch(store: Store, new: str, *, force: bool = False, by: str = "manager",
           into: str | None = None) -> ModeResult:
    if new not in MODES:
        raise UsageError(f"unknown mode {new!r}", hint=f"use one of {', '.join(MODES)}")
    old = current(store)
    target = target_branch(store, into)
    if new == old:
        return ModeResult(new, old, False, target=target)
    with flocked(store.commondir, "workspace"):
        pending = unintegrated(store, old, target)
        if pending and not force:
            what = "commit the shared state first (git storm commit)" if old == "storm" else \
                "merge or commit first (git storm commit --agent A; git storm merge)"
            raise Unintegrated(f"{old} mode has work not integrated into {target}: {'; '.join(pending)}",
                               hint=f"{what}, or pass --force")
        synced = None
        if new == "storm":
            synced = _sync_workspace(store, target, by)
        store.config_set("storm.mode", new)
        events.append(store, "mode", by, f"{old} -> {new}" + (" (forced)" if pending else ""),
                      {"from": old, "to": new, "forced": bool(pending), "unintegrated": pending,
                       "target": target, "synced": synced})
    return ModeResult(new, old, True, bool(pending), target, pending, synced)


def _sync_workspace(store: Store, target: str, by: str) -> str | None:
    """Bring the shared head to the target's tree (workspace lock held)."""
    tip = store.ref_target("refs/heads/" + target)
    ref = store.ref(WORKSPACE_REF)
    branch.record(store, tip)  # the shared workspace holds the target's tip from here on
    if ref is None:
        store.cas(None, WORKSPACE_REF, tip, "storm: start from the integrated state")
        return str(tip)
    if store.commit(ref.target).tree_id == store.commit(tip).tree_id:
        return None
    msg = (f"storm: continue from {target} (worktree mode merges)\n\n"
           f"Storm-Agent: {by}\nStorm-Op: sync\n")
    commit = store.make_commit(store.commit(tip).tree_id, [ref.target, tip], by, msg)
    if not store.cas(ref, WORKSPACE_REF, commit, "storm: sync with target"):
        raise RepoStateError(f"{WORKSPACE_REF} moved during the switch", hint="run git storm mode storm again")
    return str(commit)
