"""Running the ``git`` command itself, for what libgit2 does not do (worktrees,
merges, ``ls-tree`` of huge trees, hooks): one helper so every caller gets the
same environment hygiene and the same one-line error."""
from __future__ import annotations

import subprocess

from .errors import RepoStateError
from .store import git_env


class GitFailed(RepoStateError):
    kind = "git_failed"


def run_git(args: list[str], cwd: str, *, check: bool = True, env: dict[str, str] | None = None,
            input: bytes | None = None) -> subprocess.CompletedProcess:
    # Each command names its repository by ``cwd``: variables that a caller's git
    # (a hook, ``git --git-dir=X storm``) exported for another worktree must not leak in.
    e = git_env(**(env or {}))
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, env=e, input=input, check=False)
    if check and r.returncode != 0:
        msg = (r.stderr or r.stdout).decode("utf-8", "replace").strip().replace("\n", " ")
        raise GitFailed(f"git {' '.join(args[:3])} failed: {msg}")
    return r


def parse_status_z(data: bytes, *, rename_sources: bool = True) -> list[tuple[str, str]]:
    """``git status --porcelain=v1 -z`` parsed, one parser for every caller: (XY, path)
    per entry; a rename's or copy's source path follows it as its own entry (same XY)
    when ``rename_sources``, since that path changed too."""
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    out, i = [], 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if len(f) < 4:
            continue
        xy, p = f[:2], f[3:]
        out.append((xy, p))
        if "R" in xy or "C" in xy:
            if rename_sources and i < len(fields) and fields[i]:
                out.append((xy, fields[i]))
            i += 1
    return out
