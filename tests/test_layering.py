"""The library's folders are its layers (docs/architecture.md), checked on the source.

* no import cycle between modules -- the library, the command line (``cli/``,
  installed as ``storm_git.cli``) and the hooks (``hooks/``, ``storm_git.hooks``) --
  counting imports inside functions too (a lazy import is still a dependency: it
  only hides the cycle until the call);
* the layers themselves form no cycle (the table below is a DAG);
* each layer imports only from the layers below it: ``core`` from nothing above,
  ``storm`` and ``worktree`` from ``core`` and what lies between (neither from the other), and
  nothing in the library from the command line;
* the library never imports click and never prints (it returns payloads).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from helpers import claude_event, storm

TOP = Path(__file__).resolve().parent.parent
ROOT = TOP / "storm_git"
# the package's folders as installed: storm_git/, and cli/ and hooks/ mapped under it
PACKAGES = {"storm_git": ROOT, "storm_git.cli": TOP / "cli", "storm_git.hooks": TOP / "hooks"}
# what each layer may import from (besides itself and the standard library)
ALLOWED = {
    "core": set(),
    "disk": {"core"},  # the working tree on disk: safe file primitives, the disk record, sync
    "deps": {"core"},  # Python-source analysis: which files a write depends on
    "coordination": {"core"},  # what both modes share about agents: assignments, intent notes
    "render": {"core"},  # the text the doors show (the command line, the hooks, MCP)
    "storm": {"core", "disk", "deps", "coordination"},
    "worktree": {"core", "disk", "deps", "coordination"},
    "hooks": set(),  # the shims' templates (data); their logic is admin.guard
    "testwatch": {"core", "deps"},  # the shared head's tests as writes land, blame, notices
    # set-up, join, doctor, the demo see every part
    "admin": {"core", "disk", "storm", "worktree", "hooks", "remote", "api"},
    "remote": {"core", "disk", "storm"},  # storm mode on a git server
    "api": {"core", "storm", "worktree", "remote"},
    "integrations": {"core", "coordination", "render", "disk", "storm", "worktree", "remote", "api", "testwatch"},
    # research: drives both modes as a user would
    "sim": {"core", "disk", "storm", "worktree", "admin", "api", "testwatch"},
    "paper": {"core", "storm", "api"},  # the STORM paper's manager interface (optional)
    # a manager and its engineers
    "team": {"core", "coordination", "storm", "worktree", "admin", "integrations", "testwatch"},
    "cli": {"core", "coordination", "render", "disk", "deps", "storm", "worktree", "hooks", "admin", "remote", "api",
            "integrations", "sim", "team", "testwatch", "click"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for p in folder.rglob("*.py"):
            rel = p.relative_to(folder).with_suffix("")
            name = ".".join([package, *rel.parts])
            out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every storm_git module ``name`` imports, at any depth of the file."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                keep = len(parts) - node.level + (1 if is_pkg else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                target = f"{base}.{a.name}"
                out.add(target if target in modules else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in modules and m != name and not name.startswith(m + ".")} | \
        {m for m in out if m.startswith("storm_git.cli")} | {m for m in out if m.split(".")[0] == "click"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else parts[-1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next((w for w in it if w in graph), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_checker_finds_a_cycle_and_a_layer_breach():
    fake = {"storm_git.core.a": {"storm_git.storm.b"}, "storm_git.storm.b": {"storm_git.core.a"}}
    assert _cycles(fake) == [["storm_git.core.a", "storm_git.storm.b"]]
    assert _layer("storm_git.storm.b") not in ALLOWED[_layer("storm_git.core.a")]


def test_no_import_cycles(graph):
    assert any(n.startswith("storm_git.cli.") for n in graph) and any(n.startswith("storm_git.hooks") for n in graph)
    assert _cycles(graph) == []


def test_the_layers_form_no_cycle():
    layers = {k: {f"storm_git.{d}" for d in v if d in ALLOWED} for k, v in ALLOWED.items()}
    assert _cycles({f"storm_git.{k}": v for k, v in layers.items()}) == []


def test_each_layer_imports_only_the_layers_below(graph):
    breaches = []
    for name, deps in graph.items():
        mine = _layer(name)
        if mine not in ALLOWED:
            continue  # storm_git/__init__ and __main__: the package's front door
        for d in deps:
            theirs = _layer(d) if d.startswith("storm_git.") else d
            if theirs != mine and theirs not in ALLOWED[mine]:
                breaches.append(f"{name} -> {d}")
    assert breaches == []


def test_the_library_neither_prints_nor_imports_click(graph):
    library = {n: deps for n, deps in graph.items() if not n.startswith(("storm_git.cli", "storm_git.hooks"))}
    assert [n for n, deps in library.items() if any(d == "click" or d.startswith("storm_git.cli") for d in deps)
            if n not in ("storm_git.__main__", "storm_git.entry")] == []
    printing = []
    for p in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printing.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert printing == []


PUBLIC_UNDERSCORED = {("os", "_exit")}  # documented standard-library API despite the underscore


def _private_reaches(path: Path) -> list[str]:
    """``from M import _name`` and ``M._name`` where M is an imported module: one module
    using another's private name."""
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{path.name}:{node.lineno} from {node.module} import {a.name}")
                imported.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in imported
                and (node.value.id, node.attr) not in PUBLIC_UNDERSCORED):
            out.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return out


def test_no_module_reaches_into_another_modules_private_names():
    found = [r for folder in PACKAGES.values() for p in folder.rglob("*.py") for r in _private_reaches(p)]
    assert found == []


def test_the_private_name_check_sees_both_forms(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from a import _x\nimport b\nb._y()\nself_ok = object()._z\n")
    assert [r.split(" ", 1)[1] for r in _private_reaches(p)] == ["from a import _x", "b._y"]


# The optional parts: research tooling (the simulator) and the STORM paper's interface,
# and what only they need. A user's commands, the hooks and the write path load none.
OPTIONAL = ("storm_git.sim", "storm_git.paper", "matplotlib")


def _loaded(stderr: str) -> set[str]:
    """The modules a ``-X importtime`` run imported (its report on stderr)."""
    return {ln.rsplit("|", 1)[-1].strip() for ln in stderr.splitlines() if ln.startswith("import time:")}


def test_the_importtime_report_is_read(repo):
    r = storm(repo, "--help", fresh=True, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert r.returncode == 0 and {"storm_git.cli.main", "click"} <= _loaded(r.stderr)


def test_the_cli_the_hooks_and_the_write_path_load_no_optional_part(repo):
    """Each command as its own interpreter: its import-time report names every module it
    loaded, lazy imports included (``demo`` too: it is a user's first command, not research)."""
    env = {"PYTHONPROFILEIMPORTTIME": "1"}
    event = claude_event(repo, "s1", "PreToolUse", "Write", {"file_path": str(repo / "src/new.py"),
                                                             "content": "x = 1\n"}, "w1")
    runs = [(("--help",), None), (("read", "README.md", "--agent", "e1"), None),
            (("write", "src/made.py", "--agent", "e1"), "y = 2\n"),
            (("exec", "--agent", "e1", "--", "sh", "-c", "echo z > src/z.txt"), None),
            (("status", "--json"), None), (("log",), None), (("doctor",), None),
            (("harness", "hook"), json.dumps(event)), (("simulate", "--help"), None), (("demo",), None)]
    loaded: dict[str, set[str]] = {}
    for args, data in runs:
        r = storm(repo, *args, input=data, env=env, fresh=True)
        assert r.returncode == 0, (args, r.stdout, r.stderr[-2000:])
        loaded[" ".join(args[:2])] = {m for m in _loaded(r.stderr) if m.startswith(OPTIONAL)}
    assert loaded == {k: set() for k in loaded}
    r = storm(repo, "commit", "-m", "the shared state", fresh=True, env=env)  # the manager's commit
    assert r.returncode == 0, r.stderr[-2000:]
    assert not {m for m in _loaded(r.stderr) if m.startswith(OPTIONAL)}


# storm mode's steps (the lease, the locked check, the snapshot, the disk) are storm's:
# the doors translate their events into storm's verbs and never reach past them
DOOR_FORBIDDEN = ("storm_git.core.readsets", "storm_git.core.reservations", "storm_git.core.locks", "storm_git.disk")


def test_the_doors_never_reach_past_storms_verbs(graph):
    reached = sorted(f"{name} -> {d}" for name, deps in graph.items() if name.startswith("storm_git.integrations.")
                     for d in deps if any(d == f or d.startswith(f + ".") for f in DOOR_FORBIDDEN))
    assert reached == []
