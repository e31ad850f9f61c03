"""A computed dependency scope for a storm-mode write (``--deps auto``, ``storm.deps=auto``).

Validating a write against the agent's whole read set rejects it when any file
the agent ever read in this task changed, even one the new code does not depend
on: a needless re-plan. ``auto`` validates the target against the read files it
depends on, found with Python's ``ast`` on the content being written:

* the files it imports (``import a.b`` also runs ``a/__init__.py``; ``from a import
  b`` may name the submodule ``a/b.py``), resolved to paths of the shared head's
  tree (or the read set) from the top, from the target's directory and from each
  directory above it (``src/`` layouts, scripts), relative imports from its package;
* the files that define the names it uses: a name imported from a package that
  re-exports it is followed to the module defining it (through ``from x import
  name`` and ``*`` chains), and a name it uses but never binds (a star import,
  an injected global) counts every read Python file defining it at the top,
  plus the ``conftest.py`` files above a test (its fixtures);
* the read files that import the target (its callers: a changed caller may call
  what this write changes; both the version the agent read and the current one
  are looked at, so a caller that started using the target meanwhile counts);
* every file the agent wrote in this task (its own work must still fit together).

Anything else in the read set is left out. A write whose targets are none of them
Python, or with a Python target that does not parse or is deleted, falls back to
the whole read set (``auto:all``). A file that is not Python written together
with Python (a changelog entry, a README line, a config key for the new code)
documents or configures that code: it depends on what the code depends on, plus
every read file that is not Python either (prose read beside it). The scope only
ever drops read files; the targets themselves are always validated.
"""
from __future__ import annotations

import ast
import builtins
import posixpath
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import trailers
from ..core.errors import BadPath
from ..core.readsets import ReadEntry
from ..core.store import Store

AUTO = "auto"
ALL = "all"
FALLBACK = "auto:all"
PY_SUFFIXES = (".py", ".pyi")
# what parsing a source can raise: a syntax error, NUL bytes, or nesting deeper than
# CPython's parser (a generated 5,000-term expression) or ast's recursive helpers allow
UNPARSABLE = (SyntaxError, ValueError, RecursionError, MemoryError)
MAX_CHAIN = 4  # re-export hops followed from an imported module to the defining one
_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__package__", "__spec__",
                                          "__loader__", "__path__", "__builtins__", "__annotations__"}


@dataclass
class ModuleInfo:
    """What one Python source says about its dependencies (cached by blob id)."""

    imports: list[tuple[str, int, list[tuple[str, str]] | None]] = field(default_factory=list)
    # (module, level, [(name, bound as)] for from-imports, None for `import module`)
    defs: set[str] = field(default_factory=set)  # names bound at the top (def, class, =, import)
    free: set[str] = field(default_factory=set)  # names loaded but bound nowhere in the file
    attrs: set[tuple[str, str]] = field(default_factory=set)  # (name, attribute) of `name.attr`


@dataclass
class Scope:
    """The paths a write is validated against: ``paths`` None means the whole read set."""

    name: str  # "auto" or "auto:all"
    paths: set[str] | None
    why: str
    head: pygit2.Oid | None = None
    # read files that moved but whose change touches nothing the write uses
    # (storm_git.deps.impact), each with the reason; left out of ``paths``
    unaffected: dict[str, str] = field(default_factory=dict)
    # the moved read files that were looked inside and still reject, each with why
    kept: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "paths": None if self.paths is None else sorted(self.paths), "why": self.why}


_INFO: dict[str, ModuleInfo | None] = {}


def _top_level_binds(body: list[ast.stmt], out: set[str]) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name != "*":
                    out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for part in ("body", "orelse", "finalbody"):
                _top_level_binds(getattr(node, part, []) or [], out)
            for h in getattr(node, "handlers", []) or []:
                _top_level_binds(h.body, out)
            if isinstance(node, ast.For):
                out.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, in :func:`ast.walk`'s order, at about twice its speed (the fields of
    each node type looked up once): a write's new module is walked on the write's path."""
    todo = deque([tree])
    fields: dict[type, tuple[str, ...]] = _FIELDS
    node_type, pop, extend = ast.AST, todo.popleft, todo.extend
    while todo:
        node = pop()
        names = fields.get(type(node))
        if names is None:
            names = fields[type(node)] = type(node)._fields
        for name in names:
            value = getattr(node, name, None)
            if type(value) is list:
                extend([v for v in value if isinstance(v, node_type)])
            elif isinstance(value, node_type):
                todo.append(value)
        yield node


_FIELDS: dict[type, tuple[str, ...]] = {}
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_MATCH_NAMES = tuple(getattr(ast, n) for n in ("MatchAs", "MatchStar") if hasattr(ast, n))


def parse(source: bytes) -> ModuleInfo | None:
    """The module's imports, top-level names and free names; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except UNPARSABLE:
        return None
    info = ModuleInfo()
    bound: set[str] = set()
    loaded: set[str] = set()
    Name, Attribute, arg, Load = ast.Name, ast.Attribute, ast.arg, ast.Load
    node: Any  # dispatched on its exact type below, which mypy does not narrow (isinstance would be slower)
    for node in _nodes(tree):
        t = type(node)  # the most frequent node types first
        if t is Name:
            (loaded if type(node.ctx) is Load else bound).add(node.id)
        elif t is Attribute:
            if type(node.value) is Name:
                info.attrs.add((node.value.id, node.attr))
        elif t is arg:
            bound.add(node.arg)
        elif t is ast.Import:
            for a in node.names:
                info.imports.append((a.name, 0, None))
                bound.add((a.asname or a.name).split(".")[0])
        elif t is ast.ImportFrom:
            names = [(a.name, a.asname or a.name) for a in node.names]
            info.imports.append((node.module or "", node.level or 0, names))
            bound.update(a.asname or a.name for a in node.names if a.name != "*")
        elif t in _DEFS:
            bound.add(node.name)
        elif t is ast.Global or t is ast.Nonlocal:
            bound.update(node.names)
        elif t is ast.ExceptHandler:
            if node.name:
                bound.add(node.name)
        elif t in _MATCH_NAMES and node.name:
            bound.add(node.name)
    _top_level_binds(tree.body, info.defs)
    info.free = loaded - bound - _BUILTINS
    return info


def _remember(blob: str, info: ModuleInfo | None) -> ModuleInfo | None:
    if len(_INFO) > 4096:
        _INFO.clear()
    _INFO[blob] = info
    return info


def _info(store: Store, blob: str | None) -> ModuleInfo | None:
    if blob is None:
        return None
    if blob not in _INFO:
        try:
            return _remember(blob, parse(store.blob_bytes(pygit2.Oid(hex=blob))))
        except (KeyError, ValueError):
            return _remember(blob, None)
    return _INFO[blob]


def parse_new(content: bytes) -> ModuleInfo | None:
    """:func:`parse` of a write's new content, kept under the content's blob id: the
    write parses it once (scope, widening, impact), and the next write of the same
    file, which reads it back as the head's blob, finds it parsed (a 3,000-line module
    takes ~100 ms to walk)."""
    blob = str(pygit2.hash(content))
    return _INFO[blob] if blob in _INFO else _remember(blob, parse(content))


def is_python(path: str) -> bool:
    return path.endswith(PY_SUFFIXES)


# -- resolving modules to paths ----------------------------------------------------------------
def _roots(importer: str) -> list[str]:
    """Directories an absolute import may be relative to: the top, then the importer's
    directory and each one above it (a src/ layout, a script's own directory)."""
    d = posixpath.dirname(importer)
    out = [""]
    while d:
        out.append(d)
        d = posixpath.dirname(d)
    return out


def _candidates(parts: list[str], base: str) -> list[str]:
    """Files that importing ``parts`` from ``base`` runs: each package's __init__ and the module."""
    out = []
    for i in range(1, len(parts) + 1):
        stem = posixpath.join(base, *parts[:i]) if base else posixpath.join(*parts[:i])
        out.append(stem + "/__init__.py")
        if i == len(parts):
            out += [stem + ".py", stem + ".pyi", stem + "/__init__.pyi"]
    return out


def resolve(importer: str, module: str, level: int, known: Callable[[str], bool],
            names: Iterable[str] = ()) -> list[str]:
    """Known paths (in the head's tree, the read set or the write) that an import in
    ``importer`` may load, including submodules named by a from-import's ``names``."""
    parts = [p for p in module.split(".") if p]
    if level:
        base = posixpath.dirname(importer)
        for _ in range(level - 1):
            base = posixpath.dirname(base)
        bases = [base]
    else:
        bases = _roots(importer)
    found: list[str] = []
    for base in bases:
        if not parts and not level:
            continue
        cands = _candidates(parts, base) if parts else [posixpath.join(base, "__init__.py") if base else "__init__.py"]
        pkg = posixpath.join(base, *parts) if parts else base
        for n in names:
            if n != "*":
                sub = posixpath.join(pkg, n) if pkg else n
                cands += [sub + ".py", sub + "/__init__.py", sub + ".pyi"]
        found += [c for c in cands if known(c)]
    return list(dict.fromkeys(found))


# -- the scope ---------------------------------------------------------------------------------
class Resolver:
    """Lookups against the shared head's tree, the read set and the write, cached."""

    def __init__(self, store: Store, tree: pygit2.Tree, reads: dict[str, ReadEntry], changes: dict[str, Any]):
        self.store, self.tree, self.reads, self.changes = store, tree, reads, changes
        self._blobs: dict[str, str | None] = {}
        self._dirs: dict[str, frozenset[str]] = {}

    def head_blob(self, path: str) -> str | None:
        if path not in self._blobs:
            try:
                e = self.store.entry(self.tree, path)
            except (BadPath, KeyError, ValueError):
                e = None
            self._blobs[path] = str(e.oid) if e is not None else None
        return self._blobs[path]

    def known(self, path: str) -> bool:
        if path in self.changes or path in self.reads:
            return True
        d, _, name = path.rpartition("/")
        return name in self._names(d) and self.head_blob(path) is not None

    def _names(self, d: str) -> frozenset[str]:
        """Entry names of directory ``d`` at the head (one tree lookup per directory)."""
        if d not in self._dirs:
            try:
                obj = self.tree[d] if d else self.tree
                names = (e.name for e in obj if e.name) if isinstance(obj, pygit2.Tree) else ()
                self._dirs[d] = frozenset(names)
            except (KeyError, ValueError):
                self._dirs[d] = frozenset()
        return self._dirs[d]

    def infos(self, path: str) -> list[ModuleInfo]:
        """The module as it is at the head and as the agent read it (both can matter)."""
        blobs = {self.head_blob(path), self.reads[path].blob if path in self.reads else None}
        return [i for i in (_info(self.store, b) for b in blobs if b) if i is not None]

    def defining(self, path: str, name: str, depth: int = 0, seen: set[tuple[str, str]] | None = None) -> set[str]:
        """``path`` plus the modules it takes ``name`` from (re-exports, star imports)."""
        seen = set() if seen is None else seen
        if (path, name) in seen or depth > MAX_CHAIN:
            return set()
        seen.add((path, name))
        out = {path}
        for info in self.infos(path):
            for module, level, names in info.imports:
                if names is None:
                    continue
                for orig, asname in names:
                    if orig == "*" or asname == name:
                        for p in resolve(path, module, level, self.known, [orig]):
                            out |= self.defining(p, name if orig == "*" else orig, depth + 1, seen)
        return out


def own_writes(store: Store, agent: str, reads: dict[str, ReadEntry]) -> set[str]:
    """Read-set paths whose recorded version is one this agent wrote (in this task: a
    read set belongs to one task): the entry's head is the agent's own write of it."""
    out: set[str] = set()
    heads: dict[str, tuple[str | None, set[str]]] = {}
    for p, e in reads.items():
        if not e.head:
            continue
        if e.head not in heads:
            try:
                t = trailers.parse(store.commit(pygit2.Oid(hex=e.head)).message)
                heads[e.head] = (next(iter(t.get("Storm-Agent") or []), None), set(t.get("Storm-Path", [])))
            except (KeyError, ValueError):
                heads[e.head] = (None, set())
        who, paths = heads[e.head]
        if who == agent and p in paths:
            out.add(p)
    return out


def target_deps(r: Resolver, target: str, info: ModuleInfo) -> set[str]:
    """Imports, name-defining files and conftest.py files of one Python target."""
    out: set[str] = set()
    aliases: dict[str, list[str]] = {}
    for module, level, names in info.imports:
        listed = [n for n, _ in names] if names else []
        paths = resolve(target, module, level, r.known, listed)
        out.update(paths)
        if names is None:
            aliases.setdefault(module.split(".")[0], []).extend(paths)
            continue
        for orig, asname in names:
            for p in paths:
                if orig == "*" or not p.endswith(f"/{orig}.py"):
                    out |= r.defining(p, orig if orig != "*" else "*")
            for p in resolve(target, module, level, r.known, [orig]):
                aliases.setdefault(asname, []).append(p)
    for name, attr in info.attrs:  # pkg.helper: the module pkg takes helper from
        for p in aliases.get(name, []):
            out |= r.defining(p, attr)
            out.update(resolve(p, attr, 1, r.known) if p.endswith("__init__.py") else [])
    if info.free:
        for p in r.reads:
            if is_python(p) and p != target:
                if any(info.free & i.defs for i in r.infos(p)):
                    out.add(p)
    d = posixpath.dirname(target)
    while True:
        out.add(posixpath.join(d, "conftest.py") if d else "conftest.py")
        if not d:
            break
        d = posixpath.dirname(d)
    return out


def _exposed(r: Resolver, targets: set[str], new: list[ModuleInfo]) -> set[str]:
    """Names through which a file can reach a target: its module name, its package's,
    and every name it defines (in the version read, the current one and the new one)."""
    names = {"*"}
    for t in targets:
        stem = posixpath.basename(t).rsplit(".", 1)[0]
        names.add(posixpath.basename(posixpath.dirname(t)) if stem == "__init__" else stem)
        for info in r.infos(t) + new:
            names |= info.defs
    return names


def _may_reach(info: ModuleInfo, exposed: set[str]) -> bool:
    """Cheap and sound filter: an import or use of one of the exposed names."""
    for module, _level, names in info.imports:
        if exposed.intersection(module.split(".")) or (names and any(n in exposed or a in exposed for n, a in names)):
            return True
    return bool(exposed.intersection(a for _, a in info.attrs) or exposed & info.free)


def dependents(r: Resolver, targets: set[str], new: list[ModuleInfo]) -> set[str]:
    """Read Python files that import a target (or a name it defines), in the version
    read or the current one; conftest.py targets count for every file below them."""
    out = set()
    exposed = _exposed(r, targets, new)
    fixtures = [posixpath.dirname(t) for t in targets if posixpath.basename(t) == "conftest.py"]
    for p in r.reads:
        if p in targets or not is_python(p):
            continue
        if any(d == "" or p.startswith(d + "/") for d in fixtures):
            out.add(p)
            continue
        for info in r.infos(p):
            if _may_reach(info, exposed) and targets.intersection(target_deps(r, p, info)):
                out.add(p)
                break
    return out


def compute(store: Store, agent: str, changes: dict[str, Any], reads: dict[str, ReadEntry],
            head: pygit2.Oid) -> Scope:
    """The read files the write of ``changes`` depends on, at ``head`` (module docstring)."""
    code = python_targets(changes)
    others = [p for p in changes if p not in code]
    if not code:
        return Scope(FALLBACK, None, f"{others[0]} is not Python: the whole read set", head)
    parsed: dict[str, ModuleInfo] = {}
    for p, c in code.items():
        if c is None:
            return Scope(FALLBACK, None, f"{p} is deleted: the whole read set", head)
        info = parse_new(c) if isinstance(c, bytes) else None
        if info is None:
            return Scope(FALLBACK, None, f"{p} does not parse as Python: the whole read set", head)
        parsed[p] = info
    r = Resolver(store, store.commit(head).tree, reads, changes)
    deps: set[str] = set()
    new = list(parsed.values())
    for p, info in parsed.items():
        deps |= target_deps(r, p, info)
    deps |= dependents(r, set(code), new)
    deps |= own_writes(store, agent, reads)
    why = "imports, name definitions, importers and the agent's own writes"
    if others:
        # a file that is not code (a changelog, a README, a config) written with code: it
        # documents or configures that change, so it depends on what the code depends on,
        # and on every other file read that is not Python either (prose read beside it)
        deps |= {p for p in reads if not is_python(p)}
        why += f"; {', '.join(others[:3])}{' …' if len(others) > 3 else ''}: the non-Python files read"
    paths = {p for p in deps if p in reads and p not in changes}
    return Scope(AUTO, paths, f"{len(paths)} of {len(reads)} read file(s): {why}", head)


def python_targets(changes: dict[str, Any]) -> dict[str, Any]:
    """The Python files among a write's targets, with their new content (None: deleted)."""
    return {p: (c[0] if isinstance(c, tuple) else c) for p, c in changes.items() if is_python(p)}


def widen(scope: Scope, store: Store, agent: str, changes: dict[str, Any], reads: dict[str, ReadEntry],
          head: pygit2.Oid) -> bool:
    """Under the lock, at a head other than the one ``scope`` was computed at: add what
    the files that moved since now bring in. Returns whether paths were added."""
    if scope.paths is None or head == scope.head:
        return False
    again = compute(store, agent, changes, reads, head)
    scope.head = head
    if again.paths is None:
        scope.paths, scope.name, scope.why = None, FALLBACK, again.why
        return True
    added = again.paths - scope.paths  # a file left out as unaffected is judged again
    scope.paths |= added
    for p in added:
        scope.unaffected.pop(p, None)
    return bool(added)
