"""``git storm sync AGENT``: bring an agent's branch up to the target (worktree mode).

When ``git storm merge`` reports an agent as conflicted, the target has moved
under the agent (another agent's work was merged first). Sync merges the target
into the agent's branch *inside the agent's worktree*, with git's own ``git
merge``, so the agent resolves its conflicts where it works:

* up to date (the target is already in the branch): nothing happens;
* clean: git commits the merge (or fast-forwards) on ``storm/<agent>``;
* conflicts: git leaves them in the worktree (markers, index stages) and sync
  reports each conflicting path with its hunks (ancestor / agent / target, from
  ``git merge-tree`` on the same two commits, as ``git storm merge`` shows
  them). The agent edits the files, then ``git storm commit --agent A -m MSG``
  (a plain ``git commit`` works too) concludes the merge, and the manager's
  next ``git storm merge`` of that agent is clean.

Refused, changing nothing, when the worktree has uncommitted changes (git merge
could mix them into the merge) or a merge is already in progress there.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..core import events
from ..core.agents import validate_agent
from ..core.errors import RepoStateError, UsageError
from ..core.gitcmd import run_git
from ..core.locks import flocked
from ..core.store import Store
from .merge import ConflictFile, describe_conflicts, merge_tree
from .worktrees import agent_worktree, branch_for, dirty_paths, target_branch

SHOWN = 5


class WorktreeBusy(RepoStateError):
    kind = "worktree_busy"


@dataclass
class SyncResult:
    agent: str
    branch: str
    target: str
    path: str
    before: str  # the branch tip before
    after: str  # the branch tip after (unchanged on conflict: the merge waits in the worktree)
    target_tip: str
    status: str  # up_to_date | fast_forward | merged | conflicted
    conflicts: list[ConflictFile] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status != "conflicted"

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["conflicts"] = [c.to_dict() for c in self.conflicts]
        d["ok"] = self.ok
        return d


def _merge_in_progress(gitdir: str) -> bool:
    return any(os.path.exists(os.path.join(gitdir, n)) for n in ("MERGE_HEAD", "REBASE_HEAD", "CHERRY_PICK_HEAD"))


def _worktree_gitdir(path: str) -> str:
    r = run_git(["rev-parse", "--path-format=absolute", "--git-dir"], path)
    return r.stdout.decode("utf-8", "surrogateescape").strip()


def sync(store: Store, agent: str, *, onto: str | None = None, by: str | None = None) -> SyncResult:
    """Merge the target branch into ``agent``'s branch in its worktree (module docstring)."""
    agent = validate_agent(agent)
    branch = branch_for(store, agent)
    target = target_branch(store, onto, option="--onto BRANCH")
    if target == branch:
        raise UsageError(f"cannot sync {branch} with itself", hint="pass --onto BRANCH naming the target")
    w = agent_worktree(store, agent)
    if w is None or w.prunable or w.main:
        raise RepoStateError(f"agent {agent} has no worktree", hint=f"create it with git storm spawn {agent}")
    if w.branch != branch:
        raise RepoStateError(f"the worktree of {agent} ({w.path}) is not on {branch}",
                             hint=f"check out {branch} there (git -C {w.path} switch {branch})")
    if _merge_in_progress(_worktree_gitdir(w.path)):
        raise WorktreeBusy(f"a merge is already in progress in the worktree of {agent} ({w.path})",
                           hint=f"resolve the conflicts there, then git storm commit --agent {agent} -m MSG "
                                f"(or give up: git -C {w.path} merge --abort)")
    dirty = dirty_paths(store, w.path)
    if dirty:
        shown = ", ".join(dirty[:SHOWN]) + (f" and {len(dirty) - SHOWN} more" if len(dirty) > SHOWN else "")
        raise WorktreeBusy(f"the worktree of {agent} has {len(dirty)} uncommitted change(s): {shown}",
                           hint=f"commit them first (git storm commit --agent {agent} -m MSG), "
                                f"or stash them (git -C {w.path} stash -u), then sync again")
    tip_oid = store.ref_target("refs/heads/" + branch)
    target_oid = store.ref_target("refs/heads/" + target)
    tip, target_tip = str(tip_oid), str(target_oid)
    res = SyncResult(agent, branch, target, w.path, tip, tip, target_tip, "up_to_date")
    with flocked(store.commondir, "worktrees"):
        if target_oid == tip_oid or store.repo.descendant_of(tip_oid, target_oid):
            return res
        ff = store.repo.descendant_of(target_oid, tip_oid)
        tm = None if ff else merge_tree(store, tip, target_tip)
        message = (f"storm: sync {branch} with {target}\n\n"
                   f"Storm-Agent: {agent}\nStorm-Op: sync\nStorm-Target: {target} {target_tip}\n")
        ident = {"GIT_AUTHOR_NAME": agent, "GIT_AUTHOR_EMAIL": f"{agent}@storm.invalid",
                 "GIT_COMMITTER_NAME": agent, "GIT_COMMITTER_EMAIL": f"{agent}@storm.invalid",
                 "STORM_AGENT": agent}
        r = run_git(["merge", "--no-edit", "-m", message, target_tip], w.path, env=ident, check=False)
        if r.returncode == 0:
            res.status = "fast_forward" if ff else "merged"
            res.after = str(store.ref_target("refs/heads/" + branch))
        elif tm is not None and not tm.clean and _merge_in_progress(_worktree_gitdir(w.path)):
            res.status = "conflicted"
            res.conflicts = describe_conflicts(store, tm)
        else:
            msg = (r.stderr or r.stdout).decode("utf-8", "replace").strip().replace("\n", " ")
            raise RepoStateError(f"git merge {target} in the worktree of {agent} failed: {msg}",
                                 hint=f"look at {w.path} (git -C {w.path} status)")
    with flocked(store.commondir, "workspace"):
        events.append(store, "sync", agent, f"{branch} with {target}: {res.status}"
                      + (f", {len(res.conflicts)} conflicting path(s)" if res.conflicts else ""),
                      {"status": res.status, "branch": branch, "target": target, "before": res.before,
                       "after": res.after, "target_tip": target_tip, "by": by or agent,
                       "conflicts": [c.path for c in res.conflicts],
                       "conflict_hunks": sum(len(c.hunks) for c in res.conflicts)})
    return res


# -- the scope rules during a sync ------------------------------------------------------
def merge_head(worktree: str) -> str | None:
    """The commit being merged into the worktree's branch (a sync in progress), else None."""
    try:
        with open(os.path.join(_worktree_gitdir(worktree), "MERGE_HEAD"), encoding="utf-8") as fh:
            return fh.readline().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def taken_from_target(worktree: str, paths: list[str], *, staged: bool = False,
                      env: dict[str, str] | None = None) -> set[str]:
    """Of ``paths`` changed in ``worktree``, those whose content is the merged-in commit's,
    unchanged, while a merge (a sync) is in progress: the target's work, which the agent
    did not write. The assignment and storm.restricted rules do not count them, or
    an agent could never conclude a sync that brings in other agents' files.

    ``staged``: compare the index (the hook, with ``env``'s GIT_INDEX_FILE), else the
    working tree (``git storm commit``, before it stages)."""
    mh = merge_head(worktree)
    if mh is None or not paths:
        return set()
    args = ["diff-index", "--cached"] if staged else ["diff"]
    r = run_git([*args, "-z", "--name-only", "--no-renames", mh], worktree, env=env)
    differ = set(r.stdout.decode("utf-8", "surrogateescape").split("\0"))
    r = run_git(["--literal-pathspecs", "ls-tree", "-r", "-z", "--name-only", mh, "--", *paths], worktree)
    in_target = set(r.stdout.decode("utf-8", "surrogateescape").split("\0"))
    return {p for p in paths if p not in differ
            and (p in in_target or staged or not os.path.lexists(os.path.join(worktree, p)))}
