"""Fixtures of the remote tests: real servers, started and stopped per test."""
from __future__ import annotations

from pathlib import Path

import pytest

from servers import Daemon, bare, install_guard, seed, served


@pytest.fixture
def daemon(tmp_path: Path):
    base = tmp_path / "served"
    base.mkdir()
    d = Daemon(base)
    yield d
    d.stop()


@pytest.fixture(params=["daemon", "file", "path"])
def remote(request, tmp_path: Path):
    """(server bare repository, URL clones use) for each kind of remote."""
    return served(request, tmp_path, request.param)


@pytest.fixture
def guarded(tmp_path: Path):
    """(a bare server with storm's guard installed, the first clone that seeded it)."""
    srv = bare(tmp_path / "proj.git")
    install_guard(srv)
    return srv, seed(tmp_path, str(srv))
