"""The end-to-end suite with the real harnesses (marker ``harness``).

Run it with ``python -m pytest -m harness tests/e2e``; any other run leaves it
out (it needs Claude Code and Codex from the npm registry, ~660 MB, installed
once into a cache by tests/e2e/install_harnesses.sh, which this conftest runs).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def hook_daemons(under: Path) -> list[int]:
    """The pids of storm hook daemons serving a git dir below ``under`` (the daemon's
    argv names the git dir it serves)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"storm_git.integrations.hookd" in a for a in argv) and \
                any(a.startswith(os.fsencode(under)) for a in argv[1:]):
            found.append(int(pid))
    return found


def stop_hook_daemons(under: Path, timeout: float = 10.0) -> list[int]:
    """SIGTERM the hook daemons of the repositories below ``under`` and wait for them to
    exit: a test's daemon must not outlive its temporary repository."""
    pids = hook_daemons(under)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + timeout
    while hook_daemons(under) and time.monotonic() < end:
        time.sleep(0.05)
    return pids


@pytest.fixture
def world(tmp_path: Path):
    """(a storm repository with the default files, a HOME for the harness, the hook log);
    the hook daemons its sessions started are stopped with it."""
    from helpers import make_repo

    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    home.mkdir()
    yield repo, home, tmp_path / "hooks.jsonl"
    stop_hook_daemons(tmp_path)
    assert not hook_daemons(tmp_path), "a hook daemon outlived its test's repository"


@pytest.fixture(scope="session", autouse=True)
def no_daemon_left_behind(tmp_path_factory: pytest.TempPathFactory):
    """After the suite, no hook daemon of any of its repositories is running."""
    yield
    base = tmp_path_factory.getbasetemp()
    left = stop_hook_daemons(base)
    assert not left, f"hook daemons {left} outlived the end-to-end suite's repositories"
