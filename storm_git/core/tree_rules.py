"""The path rules of storm_git.core.paths applied to the entries of a git tree.

A tree reaches storm from outside through a push (the server guard checks every
path a pushed write changes, and every path of the tree a shared workspace starts
from) and reaches a disk through a sync. Both ask here, with the same rules a
local write obeys (:func:`storm_git.core.paths.tree_entry_refusal`), so a name,
a link or a size refused at one door is refused at all of them.
"""
from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from typing import TYPE_CHECKING

import pygit2

from .objects import blob_at, tree_at
from .paths import LINK_MODE, tree_entry_refusal

if TYPE_CHECKING:
    from .store import Store

TREE_MODE = 0o040000


def link_text(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> bytes | None:
    """The target of the link at ``path`` in ``tree``; None when no link is there."""
    try:
        entry = tree[path]
    except (KeyError, ValueError, TypeError):
        return None
    if entry.filemode != LINK_MODE:
        return None
    return blob_at(repo, entry.id).data


def entry_refusal(repo: pygit2.Repository, tree: pygit2.Tree, path: str, oid: pygit2.Oid, mode: int,
                  limit: int | None = None) -> str | None:
    """Why the entry (``path``, ``oid``, ``mode``) of ``tree`` is refused, or None.
    The size is read from the object's header: a 200 MB blob is not loaded to be refused."""
    if mode == LINK_MODE:
        target = blob_at(repo, oid).data
        return tree_entry_refusal(path, mode, link_target=target,
                                  links=lambda p: link_text(repo, tree, p))
    size = repo.odb.read_header(oid)[1] if limit is not None else None
    return tree_entry_refusal(path, mode, size=size, limit=limit)


def walk(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> Iterator[tuple[str, pygit2.Oid, int]]:
    """Every non-tree entry of ``tree``, with its full path (names as git stores them,
    decoded with surrogateescape so a name that is not UTF-8 is seen, then refused)."""
    for e in tree:
        path = prefix + (e.raw_name or b"").decode("utf-8", "surrogateescape")
        if e.filemode == TREE_MODE:
            yield from walk(repo, tree_at(repo, e.id), path + "/")
        else:
            yield path, e.id, e.filemode


def refusals(repo: pygit2.Repository, tree: pygit2.Tree,
             entries: Iterable[tuple[str, pygit2.Oid, int]] | None = None,
             limit: int | None = None) -> Iterator[str]:
    """The reasons ``entries`` (default: every entry of ``tree``) are refused."""
    for path, oid, mode in (walk(repo, tree) if entries is None else entries):
        why = entry_refusal(repo, tree, path, oid, mode, limit)
        if why is not None:
            yield why


# -- paths that differ only in case, where the file system cannot tell them apart.
#
# ``git init`` sets ``core.ignoreCase=true`` on a case-insensitive file system
# (macOS, Windows, a casefolded ext4 directory): there ``README.md`` and
# ``readme.md`` are one file on disk. git then treats them as one path (``git add
# readme.md`` updates ``README.md``). Storm's shared tree would take both as two
# entries while the disk holds one file, and each write of one would overwrite the
# other's content on disk. So where the file system ignores case, a write that
# *creates* a path is refused when a file or directory of the same name in another
# case is already there (and is not deleted by the same write: a rename that only
# changes case stays possible).


def ignores_case(store: Store) -> bool:
    """core.ignoreCase, as ``git init`` found the file system."""
    return store.config_bool("core.ignoreCase", False)


def case_twin(tree: pygit2.Tree, path: str, deleted: Container[str] = ()) -> str | None:
    """The existing path in ``tree`` that names the same file as ``path`` on a
    case-insensitive file system (a component equal but for case), unless the same
    write deletes it; None when there is none. A directory's entries are compared
    one by one: only writes that create a path, and only where case is ignored."""
    node: pygit2.Tree | None = tree
    prefix = ""
    for part in path.split("/"):
        if node is None:
            return None
        low = part.casefold()
        exact = None
        for e in node:
            if e.name == part:
                exact = e
            elif str(e.name).casefold() == low:
                twin = prefix + str(e.name)
                if isinstance(e, pygit2.Tree) or twin not in deleted:
                    return twin
        if exact is None or not isinstance(exact, pygit2.Tree):
            return None
        node = exact
        prefix += part + "/"
    return None
