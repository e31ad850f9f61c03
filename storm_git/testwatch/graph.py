"""Which tests a change can affect: the Python import graph of the head's tree (the
parser and module resolution ``--deps auto`` uses, :mod:`storm_git.deps.scope`).

A test file is affected when it, a ``conftest.py`` above it, or anything they import
(transitively) changed. Where the graph says nothing a full run is due: a changed
file that is not Python, one that does not parse, a deleted Python file.
"""
from __future__ import annotations

import fnmatch
import posixpath
from collections import deque
from dataclasses import dataclass

import pygit2

from ..deps import scope

DEFAULT_TESTS = ("test_*.py", "*_test.py")


@dataclass
class Selection:
    tests: list[str] | None  # test files to run; None: everything (a full run)
    why: str


def is_test(path: str, patterns: tuple[str, ...] = DEFAULT_TESTS) -> bool:
    name = posixpath.basename(path)
    return any(fnmatch.fnmatch(path, p) if "/" in p else fnmatch.fnmatch(name, p) for p in patterns)


def python_files(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> dict[str, pygit2.Oid]:
    out: dict[str, pygit2.Oid] = {}
    for e in tree:
        path = f"{prefix}{e.name}"
        if e.type_str == "tree":
            out.update(python_files(repo, repo[e.id], path + "/"))  # type: ignore[arg-type]
        elif e.type_str == "blob" and scope.is_python(path):
            out[path] = e.id
    return out


_PARSED: dict[str, scope.ModuleInfo | None] = {}


def _info(repo: pygit2.Repository, oid: pygit2.Oid) -> scope.ModuleInfo | None:
    key = str(oid)
    if key not in _PARSED:
        if len(_PARSED) > 8192:
            _PARSED.clear()
        blob = repo[oid]
        _PARSED[key] = scope.parse(blob.data) if isinstance(blob, pygit2.Blob) else None
    return _PARSED[key]


def imports(repo: pygit2.Repository, files: dict[str, pygit2.Oid]) -> dict[str, set[str]] | None:
    """path -> the files of the tree it imports; None when a file does not parse."""
    known = files.__contains__
    src_roots = [d for d in ("src", "lib") if any(p.startswith(d + "/") for p in files)]
    out: dict[str, set[str]] = {}
    for path, oid in files.items():
        info = _info(repo, oid)
        if info is None:
            return None
        deps: set[str] = set()
        for module, level, names in info.imports:
            named = [n for n, _ in names] if names else []
            deps.update(scope.resolve(path, module, level, known, named))
            if not level:  # a src/ layout: `import pkg` from tests/ means src/pkg
                for root in src_roots:
                    deps.update(scope.resolve(f"{root}/__storm__.py", module, 0, known, named))
        out[path] = deps - {path}
    return out


def _conftests(path: str, files: dict[str, pygit2.Oid]) -> list[str]:
    out, d = [], posixpath.dirname(path)
    while True:
        c = posixpath.join(d, "conftest.py") if d else "conftest.py"
        if c in files:
            out.append(c)
        if not d:
            return out
        d = posixpath.dirname(d)


def affected(repo: pygit2.Repository, tree: pygit2.Tree, changed: list[str], deleted: list[str],
             patterns: tuple[str, ...] = DEFAULT_TESTS) -> Selection:
    """The test files of ``tree`` that ``changed`` (present in it) and ``deleted`` paths can affect."""
    if not changed and not deleted:
        return Selection([], "nothing changed")
    other = [p for p in changed + deleted if not scope.is_python(p)]
    if other:
        return Selection(None, f"{other[0]} is not Python: no import graph applies")
    gone = [p for p in deleted if scope.is_python(p)]
    if gone:
        return Selection(None, f"{gone[0]} was deleted: its importers cannot be traced")
    files = python_files(repo, tree)
    graph = imports(repo, files)
    if graph is None:
        return Selection(None, "a Python file does not parse: no import graph")
    # reverse edges, then everything that reaches a changed file
    rev: dict[str, set[str]] = {}
    for src, deps in graph.items():
        for d in deps:
            rev.setdefault(d, set()).add(src)
    reach = set(changed)
    todo = deque(changed)
    while todo:
        for importer in rev.get(todo.popleft(), ()):
            if importer not in reach:
                reach.add(importer)
                todo.append(importer)
    tests = []
    for path in files:
        if is_test(path, patterns) and (path in reach or any(c in reach for c in _conftests(path, files))):
            tests.append(path)
    return Selection(sorted(tests), f"{len(tests)} test file(s) import what changed")
