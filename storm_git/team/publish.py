"""Where a team run lands and where it is pushed: ``--branch NAME`` (a branch of its
own, a pull request's, instead of the branch the run started on) and ``--push
[REMOTE]`` (that branch pushed after landing).

Storm mode lands through ``git storm commit``, which commits to the checked-out
branch: the main working tree switches to NAME first (created at the current tip,
as ``git switch -c`` does, so the index and the files stay as they are). Worktree
mode merges with ``git storm merge --into NAME``; the checked-out branch and the
main working tree are left alone. The push is a plain ``git push REMOTE
refs/heads/NAME:refs/heads/NAME`` (never forced): a rejected push leaves the
landed commit where it is and says so.
"""
from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from typing import Any

import pygit2

from ..core.errors import RepoStateError, UsageError
from ..core.store import Store

TAIL = 600


def check_branch(store: Store, name: str, start: str) -> None:
    """``--branch NAME``: a valid branch name, new or at ``start`` (the commit the run
    starts from); a branch with other commits is someone's work, never reused."""
    if not pygit2.reference_is_valid_name("refs/heads/" + name) or name.startswith("-"):
        raise UsageError(f"--branch {name!r} is not a valid branch name", hint="git check-ref-format --branch NAME")
    tip = store.ref_target("refs/heads/" + name)
    if tip is not None and str(tip) != start:
        raise RepoStateError(f"branch {name} exists at {str(tip)[:12]}, not at the run's start {start[:12]}",
                             hint="pick a new name for --branch, or delete that branch first")


def check_remote(store: Store, remote: str) -> None:
    """``--push REMOTE``: a configured remote, or a URL or path git push accepts."""
    if "/" in remote or ":" in remote:
        return
    if remote not in store.repo.remotes.names():
        raise UsageError(f"no remote named {remote!r} to push to",
                         hint="git remote add NAME URL, or pass --push URL")


def create_branch(top: str, name: str, commit: str) -> None:
    """``refs/heads/NAME`` at ``commit`` unless it exists (``git update-ref`` with the
    empty old value: created only if absent, atomically)."""
    r = subprocess.run(["git", "update-ref", "-m", "storm team: landing branch", "refs/heads/" + name, commit, ""],
                       cwd=top, capture_output=True, text=True, check=False)
    if r.returncode != 0 and "reference already exists" not in r.stderr:
        raise RepoStateError(f"could not create branch {name}: {r.stderr.strip()[:300]}")


def switch_to(store: Store, top: str, name: str) -> None:
    """Storm mode, before the manager's commit: HEAD on ``name``, created at the current
    tip when absent. Refused when ``name`` points elsewhere: the switch would change
    what the index and the files are compared with."""
    if not store.repo.head_is_detached and store.repo.head.shorthand == name:
        return
    tip = str(store.repo.head.target)
    create_branch(top, name, tip)
    at = store.ref_target("refs/heads/" + name)
    if str(at) != tip:
        raise RepoStateError(f"branch {name} is at {str(at)[:12]}, the checked-out branch at {tip[:12]}: "
                             "the run cannot land there", hint="git storm team status names the run's commit")
    r = subprocess.run(["git", "symbolic-ref", "-m", f"storm team: land on {name}", "HEAD", "refs/heads/" + name],
                       cwd=top, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RepoStateError(f"could not switch to branch {name}: {r.stderr.strip()[:300]}")


@dataclass
class Pushed:
    remote: str
    branch: str
    commit: str
    ok: bool
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def push(top: str, remote: str, branch: str, commit: str, env: dict[str, str],
         timeout: float = 600) -> Pushed:
    """``git push REMOTE refs/heads/BRANCH:refs/heads/BRANCH``, not forced."""
    spec = f"refs/heads/{branch}:refs/heads/{branch}"
    try:
        r = subprocess.run(["git", "push", "--porcelain", remote, spec], cwd=top, env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Pushed(remote, branch, commit, False, f"git push did not finish in {timeout:.0f} s")
    if r.returncode != 0:
        why = (r.stderr.strip() or r.stdout.strip()).splitlines()
        return Pushed(remote, branch, commit, False, " ".join(why)[-TAIL:] or f"git push exited {r.returncode}")
    return Pushed(remote, branch, commit, True)
