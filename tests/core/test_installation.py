"""Install hints repeat where this copy of git storm came from (pip's direct_url.json),
so the command they print installs something that exists."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

SHOW = "from storm_git.core.installation import pip_install; print(pip_install('mcp', python='python3'))"


def _hint(tmp_path: Path, direct_url: dict | None, *, with_dist: bool = True) -> str:
    """The hint as a process sees it whose only git-storm is the one laid out here
    (-S: no site-packages): the module copied into a site directory with the metadata
    pip would write, or (``with_dist=False``) imported from the checkout."""
    site = tmp_path / "site"
    if with_dist:
        info = site / "git_storm-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: git-storm\nVersion: 0.1.0\n")
        if direct_url is not None:
            (info / "direct_url.json").write_text(json.dumps(direct_url))
        for rel in ("storm_git/__init__.py", "storm_git/core/__init__.py", "storm_git/core/installation.py"):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, site / rel)
    path = str(site) if with_dist else str(ROOT)
    r = subprocess.run([sys.executable, "-S", "-c", SHOW], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("direct_url,expected", [
    ({"url": "file:///src/git%20storm", "dir_info": {"editable": True}},
     "python3 -m pip install -e '/src/git storm[mcp]'"),
    ({"url": "file:///src/storm", "dir_info": {}}, "python3 -m pip install '/src/storm[mcp]'"),
    ({"url": "https://example.invalid/storm.git", "vcs_info": {"vcs": "git", "commit_id": "ab" * 20}},
     "python3 -m pip install 'git-storm[mcp] @ git+https://example.invalid/storm.git'"),
    ({"url": "file:///dl/git_storm-0.1.0-py3-none-any.whl", "archive_info": {}},
     "python3 -m pip install 'git-storm[mcp] @ file:///dl/git_storm-0.1.0-py3-none-any.whl'"),
    (None, "python3 -m pip install 'git-storm[mcp]'"),  # from an index
], ids=["editable-clone", "clone", "vcs", "archive", "index"])
def test_hint_repeats_the_installation_source(tmp_path, direct_url, expected):
    assert _hint(tmp_path, direct_url) == expected


def test_hint_from_a_checkout_without_an_installation(tmp_path):
    assert _hint(tmp_path, None, with_dist=False) == f"python3 -m pip install -e '{ROOT}[mcp]'"


@pytest.mark.parametrize("record,expected", [
    ({"no": "url"}, "python3 -m pip install 'git-storm[mcp]'"),
    (["url"], "python3 -m pip install 'git-storm[mcp]'"),
    ({"url": "file:///x", "dir_info": "editable"}, "python3 -m pip install 'git-storm[mcp] @ file:///x'"),
])
def test_hint_survives_a_corrupt_record(tmp_path, record, expected):
    assert _hint(tmp_path, record) == expected
