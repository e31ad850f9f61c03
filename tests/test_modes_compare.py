"""The same scripted scenarios in storm mode and in worktree mode, through the CLI.

1. Two agents add different parameters to the same function signature (a real
   pattern from multi-agent benchmarks). Storm mode rejects the second writer
   at write time with the first agent's change in the diff; its retry keeps
   both parameters. Worktree mode accepts both commits and the conflict shows
   up at merge, with the hunk; under ``abort`` the target is untouched.
2. Agent A renames a function, agent B adds a caller of the old name. Worktree
   mode merges cleanly and the result is broken; storm mode rejects B's write
   as a stale dependency, and B's re-planned write works.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import git, make_repo, ok as _ok, rev, show, storm, storm_json

API = "def fetch(url):\n    return http_get(url)\n\n\ndef http_get(url):\n    return url\n"
CLIENT = "from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n"
FILES = {"src/api.py": API, "src/client.py": CLIENT, "README.md": "# service\n"}

BATCH_OLD = "from api import fetch\n\n\ndef load_all(urls):\n    return [fetch(u) for u in urls]\n"
BATCH_NEW = BATCH_OLD.replace("fetch", "fetch_url")


def _repo(tmp_path: Path, mode: str) -> Path:
    r = make_repo(tmp_path / mode, FILES)
    if mode == "worktree":
        assert storm(r, "mode", "worktree").returncode == 0
        for a in ("e1", "e2"):
            assert storm(r, "spawn", a).returncode == 0
    return r


def _state(r: Path) -> tuple:
    index = hashlib.sha256((r / ".git/index").read_bytes()).hexdigest()
    files = {p: (r / p).read_bytes() for p in FILES}
    return rev(r, "main"), index, files, git(r, "status", "--porcelain").stdout


def _imports_ok(root: Path, module: str) -> subprocess.CompletedProcess:
    """Run the code: does ``module`` import (i.e. is the result semantically whole)?"""
    return subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root / "src", capture_output=True)


def _signature(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("def fetch"))


# -- scenario 1: two parameters on one signature ----------------------------------------------------
def test_signature_storm_mode_rejects_second_writer_then_both_parameters(tmp_path):
    r = _repo(tmp_path, "storm")
    _ok(storm(r, "read", "src/api.py", agent="e1"))
    _ok(storm(r, "read", "src/api.py", agent="e2"))
    _ok(storm(r, "edit", "src/api.py", "--old", "def fetch(url):", "--new", "def fetch(url, timeout=None):",
              agent="e1"))
    code, out = storm_json(r, "edit", "src/api.py", "--old", "def fetch(url):", "--new",
                           "def fetch(url, retries=0):", agent="e2")
    assert code == 1 and not out["accepted"]
    rej = out["rejection"]
    assert rej["reason"] == "direct_conflict" and rej["changed_by"] == ["e1"]
    assert "-def fetch(url):" in rej["diff"] and "+def fetch(url, timeout=None):" in rej["diff"]
    # e2 re-plans on the content it was given, and retries
    assert "def fetch(url, timeout=None):" in rej["current_content"]
    _ok(storm(r, "edit", "src/api.py", "--old", "def fetch(url, timeout=None):",
              "--new", "def fetch(url, timeout=None, retries=0):", agent="e2"))
    final = show(r, "refs/storm/workspace", "src/api.py").decode()
    assert _signature(final) == "def fetch(url, timeout=None, retries=0):"
    assert _signature((r / "src/api.py").read_text()) == "def fetch(url, timeout=None, retries=0):"
    log = storm_json(r, "log")[1]
    assert [e["reason"] for e in log if e["type"] == "rejection"] == ["direct_conflict"]


def test_signature_worktree_mode_both_commit_and_conflict_appears_at_merge(tmp_path):
    r = _repo(tmp_path, "worktree")
    for agent, param in (("e1", "timeout=None"), ("e2", "retries=0")):
        _ok(storm(r, "read", "src/api.py", agent=agent))
        _ok(storm(r, "edit", "src/api.py", "--old", "def fetch(url):", "--new", f"def fetch(url, {param}):",
                  agent=agent))
        _ok(storm(r, "commit", "--agent", agent, "-m", f"{agent}: add {param}"))
    assert _signature(show(r, "storm/e1", "src/api.py").decode()) == "def fetch(url, timeout=None):"
    assert _signature(show(r, "storm/e2", "src/api.py").decode()) == "def fetch(url, retries=0):"
    before = _state(r)
    code, out = storm_json(r, "merge", "e1", "e2")  # e1 first: e2's merge meets e1's signature
    assert code == 1 and out["merged"] == ["e1"] and out["conflicted"] == ["e2"]
    [c] = out["results"][1]["conflicts"]
    [h] = c["hunks"]
    assert c["path"] == "src/api.py"
    assert (h["ancestor"], h["ours"], h["theirs"]) == (
        "def fetch(url):\n", "def fetch(url, timeout=None):\n", "def fetch(url, retries=0):\n")
    # e2's conflicting merge left main as e1's merge made it; e1's merge moved it
    assert rev(r, "main") == out["results"][0]["commit"] != before[0]
    after_e1 = _state(r)
    code, _ = storm_json(r, "merge", "e2")
    assert code == 1 and _state(r) == after_e1  # abort: branch, index, working tree untouched
    assert _signature((r / "src/api.py").read_text()) == "def fetch(url, timeout=None):"
    log = storm_json(r, "log", "-n", "100")[1]
    assert [e["status"] for e in log if e["type"] == "merge" and e["agent"] == "e2"] == ["conflicted", "conflicted"]


# -- scenario 2: textually clean, semantically broken ------------------------------------------------
def test_rename_worktree_mode_merges_cleanly_into_broken_code(tmp_path):
    r = _repo(tmp_path, "worktree")
    _ok(storm(r, "read", "src/api.py", "src/client.py", agent="e1"))
    _ok(storm(r, "read", "src/api.py", agent="e2"))
    _ok(storm(r, "edit", "src/api.py", "--old", "def fetch(url):", "--new", "def fetch_url(url):", agent="e1"))
    _ok(storm(r, "write", "src/client.py", agent="e1", input=CLIENT.replace("fetch", "fetch_url")))
    _ok(storm(r, "write", "src/batch.py", agent="e2", input=BATCH_OLD))
    _ok(storm(r, "commit", "--agent", "e1", "-m", "e1: rename fetch -> fetch_url"))
    _ok(storm(r, "commit", "--agent", "e2", "-m", "e2: batch loading"))
    code, out = storm_json(r, "merge", "e1", "e2")
    assert code == 0 and out["merged"] == ["e1", "e2"] and out["conflicted"] == []
    # each branch works on its own...
    assert _imports_ok(Path(storm_json(r, "spawn", "e2")[1]["path"]), "batch").returncode == 0
    # ...and the clean merge is broken: batch.py imports a name that no longer exists
    broken = _imports_ok(r, "batch")
    assert broken.returncode != 0 and b"cannot import name 'fetch'" in broken.stderr


def test_rename_storm_mode_rejects_stale_dependency_then_works(tmp_path):
    r = _repo(tmp_path, "storm")
    _ok(storm(r, "read", "src/api.py", "src/client.py", agent="e1"))
    _ok(storm(r, "read", "src/api.py", agent="e2"))
    _ok(storm(r, "edit", "src/api.py", "--old", "def fetch(url):", "--new", "def fetch_url(url):", agent="e1"))
    _ok(storm(r, "write", "src/client.py", agent="e1", input=CLIENT.replace("fetch", "fetch_url")))
    code, out = storm_json(r, "write", "src/batch.py", agent="e2", input=BATCH_OLD)
    assert code == 1
    rej = out["rejection"]
    assert rej["reason"] == "stale_dependency"
    [stale] = rej["stale"]
    assert stale["path"] == "src/api.py" and stale["changed_by"] == ["e1"]
    assert "+def fetch_url(url):" in stale["diff"]
    assert not (r / "src/batch.py").exists()
    # e2 reads what changed and re-plans with the new name
    _ok(storm(r, "read", "src/api.py", agent="e2"))
    _ok(storm(r, "write", "src/batch.py", agent="e2", input=BATCH_NEW))
    assert _imports_ok(r, "batch").returncode == 0


@pytest.mark.parametrize("mode", ["storm", "worktree"])
def test_both_modes_log_reads_and_writes_comparably(tmp_path, mode):
    r = _repo(tmp_path, mode)
    _ok(storm(r, "read", "README.md", agent="e1"))
    _ok(storm(r, "write", "README.md", agent="e1", input="# service v2\n"))
    log = storm_json(r, "log")[1]
    writes = [e for e in log if e["type"] == "write"]
    assert [(e["agent"], e["op"], e["paths"]) for e in writes] == [("e1", "write", ["README.md"])]
    st = storm_json(r, "status")[1]
    assert st["mode"] == mode and [a["agent"] for a in st["agents"]] == ["e1"] and st["agents"][0]["reads"] == 1
