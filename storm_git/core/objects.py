"""Objects of one kind by id, and trees written with changes applied.

Functions of a ``pygit2.Repository``, not of a :class:`~storm_git.core.store.Store`:
the server (a bare repository) reads and rebuilds trees with them too
(storm_git.remote.queue_move, server_order). Every object write goes through
:func:`odb_retry`.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TypeVar

import pygit2

from .errors import BadPath, CorruptState, NoSpace
from .files import no_space, size_limited

MODE_TREE = pygit2.GIT_FILEMODE_TREE


def tree_at(repo: pygit2.Repository, oid: pygit2.Oid) -> pygit2.Tree:
    """The tree ``oid`` names (a tree entry's id, a commit's tree_id). As ``repo[oid]``,
    KeyError if it is missing; CorruptState if it is another kind of object."""
    return _object_at(repo, oid, pygit2.Tree, "a tree")


def commit_at(repo: pygit2.Repository, oid: pygit2.Oid) -> pygit2.Commit:
    """The commit ``oid`` names, in any repository (a server's bare one too)."""
    return _object_at(repo, oid, pygit2.Commit, "a commit")


def blob_at(repo: pygit2.Repository, oid: pygit2.Oid) -> pygit2.Blob:
    """The blob ``oid`` names (KeyError if missing; CorruptState if not a blob)."""
    return _object_at(repo, oid, pygit2.Blob, "a blob")


_O = TypeVar("_O", pygit2.Tree, pygit2.Commit, pygit2.Blob)


def _object_at(repo: pygit2.Repository, oid: pygit2.Oid, kind: type[_O], what: str) -> _O:
    obj = repo[oid]
    if not isinstance(obj, kind):
        raise CorruptState(f"{oid} is not {what}", hint="run git fsck")
    return obj


def tree_with(repo: pygit2.Repository, tree: pygit2.Tree,
              changes: Mapping[str, tuple[pygit2.Oid, int] | None]) -> pygit2.Oid:
    """Write ``tree`` with ``changes`` applied (None deletes), rebuilding only
    the trees along the changed paths; empty directories disappear as in git.
    A function of the repository, not of a Store: the server (a bare repository)
    rebuilds queued writes with it too (storm_git.remote.queue_move)."""
    nested: dict = {}
    for path, value in changes.items():
        node = nested
        parts = path.split("/")
        for part in parts[:-1]:
            if node.get(part, {}) is None:
                node[part] = {}  # the file `part` is deleted and becomes a directory
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict):
            if value is None:
                continue  # deleting a file under a directory the write replaces by a file
            raise BadPath(f"conflicting paths in one write: {path!r}")
        old = node.get(parts[-1])
        if isinstance(old, dict):
            if value is None:
                continue  # deleting a file where the write puts a directory
            if not _only_deletions(old):
                raise BadPath(f"conflicting paths in one write: {path!r}")
        node[parts[-1]] = value
    oid = _rebuild(repo, tree, nested)
    return oid if oid is not None else odb_retry(repo.TreeBuilder().write)


def _rebuild(repo: pygit2.Repository, tree: pygit2.Tree | None, node: dict) -> pygit2.Oid | None:
    tb = repo.TreeBuilder(tree) if tree is not None else repo.TreeBuilder()
    for name, value in node.items():
        if isinstance(value, dict):
            sub = None
            if tree is not None:
                try:
                    obj = tree[name]
                    if obj.filemode == MODE_TREE:
                        sub = tree_at(repo, obj.id)
                except KeyError:
                    pass
            new = _rebuild(repo, sub, value)
            if new is None:
                if tb.get(name) is not None:
                    tb.remove(name)
            else:
                tb.insert(name, new, MODE_TREE)
        elif value is None:
            if tb.get(name) is not None:
                tb.remove(name)
        else:
            tb.insert(name, value[0], value[1])
    if len(tb) == 0:
        return None
    return odb_retry(tb.write)


def _only_deletions(node: dict) -> bool:
    return all(_only_deletions(v) if isinstance(v, dict) else v is None for v in node.values())


def odb_retry(write, *args):
    """Write an object, retrying while git removes an emptied ``objects/xx/`` directory.

    ``git gc``, ``git prune-packed`` and maintenance's loose-objects task delete
    fan-out directories they emptied; libgit2 may have just created one and then
    fails to rename its temporary file into it (ENOENT). git retries that race
    itself; the write is content-addressed, so repeating it is harmless.

    A commit's parents are looked up as it is made (pygit2 passes them as commit
    objects), and one was reported "object not found" while ``git gc`` moved it
    from a loose file into a pack beside a writer
    (test_writers_beside_gc_pack_refs_maintenance); the same retry covers it. An
    object that is really missing is reported after the retries (~0.1 s)."""
    for attempt in range(100):
        try:
            return write(*args)
        except (OSError, pygit2.GitError) as exc:
            moved = "object not found" in str(exc)
            if ("No such file or directory" not in str(exc) and not moved) or attempt == 99:
                # libgit2 words an object cut short by a size limit as "no error", or repeats
                # the last error it had (a config key not found): the limit is then the cause
                limit = size_limited()
                if no_space(exc) or limit:
                    why = exc if no_space(exc) else f"cut short under a file size limit of {limit} bytes"
                    raise NoSpace(f"cannot write a git object: {why}") from None
                raise
            time.sleep(0.001)
