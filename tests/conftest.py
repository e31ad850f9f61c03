"""Hermetic environment for every test: no user or system git config, a fixed
identity for plain git commands, and no inherited STORM_AGENT."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_repo  # noqa: E402


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


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An initialised storm repository with DEFAULT_FILES."""
    return make_repo(tmp_path / "repo")


@pytest.fixture
def ws(repo: Path):
    from storm_git import open_workspace

    return open_workspace(str(repo))
