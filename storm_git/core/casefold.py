"""Paths that differ only in case, where the file system cannot tell them apart.

``git init`` sets ``core.ignoreCase=true`` on a case-insensitive file system
(macOS, Windows, a casefolded ext4 directory): there ``README.md`` and
``readme.md`` are one file on disk. git then treats them as one path (``git add
readme.md`` updates ``README.md``). Storm's shared tree would take both as two
entries while the disk holds one file, and each write of one would overwrite the
other's content on disk. So where the file system ignores case, a write that
*creates* a path is refused when a file or directory of the same name in another
case is already there (and is not deleted by the same write: a rename that only
changes case stays possible).
"""
from __future__ import annotations

from collections.abc import Container

import pygit2

from .store import Store


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
