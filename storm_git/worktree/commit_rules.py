"""Worktree mode's commit rule: an engineer commits only on its own branch,
inside its assignment, and no restricted file (``storm.restricted``).

``WorktreeWorkspace.commit`` applies :func:`worktree_commit_problems` itself; the
pre-commit hook's guard (:mod:`storm_git.admin.guard`) applies :func:`pre_commit`
to a plain ``git commit`` in an agent's worktree. The assignments and globs are
the shared core's (:mod:`storm_git.core.assignments`).
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from ..core.assignments import get, restricted_paths
from ..core.gitcmd import run_git
from ..core.store import Store
from .sync import taken_from_target
from .worktrees import agent_of_worktree, branch_for


def worktree_commit_problems(store: Store, agent: str, branch: str | None, staged_paths: Iterable[str]) -> list[str]:
    """Why an engineer's commit in worktree mode must be refused ([] = allowed).

    ``branch`` is the short name of the branch being committed to (None: detached).
    """
    problems: list[str] = []
    own = branch_for(store, agent)
    if branch != own:
        problems.append(f"{agent} may commit only on its own branch {own}, not on "
                        f"{branch or 'a detached HEAD'}")
    staged = list(staged_paths)
    a = get(store, agent)
    if a is not None:
        out = [p for p in staged if not a.covers(p)]
        if out:
            problems.append(f"{len(out)} file(s) outside the assignment of {agent} "
                            f"({', '.join(a.files[:5])}): {', '.join(out[:10])}")
    bad = restricted_paths(store, staged)
    if bad:
        problems.append(f"restricted file(s) (storm.restricted): {', '.join(bad[:10])}")
    return problems


def pre_commit(cwd: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The worktree-mode pre-commit rule for a ``git commit`` about to happen in ``cwd``:
    (exit status, message). Called by the hook guard (``storm_git.admin.guard``).

    The engineer is the agent whose worktree this is (its directory under
    ``storm.worktreeDir``, or the agent branch checked out), else ``STORM_AGENT``
    when it names an engineer; the manager and humans without ``STORM_AGENT``
    committing elsewhere are not restricted.
    """
    env = dict(os.environ) if env is None else env
    store = Store.discover(cwd or os.getcwd())
    manager = store.config_get("storm.manager") or "manager"
    agent = agent_of_worktree(store)
    if agent is None:
        declared = env.get("STORM_AGENT") or ""
        if not declared or declared == manager:
            return 0, ""
        agent = declared
    head = os.path.join(store.gitdir, "HEAD")
    with open(head, encoding="utf-8") as fh:
        text = fh.read().strip()
    branch = text[len("ref: refs/heads/"):] if text.startswith("ref: refs/heads/") else None
    index = {"GIT_INDEX_FILE": env["GIT_INDEX_FILE"]} if env.get("GIT_INDEX_FILE") else {}
    unborn = store.repo.head_is_unborn
    base = "4b825dc642cb6eb9a060e54bf8d69288fbee4904" if unborn else "HEAD"
    r = run_git(["diff-index", "--cached", "-z", "--name-only", "--no-renames", base], store.top, env=index)
    staged = [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    theirs = taken_from_target(store.top, staged, staged=True, env=index)  # concluding a git storm sync
    problems = worktree_commit_problems(store, agent, branch, [p for p in staged if p not in theirs])
    if not problems:
        return 0, ""
    lines = "".join(f"  - {p}\n" for p in problems)
    return 1, (f"git storm: commit refused (worktree mode, engineer {agent}):\n{lines}"
               "  Unstage or undo those changes (git restore --staged PATH), or ask the manager to change\n"
               "  the assignment (git storm assign) or storm.restricted.\n")
