"""Hermetic environment for every test: no user or system git config, a fixed
identity for plain git commands, no inherited STORM_AGENT and no hook daemon."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import make_repo


def pytest_configure(config: pytest.Config) -> None:
    """Write bytecode here and compile storm's once, before any test starts a `git storm`.

    pytest keeps the test modules it rewrote (for its assertion messages) only where
    bytecode is written: with PYTHONDONTWRITEBYTECODE set, each worker rewrote all of
    them in every run (~15 s of CPU).

    Most tests run storm as real processes, which keep that setting: installed
    editable, nothing would write storm's .pyc files, and every one of those
    processes compiled the whole package again (0.32 s a call instead of 0.18 s,
    about a fifth of the suite's time). py_compile writes regardless of the setting;
    files already current are left.
    """
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):  # xdist workers: the controller compiled storm
        return
    import compileall

    import storm_git
    import storm_git.cli
    import storm_git.hooks

    for package in (storm_git, storm_git.cli, storm_git.hooks):
        directory = Path(package.__file__).parent
        try:
            compileall.compile_dir(str(directory), quiet=2)
        except OSError:  # a read-only install: its bytecode came with it
            pass


@pytest.fixture(autouse=True, scope="session")
def _hermetic_git(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("home")
    os.environ.update({
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
        "GIT_AUTHOR_NAME": "Test Human", "GIT_AUTHOR_EMAIL": "human@example.invalid",
        "GIT_COMMITTER_NAME": "Test Human", "GIT_COMMITTER_EMAIL": "human@example.invalid",
    })
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n")
    os.environ.pop("STORM_AGENT", None)
    # no hook daemon in every test's repository (each would stay up until idle):
    # tests/integrations/test_hookd.py and test_hook_client.py turn it on where they test it
    os.environ["STORM_NO_DAEMON"] = "1"


@pytest.fixture
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """An initialised storm repository with the test module's ``REPO_FILES``
    (DEFAULT_FILES when it has none)."""
    return make_repo(tmp_path / "repo", getattr(request.module, "REPO_FILES", None))


@pytest.fixture
def wrepo(repo: Path) -> Path:
    """``repo`` switched to worktree mode."""
    from storm_git.admin.modes import switch
    from storm_git.core.store import Store

    switch(Store.discover(str(repo)), "worktree")
    return repo


@pytest.fixture
def ws(repo: Path):
    from storm_git import open_workspace

    return open_workspace(str(repo))
