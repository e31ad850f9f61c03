"""Fixtures of the remote tests: real servers, started and stopped per test."""
from __future__ import annotations

from pathlib import Path

import pytest

from servers import Daemon, bare, install_guard, seed


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
    if request.param == "daemon":
        base = tmp_path / "served"
        base.mkdir()
        d = Daemon(base)
        request.addfinalizer(d.stop)
        srv = bare(base / "proj.git")
        return srv, d.url("proj.git")
    srv = bare(tmp_path / "proj.git")
    return srv, (f"file://{srv}" if request.param == "file" else str(srv))


@pytest.fixture
def guarded(tmp_path: Path):
    """(a bare server with storm's guard installed, the first clone that seeded it)."""
    srv = bare(tmp_path / "proj.git")
    install_guard(srv)
    return srv, seed(tmp_path, str(srv))
