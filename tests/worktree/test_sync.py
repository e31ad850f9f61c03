"""``git storm sync AGENT`` (worktree mode): bring an agent's branch up to the target
in its worktree, so a conflict found at merge time is resolved by the agent."""
from __future__ import annotations

import json
from pathlib import Path

from helpers import git, make_repo, rev, snapshot_refs, storm, storm_json


def _spawn(repo: Path, agent: str) -> Path:
    code, res = storm_json(repo, "spawn", agent)
    assert code == 0, res
    return Path(res["path"])


def _edit_and_commit(repo: Path, agent: str, path: str, old: str, new: str) -> None:
    assert storm(repo, "read", path, agent=agent).returncode == 0
    r = storm(repo, "edit", path, "--old", old, "--new", new, agent=agent)
    assert r.returncode == 0, r.stderr
    r = storm(repo, "commit", "-m", f"{agent}: {new}", agent=agent)
    assert r.returncode == 0, r.stderr


def test_sync_leaves_a_conflict_for_the_agent_then_merge_succeeds(wrepo):
    wa, wb = _spawn(wrepo, "a"), _spawn(wrepo, "b")
    _edit_and_commit(wrepo, "a", "src/api.py", "return http_get(url)", "return http_get(url, timeout=5)")
    _edit_and_commit(wrepo, "b", "src/api.py", "return http_get(url)", "return http_get(url, retries=3)")
    assert storm(wrepo, "merge", "a").returncode == 0
    r = storm(wrepo, "merge", "b")
    assert r.returncode == 1 and "git storm sync b" in r.stdout and "rebase" not in r.stdout
    code, rep = storm_json(wrepo, "merge", "b")
    assert code == 1 and rep["next"] == ["git storm sync b --onto main"]
    main_before, b_before = rev(wrepo, "main"), rev(wrepo, "storm/b")
    # sync b: the conflict is left in b's worktree, listed with its hunk, exit 1
    r = storm(wrepo, "sync", "b")
    assert r.returncode == 1, r.stderr
    assert "src/api.py (contents): 1 hunk(s)" in r.stdout
    assert "retries=3" in r.stdout and "timeout=5" in r.stdout and "git storm commit --agent b" in r.stdout
    text = (wb / "src/api.py").read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text and "retries=3" in text and "timeout=5" in text
    assert rev(wrepo, "storm/b") == b_before and rev(wrepo, "main") == main_before
    assert (wa / "src/api.py").read_text().count("timeout=5") == 1  # a's worktree untouched
    # a second sync while the merge waits: refused, nothing changes
    refs = snapshot_refs(wrepo)
    r = storm(wrepo, "sync", "b")
    assert r.returncode == 3 and "merge is already in progress" in r.stderr
    assert snapshot_refs(wrepo) == refs and "<<<<<<<" in (wb / "src/api.py").read_text()
    # b resolves and commits; the commit concludes the merge (main is its second parent)
    (wb / "src/api.py").write_text("def fetch(url):\n    return http_get(url, timeout=5, retries=3)\n")
    r = storm(wrepo, "commit", "-m", "b: sync with main", agent="b")
    assert r.returncode == 0, r.stderr
    assert git(wrepo, "rev-list", "--parents", "-n", "1", "storm/b").stdout.decode().split()[2] == main_before
    # the manager's merge of b is now clean
    code, rep = storm_json(wrepo, "merge", "b")
    assert code == 0 and rep["merged"] == ["b"], rep
    assert git(wrepo, "show", "main:src/api.py").stdout == b"def fetch(url):\n    return http_get(url, timeout=5, retries=3)\n"
    _, log = storm_json(wrepo, "log")
    [ev] = [e for e in log if e["type"] == "sync"]
    assert ev["agent"] == "b" and ev["status"] == "conflicted" and ev["conflicts"] == ["src/api.py"]


def test_sync_clean_merges_and_up_to_date(wrepo):
    _spawn(wrepo, "a")
    wb = _spawn(wrepo, "b")
    _edit_and_commit(wrepo, "a", "src/api.py", "return http_get(url)", "return http_get(url, timeout=5)")
    _edit_and_commit(wrepo, "b", "src/util.py", "return max(lo, min(x, hi))", "return min(max(x, lo), hi)")
    assert storm(wrepo, "merge", "a").returncode == 0
    code, res = storm_json(wrepo, "sync", "b")
    assert code == 0 and res["status"] == "merged" and res["ok"], res
    assert res["after"] == rev(wrepo, "storm/b") != res["before"]
    assert "timeout=5" in (wb / "src/api.py").read_text() and "min(max" in (wb / "src/util.py").read_text()
    assert git(wb, "status", "--porcelain").stdout == b""
    assert rev(wrepo, "storm/b^2") == rev(wrepo, "main")
    msg = git(wrepo, "log", "-1", "--format=%B", "storm/b").stdout.decode()
    assert "Storm-Op: sync" in msg and "Storm-Agent: b" in msg
    r = storm(wrepo, "sync", "b")
    assert r.returncode == 0 and "nothing to sync" in r.stdout
    # an agent with no commits of its own is fast-forwarded
    wc = _spawn(wrepo, "c")
    assert storm(wrepo, "merge", "b").returncode == 0
    code, res = storm_json(wrepo, "sync", "c")
    assert code == 0 and res["status"] == "fast_forward" and rev(wrepo, "storm/c") == rev(wrepo, "main")
    assert "min(max" in (wc / "src/util.py").read_text()


def test_sync_refuses_a_dirty_worktree_and_bad_input(wrepo):
    _spawn(wrepo, "a")
    wb = _spawn(wrepo, "b")
    _edit_and_commit(wrepo, "a", "src/api.py", "return http_get(url)", "return http_get(url, timeout=5)")
    assert storm(wrepo, "merge", "a").returncode == 0
    (wb / "src/util.py").write_text("uncommitted\n")
    refs = snapshot_refs(wrepo)
    r = storm(wrepo, "sync", "b")
    assert r.returncode == 3 and "uncommitted change(s): src/util.py" in r.stderr
    assert "git storm commit --agent b" in r.stderr and "stash" in r.stderr
    assert snapshot_refs(wrepo) == refs and (wb / "src/util.py").read_text() == "uncommitted\n"
    assert storm(wrepo, "sync", "nobody").returncode == 3
    r = storm(wrepo, "sync", "b", "--onto", "no-such-branch")
    assert r.returncode == 2 and "no-such-branch" in r.stderr
    r = storm(wrepo, "sync", "b", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["kind"] == "worktree_busy"


def test_sync_needs_worktree_mode(tmp_path):
    repo = make_repo(tmp_path / "r")
    r = storm(repo, "sync", "a")
    assert r.returncode == 3 and "git storm mode worktree" in r.stderr


def test_concluding_a_sync_counts_only_the_agents_own_changes(wrepo):
    """The target's files that a sync brings in are not the agent's: neither git storm
    commit nor the pre-commit hook counts them against its assignment or storm.restricted;
    a file the agent itself changes outside its assignment is still refused."""
    _spawn(wrepo, "a")
    wb = _spawn(wrepo, "b")
    assert storm(wrepo, "assign", "a", "src/api.py", "src/util.py").returncode == 0
    assert storm(wrepo, "assign", "b", "src/api.py", "--allow-overlap").returncode == 0
    _edit_and_commit(wrepo, "a", "src/util.py", "return max(lo, min(x, hi))", "return min(max(x, lo), hi)")
    _edit_and_commit(wrepo, "a", "src/api.py", "return http_get(url)", "return http_get(url, timeout=5)")
    _edit_and_commit(wrepo, "b", "src/api.py", "return http_get(url)", "return http_get(url, retries=3)")
    assert storm(wrepo, "merge", "a").returncode == 0
    git(wrepo, "config", "--add", "storm.restricted", "src/util.py")  # the manager restricts it afterwards
    assert storm(wrepo, "sync", "b").returncode == 1
    assert "min(max" in (wb / "src/util.py").read_text()  # brought in from main
    (wb / "src/api.py").write_text("def fetch(url):\n    return http_get(url, timeout=5, retries=3)\n")
    (wb / "src/client.py").write_text("# b strays outside its assignment\n")
    r = storm(wrepo, "commit", "-m", "b: sync", agent="b")
    assert r.returncode != 0 and "src/client.py" in r.stderr and "src/util.py" not in r.stderr, r.stderr
    git(wb, "checkout", "--", "src/client.py")
    # a plain git commit in b's worktree: the hook applies the same rule
    git(wb, "add", "src/api.py")
    c = git(wb, "commit", "--no-edit", check=False)
    assert c.returncode == 0, c.stderr.decode()
    code, rep = storm_json(wrepo, "merge", "b")
    assert code == 0 and rep["merged"] == ["b"], rep
