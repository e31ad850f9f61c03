"""The manager's merge of agent branches (worktree mode), computed in memory first.

Each agent branch is merged with ``git merge-tree --write-tree`` (~5 ms
at any repository size, no index, no working tree; libgit2's in-memory merge
grows with the size). The result is a tree; a clean merge becomes a merge
commit on top of the previous one, a conflicting merge under ``abort`` is
dropped, so the target branch, its index and working tree are never touched by
a conflict. After the last agent the target moves once: by ``git merge
--ff-only`` in the worktree that has it checked out (git refuses if local
changes would be overwritten, and it is a CAS: a target that moved meanwhile is
no fast-forward), or by a CAS of the ref when nobody has it checked out.

Conflict hunks (ancestor / ours / theirs) come from ``git merge-file --diff3`` on
the three stages merge-tree reports. ``--strategy ours|theirs`` resolves content
conflicts as ``git merge -X ours|theirs`` does (the same xdiff favour option,
via ``git merge-file --ours|--theirs``) and lists the hunks whose other side
was overridden; a conflict that is not about content (modify/delete, add/add of
binary files, ...) takes the favoured side's whole file, which is reported too.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import events, signing, trailers
from ..core.agents import validate_agent
from ..core.diffs import text_lines
from ..core.errors import RepoStateError, UsageError
from ..core.gitcmd import run_git
from ..core.locks import flocked
from ..core.objects import tree_at
from ..core.store import Store, ref_oid, signature
from .worktrees import ahead_behind, branch_for, list_worktrees, storm_branches, target_branch

STRATEGIES = ("abort", "ours", "theirs")
MARKER = 7


@dataclass
class Hunk:
    """One conflicting region: the three sides' text (None: binary or absent side)."""

    ours_line: int
    ancestor: str | None
    ours: str | None
    theirs: str | None
    overridden: str | None = None  # the side that lost under --strategy

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ConflictFile:
    path: str
    kind: str
    message: str
    stages: dict[int, str]
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    resolution: str | None = None  # "ours"/"theirs" hunks, or "whole-file ours/theirs"

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["hunks"] = [h.to_dict() for h in self.hunks]
        d["stages"] = {str(k): v for k, v in self.stages.items()}
        return d


@dataclass
class AgentMerge:
    agent: str
    branch: str
    tip: str
    status: str  # merged | conflicted | up_to_date | test_failed (merge --test: left unmerged)
    commit: str | None = None
    files_changed: list[dict[str, str]] = field(default_factory=list)
    conflicts: list[ConflictFile] = field(default_factory=list)
    resolved_by: str | None = None
    ms: float = 0.0
    test: dict[str, Any] | None = None  # merge --test: the candidate's test run (storm_git.worktree.merge_queue)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["conflicts"] = [c.to_dict() for c in self.conflicts]
        d["ms"] = round(self.ms, 2)
        return d


@dataclass
class MergeReport:
    target: str
    before: str
    after: str
    strategy: str
    results: list[AgentMerge]
    updated: str | None = None  # "worktree PATH" or "ref"; None when unchanged / dry run
    dry_run: bool = False
    queue: dict[str, Any] | None = None  # merge --test: command, order and why (storm_git.worktree.merge_queue)

    @property
    def conflicted(self) -> list[AgentMerge]:
        return [r for r in self.results if r.status == "conflicted"]

    @property
    def test_failed(self) -> list[AgentMerge]:
        return [r for r in self.results if r.status == "test_failed"]

    @property
    def ok(self) -> bool:
        return not self.conflicted and not self.test_failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "before": self.before, "after": self.after, "strategy": self.strategy,
            "updated": self.updated, "dry_run": self.dry_run, "ok": self.ok,
            "merged": [r.agent for r in self.results if r.status == "merged"],
            "conflicted": [r.agent for r in self.conflicted],
            **({"test_failed": [r.agent for r in self.test_failed], "queue": self.queue} if self.queue else {}),
            # what resolves a conflicted agent: merge the target into its branch, in its worktree
            "next": [f"git storm sync {r.agent} --onto {self.target}" for r in self.conflicted],
            "results": [r.to_dict() for r in self.results],
        }


# -- merge-tree ----------------------------------------------------------------------
@dataclass
class TreeMerge:
    tree: str
    clean: bool
    stages: dict[str, dict[int, tuple[int, str]]]
    messages: list[tuple[list[str], str, str]]


def merge_tree(store: Store, ours: str, theirs: str) -> TreeMerge:
    """``git merge-tree --write-tree -z --messages ours theirs``, parsed."""
    r = run_git(["merge-tree", "--write-tree", "-z", "--messages", ours, theirs], store.commondir, check=False)
    if r.returncode not in (0, 1):
        msg = r.stderr.decode("utf-8", "replace").strip().replace("\n", " ")
        raise RepoStateError(f"git merge-tree {ours[:10]} {theirs[:10]} failed: {msg}",
                             hint="git 2.38 or later is needed for merge-tree --write-tree")
    f = r.stdout.decode("utf-8", "surrogateescape").split("\0")
    tree = f[0]
    stages: dict[str, dict[int, tuple[int, str]]] = {}
    i = 1
    while i < len(f) and f[i] != "":
        meta, _, path = f[i].partition("\t")
        mode, oid, stage = meta.split(" ")
        stages.setdefault(path, {})[int(stage)] = (int(mode, 8), oid)
        i += 1
    i += 1
    messages = []
    while i < len(f) and f[i] != "":
        n = int(f[i])
        paths = f[i + 1:i + 1 + n]
        kind, text = f[i + 1 + n], f[i + 2 + n]
        messages.append((paths, kind, text.strip()))
        i += n + 3
    return TreeMerge(tree, r.returncode == 0, stages, messages)


def merge_file(store: Store, stages: dict[int, tuple[int, str]], favor: str | None) -> tuple[int, bytes]:
    """``git merge-file`` on the three stages: (conflict count, merged content)."""
    def data(stage: int) -> bytes:
        return store.blob_bytes(pygit2.Oid(hex=stages[stage][1])) if stage in stages else b""

    with tempfile.TemporaryDirectory(prefix="storm-merge-") as d:
        names = []
        for stage, label in ((2, "ours"), (1, "base"), (3, "theirs")):
            p = os.path.join(d, label)
            with open(p, "wb") as fh:
                fh.write(data(stage))
            names.append(p)
        args = ["git", "merge-file", "-p", f"--marker-size={MARKER}", "-L", "ours", "-L", "ancestor", "-L", "theirs"]
        args += ["--diff3"] if favor is None else [f"--{favor}"]
        r = subprocess.run(args + names, capture_output=True, check=False)
    if r.returncode < 0 or r.returncode > 127:
        raise RepoStateError(f"git merge-file failed: {r.stderr.decode('utf-8', 'replace').strip()}")
    return r.returncode, r.stdout


def conflict_hunks(text: bytes) -> list[Hunk]:
    """Parse diff3 conflict markers into hunks (line numbers in the merged file)."""
    lines = text_lines(text.decode("utf-8", "replace"), keepends=True)
    hunks: list[Hunk] = []
    state, start = None, 0
    parts: dict[str, list[str]] = {}
    for n, line in enumerate(lines, 1):
        bare = line.rstrip("\r\n")  # git writes the markers with the file's own line ending
        if state is None and bare.startswith("<" * MARKER + " ours"):
            state, start, parts = "ours", n, {"ours": [], "ancestor": [], "theirs": []}
        elif state == "ours" and bare.startswith("|" * MARKER + " ancestor"):
            state = "ancestor"
        elif state in ("ours", "ancestor") and bare == "=" * MARKER:
            state = "theirs"
        elif state == "theirs" and bare.startswith(">" * MARKER + " theirs"):
            hunks.append(Hunk(start, "".join(parts["ancestor"]), "".join(parts["ours"]), "".join(parts["theirs"])))
            state = None
        elif state is not None:
            parts[state].append(line)
    return hunks


def _binary(store: Store, stages: dict[int, tuple[int, str]]) -> bool:
    return any(b"\x00" in store.blob_bytes(pygit2.Oid(hex=oid))[:8000] for _, oid in stages.values())


def describe_conflicts(store: Store, tm: TreeMerge) -> list[ConflictFile]:
    kinds: dict[str, tuple[str, str]] = {}
    for paths, kind, text in tm.messages:
        if kind.startswith("CONFLICT"):
            for p in paths:
                kinds.setdefault(p, (kind[len("CONFLICT ("):-1] if kind.endswith(")") else kind, text))
    out = []
    for path, st in sorted(tm.stages.items()):
        kind, text = kinds.get(path, ("contents", ""))
        cf = ConflictFile(path, kind, text, {k: v[1] for k, v in st.items()})
        if 2 in st and 3 in st:
            if _binary(store, st):
                cf.binary = True
                cf.hunks = [Hunk(0, None, None, None)]
            else:
                _, merged = merge_file(store, st, None)
                cf.hunks = conflict_hunks(merged)
        out.append(cf)
    return out


def resolve(store: Store, tm: TreeMerge, conflicts: list[ConflictFile], favor: str) -> pygit2.Oid:
    """The merged tree with every conflict resolved towards ``favor`` (git's -X favor)."""
    loser = "theirs" if favor == "ours" else "ours"
    side = 2 if favor == "ours" else 3
    changes: dict[str, tuple[pygit2.Oid, int] | None] = {}
    for cf in conflicts:
        st = tm.stages[cf.path]
        if 2 in st and 3 in st and not cf.binary:
            _, content = merge_file(store, st, favor)
            mode = st[side][0]
            changes[cf.path] = (store.write_blob(content), mode)
            cf.resolution = favor
            for h in cf.hunks:
                h.overridden = loser
        else:
            changes[cf.path] = (pygit2.Oid(hex=st[side][1]), st[side][0]) if side in st else None
            cf.resolution = f"whole-file {favor}"
            for h in cf.hunks:
                h.overridden = loser
    base = store.tree(pygit2.Oid(hex=tm.tree))
    return store.tree_with(base, changes)


def files_changed(store: Store, old_tree: pygit2.Oid, new_tree: pygit2.Oid) -> list[dict[str, str]]:
    """Paths that differ between two trees (A/M/D/T), descending only into subtrees whose
    ids differ: the cost follows the change, not the repository (no process, no index)."""
    out: list[dict[str, str]] = []
    repo = store.repo

    def entries(oid: pygit2.Oid | None) -> dict[str, tuple[pygit2.Oid, int]]:
        return {} if oid is None else {str(e.name): (e.id, e.filemode) for e in tree_at(repo, oid)}

    def walk(a: pygit2.Oid | None, b: pygit2.Oid | None, prefix: str) -> None:
        ea, eb = entries(a), entries(b)
        for name in sorted(set(ea) | set(eb)):
            x, y = ea.get(name), eb.get(name)
            if x == y:
                continue
            path = prefix + name
            xt = x is not None and x[1] == pygit2.GIT_FILEMODE_TREE
            yt = y is not None and y[1] == pygit2.GIT_FILEMODE_TREE
            if xt or yt:
                walk(x[0] if x is not None and xt else None, y[0] if y is not None and yt else None, path + "/")
            if x is not None and not xt and (y is None or yt):
                out.append({"status": "D", "path": path})
            elif y is not None and not yt and (x is None or xt):
                out.append({"status": "A", "path": path})
            elif x is not None and y is not None and not xt and not yt:
                out.append({"status": "M" if x[1] == y[1] or x[0] != y[0] else "T", "path": path})

    walk(old_tree, new_tree, "")
    return sorted(out, key=lambda c: c["path"])


# -- order -----------------------------------------------------------------------------
def completion_order(store: Store, agents: list[str]) -> list[str]:
    """Agents by when their work was finished: their last ``git storm commit`` (from the
    log), or their branch tip's commit time when committed by plain git."""
    last: dict[str, float] = {}
    wanted = set(agents)
    for e in events.read(store):
        if e.get("type") == "commit" and e.get("agent") in wanted and e["agent"] not in last:
            last[e["agent"]] = float(e.get("time", 0))
            if len(last) == len(wanted):
                break

    def key(agent: str) -> tuple[float, str]:
        tip = store.ref_target("refs/heads/" + branch_for(store, agent))
        t = float(store.commit(tip).commit_time) if tip else 0.0
        return (max(t, last.get(agent, 0.0)), agent)

    return sorted(agents, key=key)


# -- the merge -----------------------------------------------------------------------------
Check = Callable[[str, pygit2.Oid], dict[str, Any]]
Order = Callable[[Store, list[str], pygit2.Oid], list[str]]


def merge(store: Store, agents: list[str] | None = None, *, into: str | None = None, strategy: str = "abort",
          by: str = "manager", dry_run: bool = False, check: Check | None = None,
          order_by: Order | None = None) -> MergeReport:
    """Merge agent branches into the target one by one (see module docstring).

    ``check(agent, candidate)`` (merge --test) is called on each merge commit before it
    becomes the base of the next: a result without ``passed`` leaves that agent
    unmerged (``test_failed``). ``order_by`` replaces the order of completion when no
    agents are named."""
    import time

    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}", hint=f"use one of {', '.join(STRATEGIES)}")
    target = target_branch(store, into)
    tref = "refs/heads/" + target
    sign = signing.wanted(store) and not dry_run  # a dry run's commits land nowhere
    with flocked(store.commondir, "merge"):
        ref = store.ref(tref)
        if ref is None:
            raise RepoStateError(f"the target branch {target} does not exist",
                                 hint="pass --into BRANCH naming an existing branch")
        before = ref_oid(ref)
        if agents:
            order = list(dict.fromkeys(validate_agent(a) for a in agents))
            for a in order:
                if store.ref("refs/heads/" + branch_for(store, a)) is None:
                    raise UsageError(f"agent {a} has no branch {branch_for(store, a)}",
                                     hint=f"spawn it first (git storm spawn {a})")
                if branch_for(store, a) == target:
                    raise UsageError(f"cannot merge {target} into itself")
        else:
            pending = [a for a, b in storm_branches(store).items()
                       if b != target and ahead_behind(store, str(store.ref_target("refs/heads/" + b)), before)[0]]
            order = (order_by or (lambda s, a, _t: completion_order(s, a)))(store, pending, before)
        cur = before
        results: list[AgentMerge] = []
        for agent in order:
            t0 = time.perf_counter()
            branch = branch_for(store, agent)
            tip = store.ref_target("refs/heads/" + branch)
            if tip is None:
                raise RepoStateError(f"the branch {branch} of {agent} is gone", hint="nothing was merged")
            res = AgentMerge(agent, branch, str(tip), "up_to_date")
            if tip == cur or store.repo.descendant_of(cur, tip):
                results.append(res)
                continue
            tm = merge_tree(store, str(cur), str(tip))
            tree = pygit2.Oid(hex=tm.tree)
            if not tm.clean:
                res.conflicts = describe_conflicts(store, tm)
                if strategy == "abort":
                    res.status = "conflicted"
                    res.ms = (time.perf_counter() - t0) * 1000
                    results.append(res)
                    continue
                tree = resolve(store, tm, res.conflicts, strategy)
                res.resolved_by = strategy
            old_tree = store.commit(cur).tree_id
            res.files_changed = files_changed(store, old_tree, tree)
            msg = trailers.format_message(f"storm: merge {branch} ({agent}) into {target}", agent, "merge",
                                          [c["path"] for c in res.files_changed[:50]])
            msg += f"Storm-Merged-By: {by}\nStorm-Strategy: {strategy}\n"
            sig = signature(by)  # it lands on the target branch: signed if commit.gpgSign says so
            candidate = signing.make_commit(store, tree, [cur, tip], sig, sig, msg, sign=sign)
            if check is not None:
                res.test = check(agent, candidate)
                if not res.test.get("passed"):
                    res.status, res.ms = "test_failed", (time.perf_counter() - t0) * 1000
                    results.append(res)
                    continue
            cur = candidate
            res.commit, res.status = str(cur), "merged"
            res.ms = (time.perf_counter() - t0) * 1000
            results.append(res)
        report = MergeReport(target, str(before), str(cur), strategy, results, dry_run=dry_run)
        if cur != before and not dry_run:
            report.updated = _move_target(store, ref, target, before, cur)
        if not dry_run and results:
            with flocked(store.commondir, "workspace"):
                for r in results:
                    if r.status == "up_to_date":
                        continue
                    overridden = sum(1 for c in r.conflicts for h in c.hunks if h.overridden)
                    events.append(store, "merge", r.agent,
                                  f"{r.branch} into {target}: {r.status}"
                                  + (f", {len(r.conflicts)} conflicting path(s)" if r.conflicts else ""),
                                  {"status": r.status, "branch": r.branch, "target": target, "tip": r.tip,
                                   "commit": r.commit, "strategy": strategy, "by": by,
                                   "conflicts": [c.path for c in r.conflicts],
                                   "conflict_hunks": sum(len(c.hunks) for c in r.conflicts),
                                   "overridden_hunks": overridden,
                                   "files_changed": [c["path"] for c in r.files_changed][:200],
                                   **({"test": r.test} if r.test is not None else {})})
    return report


def _move_target(store: Store, ref: pygit2.Reference, target: str, before: pygit2.Oid, new: pygit2.Oid) -> str:
    holder = next((w for w in list_worktrees(store) if w.branch == target and not w.prunable), None)
    if holder is not None:
        r = run_git(["merge", "--ff-only", "--quiet", "--no-edit", str(new)], holder.path, check=False)
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).decode("utf-8", "replace").strip().replace("\n", " ")
            raise RepoStateError(f"could not bring {target} (checked out at {holder.path}) to the merge result: {msg}",
                                 hint="commit or move local changes there, or check that nobody moved the branch, "
                                      "then run git storm merge again")
        return f"worktree {holder.path}"
    if not store.cas(ref, "refs/heads/" + target, new, f"storm: merge into {target}"):
        raise RepoStateError(f"{target} moved while merging", hint="run git storm merge again")
    return "ref"
