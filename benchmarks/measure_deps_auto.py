"""Offline: how many stale-dependency rejections --deps auto avoids on a real history.

Consecutive first-parent commits (A = c_k, B = c_k+1) start from the same base P =
parent(c_k). A reads the files its commit touches plus what they import (resolved in
P); B's change lands first; then A writes each of its files. A write is rejected
(whole read set) when B changed the target (direct) or any other file A read (stale);
with auto only when B changed a file in the computed scope (``stale_auto``: the scope
alone) and that file's change reaches what the write uses (``stale_judged``: what a
write does, storm_git.deps.impact looking inside the moved files)."""
# usage: python benchmarks/measure_deps_auto.py REPO N   (e.g. a clone of pallets/click, 300)
# another revision's rule: git worktree add /tmp/old REV; PYTHONPATH=/tmp/old python benchmarks/measure_deps_auto.py REPO N
import sys

import pygit2

from storm_git.core.readsets import ReadEntry
from storm_git.core.store import Store
from storm_git.deps import impact as depimpact, scope as depscope
from storm_git.worktree.merge import files_changed

repo_path, n = sys.argv[1], int(sys.argv[2])
store = Store.discover(repo_path)
repo = store.repo
commits = []
c = repo.head.peel(pygit2.Commit)
while len(commits) < n + 1 and c.parents:
    if len(c.parents) == 1:
        commits.append(c)
    c = c.parents[0]
commits.reverse()
stats = dict(writes=0, direct=0, stale_all=0, stale_auto=0, py_writes=0, fallback=0)
for a, b in zip(commits, commits[1:]):
    if b.parents[0].id != a.id:
        continue
    P = a.parents[0]
    A = {x["path"]: x["status"] for x in files_changed(store, P.tree_id, a.tree_id)}
    SB = {x["path"] for x in files_changed(store, a.tree_id, b.tree_id)}
    if not A or not SB:
        continue
    reads = {}
    def known(p): return p in P.tree
    for p in A:
        e = store.entry(P.tree, p) if p in P.tree else None
        reads[p] = ReadEntry(p, str(e.oid) if e else None, str(P.id))
        if p.endswith(".py") and e:
            info = depscope.parse(store.blob_bytes(e.oid))
            for mod, lvl, names in (info.imports if info else []):
                for q in depscope.resolve(p, mod, lvl, known, [x for x, _ in names] if names else []):
                    qe = store.entry(P.tree, q)
                    reads.setdefault(q, ReadEntry(q, str(qe.oid), str(P.id)))
    head_tree = store.tree_with(P.tree, {p: ((store.entry(b.tree, p).oid, store.entry(b.tree, p).mode) if p in b.tree else None) for p in SB})
    head = store.make_commit(head_tree, [P.id], "b", "b\n")
    for p, st in A.items():
        if st == "D":
            content = None
        else:
            content = store.blob_bytes(store.entry(a.tree, p).oid)
        stats["writes"] += 1
        if p in SB:
            stats["direct"] += 1
            continue
        others = set(reads) - {p}
        stale_all = bool(others & SB)
        sc = depscope.compute(store, "a", {p: content}, reads, head)
        scope = others if sc.paths is None else (sc.paths - {p})
        stale_auto = bool(scope & SB)
        stats["py_writes"] += p.endswith(".py")
        stats["fallback"] += sc.paths is None
        stats["stale_all"] += stale_all
        stats["stale_auto"] += stale_auto
        judged = stale_auto
        if stale_auto and sc.paths is not None:  # as a write does on its way to a rejection
            impact = depimpact.judge(store, "a", {p: content}, reads, repo[head].tree, scope & SB)
            judged = bool(impact.kept)
        stats["stale_judged"] = stats.get("stale_judged", 0) + judged
        if sc.paths is not None:
            stats["py_stale_all"] = stats.get("py_stale_all", 0) + stale_all
            stats["py_stale_auto"] = stats.get("py_stale_auto", 0) + stale_auto
            stats["py_stale_judged"] = stats.get("py_stale_judged", 0) + judged
print(stats)
