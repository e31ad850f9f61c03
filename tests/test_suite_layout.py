"""The suite mirrors the package (tests/README.md): a folder per package, shared
helpers only in tests/support, no test module importing another."""
from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

TESTS = ROOT / "tests"
# folders that are not a package's: the helpers, the suites of hostile input through every door, the real harnesses
OTHER_FOLDERS = {"support", "doors", "e2e"}
# files at the top level: each spans packages or checks the project as a whole
TOP_LEVEL = {"conftest.py", "__init__.py", "test_layering.py", "test_docs_snippets.py", "test_modes_compare.py",
             "test_fresh_process.py", "test_suite_layout.py", "test_docs_run.py"}


def _packages() -> set[str]:
    lib = {p.name for p in (ROOT / "storm_git").iterdir() if (p / "__init__.py").is_file()}
    return lib | {"cli"}  # cli/ is installed as storm_git.cli


def misplaced(tests: Path, packages: set[str]) -> list[str]:
    """Folders under ``tests`` that name no package, and test files at its top level that are not listed."""
    out = []
    for p in sorted(tests.iterdir()):
        if p.is_dir() and p.name != "__pycache__" and p.name not in packages | OTHER_FOLDERS:
            out.append(f"{p.name}/ names no package")
        elif p.is_file() and p.suffix == ".py" and p.name not in TOP_LEVEL:
            out.append(f"{p.name} belongs in the folder of the package it tests")
    return out


def imports_of_test_modules(path: Path) -> list[str]:
    """The test modules ``path`` imports (``import test_x``, ``from test_x import ...``, ``from .test_x ...``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        out += [n for n in names if n.split(".")[-1].startswith("test_")]
    return out


def test_every_folder_mirrors_a_package_and_the_top_level_holds_only_cross_cutting_files():
    assert misplaced(TESTS, _packages()) == []


def test_the_check_finds_a_misplaced_file_and_folder(tmp_path):
    (tmp_path / "storm").mkdir()
    (tmp_path / "stuff").mkdir()
    (tmp_path / "test_new_feature.py").write_text("")
    assert misplaced(tmp_path, {"storm"}) == ["stuff/ names no package",
                                              "test_new_feature.py belongs in the folder of the package it tests"]


def test_no_test_module_imports_another():
    found = {str(p.relative_to(TESTS)): got for p in TESTS.rglob("*.py") if (got := imports_of_test_modules(p))}
    assert found == {}


def test_the_check_finds_imports_of_test_modules(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("import test_a\nfrom test_b import f\nfrom .test_c import g\nfrom helpers import test_d\n")
    assert imports_of_test_modules(p) == ["test_a", "test_b", "test_c"]


def test_support_modules_are_not_collected_as_tests():
    assert not list((TESTS / "support").glob("test_*.py"))
    assert not (TESTS / "support" / "__init__.py").exists()  # imported by name (pytest's pythonpath), once
