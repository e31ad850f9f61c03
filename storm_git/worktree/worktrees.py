"""Agents' worktrees in worktree mode: spawn, listing, cleanup.

One ``git worktree`` and one branch (``storm/<agent>``, prefix ``storm.branchPrefix``)
per agent. The source of truth is git's own worktree records
(``<common dir>/worktrees/<id>/``): an agent's worktree is the one that has its
branch checked out, so ``git worktree move`` or a worktree adopted with
``--reuse`` keep working.

Default location: ``<common git dir>/storm/worktrees/<agent>``. Inside the git
directory the worktrees can never show up as untracked files of the main
working tree, need no ``.gitignore`` entry, do not litter the directory that
contains the repository, and go away with the repository. ``storm.worktreeDir``
moves them (a relative value is taken from the main working tree; a directory
inside the main working tree is added to ``.git/info/exclude``, and a tracked
directory is refused).
"""
from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import events, readsets
from ..core.agents import validate_agent
from ..core.errors import BadPath, RepoStateError, UsageError
from ..core.gitcmd import run_git
from ..core.locks import flocked
from ..core.paths import normalize
from ..core.porcelain import parse_status_z
from ..core.store import Store, resolve_commit

DEFAULT_PREFIX = "storm/"
COPY_UNTRACKED_KEY = "storm.copyUntracked"


# -- names and places --------------------------------------------------------------
def branch_prefix(store: Store) -> str:
    return store.config_get("storm.branchPrefix", DEFAULT_PREFIX) or ""


def branch_for(store: Store, agent: str) -> str:
    name = branch_prefix(store) + agent
    if not pygit2.reference_is_valid_name("refs/heads/" + name):
        raise UsageError(f"storm.branchPrefix gives the invalid branch name {name!r}",
                         hint="fix it with git config storm.branchPrefix storm/")
    return name


def agent_for_branch(store: Store, branch: str | None) -> str | None:
    prefix = branch_prefix(store)
    if branch and branch.startswith(prefix) and len(branch) > len(prefix):
        return branch[len(prefix):]
    return None


def worktree_root(store: Store) -> str:
    raw = store.config_get("storm.worktreeDir")
    if not raw:
        return os.path.join(store.commondir, "storm", "worktrees")
    raw = os.path.expanduser(str(raw))
    return os.path.normpath(raw if os.path.isabs(raw) else os.path.join(store.main_workdir, raw))


def worktree_path(store: Store, agent: str) -> str:
    return os.path.join(worktree_root(store), agent)


def same_path(a: str, b: str) -> bool:
    """Whether two paths name one place; a path git reports from a damaged worktree
    record (a NUL byte in its ``gitdir`` file) names no place."""
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (ValueError, OSError):
        return False


def target_branch(store: Store, into: str | None = None, *, option: str = "--into BRANCH") -> str:
    """The branch agents' work is merged into: ``into``, ``storm.target``, or the
    branch checked out in the main working tree. ``option`` is how the calling
    command names it, for the hint (``--into BRANCH``, ``--onto BRANCH``, ``--base REF``)."""
    name = into or store.config_get("storm.target")
    if not name:
        head = _read(os.path.join(store.commondir, "HEAD"))
        if head and head.startswith("ref: refs/heads/"):
            name = head[len("ref: refs/heads/"):]
        else:
            raise UsageError("the main working tree has no branch checked out (detached HEAD), so there is "
                             "no default target branch",
                             hint=f"pass {option}, or set one for good: git config storm.target BRANCH")
    if name.startswith("refs/heads/"):
        name = name[len("refs/heads/"):]
    if store.ref("refs/heads/" + name) is None:
        raise UsageError(f"no branch {name!r} to merge into", hint=f"pass {option} naming an existing branch")
    return name


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


# -- listing -----------------------------------------------------------------------
@dataclass
class WorktreeInfo:
    path: str
    branch: str | None
    head: str | None
    main: bool
    prunable: bool
    locked: bool
    agent: str | None = None
    admin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def list_worktrees(store: Store) -> list[WorktreeInfo]:
    """Every worktree git knows, read from its records (no process)."""
    def parse_head(text: str | None) -> tuple[str | None, str | None]:
        if text and text.startswith("ref: refs/heads/"):
            name = text[len("ref: refs/heads/"):]
            t = store.ref_target("refs/heads/" + name)
            return name, None if t is None else str(t)
        return None, text or None

    out = []
    branch, head = parse_head(_read(os.path.join(store.commondir, "HEAD")))
    out.append(WorktreeInfo(store.main_workdir, branch, head, True, False, False, agent_for_branch(store, branch)))
    admin_root = os.path.join(store.commondir, "worktrees")
    try:
        names = sorted(os.listdir(admin_root))
    except FileNotFoundError:
        names = []
    for name in names:
        admin = os.path.join(admin_root, name)
        gitfile = _read(os.path.join(admin, "gitdir"))
        if gitfile is None:
            continue
        path = os.path.dirname(gitfile) if os.path.basename(gitfile) == ".git" else gitfile
        branch, head = parse_head(_read(os.path.join(admin, "HEAD")))
        out.append(WorktreeInfo(path, branch, head, False, not os.path.exists(gitfile),
                                os.path.exists(os.path.join(admin, "locked")),
                                agent_for_branch(store, branch), admin))
    return out


def agent_worktree(store: Store, agent: str, wts: list[WorktreeInfo] | None = None) -> WorktreeInfo | None:
    """The worktree that has the agent's branch checked out, else the one at its path."""
    wts = list_worktrees(store) if wts is None else wts
    branch = branch_for(store, agent)
    for w in wts:
        if w.branch == branch:
            return w
    path = worktree_path(store, agent)
    for w in wts:
        if not w.main and same_path(w.path, path):
            return w
    return None


def agent_of_worktree(store: Store) -> str | None:
    """Which agent the worktree ``store`` was opened in belongs to (None: not an agent's)."""
    if store.gitdir == store.commondir:
        return None
    root = worktree_root(store)
    if same_path(os.path.dirname(store.top), root):
        return os.path.basename(store.top)
    head = _read(os.path.join(store.gitdir, "HEAD"))
    if head and head.startswith("ref: refs/heads/"):
        return agent_for_branch(store, head[len("ref: refs/heads/"):])
    return None


def storm_branches(store: Store) -> dict[str, str]:
    """{agent: branch} for every branch under the prefix."""
    prefix = "refs/heads/" + branch_prefix(store)
    out = {}
    for r in store.refs_under(prefix):
        agent = r[len(prefix):]
        if agent and "/" not in agent:
            out[agent] = r[len("refs/heads/"):]
    return dict(sorted(out.items()))


def status_entries(path: str, excludes: list[str] | None = None, *,
                   rename_sources: bool = True) -> list[tuple[str, str]]:
    """(XY, path) of ``git status --porcelain`` in a worktree, untracked files one by one
    (a staged rename's source too, unless ``rename_sources`` is False)."""
    args = ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--", "."]
    args += [f":(exclude,glob){p}" for p in excludes or []]
    return parse_status_z(run_git(args, path).stdout, rename_sources=rename_sources)


def dirty_paths(store: Store, path: str) -> list[str]:
    """Uncommitted changes in a worktree, not counting copied untracked files."""
    if not os.path.isdir(path):
        return []
    return sorted(dict.fromkeys(p for _, p in status_entries(path, copy_patterns(store))))


def ahead_behind(store: Store, tip: str | None, target: pygit2.Oid | None) -> tuple[int, int]:
    if tip is None or target is None:
        return 0, 0
    a, b = store.repo.ahead_behind(pygit2.Oid(hex=tip), target)
    return a, b


# -- spawn -------------------------------------------------------------------------
@dataclass
class SpawnResult:
    agent: str
    branch: str
    path: str
    head: str
    base: str | None
    created: bool
    reused: bool
    copied: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def copy_patterns(store: Store) -> list[str]:
    from ..core.assignments import config_list

    return config_list(store, COPY_UNTRACKED_KEY)


def copy_untracked(store: Store, dest: str) -> list[str]:
    """Copy files of the main working tree matching ``storm.copyUntracked`` that are not
    tracked into ``dest``; existing files in ``dest`` are never overwritten."""
    copied: list[str] = []
    patterns = copy_patterns(store)
    if not patterns:
        return copied
    src_root = store.main_workdir
    try:
        index = store.repo.index if store.gitdir == store.commondir else pygit2.Repository(store.commondir).index
    except pygit2.GitError:
        index = None
    for pattern in patterns:
        for rel in sorted(glob.glob(pattern, root_dir=src_root, recursive=True, include_hidden=True)):
            try:
                p = normalize(rel)
            except BadPath:
                raise UsageError(f"storm.copyUntracked pattern {pattern!r} matches {rel!r}, outside the repository",
                                 hint="use patterns relative to the top of the repository") from None
            src = os.path.join(src_root, p)
            if os.path.isdir(src) and not os.path.islink(src):
                continue
            if index is not None and p in index:
                continue  # tracked: the checkout has it already
            dst = os.path.join(dest, p)
            if os.path.lexists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
            copied.append(p)
    return copied


def _exclude_in_main(store: Store, root: str) -> None:
    """A worktree directory inside the main working tree must not show as untracked."""
    main = os.path.realpath(store.main_workdir)
    real = os.path.realpath(root)
    if not real.startswith(main + os.sep):
        return
    rel = os.path.relpath(real, main).replace(os.sep, "/")
    if rel.split("/")[0] == ".git":
        return
    head = store.repo.revparse_single("HEAD").peel(pygit2.Tree) if not store.repo.head_is_unborn else None
    if head is not None:
        try:
            head[rel]
            raise UsageError(f"storm.worktreeDir {rel!r} is tracked in the main working tree",
                             hint="choose a directory outside the tracked files")
        except KeyError:
            pass
    exclude = os.path.join(store.commondir, "info", "exclude")
    line = f"/{rel}/"
    existing = _read(exclude) or ""
    if line not in existing.splitlines():
        os.makedirs(os.path.dirname(exclude), exist_ok=True)
        with open(exclude, "a", encoding="utf-8") as fh:
            fh.write(("" if existing.endswith("\n") or not existing else "\n") + line + "\n")


def spawn(store: Store, agent: str, *, base: str | None = None, reuse: bool = False,
          by: str | None = None) -> SpawnResult:
    """Create (or find) agent's worktree and branch from the integrated state (the target
    branch, or ``base``), and copy ``storm.copyUntracked`` files into it. Idempotent."""

    agent = validate_agent(agent)
    branch = branch_for(store, agent)
    path = worktree_path(store, agent)
    ref_name = "refs/heads/" + branch
    with flocked(store.commondir, "worktrees"):
        wts = list_worktrees(store)
        mine = next((w for w in wts if w.branch == branch), None)
        created = reused = False
        base_oid: str | None = None
        if mine is not None and mine.main:
            raise RepoStateError(f"{branch} is checked out in the main working tree {mine.path}",
                                 hint="switch the main working tree to another branch first")
        if mine is not None and mine.prunable:
            if not reuse:
                raise RepoStateError(
                    f"stale worktree record: {branch} is registered at {mine.path}, which no longer exists",
                    hint="run git storm cleanup to prune it, or spawn again with --reuse")
            run_git(["worktree", "prune"], store.main_workdir)
            mine = None
        if mine is not None:
            if not same_path(mine.path, path) and not reuse:
                raise RepoStateError(f"{branch} is already checked out at {mine.path}",
                                     hint=f"pass --reuse to let {agent} work there, or remove it "
                                          f"(git worktree remove {mine.path}) and spawn again")
            path, head = mine.path, mine.head or ""
            reused = not same_path(mine.path, worktree_path(store, agent))
        else:
            at_path = next((w for w in wts if not w.main and same_path(w.path, path)), None)
            if at_path is not None:
                if at_path.prunable:
                    if not reuse:
                        raise RepoStateError(f"stale worktree record for {path} (directory missing)",
                                             hint="run git storm cleanup to prune it, or spawn again with --reuse")
                    run_git(["worktree", "prune"], store.main_workdir)
                else:
                    raise RepoStateError(
                        f"{path} is a worktree on {at_path.branch or 'a detached HEAD'}, not on {branch}",
                        hint=f"check out {branch} there, or remove it (git worktree remove {path})")
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
                raise RepoStateError(f"leftover directory {path} is not a worktree of this repository",
                                     hint="run git storm cleanup to remove leftovers, or move it away")
            root = os.path.dirname(path)
            _exclude_in_main(store, root)
            existing = store.ref(ref_name)
            if existing is not None:
                if not reuse:
                    target = None
                    try:
                        target = store.ref_target("refs/heads/" + target_branch(store))
                    except UsageError:
                        pass
                    ahead, _ = ahead_behind(store, str(existing.target), target)
                    raise RepoStateError(
                        f"branch {branch} already exists ({ahead} commit(s) not merged) but has no worktree",
                        hint="pass --reuse to check it out again, or delete it (git storm cleanup --all)")
                if base is not None:
                    raise UsageError("--base cannot be combined with --reuse of an existing branch",
                                     hint=f"delete {branch} first to start from {base}")
                run_git(["worktree", "add", "--quiet", path, branch], store.main_workdir)
                reused = True
            else:
                commit = resolve_commit(store, base or ("refs/heads/" + target_branch(store, option="--base REF")))
                base_oid = str(commit.id)
                run_git(["worktree", "add", "--quiet", "-b", branch, path, base_oid], store.main_workdir)
            created = True
            head = str(store.ref_target(ref_name))
    copied = copy_untracked(store, path)
    if created or copied:
        with flocked(store.commondir, "workspace"):
            events.append(store, "spawn", agent, f"{agent} on {branch} at {path}",
                          {"branch": branch, "path": path, "base": base_oid, "head": head,
                           "created": created, "reused": reused, "copied": copied, "by": by})
    return SpawnResult(agent, branch, path, head, base_oid, created, reused, copied)


def _former_worktree(store: Store, path: str) -> bool:
    """An empty directory, or one whose ``.git`` file points into this repository's
    worktree records (a worktree whose record was pruned)."""
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    if not entries:
        return True
    text = _read(os.path.join(path, ".git"))
    if not text or not text.startswith("gitdir: ") or os.path.isdir(os.path.join(path, ".git")):
        return False
    admin = text[len("gitdir: "):]
    return same_path(os.path.dirname(admin), os.path.join(store.commondir, "worktrees"))


# -- cleanup -----------------------------------------------------------------------
@dataclass
class CleanupResult:
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def cleanup(store: Store, *, merged: bool = False, all_: bool = False, into: str | None = None,
            by: str | None = None) -> CleanupResult:
    """Prune stale worktree records and leftover directories; with ``merged`` also remove
    the worktrees and branches of agents whose branch is merged into the target (and
    whose worktree has no uncommitted change); with ``all_`` every agent's."""
    res = CleanupResult()
    with flocked(store.commondir, "worktrees"):
        wts = list_worktrees(store)
        res.pruned = [w.path for w in wts if w.prunable]
        if res.pruned:
            run_git(["worktree", "prune"], store.main_workdir)
            wts = [w for w in wts if not w.prunable]
        root = worktree_root(store)
        registered = {os.path.realpath(w.path) for w in wts}
        if os.path.isdir(root):
            for name in sorted(os.listdir(root)):
                full = os.path.join(root, name)
                if os.path.realpath(full) in registered or os.path.islink(full) or not os.path.isdir(full):
                    continue
                if _former_worktree(store, full):
                    shutil.rmtree(full)
                    res.leftovers.append(full)
                else:
                    res.kept.append({"agent": None, "branch": None, "path": full,
                                     "reason": "not a former worktree of this repository: left alone"})
        if merged or all_:
            target_name = target_branch(store, into)
            target = store.ref_target("refs/heads/" + target_name)
            for agent, branch in storm_branches(store).items():
                tip = store.ref_target("refs/heads/" + branch)
                ahead, _ = ahead_behind(store, str(tip), target)
                wt = next((w for w in wts if w.branch == branch), None)
                if wt is not None and wt.main:
                    res.kept.append({"agent": agent, "branch": branch, "reason": "checked out in the main working tree"})
                    continue
                dirty = dirty_paths(store, wt.path) if wt else []
                if not all_:
                    if ahead:
                        res.kept.append({"agent": agent, "branch": branch,
                                         "reason": f"{ahead} commit(s) not merged into {target_name}"})
                        continue
                    if dirty:
                        res.kept.append({"agent": agent, "branch": branch,
                                         "reason": f"{len(dirty)} uncommitted change(s) in {wt.path}"})
                        continue
                if wt is not None:
                    run_git(["worktree", "remove", "--force", "--force", wt.path], store.main_workdir)
                run_git(["update-ref", "-d", "refs/heads/" + branch, str(tip)], store.main_workdir)
                # its read set named versions in the worktree just removed: left, it would be
                # an orphan doctor reports (its folded journals stay, they are history)
                readsets.forget(store, agent, None)
                res.removed.append({"agent": agent, "branch": branch, "path": wt.path if wt else None,
                                    "head": str(tip), "merged": ahead == 0, "dirty": dirty})
    if res.removed or res.pruned or res.leftovers:
        with flocked(store.commondir, "workspace"):
            events.append(store, "cleanup", by or "manager",
                          f"removed {len(res.removed)}, pruned {len(res.pruned)}, leftovers {len(res.leftovers)}",
                          res.to_dict())
    return res
