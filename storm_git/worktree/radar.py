"""Conflict radar for worktree mode: which files an agent relies on another agent changed.

Worktree mode isolates agents until ``git storm merge``; storm mode catches a
conflict at the write. The radar gives worktree mode the early warning without
giving up isolation: both modes record each agent's reads and writes (its read
set, storm_git.core.readsets), so for agent A the radar looks at every path A read or
wrote (its read set, what its branch changed, what its worktree has uncommitted)
and reports those that another agent's branch changed (its commits not yet on
the target), or that the target gained since A forked. Each hit carries the
other side's diff from the merge base, and whether an in-memory three-way merge
of the two trees (pygit2 ``merge_trees``: no index, no working tree) conflicts
on that path, with the conflict hunks (ancestor / ours / theirs).

It is advisory: nothing is merged, moved or refused. It shows at three places:
A's commit (the pre-commit guard and ``git storm commit`` print it), ``git
storm status`` (a short ``radar`` section) and ``git storm radar [AGENT]``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import readsets
from ..core.diffs import unified
from ..core.errors import StormError
from ..core.store import Store
from .merge import Hunk, conflict_hunks, files_changed, merge_file
from .worktrees import (
    agent_of_worktree,
    agent_worktree,
    branch_for,
    dirty_paths,
    run_git,
    storm_branches,
    target_branch,
)

OFF_ENV = "STORM_RADAR"  # "off": the pre-commit guard skips the radar (git storm commit shows it itself)
MAX_SHOWN_LINES = 40  # per hit, in the commit-time warning


@dataclass
class RadarHit:
    """A path ``agent`` read or wrote that ``other`` changed (on ``branch``)."""

    agent: str
    other: str
    branch: str
    kind: str  # "agent": another agent's branch; "target": merged into the target since agent forked
    path: str
    why: str  # "read" or "wrote"
    conflict: bool = False
    conflict_kind: str | None = None
    diff: str = ""
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def state(self) -> str:
        who = f"{self.other} changed it on {self.branch}" if self.kind == "agent" else \
            f"{self.branch} changed it since {self.agent} forked (merged work)"
        merge = f"a merge would conflict ({self.conflict_kind}, {len(self.hunks)} hunk(s))" if self.conflict \
            else "merges cleanly as text"
        return f"{self.agent} {self.why} it; {who}; {merge}"

    def to_dict(self, full: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"agent": self.agent, "other": self.other, "branch": self.branch, "kind": self.kind,
                             "path": self.path, "why": self.why, "conflict": self.conflict,
                             "conflict_kind": self.conflict_kind, "state": self.state}
        if full:
            d["diff"] = self.diff
            d["hunks"] = [h.to_dict() for h in self.hunks]
        return d


@dataclass
class RadarReport:
    agents: list[str]
    target: str | None
    hits: list[RadarHit]

    def to_dict(self) -> dict[str, Any]:
        return {"agents": self.agents, "target": self.target, "hits": [h.to_dict() for h in self.hits]}


# -- the scan ------------------------------------------------------------------------------------
def _tree(store: Store, oid: pygit2.Oid | None) -> pygit2.Oid | None:
    return None if oid is None else store.commit(oid).tree_id


def _base(store: Store, a: pygit2.Oid, b: pygit2.Oid) -> pygit2.Oid | None:
    try:
        return store.repo.merge_base(a, b)
    except (pygit2.GitError, KeyError):
        return None


def _changed(store: Store, old_tree: pygit2.Oid | None, new_tree: pygit2.Oid) -> set[str]:
    old = old_tree if old_tree is not None else store.empty_tree()
    return {c["path"] for c in files_changed(store, old, new_tree)}


def _blob(store: Store, tree: pygit2.Oid | None, path: str) -> bytes | None:
    if tree is None:
        return None
    try:
        e = store.entry(store.repo[tree], path)
    except StormError:
        return None
    return None if e is None else store.blob_bytes(e.oid)


def _conflicts(store: Store, base: pygit2.Oid | None, ours: pygit2.Oid, theirs: pygit2.Oid,
               paths: set[str]) -> dict[str, tuple[str, list[Hunk]]]:
    """{path: (kind, hunks)} of the in-memory merge's conflicts among ``paths``."""
    repo = store.repo
    index = repo.merge_trees(repo[base if base is not None else store.empty_tree()], repo[ours], repo[theirs])
    out: dict[str, tuple[str, list[Hunk]]] = {}
    if index.conflicts is None:
        return out
    for anc, our, their in index.conflicts:
        path = next(e.path for e in (anc, our, their) if e is not None)
        if path not in paths:
            continue
        stages = {n: (e.mode, str(e.id)) for n, e in ((1, anc), (2, our), (3, their)) if e is not None}
        if 2 in stages and 3 in stages:
            data = [store.blob_bytes(pygit2.Oid(hex=stages[n][1])) for n in (2, 3)]
            if any(b"\x00" in d[:8000] for d in data):
                out[path] = ("binary", [Hunk(0, None, None, None)])
            else:
                _, merged = merge_file(store, stages, None)
                out[path] = ("contents", conflict_hunks(merged))
        else:
            out[path] = ("modify/delete", [])
    return out


def _interest(store: Store, agent: str, tip: pygit2.Oid, target: pygit2.Oid | None,
              uncommitted: set[str] | None) -> tuple[set[str], set[str]]:
    """(paths read, paths written) by the agent: its read set; its branch's and worktree's
    changes (``uncommitted``: the staged or dirty paths, when the caller knows them)."""
    try:
        reads = set(readsets.peek(store, agent))
    except readsets.CorruptReadSet:
        reads = set()
    fork = _base(store, tip, target) if target is not None else None
    wrote = _changed(store, _tree(store, fork), _tree(store, tip)) if fork != tip else set()
    if uncommitted is not None:
        wrote |= uncommitted
    else:
        w = agent_worktree(store, agent)
        if w is not None and not w.prunable and not w.main:
            wrote |= set(dirty_paths(store, w.path))
    return reads - wrote, wrote


def scan(store: Store, agents: list[str] | None = None, *, ours_tree: pygit2.Oid | None = None,
         staged: set[str] | None = None, diffs: bool = True,
         dirty: dict[str, list[str]] | None = None) -> RadarReport:
    """Radar hits for ``agents`` (default: every agent with a branch). ``ours_tree`` and
    ``staged``: one agent's commit about to be made (its staged tree and paths).
    ``diffs`` False leaves out the other side's diff (status: the costly part);
    ``dirty``: each agent's uncommitted paths when the caller has them already."""
    branches = storm_branches(store)
    try:
        target_name: str | None = target_branch(store)
    except StormError:
        target_name = None
    target = store.ref_target("refs/heads/" + target_name) if target_name else None
    names = sorted(branches) if agents is None else agents
    tips = {a: store.ref_target("refs/heads/" + b) for a, b in branches.items()}
    own_changes: dict[str, tuple[pygit2.Oid | None, set[str]]] = {}

    def changes_of(other: str) -> tuple[pygit2.Oid | None, set[str]]:
        """What the other agent's branch has that the target lacks."""
        if other not in own_changes:
            tip = tips[other]
            fork = _base(store, tip, target) if target is not None else None
            own_changes[other] = (fork, set() if fork == tip else _changed(store, _tree(store, fork), _tree(store, tip)))
        return own_changes[other]

    hits: list[RadarHit] = []
    for agent in names:
        tip = tips.get(agent) or store.ref_target("refs/heads/" + branch_for(store, agent))
        if tip is None:
            continue
        known_dirty = set(dirty[agent]) if dirty is not None and agent in dirty else None
        reads, wrote = _interest(store, agent, tip, target, staged if staged is not None else known_dirty)
        mine = reads | wrote
        if not mine:
            continue
        ours = ours_tree if ours_tree is not None else _tree(store, tip)
        sources: list[tuple[str, str, str, pygit2.Oid, set[str]]] = []
        for other, branch in branches.items():
            if other == agent or tips.get(other) is None or branch == target_name:
                continue
            if tips[other] == tip or store.repo.descendant_of(tip, tips[other]):
                continue  # the agent has all of it already
            _, changed = changes_of(other)
            if changed & mine:
                sources.append((other, branch, "agent", tips[other], changed & mine))
        if target is not None and target_name is not None and target != tip and not store.repo.descendant_of(tip, target):
            fork = _base(store, tip, target)
            gained = _changed(store, _tree(store, fork), _tree(store, target)) & mine
            if gained:
                sources.append((target_name, target_name, "target", target, gained))
        for other, branch, kind, their_tip, paths in sources:
            base = _base(store, tip, their_tip)
            base_tree, their_tree = _tree(store, base), _tree(store, their_tip)
            conflicts = _conflicts(store, base_tree, ours, their_tree, paths)
            for p in sorted(paths):
                ck, hunks = conflicts.get(p, (None, []))
                diff = unified(p, _blob(store, base_tree, p), _blob(store, their_tree, p)) if diffs else ""
                hits.append(RadarHit(agent, other, branch, kind, p, "wrote" if p in wrote else "read",
                                     p in conflicts, ck, diff, hunks))
    return RadarReport(names, target_name, hits)


def status_items(store: Store, dirty: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """The short ``radar`` section of ``git storm status`` (no diffs; ``git storm radar`` has them)."""
    try:
        return [h.to_dict(full=False) for h in scan(store, diffs=False, dirty=dirty).hits]
    except Exception as exc:  # noqa: BLE001 - advisory: status still reports everything else
        return [{"path": "(radar unavailable)", "state": getattr(exc, "message", None) or str(exc)}]


# -- at an agent's commit ------------------------------------------------------------------------
def render_hit(h: dict[str, Any], max_lines: int | None = None) -> list[str]:
    """A hit (``RadarHit.to_dict()``) as text: the summary line, the other side's diff,
    the conflict hunks. Used by the pre-commit message and the CLI alike."""
    out = [f"  {h['path']}: {h['state']}"]
    diff = h.get("diff") or ""
    body = [f"    {line}" for line in diff.rstrip("\n").split("\n")] if diff else []
    for hk in h.get("hunks") or []:
        body.append(f"    conflict @@ line {hk['ours_line']}")
        for label, key in (("ancestor", "ancestor"), (f"ours ({h['agent']})", "ours"), (f"theirs ({h['other']})", "theirs")):
            text = hk.get(key)
            body.append(f"      {label}:")
            body.extend(f"        {line}" for line in (text if text is not None else "(binary)").rstrip("\n").split("\n"))
    if max_lines is not None and len(body) > max_lines:
        body = body[:max_lines] + [f"    ... ({len(body) - max_lines} more line(s): git storm radar {h['agent']})"]
    return out + body


def commit_warning(cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """The radar's advisory text for a ``git commit`` about to happen in an agent's
    worktree ("" when nothing overlaps). Never raises: a commit is never refused or
    broken by the radar."""
    env = dict(os.environ) if env is None else env
    if (env.get(OFF_ENV) or "").lower() in ("0", "off", "false", "no"):
        return ""
    try:
        store = Store.discover(cwd or os.getcwd())
        agent = agent_of_worktree(store) or env.get("STORM_AGENT") or ""
        if not agent or agent == (store.config_get("storm.manager") or "manager"):
            return ""
        index = {"GIT_INDEX_FILE": env["GIT_INDEX_FILE"]} if env.get("GIT_INDEX_FILE") else {}
        r = run_git(["write-tree"], store.top, env=index, check=False)
        if r.returncode != 0:
            return ""
        staged_tree = pygit2.Oid(hex=r.stdout.decode().strip())
        head_tree = None if store.repo.head_is_unborn else store.repo.head.peel(pygit2.Commit).tree_id
        staged = _changed(store, head_tree, staged_tree)
        rep = scan(store, [agent], ours_tree=staged_tree, staged=staged)
    except Exception:  # noqa: BLE001 - advisory: whatever happens, the commit goes on
        return ""
    return format_warning(agent, rep.hits)


def format_warning(agent: str, hits: list[RadarHit] | list[dict[str, Any]]) -> str:
    """The commit-time warning: one block per hit, diffs cut at MAX_SHOWN_LINES."""
    if not hits:
        return ""
    lines = [f"git storm radar: {len(hits)} file(s) {agent} read or wrote were changed by other agents "
             "(advisory: the commit goes on; isolation stays):"]
    for h in hits:
        lines.extend(render_hit(h if isinstance(h, dict) else h.to_dict(), MAX_SHOWN_LINES))
    lines.append(f"  (git storm radar {agent} shows them again; agree with the other agent now, "
                 "or expect it at git storm merge)")
    return "\n".join(lines) + "\n"


def safe_hits(store: Store, agent: str) -> list[dict[str, Any]]:
    """Hits for ``agent`` with diffs, for ``git storm commit`` (never raises: advisory)."""
    try:
        return [h.to_dict() for h in scan(store, [agent]).hits]
    except Exception:  # noqa: BLE001 - the commit is made; the radar must not turn it into an error
        return []
