"""Whether a dependency that moved since the agent read it touches what the write uses.

``--deps auto`` (storm_git.deps.scope) keeps a read file in a write's scope
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
every caller is reached). A caller's change is read as a write's is (below): a new
function that calls the caller's own unchanged ``run()``, which calls the target's
``helper``, reaches ``helper``; a name the caller binds itself at its top is its own.

What the write uses is what its *change* uses (``change_slice``): in a target the agent
read, the definitions that differ from the version read (as written and as read);
wherever the target's unchanged code mentions one of them, the names of that statement
and, in a function, of the statements sharing a local name with it (what is passed in,
where the result goes: ``run()`` calling ``show(helper())`` when the write changes
``show``); the target's ``if __name__ == "__main__":`` block; and every definition of
the target those use, transitively. A write that adds a function calling nothing does
not depend on what the target's other functions call. A target the agent did not read,
or whose module-level statements the write changes, is used whole.

A changed definition the write uses keeps the file, a class as a whole whichever of
its members changed (looking inside a class, member by member, changed no count on
click's history). Anything else keeps the file in the scope too:

* a changed import that may close an import cycle (a file it loads that the file
  did not load before leads, by its imports, back to the file or to a target of
  the write; past 400 files followed, assumed: a name added to an import of a module
  already loaded adds no edge to the import graph), or another module-level
  statement (it runs on import: a registration, a side effect); any other import (``import select``, or a
  module of the repository that leads to neither) counts as a definition of the
  names it binds;
* a file used as a whole (``from m import *`` with a changed name, a module
  object passed around, ``import a.b`` used as ``a.b.f``), a ``conftest.py``
  (fixtures are found by name at run time), the agent's own earlier writes
  unless the write imports them or they import it (then the names decide, as
  for any import: ``scope.own_writes`` cannot tell this task's write from a
  read of an earlier task's write at an unchanged head);
* a file whose reason for being in the scope is not accounted for here, a file
  that is not Python, does not parse, or was created or deleted.

The rule errs towards rejecting: a dropped file is one whose change cannot reach
the write's change through the names it uses. What it cannot see (a name built at
run time, ``getattr`` with a string at the top level; a definition used only
through another module the write calls; a value that reaches the
changed code from the target's unchanged code other than through the statements that
mention it and their locals, such as an attribute set in one method and read in
another, or a global the unchanged code assigns) is the documented limit
of ``--deps auto``.

What each rule buys, on 300 commits of click's history dealt in pairs
(``benchmarks/measure_deps_auto.py``; method and date in docs/storm-mode.md):
stale-dependency rejections of Python writes are 131 with the whole read set, 51
with the computed scope and 33 with this module. With one rule switched off they
would be 44 without the change's slice (the whole target used), 41 with every
changed import a module-level statement (37 with only the already-loaded case
off), 38 with every changed caller kept; 48 with the three off.
"""
from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.readsets import ReadEntry
from ..core.store import Store
from .scope import (
    UNPARSABLE,
    Resolver,
    dependents,
    is_python,
    own_writes,
    parse_new,
    python_targets,
    resolve,
    target_deps,
)
from .units import (
    both_versions,
    changed_units,
    is_main_guard,
    is_type_checking,
    names_in,
)

Uses = dict[str, "set[str] | None"]  # per read file, the names used; None: used as a whole


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
    info = parse_new(source)
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
                    members = aliases.get(asname, set())
                    if members is None:
                        _add(uses, p, None)
                    else:
                        for a in members:
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
            todo.extend(names_in(v.get(("def", n), [])) - out)
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
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or is_type_checking(n):
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


def _cycle_risk(r: Resolver, path: str, goals: set[str], was: str) -> Callable[[ast.stmt], bool]:
    """Whether an import statement in ``path`` may close an import cycle through the
    repository's files: back to ``path`` itself or to a target of the write (``goals``).
    An import that loads only files the version ``was`` (a blob id) already loaded when
    imported adds no edge to the import graph (``from .store import Store`` becoming
    ``from .store import Store, odb_retry``), so it cannot close a new cycle. An import
    that cannot is a definition of the names it binds."""
    goals = goals | {path}
    already: list[set[str]] = []  # resolved at the first new import, if there is one

    def check(node: ast.stmt) -> bool:
        starts = _loads(r, path, node)
        if not starts:  # outside the repository (a relative one not found: assume the worst)
            return isinstance(node, ast.ImportFrom) and bool(node.level)
        if not already:
            already.append({q for module, level, names in _runtime_imports(r.store, was) or []
                            for q in resolve(path, module, level, r.known, names)})
        new = [p for p in starts if p not in already[0]]
        return bool(new) and _reaches(r, new, goals)
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
                                _cycle_risk(r, target, goals, was)) if was else None
        except (KeyError, ValueError):
            got = None
        if got is None:
            return cls(target, None, [])
        changed = changed_units(*got)
        if any(kind == "stmt" for kind, _ in changed):
            return cls(target, None, [])
        return cls(target, {n for _, n in changed}, list(got))

    def reason(self, r: Resolver, path: str, caller: Changed) -> str | None:
        """Why the changed caller ``path`` still counts (None: its change reaches,
        directly or through the target's own definitions, nothing this write changes).
        Its change is read as a write's is (``change_slice``), so a new function that
        calls one of the caller's own, unchanged, that calls the target counts; and,
        erring towards rejecting, any attribute of its changed code, or name it does not
        bind itself at its top, that the target defines counts too, however it got there."""
        old_u, new_u, changed = caller
        if self.names is None:
            return f"imports {self.target}, whose module-level code this write changes"
        touched = [n for k in changed for n in old_u.get(k, []) + new_u.get(k, [])]
        # a name the caller binds itself at its top (a definition, an import) is its own,
        # not the target's; what it takes from the target is found through its imports
        own = {n for u in (old_u, new_u) for kind, n in u if kind == "def"}
        names = (names_in(touched) - own) | (names_in(touched, attrs=True) - names_in(touched))
        blob = r.head_blob(path)
        if blob is not None:
            content = r.store.blob_bytes(pygit2.Oid(hex=blob))
            part = change_slice(_Edits(path, {n for _, n in changed}, [old_u, new_u]), content)
            taken = target_uses(r, path, part).get(self.target, set())
            if taken is None:
                return f"imports {self.target} and uses it as a whole in the code its change reaches"
            names |= taken
        hit = _closure(names, *self.versions) & self.names
        if hit:
            return f"imports {self.target}, and its changed code uses {_names(hit)}, which this write changes"
        return None


def _own_parts(stmt: ast.stmt) -> list[ast.AST]:
    """A statement without the statements nested in it: ``if x:``'s test, not its body."""
    out: list[ast.AST] = []
    for _, value in ast.iter_fields(stmt):
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, ast.AST) and not isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case)):
                out.append(v)
            elif isinstance(v, (ast.excepthandler, ast.match_case)):  # `except E as e:`, `case P if g:`
                out += [x for x in ast.iter_child_nodes(v) if not isinstance(x, ast.stmt)]
    return out


def _locals(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function binds itself: its parameters and what it assigns."""
    a = fn.args
    out = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _statements(node: ast.stmt) -> list[tuple[ast.AST | None, set[str]]]:
    """Each statement in ``node`` (itself included) with the names it mentions, and the
    innermost function whose body holds it (None: the module's or a class's body)."""
    out: list[tuple[ast.AST | None, set[str]]] = [(None, names_in(_own_parts(node)))]

    def visit(n: ast.AST, fn: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(n):
            if isinstance(child, ast.stmt):
                out.append((fn, names_in(_own_parts(child))))
            visit(child, child if isinstance(child, _FUNCTIONS) else fn)
    visit(node, node if isinstance(node, _FUNCTIONS) else None)
    return out


def _call_sites(nodes: Iterable[ast.stmt], names: set[str]) -> set[str]:
    """The names of every statement in ``nodes`` that mentions one of ``names`` (at a
    call of what the write changes: what is passed in, where the result goes), and,
    in a function, of every statement that shares a local name with those, until none
    is added (``x = helper(); show(x)`` as ``show(helper())``)."""
    out: set[str] = set()
    for node in nodes:
        groups: dict[int, tuple[ast.AST | None, list[set[str]]]] = {}
        for fn, refs in _statements(node):
            groups.setdefault(id(fn), (fn, []))[1].append(refs)
        for fn, stmts in groups.values():
            got = set().union(*(refs for refs in stmts if refs & names))
            if got and fn is not None:
                local = _locals(fn)  # type: ignore[arg-type]
                grew = True
                while grew:
                    grew = False
                    for refs in stmts:
                        if refs & got & local and not refs <= got:
                            got |= refs
                            grew = True
            out |= got
    return out


def change_slice(edits: _Edits, content: bytes) -> bytes:
    """The part of a target's new content its change involves, as source: the changed
    definitions (as written and as read); wherever the target's unchanged code mentions
    one of them, the names of that statement (what is passed in, where the result goes);
    its ``if __name__ == "__main__":`` block; and every definition of the target those
    use, transitively. The whole content when a module-level statement changed or the
    target was not read (``edits.names`` is None)."""
    if edits.names is None:
        return content
    old_u, new_u = edits.versions
    changed = set(edits.names)
    others = [x for k, nodes in new_u.items() if k[1] not in changed for x in nodes]
    main = [n for n in ast.parse(content).body if is_main_guard(n)]  # not a unit: kept whole
    names = _closure(changed | _call_sites(others, changed) | names_in(main), new_u)
    nodes = main + [x for n in sorted(names) for x in new_u.get(("def", n), [])]
    nodes += [x for n in sorted(changed) for x in old_u.get(("def", n), [])]  # what it replaced
    return ast.unparse(ast.Module(body=nodes, type_ignores=[])).encode()


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
    for p, c in python_targets(changes).items():  # a non-Python target uses no name
        if not isinstance(c, bytes) or parse_new(c) is None:
            out.kept.update({d: "the write's scope is the whole read set" for d in moved})
            return out
        new[p] = c
    r = Resolver(store, tree, reads, changes)
    goals = set(new)
    edits = {p: _Edits.of(r, reads, p, c, goals) for p, c in new.items()}
    # the files in the scope through the new content; the names its change uses
    related: set[str] = set()
    uses: Uses = {}
    for p, c in new.items():
        whole = target_uses(r, p, c)
        related.update(whole)
        part = change_slice(edits[p], c)
        for d, names in (whole if part is c else target_uses(r, p, part)).items():
            _add(uses, d, names)
    infos = [parse_new(c) for c in new.values()]
    importers = dependents(r, set(new), [i for i in infos if i is not None])
    own = own_writes(store, agent, reads)
    for d in moved:
        is_related = d in related or d in importers
        got = _changed_in(store, r, reads, d, goals) if is_related else None
        why = _verdict(r, reads, d, uses, is_related, d in own, got)
        if why is None and d in importers:
            # a caller changed: it matters if its changed code reaches what this write
            # changes in the targets it imports (all of them, if none is found)
            reached = {t for t in new for i in r.infos(d) if t in target_deps(r, d, i)} or goals
            for t in sorted(reached):
                why = edits[t].reason(r, d, got)  # type: ignore[arg-type]
                if why is not None:
                    break
        if why is not None:
            out.kept[d] = why
            continue
        names = {n for _, n in got[2]} if got else set()
        out.spared[d] = (f"changed {_names(names)}, which the write's change does not use" if names
                         else "only formatting or comments changed")
    return out


def _changed_in(store: Store, r: Resolver, reads: dict[str, ReadEntry], d: str, goals: set[str]) -> Changed | None:
    """Read file ``d`` as read and now, and what differs; None if created, deleted or unparsable."""
    cur, was = r.head_blob(d), reads[d].blob
    if cur is None or was is None:
        return None
    try:
        got = both_versions(store.blob_bytes(pygit2.Oid(hex=was)), store.blob_bytes(pygit2.Oid(hex=cur)),
                            _cycle_risk(r, d, goals, was))
    except (KeyError, ValueError):
        return None
    return None if got is None else (got[0], got[1], changed_units(*got))


def _verdict(r: Resolver, reads: dict[str, ReadEntry], d: str, uses: Uses, related: bool, own: bool,
             got: Changed | None) -> str | None:
    """Why moved file ``d`` still counts (None: nothing found, so far). A changed
    definition the write uses counts whole, a class as much as a function."""
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
    return f"changed {_names(hit)}, which the write uses" if hit else None
