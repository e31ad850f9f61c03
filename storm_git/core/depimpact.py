"""Whether a dependency that moved since the agent read it touches what the write uses.

``--deps auto`` (storm_git.core.depscope) keeps a read file in a write's scope
when the new content imports it, takes names from it, or is imported by it. A
file in that scope that another agent changed meanwhile still rejects the write
as a stale dependency, even when the change is to a function the write never
calls: the needless re-plan the computed scope exists to avoid.

Here, only when such a write would be rejected, each moved file is compared at
the level of its top-level statements (``ast``, so comments, blank lines and
moves do not count): the file is *unaffected*, and leaves the scope, when every
changed statement is a definition (``def``, ``class``, a plain assignment) whose
name the write does not use, directly or through the definitions it uses in that
file, and, if the file imports the target, a definition that does not mention
any name the target exposes. Anything else keeps the file in the scope:

* a changed import or other module-level statement (it runs on import: a new
  import cycle, a registration, a side effect);
* a file used as a whole (``from m import *`` with a changed name, a module
  object passed around, ``import a.b`` used as ``a.b.f``), a ``conftest.py``
  (fixtures are found by name at run time), the agent's own earlier writes;
* a file whose reason for being in the scope is not accounted for here, a file
  that is not Python, does not parse, or was created or deleted.

The rule errs towards rejecting: a dropped file is one whose change cannot reach
the new content through the names it uses. What it cannot see (a name built at
run time, ``getattr`` with a string) is the documented limit of ``--deps auto``.
"""
from __future__ import annotations

import ast
import posixpath
from collections.abc import Iterable
from typing import Any

import pygit2

from .depscope import Resolver, dependents, exposed_names, is_python, own_writes, parse, resolve
from .readsets import ReadEntry
from .store import Store

ALL = None  # a file used as a whole: every changed definition matters
Uses = dict[str, "set[str] | None"]


# -- the file's units ---------------------------------------------------------------------------
def _unit_names(node: ast.stmt) -> list[str] | None:
    """The names a definition binds, or None for a statement that is not one."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if all(isinstance(t, ast.Name) for t in targets):
            return [t.id for t in targets]  # type: ignore[union-attr]
    return None


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` does not run on import."""
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def units(source: bytes) -> dict[tuple[str, str], list[ast.stmt]] | None:
    """Top-level statements by key: ("def", name) for definitions, ("stmt", dump) for
    the rest. None when the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    out: dict[tuple[str, str], list[ast.stmt]] = {}
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # the module's docstring
        if _is_main_guard(node):
            continue
        names = _unit_names(node)
        for key in ([("def", n) for n in names] if names else [("stmt", ast.dump(node))]):
            out.setdefault(key, []).append(node)
    return out


def _changed(old: dict[tuple[str, str], list[ast.stmt]],
             new: dict[tuple[str, str], list[ast.stmt]]) -> set[tuple[str, str]]:
    return {k for k in old.keys() | new.keys()
            if [ast.dump(n) for n in old.get(k, [])] != [ast.dump(n) for n in new.get(k, [])]}


def _refs(nodes: Iterable[ast.AST], attrs: bool = False) -> set[str]:
    """Names a statement mentions (and, with ``attrs``, the attributes it reads)."""
    out: set[str] = set()
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif attrs and isinstance(n, ast.Attribute):
                out.add(n.attr)
    return out


# -- what the write uses of each file -------------------------------------------------------------
def _alias_uses(tree: ast.Module) -> dict[str, set[str] | None]:
    """For each name used as ``name.attr``: the attributes; None when the name is
    also used bare (a module object passed around is used as a whole)."""
    bases: set[int] = set()
    out: dict[str, set[str] | None] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            bases.add(id(n.value))
            cur = out.setdefault(n.value.id, set())
            if cur is not None:
                cur.add(n.attr)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in bases:
            out[n.id] = None
    return out


def _add(uses: Uses, path: str, names: set[str] | None) -> None:
    if names is None or uses.get(path, set()) is None:
        uses[path] = None
    else:
        uses.setdefault(path, set()).update(names)  # type: ignore[union-attr]


def _is_module(path: str, parts: list[str]) -> bool:
    """Whether ``path`` is the module ``parts`` names itself (not a package above it)."""
    stem = "/".join(parts)
    return any(path == stem + s or path.endswith("/" + stem + s)
               for s in (".py", ".pyi", "/__init__.py", "/__init__.pyi"))


def _chain(r: Resolver, path: str, name: str, uses: Uses) -> None:
    """``name`` taken from ``path``: it, and each module it is re-exported from."""
    seen: set[tuple[str, str]] = set()
    r.defining(path, name, 0, seen)
    for p, n in seen:
        _add(uses, p, None if n == "*" else {n})


def target_uses(r: Resolver, target: str, source: bytes) -> Uses:
    """Per read file, the names the new content of ``target`` takes from it ({} for a
    package that is only run on the way; None for a file used as a whole)."""
    tree = ast.parse(source)
    info = parse(source)
    aliases = _alias_uses(tree)
    uses: Uses = {}
    assert info is not None
    for module, level, names in info.imports:
        parts = [p for p in module.split(".") if p]
        if names is None:  # import a.b.c [as x]
            found = resolve(target, module, level, r.known)
            bound = module.split(".")[0]
            dotted_bare = len(parts) > 1 and not any(
                isinstance(n, ast.Import) and any(a.name == module and a.asname for a in n.names)
                for n in ast.walk(tree))
            asname = next((a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                           for a in n.names if a.name == module and a.asname), None)
            attrs = aliases.get(asname or bound, set())
            for p in found:
                if not _is_module(p, parts):
                    _add(uses, p, set())  # a package __init__ run on the way
                elif dotted_bare or attrs is None:
                    _add(uses, p, None)
                else:
                    for a in attrs:
                        _chain(r, p, a, uses)
                        if posixpath.basename(p).startswith("__init__."):
                            for sub in resolve(p, a, 1, r.known):
                                _add(uses, sub, None)
                    _add(uses, p, set())
            continue
        for orig, asname in names:
            for p in resolve(target, module, level, r.known, [orig]):
                if orig != "*" and _is_module(p, parts + [orig]):  # from pkg import submodule
                    sub = aliases.get(asname, set())
                    if sub is None:
                        _add(uses, p, None)
                    else:
                        for a in sub:
                            _chain(r, p, a, uses)
                        _add(uses, p, set())
                elif _is_module(p, parts) or (not parts and level):
                    if orig == "*":
                        _add(uses, p, None)
                        _chain(r, p, "*", uses)
                    else:
                        _chain(r, p, orig, uses)
                else:
                    _add(uses, p, set())
    if info.free:  # names bound nowhere: any read file defining one of them provides it
        for p in r.reads:
            if is_python(p) and p != target:
                for i in r.infos(p):
                    hit = info.free & i.defs
                    if hit:
                        _add(uses, p, set(hit))
    return uses


def _closure(names: set[str], *versions: dict[tuple[str, str], list[ast.stmt]]) -> set[str]:
    """``names`` and every top-level name their definitions mention, in either version."""
    out, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        for v in versions:
            todo.extend(_refs(v.get(("def", n), [])) - out)
    return out


# -- the verdict -----------------------------------------------------------------------------------
def unaffected(store: Store, agent: str, changes: dict[str, Any], reads: dict[str, ReadEntry],
               tree: pygit2.Tree, moved: Iterable[str]) -> dict[str, str]:
    """Of the ``moved`` read files (stale under a computed scope, at ``tree``), those whose
    change cannot reach the write, each with the reason in one line (module docstring)."""
    moved = [p for p in moved if p in reads and p not in changes and is_python(p)
             and posixpath.basename(p) not in ("conftest.py",)]
    if not moved:
        return {}
    new: dict[str, bytes] = {}
    for p, c in changes.items():
        c = c[0] if isinstance(c, tuple) else c
        if not is_python(p) or not isinstance(c, bytes) or parse(c) is None:
            return {}  # the scope was the whole read set anyway
        new[p] = c
    r = Resolver(store, tree, reads, changes)
    uses: Uses = {}
    for p, c in new.items():
        for d, names in target_uses(r, p, c).items():
            _add(uses, d, names)
    infos = [parse(c) for c in new.values()]
    importers = dependents(r, set(new), [i for i in infos if i is not None])
    own = own_writes(store, agent, reads)
    exposed: set[str] | None = None
    out: dict[str, str] = {}
    for d in moved:
        if d in own or (d not in uses and d not in importers):
            continue
        cur = r.head_blob(d)
        was = reads[d].blob
        if cur is None or was is None:
            continue
        try:
            old_u = units(store.blob_bytes(pygit2.Oid(hex=was)))
            new_u = units(store.blob_bytes(pygit2.Oid(hex=cur)))
        except (KeyError, ValueError):
            continue
        if old_u is None or new_u is None:
            continue
        changed = _changed(old_u, new_u)
        if any(kind == "stmt" for kind, _ in changed):
            continue
        names = {n for _, n in changed}
        used = uses.get(d, set())
        if used is None and names:
            continue
        if used and names & _closure(set(used), old_u, new_u):
            continue
        if d in importers:
            if exposed is None:
                exposed = exposed_names(r, set(new), [i for i in infos if i is not None]) - {"*"}
            touched = [n for k in changed for n in old_u.get(k, []) + new_u.get(k, [])]
            if _refs(touched, attrs=True) & exposed:
                continue
        out[d] = ("only formatting or comments changed" if not names else
                  f"changed {', '.join(sorted(names)[:4])}{'…' if len(names) > 4 else ''}, "
                  "which the write does not use")
    return out
