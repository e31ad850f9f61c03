"""Blame by bisection: which write made a test fail, and with which other write.

The shared head's history is a chain of writes, one commit each, on the *base* (the
first commit below the head that no agent wrote). For a test that passed (or did
not exist) on an earlier head and fails on this one:

1. red on the base: it was failing before any agent wrote (*known failing*), and is
   never blamed;
2. otherwise the first failing head between the last green one and this one is
   found by bisection (only the failing tests run);
3. that write's agent's writes alone, each applied as a diff (a three-way merge)
   onto the base (onto the last green head when they do not apply to the base:
   they build on other agents' writes): the test fails there too, it is a *break*
   by that write; it passes, the first other agent's write that makes it fail
   with them (bisected the same way) is the write it interacts with: a *semantic
   conflict* between the two. Alone means alone: another agent's write that was
   green on its own (the last green head) is still a partner.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pygit2

from ..core import trailers

MAX_CHAIN = 5000


@dataclass
class Link:
    """One commit of the chain: the base (``agent`` None) or a write."""

    commit: str
    tree: str
    parent_tree: str | None
    agent: str | None
    subject: str
    paths: list[str] = field(default_factory=list)


@dataclass
class Finding:
    test: str
    kind: str  # semantic, break, known_failing, unresolved
    writes: list[Link]
    tail: str = ""
    why: str = ""


def chain(repo: pygit2.Repository, head: pygit2.Oid, limit: int = MAX_CHAIN) -> list[Link]:
    """[base, first write, ..., head]: the first-parent commits back to the first one
    no agent wrote (or the root, or ``limit`` writes back)."""
    out: list[Link] = []
    c = repo[head]
    while True:
        assert isinstance(c, pygit2.Commit)
        found = trailers.parse(c.message)
        agent = (found.get("Storm-Agent") or [None])[0]
        parent = c.parents[0] if c.parents else None
        out.append(Link(str(c.id), str(c.tree_id), str(parent.tree_id) if parent is not None else None,
                        agent if agent and agent != "manager" else None, trailers.subject(c.message),
                        list(found.get("Storm-Path") or [])))
        if out[-1].agent is None or parent is None or len(out) > limit:
            out[-1].agent = None  # the base: nobody's write
            break
        c = parent
    return out[::-1]


def apply(repo: pygit2.Repository, onto: str, writes: list[Link]) -> str | None:
    """``onto`` with each write's diff (its parent's tree to its own) merged in, in
    order; None when one does not merge cleanly."""
    tree = onto
    for w in writes:
        if w.parent_tree is None:
            return None
        idx = repo.merge_trees(pygit2.Oid(hex=w.parent_tree), pygit2.Oid(hex=tree), pygit2.Oid(hex=w.tree))
        if idx.conflicts is not None:
            return None
        tree = str(idx.write_tree(repo))
    return tree


Fails = Callable[[str, str], tuple[bool, str]]  # (tree, test) -> (failed, tail)


def _first(lo: int, hi: int, bad: Callable[[int], bool]) -> int:
    """The smallest i in (lo, hi] with bad(i), given not bad(lo) and bad(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bad(mid):
            hi = mid
        else:
            lo = mid
    return hi


def blame(repo: pygit2.Repository, links: list[Link], test: str, fails: Fails,
          last_green: str | None = None) -> Finding:
    """Why ``test`` fails on the chain's last head (it does: the caller saw it, twice)."""
    n = len(links) - 1
    _, tail = fails(links[n].tree, test)
    base_failed, _ = fails(links[0].tree, test)
    if base_failed:
        return Finding(test, "known_failing", [], tail, "it fails on the base, before any agent wrote")
    lo = 0
    if last_green is not None:
        lo = next((i for i, lk in enumerate(links) if lk.commit == last_green), 0)
    k = _first(lo, n, lambda i: fails(links[i].tree, test)[0])
    culprit = links[k]
    if culprit.agent is None:
        return Finding(test, "unresolved", [culprit], tail, "the first failing head is no agent's write")
    start = 0
    own = [lk for lk in links[1:k + 1] if lk.agent == culprit.agent]
    alone = apply(repo, links[0].tree, own)
    if alone is None:  # they build on other agents' writes: alone on the last green head
        start = lo
        own = [lk for lk in links[lo + 1:k + 1] if lk.agent == culprit.agent]
        alone = apply(repo, links[lo].tree, own)
    if alone is None:
        return Finding(test, "unresolved", [culprit], tail, "its writes do not apply alone to the last green head")
    if fails(alone, test)[0]:
        return Finding(test, "break", [culprit], tail, "it fails with this write alone")
    others = [i for i in range(start + 1, k) if links[i].agent not in (None, culprit.agent)]
    if not others:
        return Finding(test, "unresolved", [culprit], tail, "it passes with this write alone and no other agent wrote")

    def with_own(j: int) -> bool:
        t = apply(repo, links[j].tree, own)
        return t is not None and fails(t, test)[0]

    # the first other agent's write after which adding the culprit's writes fails
    pos = _first(-1, len(others) - 1, lambda x: with_own(others[x]))
    if pos == len(others) - 1 and not with_own(others[pos]):
        return Finding(test, "unresolved", [culprit], tail, "no other write makes it fail with this one")
    partner = links[others[pos]]
    return Finding(test, "semantic", [partner, culprit], tail,
                   "it passes with each write alone and fails with both")
