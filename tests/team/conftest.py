"""Fixtures for ``git storm team``: the repository and the scripted team (tests/support/team_agent.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import make_repo
from team_helpers import REPO_FILES, agent_cmd


@pytest.fixture
def team_repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", REPO_FILES)


@pytest.fixture
def scenario(tmp_path: Path):
    """write(steps) -> (the --harness-cmd, the folder each engineer logs to)."""
    log = tmp_path / "log"
    log.mkdir()

    def write(steps: dict) -> tuple[str, Path]:
        path = tmp_path / "scenario.json"
        path.write_text(json.dumps(steps))
        return agent_cmd(path, log), log

    return write
