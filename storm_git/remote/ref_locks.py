"""The ``<ref>.lock`` files of a server's storm refs: which a dead update left, and clearing them.

git moves a loose ref by writing the new value to ``<ref>.lock`` and renaming it onto
the ref; ``git update-ref --stdin`` takes every lock of its transaction, then renames
them one by one. Killed in between, it leaves its locks behind, and some of its refs
moved: every later update of those refs then fails ("cannot lock ref"), on every
clone, until the lock goes. The server's ordering hook (:mod:`.server_order`) tells
them apart as a writer's ``Store.cas`` does locally:

* a lock holding the very value its own transaction was writing was left by that
  transaction (no other writer writes that commit to that ref): removed at once, and
  the refs read again, so the push's answer is what the refs now hold;
* any other lock older than ``STALE_REF_LOCK_SECONDS`` (or dated in the future) is a
  dead writer's: git holds a ref's lock for the moment of one update. Removed by the
  ordering hook under the server lock and by the guard before a push leased on the
  ref; reported by ``git storm server-hook check`` and by ``doctor`` in a clone of a
  server on this machine.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..core.store import FUTURE_REF_LOCK_SECONDS, STALE_REF_LOCK_SECONDS

STORM_REF_ROOTS = ("refs/storm", "refs/notes/storm")


def lock_path(gitdir: str, ref: str) -> str:
    return os.path.join(gitdir, *ref.split("/")) + ".lock"


def clear_own(gitdir: str, changes: Iterable[tuple[str, str, str]]) -> list[str]:
    """Remove the locks a dead transaction of ``changes`` ((ref, old, new)) left: those
    holding the value it was writing. Returns the refs whose lock went."""
    out = []
    for ref, _old, new in changes:
        path = lock_path(gitdir, ref)
        try:
            with open(path, "rb") as fh:
                held = fh.read(200).strip().decode("ascii", "replace")
        except (FileNotFoundError, IsADirectoryError):
            continue
        if held == new and _unlink(path):
            out.append(ref)
    return out


@dataclass(frozen=True)
class StaleLock:
    ref: str
    path: str
    age: float  # seconds; negative: dated in the future

    def describe(self) -> str:
        when = f"{self.age:.0f} s old" if self.age >= 0 else f"dated {-self.age:.0f} s in the future"
        return f"{self.path} is {when}: left by a git update of {self.ref} that died mid-commit"


def stale(gitdir: str, refs: Iterable[str] | None = None) -> list[StaleLock]:
    """The stale locks of ``refs`` (None: of every ref under storm's roots)."""
    if refs is None:
        found = []
        for root in STORM_REF_ROOTS:
            for dirpath, _dirs, files in os.walk(os.path.join(gitdir, *root.split("/"))):
                for name in files:
                    if name.endswith(".lock"):
                        full = os.path.join(dirpath, name)
                        found.append(os.path.relpath(full, gitdir).replace(os.sep, "/")[:-len(".lock")])
        refs = found
    out = []
    now = time.time()
    for ref in refs:
        path = lock_path(gitdir, ref)
        try:
            age = now - os.stat(path).st_mtime
        except FileNotFoundError:
            continue
        if not -FUTURE_REF_LOCK_SECONDS <= age < STALE_REF_LOCK_SECONDS:
            out.append(StaleLock(ref, path, age))
    return out


def clear_stale(gitdir: str, refs: Iterable[str] | None = None) -> list[StaleLock]:
    """Remove the stale locks of ``refs`` (:func:`stale`); the ones removed."""
    return [s for s in stale(gitdir, refs) if _unlink(s.path)]


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def local_server(url: str) -> str | None:
    """The git directory a remote URL names on this machine (``file://`` or a path),
    whose files a clone can look at; None for a server elsewhere."""
    path = url.removeprefix("file://")
    if "://" in path or (":" in path.split("/", 1)[0] and not os.path.exists(path)):
        return None  # another transport, or scp-like host:path
    for d in (path, os.path.join(path, ".git")):
        if os.path.isfile(os.path.join(d, "HEAD")) and os.path.isdir(os.path.join(d, "refs")):
            return os.path.abspath(d)
    return None
