"""A Python file as units of top-level statements, for comparing two versions of it.

A unit is one top-level definition (``def``, ``class``, a plain assignment), one
imported name, or another module-level statement, keyed by its kind and the names
it binds; ``storm_git.deps.impact`` compares a file's units at two versions to tell
which definitions a change touched, and which names a set of statements refers to.
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from .scope import UNPARSABLE


def _unit_names(node: ast.stmt) -> list[str] | None:
    """The names a definition binds, or None for a statement that is not one."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if len(names) == len(targets):
            return names
    return None


def is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` does not run on import."""
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def _import_names(node: ast.stmt) -> list[str] | None:
    """The names an import binds; None for a star import."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom) and all(a.name != "*" for a in node.names):
        return [a.asname or a.name for a in node.names]
    return None


def is_type_checking(node: ast.stmt) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.``/``t.TYPE_CHECKING``): never runs."""
    t = node.test if isinstance(node, ast.If) and not node.orelse else None
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def units(source: bytes, may_cycle: Callable[[ast.stmt], bool] | None = None,
          ) -> dict[tuple[str, str], list[ast.stmt]] | None:
    """Top-level statements by key: ("def", name) for definitions, ("stmt", dump) for
    the rest. An import is a definition of the names it binds unless ``may_cycle``
    says it may close an import cycle (None: none may); the imports of an ``if
    TYPE_CHECKING:`` block always are. None when the source does not parse."""
    try:
        tree = ast.parse(source)
        return _units(tree, may_cycle)
    except UNPARSABLE:
        return None


def _units(tree: ast.Module, may_cycle: Callable[[ast.stmt], bool] | None,
           ) -> dict[tuple[str, str], list[ast.stmt]]:
    out: dict[tuple[str, str], list[ast.stmt]] = {}
    body = []
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # the module's docstring
        if is_main_guard(node):
            continue
        if isinstance(node, ast.If) and is_type_checking(node):
            body += [(n, False) for n in node.body]
        else:
            body.append((node, True))
    for node, runs in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _import_names(node) is not None \
                and not (runs and may_cycle is not None and may_cycle(node)):
            for one in _split_import(node):  # one unit per name: adding a name changes no other
                out.setdefault(("def", _import_names(one)[0]), []).append(one)  # type: ignore[index]
            continue
        names = _unit_names(node)
        for key in ([("def", n) for n in names] if names else [("stmt", ast.dump(node))]):
            out.setdefault(key, []).append(node)
    return out


def _split_import(node: ast.Import | ast.ImportFrom) -> list[ast.stmt]:
    """``from m import a, b`` as ``from m import a`` and ``from m import b``."""
    out: list[ast.stmt] = []
    for a in node.names:
        one: ast.stmt = (ast.ImportFrom(module=node.module, names=[a], level=node.level)
                         if isinstance(node, ast.ImportFrom) else ast.Import(names=[a]))
        out.append(ast.copy_location(one, node))
    return out


def both_versions(old: bytes, new: bytes, may_cycle: Callable[[ast.stmt], bool]):
    """Both versions' units, an import counted as a statement only where it is new
    (a removed or unchanged import cannot close a new cycle); None if one does not parse."""
    try:
        before = {ast.dump(n) for n in ast.walk(ast.parse(old)) if isinstance(n, (ast.Import, ast.ImportFrom))}
    except UNPARSABLE:
        return None
    old_u = units(old)
    new_u = units(new, lambda n: ast.dump(n) not in before and may_cycle(n))
    return None if old_u is None or new_u is None else (old_u, new_u)


def changed_units(old: dict[tuple[str, str], list[ast.stmt]],
             new: dict[tuple[str, str], list[ast.stmt]]) -> set[tuple[str, str]]:
    return {k for k in old.keys() | new.keys()
            if [ast.dump(n) for n in old.get(k, [])] != [ast.dump(n) for n in new.get(k, [])]}


def names_in(nodes: Iterable[ast.AST], attrs: bool = False) -> set[str]:
    """Names a statement mentions (and, with ``attrs``, the attributes it reads)."""
    out: set[str] = set()
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif attrs and isinstance(n, ast.Attribute):
                out.add(n.attr)
    return out
