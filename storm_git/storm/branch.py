"""The branch the manager commits to, and what of it the shared workspace holds.

A person's git moves the branch without storm: ``git pull``, ``git merge``,
``git commit --no-verify``, ``git cherry-pick``. The manager's commit makes a
commit whose tree is the shared head's on top of the branch tip, which alone
would undo every such change (a pulled upstream fix reverted by the next
``git storm commit``). So storm records the last branch commit the shared
workspace is known to contain (``refs/storm/integrated``: set by ``init``, the
manager's commit and each integration), and the commits the branch has gained
since are merged into the shared workspace (three ways, from the commit where
the two lines meet) before it is committed.

A branch that moved *back* (``git reset HEAD~``, to redo a commit) gained nothing:
the shared workspace still holds the work, and the next commit puts it back on
top. Dropping agents' work is done in the shared workspace, not by moving the branch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import trailers
from ..core.errors import RepoStateError
from ..core.locks import flocked
from ..core.store import WORKSPACE_REF, Store, ref_oid
from .validated_writer import ValidatedWriter

INTEGRATED_REF = "refs/storm/integrated"
# For a repository from before the ref: how far back the branch's first-parent line
# is searched for a commit the shared workspace holds.
MAX_WALK = 1000
LISTED = 10


@dataclass
class BranchNews:
    """Commits on the branch that the shared workspace does not hold yet."""

    branch: str
    tip: pygit2.Oid
    base: pygit2.Oid  # where the branch and what storm integrated meet: the merge's ancestor
    commits: list[str] = field(default_factory=list)  # "<short oid> <subject>", newest first, at most LISTED
    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"branch": self.branch, "tip": str(self.tip), "base": str(self.base), "count": self.count,
                "commits": self.commits}


def known(store: Store, head: pygit2.Oid, tip: pygit2.Oid) -> pygit2.Oid | None:
    """The last branch commit the shared workspace is known to contain: the recorded
    one; for a repository from before the record, the newest commit on the tip's
    first-parent line that is a manager's commit (``Storm-Workspace``) of a shared
    head in the shared history, or else where the tip's history meets the shared
    history (init, a mode switch). One history walk, not one per commit."""
    ref = store.ref(INTEGRATED_REF)
    if ref is not None:
        return ref_oid(ref)
    repo = store.repo
    meet = repo.merge_base(head, tip)
    c = store.commit(tip)
    for _ in range(MAX_WALK):
        if c.id == meet:
            return meet
        ws = trailers.parse(c.message).get("Storm-Workspace")
        if ws:
            try:
                w = pygit2.Oid(hex=ws[0])
                if w == head or repo.descendant_of(head, w):
                    return c.id
            except (ValueError, KeyError, pygit2.GitError):
                pass
        if not c.parent_ids:
            break
        c = store.commit(c.parent_ids[0])
    return meet


def news(store: Store, branch_ref: pygit2.Reference, head: pygit2.Oid | None = None) -> BranchNews | None:
    """What the branch gained outside storm since the shared workspace last held it
    (None: nothing, or nothing storm can tell: unrelated histories, see ``unrelated``)."""
    head = head if head is not None else store.ref_target(WORKSPACE_REF)
    if head is None:
        return None  # no shared head: nothing the shared workspace held
    tip = ref_oid(branch_ref)
    x = known(store, head, tip)
    if x is None or x == tip:
        return None
    base = store.repo.merge_base(x, tip)
    if base is None or base == tip:  # unrelated, or the branch moved back: nothing gained
        return None
    out = BranchNews(branch_ref.shorthand, tip, base)
    walker = store.repo.walk(tip, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    for c in walker:
        out.count += 1
        if len(out.commits) < LISTED:
            out.commits.append(f"{str(c.id)[:10]} {trailers.subject(c.message)}")
    return out


# Shared commits searched for versions storm already had (as for a reverted file).
OWN_LOOKBACK = 100


def without_own_versions(store: Store, head: pygit2.Oid, news: BranchNews) -> tuple[pygit2.Oid, list[str]]:
    """The branch tip's tree with every path whose version there is one storm's shared
    workspace already had set back to the merge base's: that is not news from the
    branch but storm's own work, come back through a rewrite of a manager's commit
    (``git pull --rebase``, ``git commit --amend``, ``git rebase``), and a three-way
    merge from the base would call it a conflict with the newer shared version.
    Versions storm had: the shared heads the branch's commits name
    (``Storm-Workspace``) and the last OWN_LOOKBACK shared commits. Returns (tree,
    the paths set back)."""
    repo = store.repo
    base, tip = store.commit(news.base).tree, store.commit(news.tip).tree
    changed = [d for d in base.diff_to_tree(tip).deltas if d.status != pygit2.enums.DeltaStatus.DELETED]
    if not changed:
        return tip.id, []
    trees: list[pygit2.Tree] = []
    walker = repo.walk(news.tip, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(news.base)
    for c in walker:
        for w in trailers.parse(c.message).get("Storm-Workspace", []):
            try:
                trees.append(store.commit(pygit2.Oid(hex=w)).tree)
            except (ValueError, KeyError, pygit2.GitError):
                pass
    c = store.commit(head)
    for _ in range(OWN_LOOKBACK):
        trees.append(c.tree)
        if not c.parent_ids:
            break
        c = store.commit(c.parent_ids[0])
    own = []
    for d in changed:
        path, oid = d.new_file.path, d.new_file.id
        for t in trees:
            try:
                if t[path].id == oid:
                    own.append(path)
                    break
            except KeyError:
                continue
    if not own:
        return tip.id, []
    index = pygit2.Index()
    index.read_tree(tip)
    for path in own:
        try:
            e = base[path]
            index.add(pygit2.IndexEntry(path, e.id, e.filemode))
        except KeyError:
            index.remove(path)
    return index.write_tree(repo), own


def in_step(store: Store, head: pygit2.Oid, tip: pygit2.Oid) -> bool:
    """The branch tip holds nothing the shared workspace lacks (it is, or is behind,
    what storm integrated): its tree is then an older state of the shared one."""
    x = known(store, head, tip)
    return x is not None and (x == tip or store.repo.merge_base(x, tip) == tip)


def record(store: Store, commit: pygit2.Oid) -> None:
    """The shared workspace now holds ``commit`` of the branch (the workspace lock held)."""
    ref = store.ref(INTEGRATED_REF)
    if ref is None or ref.target != commit:
        store.cas(ref, INTEGRATED_REF, commit, "storm: the shared workspace holds this branch commit")


class BranchConflict(RepoStateError):
    """The branch gained commits outside storm that change what the agents changed too."""

    kind = "branch_conflict"


class BranchUnrelated(RepoStateError):
    """The branch shares no history with the commit the shared workspace last held."""

    kind = "branch_unrelated"


def _check_related(store: Store, branch_ref: pygit2.Reference, head: pygit2.Oid) -> None:
    """Refuse a branch rewritten past what storm held (``git filter-repo``, an orphan
    branch): it gains no "news" (no merge base), and committing the shared tree on
    top would bring back whatever the rewrite removed."""
    tip = ref_oid(branch_ref)
    x = known(store, head, tip)
    if x is None or x == tip or store.repo.merge_base(x, tip) is not None:
        return
    raise BranchUnrelated(
        f"{branch_ref.shorthand} shares no history with {str(x)[:10]}, the commit the shared workspace last held "
        "(rewritten: git filter-repo, an orphan branch?); committing the shared tree on top would bring back "
        "what the rewrite removed; nothing was committed",
        hint=f"if the shared workspace should go on top of it as it is: git update-ref {INTEGRATED_REF} "
             f"{branch_ref.shorthand}, then commit again; else switch back to the branch storm works on")


def integrate(ws: ValidatedWriter, manager: str, *, keep_shared: bool = False,
              attempts: int = 3) -> tuple[BranchNews | None, list[str]]:
    """Merge the commits the branch gained outside storm (a person's git pull, merge,
    commit) into the shared workspace, as the manager's write, before committing:
    the commit's tree is the shared one, so without this it would undo them.
    Three-way, from where the branch and what storm integrated meet; a path both
    sides changed differently is a BranchConflict (exit 3, nothing changed) unless
    ``keep_shared`` says the shared version is the resolution. The write is
    validated against the versions merged (an agent's write meanwhile: merged again)."""
    store = ws.store
    branch_ref = store.repo.lookup_reference("HEAD").resolve()
    _check_related(store, branch_ref, ws.head())
    for _ in range(attempts):
        head = ws.head()
        found = news(store, branch_ref, head)
        if found is None:
            return None, []
        shared = store.commit(head).tree
        repo = store.repo
        theirs, _own = without_own_versions(store, head, found)
        merging = repo.merge_trees(store.commit(found.base).tree, shared, store.tree(theirs))
        conflicts = sorted({next(side for side in sides if side is not None).path
                            for sides in merging.conflicts}) if merging.conflicts is not None else []
        if conflicts and not keep_shared:
            listed = ", ".join(conflicts[:5]) + (" …" if len(conflicts) > 5 else "")
            raise BranchConflict(
                f"{found.branch} gained {found.count} commit(s) outside storm ({found.commits[0]}) that change "
                f"what the agents changed too: {listed}; nothing was changed",
                hint=f"write each as it should be (git show {found.branch}:PATH is the branch's version; "
                     f"git storm write PATH --agent {manager}), then git storm commit --keep-shared; "
                     "or undo the branch's move (git reset) if it was a mistake")
        for path in conflicts:  # keep_shared: the shared version is the resolution
            del merging.conflicts[path]
            entry = _entry(shared, path)
            if entry is not None:
                merging.add(pygit2.IndexEntry(path, entry.id, entry.filemode))
        merged = store.tree(merging.write_tree(repo))
        changes: dict[str, object] = {}
        expected: dict[str, str | None] = {}
        for d in shared.diff_to_tree(merged).deltas:
            old, new = d.old_file, d.new_file
            if d.status == pygit2.enums.DeltaStatus.DELETED:
                changes[old.path], expected[old.path] = None, str(old.id)
            else:
                changes[new.path] = (new.id, new.mode)
                expected[new.path] = None if d.status == pygit2.enums.DeltaStatus.ADDED else str(old.id)
        with flocked(store.commondir, "workspace"):
            if not changes and ws.head() == head:
                record(store, found.tip)
                return found, []
        if not changes:
            continue
        res = ws.apply(manager, changes, intent=f"{manager}: bring {found.count} commit(s) of {found.branch} "
                                                f"into the shared workspace ({found.commits[0]})",
                       deps=[], wait=True, op="adopt", expected=expected)
        if res.accepted:
            with flocked(store.commondir, "workspace"):
                record(store, found.tip)
            return found, sorted(changes)
    raise RepoStateError(f"agents kept changing the paths {branch_ref.shorthand}'s new commits change",
                         hint="run git storm commit again")


def _entry(tree: pygit2.Tree, path: str) -> pygit2.Object | None:
    try:
        return tree[path]
    except KeyError:
        return None
