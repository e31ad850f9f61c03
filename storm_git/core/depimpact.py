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
file, and, if the file imports the target (a caller), a definition whose code does
not reach, directly or through the target's own definitions, a definition this
write changes (when the write changes a module-level statement of the target,
every caller is reached). Anything else keeps the file in the scope:

* a changed import that may close an import cycle (the files it loads lead, by
  their imports, back to the file or to a target of the write; past 400 files
  followed, assumed), or another module-level statement (it runs on import: a
  registration, a side effect); any other import (``import select``, or a
  module of the repository that leads to neither) counts as a definition of the
  names it binds;
* a file used as a whole (``from m import *`` with a changed name, a module
  object passed around, ``import a.b`` used as ``a.b.f``), a ``conftest.py``
  (fixtures are found by name at run time), the agent's own earlier writes
  unless the write imports them or they import it (then the names decide, as
  for any import: ``depscope.own_writes`` cannot tell this task's write from a
  read of an earlier task's write at an unchanged head);
* a file whose reason for being in the scope is not accounted for here, a file
  that is not Python, does not parse, or was created or deleted.

The rule errs towards rejecting: a dropped file is one whose change cannot reach
the new content through the names it uses. What it cannot see (a name built at
run time, ``getattr`` with a string) is the documented limit of ``--deps auto``.
"""
from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from .depscope import UNPARSABLE, Resolver, dependents, is_python, own_writes, parse, resolve, target_deps
from .readsets import ReadEntry
from .store import Store

Uses = dict[str, "set[str] | None"]  # per read file, the names used; None: used as a whole


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


def _import_names(node: ast.stmt) -> list[str] | None:
    """The names an import binds; None for a star import."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom) and all(a.name != "*" for a in node.names):
        return [a.asname or a.name for a in node.names]
    return None


def _is_type_checking(node: ast.stmt) -> bool:
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
        if _is_main_guard(node):
            continue
        if _is_type_checking(node):
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


FOLLOW_LIMIT = 400  # files an import is followed through before it is assumed to close a cycle


def _loads(r: Resolver, path: str, node: ast.stmt) -> list[str]:
    """The repository's files an import statement in ``path`` may load."""
    if isinstance(node, ast.ImportFrom):
        return resolve(path, node.module or "", node.level or 0, r.known,
                       [a.name for a in node.names if a.name != "*"])
    assert isinstance(node, ast.Import)
    return [p for a in node.names for p in resolve(path, a.name, 0, r.known)]


_RUNTIME: dict[str, list[tuple[str, int, list[str]]] | None] = {}


def _runtime_imports(store: Store, blob: str) -> list[tuple[str, int, list[str]]] | None:
    """The imports a module runs when imported: at its top and in its class bodies and
    top-level blocks, not in functions nor under ``if TYPE_CHECKING:`` (cached by blob)."""
    if blob not in _RUNTIME:
        if len(_RUNTIME) > 4096:
            _RUNTIME.clear()
        out: list[tuple[str, int, list[str]]] = []
        try:
            todo = list(ast.parse(store.blob_bytes(pygit2.Oid(hex=blob))).body)
        except (*UNPARSABLE, KeyError):
            _RUNTIME[blob] = None  # unreadable: whoever follows it assumes the worst
            return None
        while todo:
            n = todo.pop()
            if isinstance(n, ast.Import):
                out += [(a.name, 0, []) for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                out.append((n.module or "", n.level or 0, [a.name for a in n.names if a.name != "*"]))
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or _is_type_checking(n):
                continue
            else:
                todo += [c for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt)]
        _RUNTIME[blob] = out
    return _RUNTIME[blob]


def _reaches(r: Resolver, starts: list[str], goals: set[str]) -> bool:
    """Whether the imports that ``starts`` run (as read or at the head) lead to one of
    ``goals``; True too past FOLLOW_LIMIT files (assume the worst)."""
    seen, todo = set(starts), list(starts)
    while todo:
        p = todo.pop()
        if p in goals or len(seen) > FOLLOW_LIMIT:
            return True
        blobs = {r.head_blob(p), r.reads[p].blob if p in r.reads else None} - {None}
        for blob in blobs:
            found = _runtime_imports(r.store, blob)  # type: ignore[arg-type]
            if found is None:
                return True
            for module, level, names in found:
                for q in resolve(p, module, level, r.known, names):
                    if q not in seen:
                        seen.add(q)
                        todo.append(q)
    return False


def _cycle_risk(r: Resolver, path: str, goals: set[str]) -> Callable[[ast.stmt], bool]:
    """Whether an import statement in ``path`` may close an import cycle through the
    repository's files: back to ``path`` itself or to a target of the write (``goals``).
    An import that cannot is a definition of the names it binds."""
    goals = goals | {path}

    def check(node: ast.stmt) -> bool:
        starts = _loads(r, path, node)
        if not starts:  # outside the repository (a relative one not found: assume the worst)
            return isinstance(node, ast.ImportFrom) and bool(node.level)
        return _reaches(r, starts, goals)
    return check


Units = dict[tuple[str, str], list[ast.stmt]]
Changed = tuple[Units, Units, set[tuple[str, str]]]  # as read, now, the keys that differ


class _Edits:
    """What the write changes in one target: the changed definitions' names, with the
    target's definitions as read and as written (names None: a module-level statement
    changed, or the target is new or unreadable: every caller is reached)."""

    def __init__(self, target: str, names: set[str] | None, versions: list[Units]):
        self.target, self.names, self.versions = target, names, versions

    @classmethod
    def of(cls, r: Resolver, reads: dict[str, ReadEntry], target: str, content: bytes,
           goals: set[str]) -> "_Edits":
        was = reads[target].blob if target in reads else None
        try:
            got = both_versions(r.store.blob_bytes(pygit2.Oid(hex=was)), content,
                                _cycle_risk(r, target, goals)) if was else None
        except (KeyError, ValueError):
            got = None
        if got is None:
            return cls(target, None, [])
        changed = _changed(*got)
        if any(kind == "stmt" for kind, _ in changed):
            return cls(target, None, [])
        return cls(target, {n for _, n in changed}, list(got))

    def reason(self, caller: Changed) -> str | None:
        """Why a changed caller still counts (None: its changed code reaches, directly
        or through the target's own definitions, nothing this write changes)."""
        old_u, new_u, changed = caller
        if self.names is None:
            return f"imports {self.target}, whose module-level code this write changes"
        touched = [n for k in changed for n in old_u.get(k, []) + new_u.get(k, [])]
        hit = _closure(_refs(touched, attrs=True), *self.versions) & self.names
        if hit:
            return f"imports {self.target}, and its changed code uses {_names(hit)}, which this write changes"
        return None


# -- the verdict -----------------------------------------------------------------------------------
def _names(names: Iterable[str]) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + ("…" if len(names) > 4 else "")


@dataclass
class Impact:
    """The moved files judged: ``spared`` leave the scope, ``kept`` still reject; each
    with why in one line (a rejection's payload shows the kept ones)."""

    spared: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)


def judge(store: Store, agent: str, changes: dict[str, Any], reads: dict[str, ReadEntry],
          tree: pygit2.Tree, moved: Iterable[str]) -> Impact:
    """Whether each of the ``moved`` read files (stale under a computed scope, at
    ``tree``) can reach the write (module docstring)."""
    out = Impact()
    moved = [p for p in moved if p in reads and p not in changes]
    for p in moved:
        if not is_python(p):
            out.kept[p] = "not Python"
        elif posixpath.basename(p) == "conftest.py":
            out.kept[p] = "a conftest.py: its fixtures are found by name"
    moved = [p for p in moved if p not in out.kept]
    if not moved:
        return out
    new: dict[str, bytes] = {}
    for p, c in changes.items():
        c = c[0] if isinstance(c, tuple) else c
        if not is_python(p) or not isinstance(c, bytes) or parse(c) is None:
            out.kept.update({d: "the write's scope is the whole read set" for d in moved})
            return out
        new[p] = c
    r = Resolver(store, tree, reads, changes)
    uses: Uses = {}
    for p, c in new.items():
        for d, names in target_uses(r, p, c).items():
            _add(uses, d, names)
    infos = [parse(c) for c in new.values()]
    importers = dependents(r, set(new), [i for i in infos if i is not None])
    own = own_writes(store, agent, reads)
    goals = set(new)
    edits: dict[str, _Edits] = {}
    for d in moved:
        related = d in uses or d in importers
        got = _changed_in(store, r, reads, d, goals) if related else None
        why = _verdict(r, reads, d, uses, related, d in own, got)
        if why is None and d in importers:
            # a caller changed: it matters if its changed code reaches what this write
            # changes in the targets it imports (all of them, if none is found)
            reached = {t for t in new for i in r.infos(d) if t in target_deps(r, d, i)} or goals
            for t in sorted(reached):
                if t not in edits:
                    edits[t] = _Edits.of(r, reads, t, new[t], goals)
                why = edits[t].reason(got)  # type: ignore[arg-type]
                if why is not None:
                    break
        if why is not None:
            out.kept[d] = why
            continue
        names = {n for _, n in got[2]} if got else set()
        out.spared[d] = ("only formatting or comments changed" if not names else
                         f"changed {_names(names)}, which the write does not use")
    return out


def _changed_in(store: Store, r: Resolver, reads: dict[str, ReadEntry], d: str, goals: set[str]) -> Changed | None:
    """Read file ``d`` as read and now, and what differs; None if created, deleted or unparsable."""
    cur, was = r.head_blob(d), reads[d].blob
    if cur is None or was is None:
        return None
    try:
        got = both_versions(store.blob_bytes(pygit2.Oid(hex=was)), store.blob_bytes(pygit2.Oid(hex=cur)),
                            _cycle_risk(r, d, goals))
    except (KeyError, ValueError):
        return None
    return None if got is None else (got[0], got[1], _changed(*got))


def _verdict(r: Resolver, reads: dict[str, ReadEntry], d: str, uses: Uses, related: bool, own: bool,
             got: Changed | None) -> str | None:
    """Why moved file ``d`` still counts (None: nothing found, so far)."""
    if not related:
        # its own earlier write: its work must fit together, in ways imports do not show
        return "the agent wrote it in this task" if own else "in the scope for a reason not looked inside"
    if r.head_blob(d) is None or reads[d].blob is None:
        return "created or deleted since read"
    if got is None:
        return "does not parse"
    old_u, new_u, changed = got
    stmts = [n for k in changed if k[0] == "stmt" for n in new_u.get(k, []) or old_u.get(k, [])]
    if stmts:
        first = min(stmts, key=lambda n: n.lineno)
        what = "an import that may close an import cycle" if isinstance(first, (ast.Import, ast.ImportFrom)) \
            else "a module-level statement"
        where = "" if first in new_u.get(("stmt", ast.dump(first)), []) else " as read"
        return f"{what} changed (line {first.lineno}{where})"
    names = {n for _, n in changed}
    used = uses.get(d, set())
    if used is None and names:
        return f"used as a whole, and {_names(names)} changed"
    hit = names & _closure(set(used), old_u, new_u) if used else set()
    if hit:
        return f"changed {_names(hit)}, which the write uses"
    return None
