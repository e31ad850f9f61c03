"""The manager's merge in worktree mode: in-memory first, conflicts with hunks,
abort leaves the target untouched, ours/theirs resolution, order and the log."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers import git, rev, show, storm, storm_json
from storm_git import open_workspace
from storm_git.core import events
from storm_git.core.errors import RepoStateError, UsageError
from storm_git.core.store import Store
from storm_git.worktree.merge import merge, merge_tree
from storm_git.worktree.worktrees import spawn

BASE = "def fetch(url):\n    return http_get(url)\n"


def _do(r: Path, agent: str, path: str, content: bytes, msg: str | None = None) -> str:
    s = Store.discover(str(r))
    spawn(s, agent)
    ws = open_workspace(str(r))
    ws.write(path, content, agent=agent)
    return ws.commit(msg or f"{agent}: {path}", agent=agent).commit


def _target_state(r: Path) -> tuple:
    """Branch, index and working tree of the main checkout."""
    index = hashlib.sha256((r / ".git/index").read_bytes()).hexdigest()
    files = {p.relative_to(r).as_posix(): p.read_bytes() for p in r.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(r).parts}
    return rev(r, "main"), index, files, git(r, "status", "--porcelain").stdout


def test_clean_merges_in_order_of_completion(wrepo):
    _do(wrepo, "b", "b.txt", b"b\n")
    _do(wrepo, "a", "src/util.py", b"def clamp(x):\n    return x\n")
    before = rev(wrepo, "main")
    rep = merge(Store.discover(str(wrepo)))
    assert [r.agent for r in rep.results] == ["b", "a"]  # b finished first
    assert rep.ok and all(r.status == "merged" for r in rep.results)
    assert rep.results[0].files_changed == [{"status": "A", "path": "b.txt"}]
    assert rep.results[1].files_changed == [{"status": "M", "path": "src/util.py"}]
    # one merge commit per agent, target updated with its index and working tree
    assert rev(wrepo, "main") == rep.after == rep.results[1].commit
    assert git(wrepo, "rev-parse", "main^2").stdout.decode().strip() == rev(wrepo, "storm/a")
    assert git(wrepo, "rev-parse", "main^1^1").stdout.decode().strip() == before
    assert (wrepo / "b.txt").read_bytes() == b"b\n" and git(wrepo, "status", "--porcelain").stdout == b""
    assert rep.updated == f"worktree {wrepo}"
    logged = [(e["agent"], e["status"]) for e in events.read(Store.discover(str(wrepo))) if e["type"] == "merge"]
    assert logged == [("a", "merged"), ("b", "merged")]  # newest first
    # nothing new: nothing to merge; explicit order is respected
    assert merge(Store.discover(str(wrepo))).results == []
    assert [r.status for r in merge(Store.discover(str(wrepo)), ["a"]).results] == ["up_to_date"]


def test_conflict_under_abort_leaves_target_untouched_and_reports_hunks(wrepo):
    _do(wrepo, "e1", "src/api.py", b"def fetch(url, timeout):\n    return http_get(url)\n")
    _do(wrepo, "e2", "src/api.py", b"def fetch(url, retries):\n    return http_get(url)\n")
    _do(wrepo, "e3", "notes.txt", b"n\n")
    s = Store.discover(str(wrepo))
    rep = merge(s, ["e1"])
    assert rep.ok
    state = _target_state(wrepo)
    code, out = storm_json(wrepo, "merge", "e2", "e3")
    assert code == 1 and not out["ok"] and out["conflicted"] == ["e2"] and out["merged"] == ["e3"]
    [e2, e3] = out["results"]
    [c] = e2["conflicts"]
    assert c["path"] == "src/api.py" and c["kind"] == "contents" and set(c["stages"]) == {"1", "2", "3"}
    [h] = c["hunks"]
    assert h["ancestor"] == "def fetch(url):\n"
    assert h["ours"] == "def fetch(url, timeout):\n" and h["theirs"] == "def fetch(url, retries):\n"
    assert h["ours_line"] == 1 and h["overridden"] is None
    # e2's merge did not touch main; e3 (clean) did
    head, index, files, status = _target_state(wrepo)
    assert git(wrepo, "rev-parse", "main^1").stdout.decode().strip() == state[0]
    assert files["src/api.py"] == state[2]["src/api.py"] and status == b""
    # again, with nothing else to merge: branch, index and working tree byte for byte unchanged
    before = _target_state(wrepo)
    r = storm(wrepo, "merge", "e2")
    assert r.returncode == 1 and "conflicted  e2" in r.stdout and "def fetch(url, retries):" in r.stdout
    assert _target_state(wrepo) == before
    kinds = [(e["agent"], e["status"], e["conflicts"]) for e in events.read(s) if e["type"] == "merge"]
    assert kinds[0] == ("e2", "conflicted", ["src/api.py"])
    assert sum(1 for e in events.read(s) if e["type"] == "merge" and e["status"] == "conflicted") == 2


def test_a_conflicts_line_after_a_form_feed_is_gits(wrepo):
    """A ^L page break is inside a line for git: the hunk's line in the merged file is
    the one git's conflict markers are on, not one further per ^L."""
    base = "import os\n\x0c\n" + BASE
    for agent, arg in (("e0", None), ("e1", "timeout"), ("e2", "retries")):
        text = base if arg is None else base.replace("(url)", f"(url, {arg})")
        _do(wrepo, agent, "src/api.py", text.encode())
        if arg is None:
            assert merge(Store.discover(str(wrepo)), ["e0"]).ok
    assert merge(Store.discover(str(wrepo)), ["e1"]).ok
    code, out = storm_json(wrepo, "merge", "--dry-run", "e2")
    [h] = out["results"][0]["conflicts"][0]["hunks"]
    assert h["ours_line"] == 3 and h["ours"].startswith("def fetch(url, timeout):\n")


@pytest.mark.parametrize("strategy,winner,loser", [("theirs", "retries", "ours"), ("ours", "timeout", "theirs")])
def test_ours_theirs_resolve_like_git_and_name_overridden_hunks(wrepo, strategy, winner, loser):
    _do(wrepo, "e1", "src/api.py", b"def fetch(url, timeout):\n    return http_get(url)\n# e1\n")
    _do(wrepo, "e2", "src/api.py", b"def fetch(url, retries):\n    return http_get(url)\n")
    s = Store.discover(str(wrepo))
    merge(s, ["e1"])
    rep = merge(s, ["e2"], strategy=strategy)
    assert rep.ok and rep.results[0].status == "merged" and rep.results[0].resolved_by == strategy
    [c] = rep.results[0].conflicts
    assert c.resolution == strategy and [h.overridden for h in c.hunks] == [loser]
    merged = show(wrepo, "main", "src/api.py").decode()
    assert merged.startswith(f"def fetch(url, {winner}):\n") and "# e1\n" in merged  # clean hunks kept
    # the same as git merge -X STRATEGY would give
    git(wrepo, "checkout", "-q", "-b", "check", "main^1")
    git(wrepo, "merge", "-q", "--no-edit", "-X", strategy, "storm/e2")
    assert show(wrepo, "check", "src/api.py").decode() == merged


def test_modify_delete_takes_the_favoured_side_whole(wrepo):
    s = Store.discover(str(wrepo))
    spawn(s, "d")
    ws = open_workspace(str(wrepo))
    ws.rm("src/util.py", agent="d")
    ws.commit("d: rm util", agent="d")
    _do(wrepo, "m", "src/util.py", b"changed\n")
    merge(s, ["d"])
    rep = merge(s, ["m"], dry_run=True)
    assert rep.results[0].status == "conflicted" and rep.results[0].conflicts[0].kind == "modify/delete"
    rep = merge(s, ["m"], strategy="theirs")
    assert rep.ok and rep.results[0].conflicts[0].resolution == "whole-file theirs"
    assert show(wrepo, "main", "src/util.py") == b"changed\n"


def test_into_a_branch_nobody_has_checked_out_and_dry_run(wrepo):
    git(wrepo, "branch", "integration")
    _do(wrepo, "a", "a.txt", b"a\n")
    s = Store.discover(str(wrepo))
    main = rev(wrepo, "main")
    dry = merge(s, into="integration", dry_run=True)
    assert dry.results[0].status == "merged" and rev(wrepo, "integration") == main and dry.updated is None
    rep = merge(s, into="integration")
    assert rep.updated == "ref" and rev(wrepo, "integration") == rep.after and rev(wrepo, "main") == main
    with pytest.raises(UsageError, match="no branch"):
        merge(s, into="nope")
    with pytest.raises(UsageError, match="no branch storm/ghost"):
        merge(s, ["ghost"])
    assert storm(wrepo, "merge", "--strategy", "sideways").returncode == 2


def test_local_changes_in_the_target_checkout_block_the_update(wrepo):
    _do(wrepo, "a", "src/api.py", b"agent\n")
    (wrepo / "src/api.py").write_text("human edit\n")
    main = rev(wrepo, "main")
    with pytest.raises(RepoStateError, match="local changes|overwritten"):
        merge(Store.discover(str(wrepo)))
    assert rev(wrepo, "main") == main and (wrepo / "src/api.py").read_text() == "human edit\n"


def test_merge_tree_parse_reports_stages(wrepo):
    _do(wrepo, "x", "src/api.py", b"x\n")
    _do(wrepo, "y", "src/api.py", b"y\n")
    tm = merge_tree(Store.discover(str(wrepo)), rev(wrepo, "storm/x"), rev(wrepo, "storm/y"))
    assert not tm.clean and set(tm.stages["src/api.py"]) == {1, 2, 3}
    assert any(kind == "CONFLICT (contents)" for _, kind, _ in tm.messages)
    clean = merge_tree(Store.discover(str(wrepo)), rev(wrepo, "main"), rev(wrepo, "storm/x"))
    assert clean.clean and clean.stages == {}


def test_a_conflict_in_a_crlf_file_is_reported_with_its_hunk(wrepo):
    """git writes the conflict markers of a CRLF file with CRLF; they were not
    recognised (the line kept its CR), so the conflict came with no hunk."""
    base = "import os\r\n" + BASE.replace("\n", "\r\n")
    _do(wrepo, "e0", "src/api.py", base.encode())
    assert merge(Store.discover(str(wrepo)), ["e0"]).ok
    _do(wrepo, "e1", "src/api.py", base.replace("(url):", "(url, timeout):").encode())
    _do(wrepo, "e2", "src/api.py", base.replace("(url):", "(url, retries):").encode())
    assert merge(Store.discover(str(wrepo)), ["e1"]).ok
    code, out = storm_json(wrepo, "merge", "--dry-run", "e2")
    [h] = out["results"][0]["conflicts"][0]["hunks"]
    assert h["ours_line"] == 2 and h["ours"] == "def fetch(url, timeout):\r\n"
