"""The conflict radar of worktree mode (storm_git.worktree.radar): an agent is warned when another
agent's branch changed a file it read or wrote — at its commit (plain git commit through
the pre-commit guard, and git storm commit), in status, and by git storm radar — with the
other agent's hunk; disjoint work stays silent, and nothing is merged or refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import git, make_repo, ok as _ok, rev, snapshot_refs, storm, storm_json


@pytest.fixture
def wrepo(wrepo: Path) -> Path:
    """A worktree-mode repository with agents e1, e2 and e3 spawned."""
    for a in ("e1", "e2", "e3"):
        assert storm(wrepo, "spawn", a).returncode == 0
    return wrepo


def _wt(repo: Path, agent: str) -> Path:
    return repo / ".git" / "storm" / "worktrees" / agent


def _e2_changes_fetch(repo: Path) -> None:
    _ok(storm(repo, "edit", "src/api.py", "--old", "def fetch(url):", "--new", "def fetch(url, timeout=None):",
              agent="e2"))
    _ok(storm(repo, "commit", "-m", "timeout", agent="e2"))


def test_radar_warns_about_a_file_read_with_the_other_agents_hunk(wrepo):
    _ok(storm(wrepo, "read", "src/api.py", agent="e1"))
    _ok(storm(wrepo, "read", "README.md", agent="e3"))
    _e2_changes_fetch(wrepo)
    before = snapshot_refs(wrepo)
    code, out = storm_json(wrepo, "radar", "e1")
    assert code == 0
    [hit] = out["hits"]
    assert (hit["agent"], hit["other"], hit["path"], hit["why"], hit["conflict"]) == \
        ("e1", "e2", "src/api.py", "read", False)
    assert "+def fetch(url, timeout=None):" in hit["diff"] and "-def fetch(url):" in hit["diff"]
    # disjoint work: silent
    code, out = storm_json(wrepo, "radar", "e3")
    assert code == 0 and out["hits"] == []
    r = _ok(storm(wrepo, "radar", "e3"))
    assert "nothing e3 read or wrote" in r.stdout
    r = _ok(storm(wrepo, "radar"))
    assert "e1: 1 file(s) changed elsewhere" in r.stdout and "timeout=None" in r.stdout and "e3" not in r.stdout
    assert snapshot_refs(wrepo) == before  # advisory: nothing moved


def test_radar_at_plain_git_commit_shows_conflict_hunks_and_never_refuses(wrepo):
    _e2_changes_fetch(wrepo)
    wt = _wt(wrepo, "e1")
    api = wt / "src/api.py"
    api.write_text(api.read_text().replace("def fetch(url):", "def fetch(url, retries=3):"))
    git(wt, "add", "-A")
    r = git(wt, "commit", "-m", "retries", check=False)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "git storm radar" in err and "src/api.py: e1 wrote it; e2 changed it on storm/e2" in err
    assert "a merge would conflict" in err
    assert "def fetch(url, retries=3):" in err and "def fetch(url, timeout=None):" in err  # ours and theirs
    assert rev(wt, "HEAD") == rev(wrepo, "storm/e1")  # committed
    # disjoint commit by e3: the guard says nothing
    (_wt(wrepo, "e3") / "README.md").write_text("# service\nmore\n")
    git(_wt(wrepo, "e3"), "add", "-A")
    r = git(_wt(wrepo, "e3"), "commit", "-m", "readme", check=False)
    assert r.returncode == 0 and "radar" not in r.stderr.decode()


def test_radar_at_git_storm_commit_and_in_status(wrepo):
    _ok(storm(wrepo, "read", "src/api.py", agent="e1"))
    _e2_changes_fetch(wrepo)
    _ok(storm(wrepo, "edit", "src/client.py", "--old", "return fetch(url)", "--new", "return fetch(url) or None",
              agent="e1"))
    r = _ok(storm(wrepo, "commit", "-m", "client", agent="e1"))
    assert "git storm radar: 1 file(s)" in r.stderr and "src/api.py: e1 read it" in r.stderr
    assert "+def fetch(url, timeout=None):" in r.stderr
    code, out = storm_json(wrepo, "commit", "-m", "nothing", agent="e3")
    assert code == 0 and out["radar"] == []
    r = _ok(storm(wrepo, "status"))
    assert "radar: 1" in r.stdout  # e1 read api.py that e2 changed; nobody touched what e1 changed
    assert "src/api.py (e1 read it; e2 changed it on storm/e2; merges cleanly as text)" in r.stdout
    code, out = storm_json(wrepo, "status")
    assert [(h["agent"], h["other"], h["path"]) for h in out["radar"]] == [("e1", "e2", "src/api.py")]
    assert "diff" not in out["radar"][0]  # status stays short


def test_radar_names_work_merged_into_the_target_since_the_agent_forked(wrepo):
    _ok(storm(wrepo, "read", "src/api.py", agent="e1"))
    _e2_changes_fetch(wrepo)
    _ok(storm(wrepo, "merge", "e2"))
    code, out = storm_json(wrepo, "radar", "e1")
    [hit] = out["hits"]
    assert (hit["other"], hit["kind"], hit["path"]) == ("main", "target", "src/api.py")
    _ok(storm(wrepo, "sync", "e1"))
    code, out = storm_json(wrepo, "radar", "e1")
    assert out["hits"] == []  # once the agent has it, nothing to warn about


def test_radar_is_worktree_mode_only(tmp_path):
    repo = make_repo(tmp_path / "s")
    r = storm(repo, "radar")
    assert r.returncode == 3 and "git storm mode worktree" in r.stderr


def test_disjoint_work_leaves_status_and_commit_silent(wrepo):
    _ok(storm(wrepo, "read", "src/util.py", "README.md", agent="e1"))
    _ok(storm(wrepo, "edit", "src/util.py", "--old", "def clamp(x, lo, hi):", "--new", "def clamp(x, lo=0, hi=1):",
              agent="e1"))
    _e2_changes_fetch(wrepo)
    r = _ok(storm(wrepo, "commit", "-m", "clamp defaults", agent="e1"))
    assert "radar" not in r.stderr
    code, out = storm_json(wrepo, "status")
    assert code == 0 and out["radar"] == []
    assert "radar: 0" in storm(wrepo, "status").stdout
