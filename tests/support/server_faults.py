"""Faults injected into a server's own git processes: the ``git update-ref`` the
ordering hook runs, killed by ``strace`` at the rename of one ref's lock.

The hook runs ``git`` by name, and git puts its exec path first on the ``PATH`` of
the hooks it runs; a push made with ``GIT_EXEC_PATH`` set to :func:`exec_path`'s
directory (git's own commands, linked, and a ``git`` wrapper) runs the first
``git update-ref --stdin`` after :func:`arm` under ``strace -f -P <ref>.lock -e
inject=rename:signal=KILL:when=1``: it takes every lock of its transaction and is
killed at the rename of that one, as a crash would leave it. The later ones run as
they are. Over ``file://`` the server's processes are the pushing process's children
and inherit the variable.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

WRAPPER = """#!/bin/sh
if [ "$1" = update-ref ] && [ "$2" = --stdin ] && mv "{arm}" "{arm}.fired" 2>/dev/null; then
    exec strace -f -o /dev/null -P "$(cat "{arm}.fired")" -e trace=rename,renameat,renameat2 \\
        -e inject=rename,renameat,renameat2:signal=KILL:when=1 "{real}" "$@"
fi
exec "{real}" "$@"
"""


def available() -> bool:
    return shutil.which("strace") is not None


def exec_path(base: Path) -> dict[str, str]:
    """The environment of a push whose server-side update can be killed (:func:`arm`)."""
    real = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
    d = base / "git-exec-path"
    d.mkdir(exist_ok=True)
    for name in os.listdir(real):
        if name != "git" and not (d / name).exists():
            os.symlink(os.path.join(real, name), d / name)
    w = d / "git"
    w.write_text(WRAPPER.format(arm=base / "kill-update", real=os.path.join(real, "git")))
    w.chmod(0o755)
    return {"GIT_EXEC_PATH": str(d)}


def arm(base: Path, server: Path, ref: str) -> None:
    """The next storm update of the server's refs is killed at the rename of ``ref``'s lock."""
    (base / "kill-update").write_text(str(server / (ref + ".lock")))


def fired(base: Path) -> bool:
    return (base / "kill-update.fired").exists()
