"""Installing and removing storm's hook shims, chaining hooks that were there.

The hooks directory is the one git uses: ``core.hooksPath`` when it is set
(respected: storm never changes the setting), else ``<common git dir>/hooks``,
shared by all linked worktrees. A hook that was already installed (by a person,
husky, the pre-commit framework...) is renamed to ``<hook>.storm-chained`` and
the shim runs it after the guard, with the same arguments; ``uninstall``
removes the shim and puts it back.

Storm installs for this repository only, and never touches the project's own
files. So it writes nothing when ``core.hooksPath`` points into the working
tree (tracked hooks such as ``.githooks/``: rewriting them would change the
project for everyone and leave untracked files behind) or comes from the
global or system configuration (a directory used by every repository of the
machine). It then reports why and the one line the person can add to their
own hook instead (:data:`ADD_LINE`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

from ..core.errors import RepoStateError
from ..core.files import replace_file
from ..core.installation import pip_install
from ..core.store import Store, git_env

CHAINED_SUFFIX = ".storm-chained"
# What a person adds to a hook storm must not write itself (tracked or global hooks).
# Guarded by `command -v` so the hook still works for people without git storm.
ADD_LINE = "if command -v git-storm >/dev/null 2>&1; then git-storm hook pre-commit || exit 1; fi"
WHY = ("in storm mode the agents' accepted writes live in refs/storm/workspace and the manager commits them; "
       "the hook refuses a plain git commit by an engineer (STORM_AGENT set) and a commit of content "
       "that no agent's write recorded")
HOW_TO_COMMIT = ("commit as the manager with: git storm commit -m MSG; "
                 "or remove the hook to commit with plain git: git storm uninstall-hooks")
OWN_SCOPES = ("local", "worktree")


@dataclass
class HooksResult:
    directory: str
    hooks_path_config: bool
    installed: list[str] = field(default_factory=list)
    chained: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    hooks_path_scope: str | None = None  # where core.hooksPath is set: local, global, system...
    skipped: str | None = None  # why nothing was installed (the directory is not storm's to write)
    add_line: str | None = None  # with skipped: the line to add to the person's own hook
    add_to: str | None = None  # ... and the hook file it goes into

    @property
    def paths(self) -> list[str]:
        return [os.path.join(self.directory, n) for n in self.installed]

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["paths"] = self.paths
        if self.installed:
            d["why"], d["how_to_commit"] = WHY, HOW_TO_COMMIT
        return d


def hooks_dir(store: Store) -> tuple[str, bool]:
    """(absolute hooks directory git uses, whether core.hooksPath set it).

    Both come from git itself: libgit2 does not read every config git reads
    (GIT_CONFIG_GLOBAL, for one)."""
    configured = hooks_path_scope(store)
    r = subprocess.run(["git", "rev-parse", "--git-path", "hooks"], cwd=store.main_workdir,
                       capture_output=True, env=git_env())
    if r.returncode != 0:
        raise RepoStateError("cannot find the hooks directory: " + r.stderr.decode("utf-8", "replace").strip())
    path = os.fsdecode(r.stdout.rstrip(b"\n"))
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(store.main_workdir, path)
    return os.path.normpath(path), configured is not None


def hooks_path_scope(store: Store) -> str | None:
    """The config scope core.hooksPath comes from (local, worktree, global, system, command)."""
    r = subprocess.run(["git", "config", "--show-scope", "--get", "core.hooksPath"], cwd=store.main_workdir,
                       capture_output=True, env=git_env())
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return r.stdout.decode("utf-8", "replace").split("\t", 1)[0].strip() or None


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def not_ours(store: Store, directory: str, scope: str | None) -> str | None:
    """Why storm must not write into ``directory`` (None: it may)."""
    if _inside(directory, store.commondir):
        return None  # .git/hooks or another directory of this repository's own git dir
    if _inside(directory, store.main_workdir) or _inside(directory, store.top):
        return (f"core.hooksPath points into the working tree ({directory}): those hooks are files of the "
                "project, which storm never changes")
    if scope not in OWN_SCOPES:
        return (f"core.hooksPath is set in the {scope or 'global'} git configuration ({directory}): hooks there "
                "run for every repository of this machine, and storm installs for one repository only")
    return None


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _is_ours(path: str) -> bool:
    from storm_git.hooks import MARKER

    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except (FileNotFoundError, IsADirectoryError):
        return False
    return MARKER.encode() in head


def render_shim(name: str) -> str:
    from storm_git.admin import guard
    from storm_git.hooks import shim_template

    return (shim_template(name)
            .replace("@PYTHON@", _sh_quote(sys.executable))
            .replace("@GUARD@", _sh_quote(os.path.abspath(guard.__file__)))
            # the recorded interpreter is gone when the shim needs this: python3 from PATH
            .replace("@REINSTALL@", _sh_quote(pip_install(python="python3")))
            .replace("@CHAINED@", name + CHAINED_SUFFIX))


def install(store: Store) -> HooksResult:
    """Install every shim; idempotent (re-running refreshes the interpreter path).

    Writes nothing when the hooks directory is not this repository's (see
    :func:`not_ours`): the result's ``skipped`` says why and ``add_line`` what
    the person can add to their own hook."""
    from storm_git.hooks import SHIMS

    d, configured = hooks_dir(store)
    scope = hooks_path_scope(store) if configured else None
    res = HooksResult(d, configured, hooks_path_scope=scope)
    reason = not_ours(store, d, scope) if configured else None
    if reason is not None:
        res.skipped, res.add_line, res.add_to = reason, ADD_LINE, os.path.join(d, SHIMS[0])
        return res
    os.makedirs(d, exist_ok=True)
    for name in SHIMS:
        target = os.path.join(d, name)
        chained = target + CHAINED_SUFFIX
        if os.path.lexists(target) and not _is_ours(target):
            if os.path.lexists(chained):
                raise RepoStateError(f"{target} is not storm's and {chained} already exists",
                                     hint="move one of them away, then run git storm install-hooks")
            os.rename(target, chained)
            res.chained.append(name)
        replace_file(target, render_shim(name).encode("utf-8"), mode=0o755)
        res.installed.append(name)
    return res


def uninstall(store: Store) -> HooksResult:
    """Remove storm's shims and restore the hooks they chained."""
    from storm_git.hooks import SHIMS

    d, configured = hooks_dir(store)
    res = HooksResult(d, configured)
    for name in SHIMS:
        target = os.path.join(d, name)
        chained = target + CHAINED_SUFFIX
        if _is_ours(target):
            os.unlink(target)
            res.removed.append(name)
        if os.path.lexists(chained) and not os.path.lexists(target):
            os.rename(chained, target)
            res.restored.append(name)
    return res


def installed(store: Store) -> list[str]:
    from storm_git.hooks import SHIMS

    d, _ = hooks_dir(store)
    return [n for n in SHIMS if _is_ours(os.path.join(d, n))]
