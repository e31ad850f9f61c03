"""The pre-commit guard: the second layer behind the CAS.

libgit2 never runs hooks, so the guard protects ``git commit`` only; the
compare-and-swap on ``refs/storm/workspace`` protects the shared state. In storm
mode:

* an engineer (``STORM_AGENT`` set to anyone but ``storm.manager``, default
  ``manager``) may not ``git commit``: the manager commits the shared state;
* for the manager and humans, a commit whose staged content of a path differs
  from the shared head is refused (unmediated or stale content would enter
  history), naming the paths and the command that fixes it.

This module uses the standard library only and is run directly as a script by
the hook shim (``python .../guard.py pre-commit``), so a commit pays for a
Python start and three small git commands, not for importing pygit2 or click.
It runs wherever git runs hooks: the top of the (possibly linked) worktree,
with ``GIT_INDEX_FILE`` set by ``git commit``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping  # loaded by os already: free for the hook

WORKSPACE_REF = "refs/storm/workspace"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
DEFAULT_MANAGER = "manager"
MAX_NAMED = 20
# Said to a person whose plain `git commit` the guard refused.
HUMAN_WAY = ("  (This is storm's pre-commit hook, installed by git storm init. To commit with plain git\n"
             "  instead, remove it: git storm uninstall-hooks)\n")


def _git_exe() -> str:
    # git puts its exec-path first on PATH when it runs hooks; fall back to the
    # usual places so the guard works with a minimal PATH too.
    found = shutil.which("git")
    if found:
        return found
    for d in (os.environ.get("GIT_EXEC_PATH"), "/usr/bin", "/usr/local/bin", "/usr/lib/git-core"):
        if d and os.access(os.path.join(d, "git"), os.X_OK):
            return os.path.join(d, "git")
    return "git"


def _run(git: str, *args: str) -> tuple[int, bytes]:
    r = subprocess.run([git, *args], capture_output=True)
    return r.returncode, r.stdout


def _config(git: str) -> dict[str, str]:
    code, out = _run(git, "config", "-z", "--get-regexp", r"^storm\.(mode|manager|shelledits)$")
    cfg: dict[str, str] = {}
    if code == 0:
        for item in out.split(b"\0"):
            if item:
                key, _, value = item.decode("utf-8", "replace").partition("\n")
                cfg[key.lower()] = value
    return cfg


def _show(path: str) -> str:
    return repr(path) if (" " in path or not path.isprintable()) else path


def check_pre_commit(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(exit status, message) for a ``git commit`` about to happen here."""
    environ = os.environ if env is None else env
    git = _git_exe()
    cfg = _config(git)
    if cfg.get("storm.mode") == "worktree":
        # worktree-mode rules (own branch, assignment, storm.restricted): storm_git.worktree.commit_rules
        from storm_git.worktree.commit_rules import pre_commit

        code, message = pre_commit(None, dict(environ))
        if code == 0:  # the conflict radar: advisory, never refuses (storm_git.worktree.radar)
            try:
                from storm_git.worktree.radar import commit_warning
            except ImportError:  # an older or partial install: the commit goes on without it
                return code, message
            message += commit_warning(None, dict(environ))
        return code, message
    if cfg.get("storm.mode") != "storm":
        return 0, ""  # not storm mode: nothing for this guard to enforce
    manager = cfg.get("storm.manager") or DEFAULT_MANAGER
    agent = environ.get("STORM_AGENT") or ""
    if agent and agent != manager:
        return 1, (
            f"git storm: commit refused: STORM_AGENT={agent} is an engineer, and in storm mode the manager "
            f"({manager}) commits the shared state.\n"
            "  Your accepted writes (git storm write/edit/exec/adopt) are already in the shared workspace;\n"
            f"  the manager integrates them with: STORM_AGENT={manager} git storm commit -m MSG\n"
        )
    code, _ = _run(git, "rev-parse", "-q", "--verify", WORKSPACE_REF)
    if code != 0:
        return 0, ""  # storm mode configured but not initialised: nothing to compare with
    code, _ = _run(git, "rev-parse", "-q", "--verify", "HEAD")
    base = "HEAD" if code == 0 else EMPTY_TREE
    # Both comparisons use the index's cache-tree: unchanged directories cost nothing.
    p_staged = subprocess.Popen([git, "diff-index", "--cached", "-z", "--name-only", "--no-renames",
                                 "--ignore-submodules=all", base], stdout=subprocess.PIPE)
    p_shared = subprocess.Popen([git, "diff-index", "--cached", "-z", "--name-only", "--no-renames",
                                 "--ignore-submodules=all", WORKSPACE_REF], stdout=subprocess.PIPE)
    staged, _ = p_staged.communicate()
    differs, _ = p_shared.communicate()
    if p_staged.returncode != 0 or p_shared.returncode != 0:
        return 1, "git storm: commit refused: could not compare the index with the shared workspace\n"
    differ = set(differs.split(b"\0"))
    bad = [p.decode("utf-8", "surrogateescape") for p in staged.split(b"\0") if p and p in differ]
    adopting = (cfg.get("storm.shelledits") or "").strip().lower() == "adopt"
    if bad and adopting:
        # shell edits are writes here: take them in (storm.shellAgent's write), then the
        # staged content of those paths is the shared head's, and the commit holds it
        bad = _after_take_in(git, base, bad)
    if not bad:
        return 0, ""
    named = ", ".join(_show(p) for p in bad[:MAX_NAMED]) + (f" and {len(bad) - MAX_NAMED} more"
                                                            if len(bad) > MAX_NAMED else "")
    return 1, (
        f"git storm: commit refused: the staged content of {len(bad)} path(s) differs from the shared "
        f"workspace ({WORKSPACE_REF}), so unmediated or stale content would enter history: {named}\n"
        "  To keep an edit made outside storm, record it first:  git storm adopt PATH... --agent ID\n"
        f"  Then commit the shared state (as {manager}):        git storm commit -m MSG\n"
        "  (git storm status shows the diffs; git restore --staged PATH unstages.)\n"
        + ("  (storm.shellEdits=adopt: these could not be taken in as shell edits; git storm status says why)\n"
           if adopting else
           "  Where agents edit through a shell storm does not run (a harness's own terminal), let their edits be\n"
           "  writes and plain git add -A && git commit work:  git config storm.shellEdits adopt\n")
        + HUMAN_WAY
    )


def _after_take_in(git: str, base: str, bad: list[str]) -> list[str]:
    """Take the edits on disk in as shell edits (storm's own code, in this Python), then
    the staged paths that still differ from the shared head."""
    code = ("import sys\nfrom storm_git.api import open_workspace\n"
            "open_workspace().take_in_shell_edits(sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-c", code, *bad], capture_output=True)
    if r.returncode != 0:
        return bad
    p = subprocess.run([git, "diff-index", "--cached", "-z", "--name-only", "--no-renames",
                        "--ignore-submodules=all", WORKSPACE_REF], capture_output=True)
    if p.returncode != 0:
        return bad
    differ = set(p.stdout.split(b"\0"))
    return [x for x in bad if x.encode("utf-8", "surrogateescape") in differ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "pre-commit":
        sys.stderr.write("usage: guard.py pre-commit\n")
        return 2
    code, message = check_pre_commit()
    if message:
        sys.stderr.write(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
