"""The end-to-end suite with the real harnesses (marker ``harness``).

Run it with ``python -m pytest -m harness tests/e2e``; any other run leaves it
out (it needs Claude Code and Codex from the npm registry, ~660 MB, installed
once into a cache by tests/e2e/install_harnesses.sh, which this conftest runs).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
# captured before the suite's hermetic HOME replaces it: the installs are cached across runs
CACHE = os.environ.get("STORM_HARNESS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "storm-harnesses")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "harness" in (config.getoption("markexpr") or ""):
        return
    keep = [i for i in items if i.get_closest_marker("harness") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("harness") is not None])
        items[:] = keep


@pytest.fixture(scope="session")
def harness_bin() -> Path:
    """The directory holding ``claude`` and ``codex`` (installed on first use)."""
    r = subprocess.run(["bash", str(HERE / "install_harnesses.sh"), CACHE], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"installing the harnesses failed:\n{r.stderr[-3000:]}"
    path = Path(r.stdout.strip().splitlines()[-1])
    assert (path / "claude").exists() and (path / "codex").exists(), path
    return path


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a storm repository with the default files, a HOME for the harness, the hook log)."""
    from helpers import make_repo

    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    home.mkdir()
    return repo, home, tmp_path / "hooks.jsonl"
