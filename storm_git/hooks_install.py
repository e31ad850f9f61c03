"""Installing and removing storm's hook shims, chaining hooks that were there.

The hooks directory is the one git uses: ``core.hooksPath`` when it is set
(respected: storm installs there and never changes the setting), else
``<common git dir>/hooks``, shared by all linked worktrees. A hook that was
already installed (by a person, husky, the pre-commit framework...) is renamed
to ``<hook>.storm-chained`` and the shim runs it after the guard, with the same
arguments; ``uninstall`` removes the shim and puts it back.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

from .errors import RepoStateError
from .store import Store, git_env

CHAINED_SUFFIX = ".storm-chained"


@dataclass
class HooksResult:
    directory: str
    hooks_path_config: bool
    installed: list[str] = field(default_factory=list)
    chained: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def hooks_dir(store: Store) -> tuple[str, bool]:
    """(absolute hooks directory git uses, whether core.hooksPath set it)."""
    configured = store.config_get("core.hooksPath")
    r = subprocess.run(["git", "rev-parse", "--git-path", "hooks"], cwd=store.main_workdir,
                       capture_output=True, env=git_env())
    if r.returncode != 0:
        raise RepoStateError("cannot find the hooks directory: " + r.stderr.decode("utf-8", "replace").strip())
    path = os.fsdecode(r.stdout.rstrip(b"\n"))
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(store.main_workdir, path)
    return os.path.normpath(path), configured is not None


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
    from storm_git import guard
    from storm_git.hooks import shim_template

    return (shim_template(name)
            .replace("@PYTHON@", _sh_quote(sys.executable))
            .replace("@GUARD@", _sh_quote(os.path.abspath(guard.__file__)))
            .replace("@CHAINED@", name + CHAINED_SUFFIX))


def install(store: Store) -> HooksResult:
    """Install every shim; idempotent (re-running refreshes the interpreter path)."""
    from storm_git.hooks import SHIMS

    d, configured = hooks_dir(store)
    os.makedirs(d, exist_ok=True)
    res = HooksResult(d, configured)
    for name in SHIMS:
        target = os.path.join(d, name)
        chained = target + CHAINED_SUFFIX
        if os.path.lexists(target) and not _is_ours(target):
            if os.path.lexists(chained):
                raise RepoStateError(f"{target} is not storm's and {chained} already exists",
                                     hint="move one of them away, then run git storm install-hooks")
            os.rename(target, chained)
            res.chained.append(name)
        tmp = f"{target}.storm-tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(render_shim(name))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
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
