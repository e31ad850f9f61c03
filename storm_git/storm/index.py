"""git's index as the manager's commit holds it (storm mode).

The commit moves the branch, then gives git's index the new tree, all while
holding git's own ``index.lock`` (so a person's git command cannot interleave). The
lock's content names storm, its pid and, from just before the branch moves, the
commit it moves to: a commit killed holding it is told from git's own lock and
repaired by ``doctor`` (:func:`stale_index_lock`, :func:`repair_index`).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pygit2

from ..core.errors import Busy, RepoStateError
from ..core.files import index_copy
from ..core.locks import pid_alive
from ..core.store import Store, git_env, ref_oid

INDEX_LOCK_MARK = b"git-storm manager-commit"


@dataclass
class IndexLock:
    """git's ``index.lock`` as the manager's commit holds it. Its content says who
    holds it and, from just before the branch moves, the commit the branch moves to:
    a commit killed with the lock held leaves a file ``doctor`` can tell from git's
    own (the pid is gone) and repair (the index reset to the branch's tree when the
    branch did move; the lock removed)."""

    path: str

    def write(self, new: pygit2.Oid | None = None) -> None:
        with open(self.path, "wb") as fh:
            fh.write(INDEX_LOCK_MARK + f" pid={os.getpid()} new={new or '-'}\n".encode())


def stale_index_lock(store: Store) -> tuple[int, str | None] | None:
    """(pid, commit the branch was moving to or None) of a manager's commit that left
    ``index.lock`` and no longer runs; None when there is none (or it is git's)."""
    try:
        with open(os.path.join(store.gitdir, "index.lock"), "rb") as fh:
            first = fh.read(200)
    except OSError:
        return None
    if not first.startswith(INDEX_LOCK_MARK):
        return None
    fields = dict(f.split("=", 1) for f in first.decode("ascii", "replace").split()[2:] if "=" in f)
    try:
        pid = int(fields.get("pid", ""))
    except ValueError:
        return None
    if pid_alive(pid):
        return None
    new = fields.get("new")
    return pid, (new if new and new != "-" else None)


def repair_index(store: Store, new: str | None) -> bool:
    """Finish what a killed manager's commit left: when the branch moved to ``new``,
    the index gets its tree (else the person's next git commit would record a revert
    of the agents' work); then the lock goes. True when the index was reset."""
    lock = os.path.join(store.gitdir, "index.lock")
    done = False
    try:
        tip = ref_oid(store.repo.lookup_reference("HEAD"))
        if new is not None and str(tip) == new:
            reset(store, store.commit(tip).tree_id)
            done = True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
    return done


@contextlib.contextmanager
def locked(store: Store) -> Iterator[IndexLock]:
    """git's own lock on the index (``index.lock``, created exclusively), held from
    before the branch moves until the index holds the new tree.

    Taken before the branch moves: if a git command holds it (a person's ``git add
    -p``, an editor's ``git status``) or one that crashed left it, the commit is
    refused with nothing changed, as git refuses. Taken after, the branch would move
    and the index keep the old tree, and the person's next ``git commit`` would
    record a revert of the agents' work."""
    lock = os.path.join(store.gitdir, "index.lock")
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        if stale_index_lock(store) is not None:
            hint = "a git storm commit was killed holding it: git storm doctor --fix repairs the index"
        else:
            hint = ("wait for it and run git storm commit again; if no git command runs, remove the file "
                    "(git says the same)")
        raise Busy(f"git's index is locked ({lock}): another git command is running here, or one crashed "
                   "and left the file", hint=hint) from None
    held = IndexLock(lock)
    try:
        held.write()
        yield held
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)


def reset(store: Store, tree: pygit2.Oid) -> None:
    """Make git's index hold ``tree`` (its lock held: :func:`locked`); keep stat data
    of unchanged entries so the next ``git status`` does not re-read every file.
    Built in a copy, then renamed over the index: never half-written."""
    path = os.path.join(store.gitdir, "index")
    with index_copy(path) as tmp:
        env = git_env(GIT_DIR=store.gitdir, GIT_WORK_TREE=store.top, GIT_INDEX_FILE=tmp)
        if os.path.exists(tmp) and _reset_changed(store, tree, env):
            os.replace(tmp, path)
            return
        for args in (["read-tree", "--reset", str(tree)], ["update-index", "-q", "--refresh"]):
            r = subprocess.run(["git", *args], cwd=store.top, env=env, capture_output=True)
            if r.returncode != 0 and args[0] == "read-tree":
                err = r.stderr.decode("utf-8", "replace").strip()
                raise RepoStateError(f"the commit was made but the index could not be reset: {err}",
                                     hint="run git read-tree HEAD")
        os.replace(tmp, path)


def _reset_changed(store: Store, tree: pygit2.Oid, env: dict[str, str]) -> bool:
    """Make the index at ``GIT_INDEX_FILE`` hold ``tree`` by replacing only the
    entries that differ from it (``git diff-index --cached``, which skips the
    subtrees git's cache-tree knows unchanged): every other entry keeps its stat
    data without a refresh that would lstat every file. False when that cannot be
    done (a conflicted entry, a git failure, a sparse checkout, whose skip-worktree
    bits only a read of the tree sets): the caller rebuilds the index."""
    if store.config_bool("core.sparseCheckout", False):
        return False
    r = subprocess.run(["git", "diff-index", "--cached", "-z", "--raw", "--no-renames", "--abbrev=40",
                        "--ignore-submodules=none", str(tree)], cwd=store.top, env=env, capture_output=True)
    if r.returncode != 0:
        return False
    fields = r.stdout.split(b"\0")
    lines, kept = [], []
    for i in range(0, len(fields) - 1, 2):
        meta, name = fields[i], fields[i + 1]
        parts = meta.lstrip(b":").split()
        if len(parts) != 5 or parts[4] == b"U":
            return False
        mode, oid = parts[0], parts[2]
        if set(mode) == {ord("0")}:
            lines.append(b"0 " + b"0" * 40 + b"\t" + name + b"\0")  # not in the tree: removed
        else:
            lines.append(mode + b" " + oid + b"\t" + name + b"\0")
            if os.path.lexists(os.path.join(os.fsencode(store.top), name)):
                kept.append(name + b"\0")
    if lines:
        u = subprocess.run(["git", "update-index", "-z", "--index-info"], cwd=store.top, env=env,
                           input=b"".join(lines), capture_output=True)
        if u.returncode != 0:
            return False
    if kept:  # stat data for the replaced entries only (git refuses a path missing on disk)
        subprocess.run(["git", "--literal-pathspecs", "add", "--refresh", "--pathspec-from-file=-",
                        "--pathspec-file-nul"], cwd=store.top, env=env, input=b"".join(kept), capture_output=True)
    return True
