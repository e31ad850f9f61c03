"""Worktree mode: spawn, the verbs in an agent's worktree, commit rules, assignments,
mode switching, status and cleanup, on real repositories (library and CLI)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers import git, make_repo, rev, snapshot_refs, storm, storm_json
from storm_git import open_workspace
from storm_git.admin.modes import switch
from storm_git.core import assignments as scope, events
from storm_git.core.errors import NotFound, RepoStateError, UsageError
from storm_git.core.store import Store
from storm_git.worktree.commit_rules import worktree_commit_problems
from storm_git.worktree.isolated import CommitRefused, WorktreeWorkspace
from storm_git.worktree.worktrees import cleanup, spawn, worktree_path


def _store(r: Path) -> Store:
    return Store.discover(str(r))


def _events(r: Path, kind: str) -> list[dict]:
    return [e for e in events.read(_store(r)) if e.get("type") == kind]


# -- patterns -------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,path,expected", [
    ("__init__.py", "__init__.py", True),
    ("__init__.py", "src/pkg/__init__.py", True),
    ("src/api.py", "src/api.py", True),
    ("src/api.py", "lib/src/api.py", False),
    ("src", "src/deep/x.py", True),
    ("src/*.py", "src/a.py", True),
    ("src/*.py", "src/sub/a.py", False),
    ("src/**", "src/sub/a.py", True),
    ("src/**/test_*.py", "src/a/b/test_x.py", True),
    ("src/**/test_*.py", "src/test_x.py", True),
    ("*.md", "docs/x.md", True),
    ("docs/", "docs/x.md", True),
    ("docs/", "mydocs/x.md", False),
])
def test_glob_semantics_follow_gitignore(pattern, path, expected):
    assert scope.matches(pattern, path) is expected


# -- spawn ------------------------------------------------------------------------------
def test_spawn_creates_worktree_in_git_dir_and_copies_untracked(wrepo):
    (wrepo / ".env").write_text("TOKEN=1\n")
    (wrepo / "config").mkdir()
    (wrepo / "config" / "dev.local").write_text("x\n")
    git(wrepo, "config", "--add", "storm.copyUntracked", ".env")
    git(wrepo, "config", "--add", "storm.copyUntracked", "config/*.local README.md")
    before_status = git(wrepo, "status", "--porcelain").stdout
    res = spawn(_store(wrepo), "e1")
    assert res.created and res.branch == "storm/e1"
    assert res.path == os.path.join(str(wrepo), ".git", "storm", "worktrees", "e1")
    assert rev(wrepo, "storm/e1") == rev(wrepo, "main") == res.head
    assert sorted(res.copied) == [".env", "config/dev.local"]  # README.md is tracked: not copied
    assert (Path(res.path) / ".env").read_text() == "TOKEN=1\n"
    assert (Path(res.path) / "src/api.py").exists()
    # nothing new appears in the main working tree
    assert git(wrepo, "status", "--porcelain").stdout == before_status
    # idempotent; a copied file changed by the agent is not overwritten
    (Path(res.path) / ".env").write_text("TOKEN=2\n")
    again = spawn(_store(wrepo), "e1")
    assert not again.created and again.path == res.path and again.copied == []
    assert (Path(res.path) / ".env").read_text() == "TOKEN=2\n"
    assert [e["agent"] for e in _events(wrepo, "spawn")] == ["e1"]


def test_spawn_base_and_configured_location(wrepo, tmp_path):
    git(wrepo, "config", "storm.worktreeDir", ".agents")
    git(wrepo, "config", "storm.branchPrefix", "agent/")
    res = spawn(_store(wrepo), "e2", base="HEAD")
    assert res.path == str(wrepo / ".agents" / "e2") and res.branch == "agent/e2"
    # inside the main working tree, but excluded: not an untracked file there
    assert ".agents" not in git(wrepo, "status", "--porcelain", "--untracked-files=all").stdout.decode()
    with pytest.raises(UsageError, match="does not name a commit"):
        spawn(_store(wrepo), "e3", base="no-such-ref")


def test_spawn_leftover_directory_stale_record_and_branch_elsewhere(wrepo, tmp_path):
    s = _store(wrepo)
    # a leftover directory: the worktree record vanished, the directory stayed
    res = spawn(s, "c")
    shutil.rmtree(wrepo / ".git" / "worktrees" / "c")
    refs = snapshot_refs(wrepo)
    with pytest.raises(RepoStateError, match="leftover directory"):
        spawn(s, "c")
    assert snapshot_refs(wrepo) == refs
    out = cleanup(s)
    assert out.leftovers == [res.path]
    with pytest.raises(RepoStateError, match="already exists.*--reuse"):
        spawn(s, "c")
    assert spawn(s, "c", reuse=True).reused
    # a stale record: the directory was deleted by hand
    d = spawn(s, "d")
    shutil.rmtree(d.path)
    with pytest.raises(RepoStateError, match="stale worktree record"):
        spawn(s, "d")
    assert cleanup(s).pruned == [d.path]
    assert spawn(s, "d", reuse=True).created
    # the agent's branch checked out somewhere else
    git(wrepo, "branch", "storm/e")
    elsewhere = tmp_path / "elsewhere"
    git(wrepo, "worktree", "add", "-q", str(elsewhere), "storm/e")
    with pytest.raises(RepoStateError, match="already checked out at"):
        spawn(s, "e")
    assert spawn(s, "e", reuse=True).path == str(elsewhere)


def test_damaged_worktree_record_does_not_break_spawn_status_or_cleanup(wrepo):
    """A worktree record whose gitdir file holds a NUL byte (git lists it as prunable)
    made spawn an internal error (realpath: embedded null byte)."""
    spawn(_store(wrepo), "c")
    (wrepo / ".git" / "worktrees" / "c" / "gitdir").write_bytes(b"\x00\n")
    r = storm(wrepo, "spawn", "d")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert storm(wrepo, "status").returncode == 0
    r = storm(wrepo, "cleanup")
    assert r.returncode == 0, r.stderr
    assert "c" not in os.listdir(wrepo / ".git" / "worktrees")


def test_spawn_cli_refuses_in_storm_mode_and_reports_json(repo):
    r = storm(repo, "spawn", "e1")
    assert r.returncode == 3 and "storm mode" in r.stderr and "git storm mode worktree" in r.stderr
    assert storm(repo, "mode", "worktree").returncode == 0
    code, out = storm_json(repo, "spawn", "e1")
    assert code == 0 and out["created"] and out["branch"] == "storm/e1"
    assert storm(repo, "spawn", "bad..id").returncode == 2


# -- the verbs in an agent's worktree ---------------------------------------------------------
def test_verbs_act_in_the_agents_worktree_without_validation(wrepo):
    s = _store(wrepo)
    a, b = spawn(s, "a"), spawn(s, "b")
    ws = open_workspace(str(wrepo))
    assert isinstance(ws, WorktreeWorkspace) and ws.mode == "worktree"
    [r] = ws.read(["src/api.py"], agent="a")
    assert r.version == git(wrepo, "rev-parse", "HEAD:src/api.py").stdout.decode().strip()
    assert ws.read_set("a")["src/api.py"].blob == r.version  # recorded like storm mode
    # b never read the file, a's copy changed: no validation, both accepted
    ra = ws.write("src/api.py", b"A\n", agent="a", intent="a: rewrite")
    rb = ws.write("src/api.py", b"B\n", agent="b")
    assert ra.accepted and rb.accepted and ra.commit is None
    assert (Path(a.path) / "src/api.py").read_bytes() == b"A\n"
    assert (Path(b.path) / "src/api.py").read_bytes() == b"B\n"
    assert (wrepo / "src/api.py").read_bytes().startswith(b"def fetch")  # main tree untouched
    assert ws.edit("src/util.py", "lo, hi", "low, high", agent="a").accepted
    with pytest.raises(UsageError, match="not found"):
        ws.edit("src/util.py", "lo, hi", "x", agent="a")
    assert ws.rm("README.md", agent="a").accepted and not (Path(a.path) / "README.md").exists()
    with pytest.raises(NotFound):
        ws.rm("README.md", agent="a")
    with pytest.raises(UsageError, match="no reservations"):
        ws.release("src/api.py", agent="a")
    with pytest.raises(RepoStateError, match="spawn"):
        ws.write("x.py", b"x", agent="nobody")
    res = ws.exec([sys.executable, "-c", "open('gen.txt','w').write('g')"], agent="b")
    assert res.returncode == 0 and res.paths == ["gen.txt"] and res.write.accepted
    assert (Path(b.path) / "gen.txt").read_text() == "g"
    # every write is in the log, as in storm mode
    writes = [(e["agent"], e["op"]) for e in ws.log(100) if e["type"] == "write"]
    assert ("a", "write") in writes and ("a", "edit") in writes and ("a", "rm") in writes and ("b", "exec") in writes
    # commit: a's worktree onto storm/a
    before = rev(wrepo, "storm/a")
    c = ws.commit("a: rewrite api", agent="a")
    assert c.commit == rev(wrepo, "storm/a") and c.commit != before and c.branch == "storm/a"
    assert sorted(c.paths) == ["README.md", "src/api.py", "src/util.py"] and c.writes == 3
    assert git(wrepo, "log", "-1", "--format=%an", "storm/a").stdout.decode().strip() == "a"
    assert git(Path(a.path), "status", "--porcelain").stdout == b""  # index follows the commit
    assert rev(wrepo, "main") == before  # the target is the manager's business
    assert ws.commit("again", agent="a").commit is None
    with pytest.raises(UsageError, match="--agent"):
        ws.commit("who?")


def test_commit_rules_own_branch_assignment_restricted(wrepo):
    s = _store(wrepo)
    a = spawn(s, "a")
    spawn(s, "b")
    scope.assign(s, "a", ["src/api.py"])
    git(wrepo, "config", "--add", "storm.restricted", "README.md")
    ws = open_workspace(str(wrepo))
    ws.write("src/util.py", b"outside\n", agent="a")
    ws.write("README.md", b"restricted\n", agent="a")
    tip = rev(wrepo, "storm/a")
    index = (wrepo / ".git/worktrees/a/index").read_bytes()
    with pytest.raises(CommitRefused) as exc:
        ws.commit("a: too much", agent="a")
    assert "outside the assignment" in str(exc.value) and "src/util.py" in str(exc.value)
    assert "restricted" in str(exc.value) and exc.value.exit_code == 1
    assert rev(wrepo, "storm/a") == tip and (wrepo / ".git/worktrees/a/index").read_bytes() == index
    assert _events(wrepo, "commit_refused")[0]["agent"] == "a"
    # the pure rule, as the hook uses it
    assert worktree_commit_problems(s, "a", "storm/a", ["src/api.py"]) == []
    assert "own branch storm/a" in worktree_commit_problems(s, "a", "storm/b", ["src/api.py"])[0]
    assert "detached" in worktree_commit_problems(s, "a", None, [])[0]
    assert worktree_commit_problems(s, "b", "storm/b", ["anything.py"]) == []  # no assignment
    assert "restricted" in worktree_commit_problems(s, "b", "storm/b", ["README.md"])[0]
    # a real `git commit` in the worktree meets the same rule through the pre-commit hook
    assert (wrepo / ".git/hooks/pre-commit").exists(), "git storm init installs the pre-commit guard"
    git(Path(a.path), "add", "-A")
    r = git(Path(a.path), "commit", "-m", "plain git", check=False)
    assert r.returncode != 0 and b"outside the assignment of a" in r.stderr
    assert rev(wrepo, "storm/a") == tip
    git(Path(a.path), "checkout", "-q", "storm/a", "--", "src/util.py", "README.md")
    git(Path(a.path), "checkout", "-q", "-b", "sneaky")
    (Path(a.path) / "src/api.py").write_text("ok\n")
    git(Path(a.path), "add", "src/api.py")
    r = git(Path(a.path), "commit", "-m", "not my branch", check=False)
    assert r.returncode != 0 and b"only on its own branch storm/a" in r.stderr
    git(Path(a.path), "checkout", "-q", "storm/a")
    r = git(Path(a.path), "commit", "-m", "fine", check=False)
    assert r.returncode == 0, r.stderr


# -- assignments -------------------------------------------------------------------------------
def test_assignments_are_disjoint_and_durable(wrepo):
    s = _store(wrepo)
    tree = s.commit(s.ref_target("refs/heads/main")).tree_id
    scope.assign(s, "a", ["src/**"], task="api work", integrated_tree=tree)
    with pytest.raises(RepoStateError, match="overlap.*a: src/api.py"):
        scope.assign(s, "b", ["src/api.py"], integrated_tree=tree)
    with pytest.raises(RepoStateError, match="overlap"):
        scope.assign(s, "b", ["*.py"], integrated_tree=tree)  # covers src/util.py in the tree
    res = scope.assign(s, "b", ["*.py"], allow_overlap=True, integrated_tree=tree)
    assert res.overlaps["a"]
    assert scope.assign(s, "c", ["README.md"], integrated_tree=tree).overlaps == {}
    assert sorted(scope.load_all(s)) == ["a", "b", "c"]
    # kept in git: an auditable chain under refs/storm/assignments
    assert git(wrepo, "rev-list", "--count", "refs/storm/assignments").stdout.strip() == b"3"
    assert json.loads(git(wrepo, "show", "refs/storm/assignments:a.json").stdout)["task"] == "api work"
    # a new task resets the read set; the same task does not
    ws = open_workspace(str(wrepo))
    spawn(s, "c")
    ws.read(["README.md"], agent="c")
    assert not scope.assign(s, "c", ["README.md"]).reads_reset and ws.read_set("c")
    assert scope.assign(s, "c", ["README.md"], task="docs").reads_reset and ws.read_set("c") == {}
    scope.assign(s, "c", None)
    assert scope.get(s, "c") is None
    code, out = storm_json(wrepo, "assign")
    assert code == 0 and sorted(out["assignments"]) == ["a", "b"]
    r = storm(wrepo, "assign", "d", "--files", "src/client.py")
    assert r.returncode == 3 and "overlap" in r.stderr and "--allow-overlap" in r.stderr
    assert storm(wrepo, "assign", "d", "--files", "../x").returncode == 2


def test_storm_mode_write_outside_assignment_is_flagged_and_logged(repo, ws):
    s = _store(repo)
    scope.assign(s, "e1", ["src/api.py"])
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    inside = ws.write("src/api.py", b"in\n", agent="e1")
    assert inside.accepted and inside.flags == []
    out = ws.write("src/util.py", b"out\n", agent="e1")
    assert out.accepted and out.flags == ["outside_assignment"]
    [ev] = _events(repo, "boundary")
    assert ev["agent"] == "e1" and ev["paths"] == ["src/util.py"] and ev["commit"] == out.commit
    # an agent without an assignment is never flagged
    ws.read(["src/client.py"], agent="e2")
    assert ws.write("src/client.py", b"c\n", agent="e2").flags == []
    code, payload = storm_json(repo, "write", "README.md", agent="e1", input="r\n")
    assert code == 1 or payload["flags"] == ["outside_assignment"]  # unread target rejects first
    ws.read(["README.md"], agent="e1")
    code, payload = storm_json(repo, "write", "README.md", agent="e1", input="r\n")
    assert code == 0 and payload["flags"] == ["outside_assignment"]


# -- modes ---------------------------------------------------------------------------------------
def test_mode_switch_refuses_unintegrated_work_unless_forced(repo, ws):
    code, out = storm_json(repo, "mode")
    assert code == 0 and out["mode"] == "storm" and out["unintegrated"] == []
    ws.read(["src/api.py"], agent="e1")
    ws.write("src/api.py", b"shared\n", agent="e1")
    cfg = git(repo, "config", "storm.mode").stdout
    r = storm(repo, "mode", "worktree")
    assert r.returncode == 3 and "refs/storm/workspace" in r.stderr and "src/api.py" in r.stderr
    assert "--force" in r.stderr and git(repo, "config", "storm.mode").stdout == cfg
    code, out = storm_json(repo, "mode", "worktree", "--force")
    assert code == 0 and out["forced"] and out["mode"] == "worktree"
    [ev] = _events(repo, "mode")
    assert ev["from"] == "storm" and ev["to"] == "worktree" and ev["forced"]
    assert storm(repo, "mode", "sideways").returncode == 2
    # worktree -> storm: refused while an agent branch is not merged
    s = _store(repo)
    git(repo, "checkout", "-q", "--", "src/api.py")
    a = spawn(s, "a")
    wws = open_workspace(str(repo))
    wws.write("docs.txt", b"d\n", agent="a")
    with pytest.raises(RepoStateError, match="uncommitted change"):
        switch(s, "storm")
    wws.commit("a: docs", agent="a")
    with pytest.raises(RepoStateError, match="storm/a: 1 commit"):
        switch(s, "storm")
    assert storm(repo, "merge").returncode == 0
    res = switch(s, "storm")
    assert res.changed and not res.forced and res.synced
    # storm mode continues from the merged state
    assert git(repo, "rev-parse", "refs/storm/workspace^{tree}").stdout == git(repo, "rev-parse", "main^{tree}").stdout
    assert (Path(a.path) / "docs.txt").exists() and (repo / "docs.txt").exists()
    assert open_workspace(str(repo)).read(["docs.txt"], agent="e9")[0].content == b"d\n"


# -- status and cleanup -------------------------------------------------------------------------
def test_status_lists_worktrees_and_cleanup_removes_merged(wrepo):
    s = _store(wrepo)
    ws = open_workspace(str(wrepo))
    for a in ("a", "b", "c"):
        spawn(s, a)
    ws.write("a.txt", b"a\n", agent="a")
    ws.commit("a", agent="a")
    ws.write("b.txt", b"b\n", agent="b")
    ws.commit("b", agent="b")
    ws.write("c.txt", b"c\n", agent="c")  # uncommitted
    for a in ("a", "b", "c"):
        ws.read([f"{a}.txt"], agent=a)
    assert storm(wrepo, "merge", "a").returncode == 0
    rows = {w["agent"]: w for w in ws.status().extra["worktrees"]}
    assert (rows["a"]["ahead"], rows["a"]["merge"]) == (0, "merged")
    assert (rows["b"]["ahead"], rows["b"]["behind"], rows["b"]["merge"]) == (1, 2, None)  # a + the merge commit
    assert rows["c"]["dirty"] == 1 and rows["c"]["dirty_paths"] == ["c.txt"]
    r = storm(wrepo, "status")
    assert r.returncode == 0 and "storm/b" in r.stdout and "1 ahead / 2 behind main" in r.stdout
    res = cleanup(s, merged=True)
    assert [x["agent"] for x in res.removed] == ["a"]
    assert {k["agent"]: k["reason"] for k in res.kept} == {
        "b": "1 commit(s) not merged into main", "c": f"1 uncommitted change(s) in {worktree_path(s, 'c')}"}
    assert not os.path.exists(worktree_path(s, "a")) and git(wrepo, "rev-parse", "--verify", "-q", "storm/a",
                                                             check=False).returncode != 0
    assert ws.read_set("a") == {} and ws.read_set("b")  # a removed agent leaves no orphan read set
    code, out = storm_json(wrepo, "cleanup", "--all")
    assert code == 0 and sorted(x["agent"] for x in out["removed"]) == ["b", "c"]
    assert {x["agent"]: (x["merged"], x["dirty"]) for x in out["removed"]} == {"b": (False, []), "c": (True, ["c.txt"])}
    assert git(wrepo, "worktree", "list", "--porcelain").stdout.count(b"worktree ") == 1
    assert storm(wrepo, "doctor").returncode == 0, storm(wrepo, "doctor").stdout


def test_cli_help_has_examples():
    for cmd in ("mode", "spawn", "merge", "assign", "cleanup"):
        r = storm(".", cmd, "-h")
        assert r.returncode == 0 and "Example" in r.stdout, cmd


def test_commit_of_a_staged_rename_commits_it(wrepo):
    """A staged rename (git mv, or a sync that brought one) lists its source path,
    which is in neither the index nor the worktree: git add refused it and the
    commit failed with exit 3 (found by git storm simulate on click's history)."""
    w = Path(storm_json(wrepo, "spawn", "e1")[1]["path"])
    git(w, "mv", "src/util.py", "src/helpers.py")
    r = storm(wrepo, "commit", "--agent", "e1", "-m", "rename util")
    assert r.returncode == 0, r.stderr
    names = git(wrepo, "show", "--name-status", "--format=", "storm/e1").stdout.decode()
    assert names.split() == ["R100", "src/util.py", "src/helpers.py"]


def test_commit_of_a_staged_deletion_commits_it(wrepo):
    """A deletion already staged (git rm, or a sync whose merge staged one): its path is in
    neither the index nor the worktree; git add refused it (seen replaying click)."""
    w = Path(storm_json(wrepo, "spawn", "e1")[1]["path"])
    git(w, "rm", "-q", "src/util.py")
    r = storm(wrepo, "commit", "--agent", "e1", "-m", "drop util")
    assert r.returncode == 0, r.stderr
    names = git(wrepo, "show", "--name-status", "--format=", "storm/e1").stdout.decode()
    assert names.split() == ["D", "src/util.py"]


def test_log_in_worktree_mode_keeps_the_storm_mode_writes(tmp_path):
    """One repository, one log: after a switch to worktree mode `git storm log` still shows
    the writes accepted in storm mode (the shared ref's history), merged by time with
    worktree mode's own events."""
    r = make_repo(tmp_path / "repo")
    for agent, path in (("e1", "src/api.py"), ("e2", "src/util.py")):
        assert storm(r, "read", path, agent=agent).returncode == 0
        assert storm(r, "write", path, "-m", f"{agent} edits", input="x = 1\n", agent=agent).returncode == 0
    assert storm(r, "commit", "-m", "both edits").returncode == 0
    _, before = storm_json(r, "log", "-n", "100")
    writes = [e["commit"] for e in before if e["type"] == "write"]
    assert len(writes) == 2
    assert storm(r, "mode", "worktree").returncode == 0
    assert storm(r, "spawn", "e3").returncode == 0
    _, after = storm_json(r, "log", "-n", "100")
    assert [e["commit"] for e in after if e["type"] == "write" and e.get("commit")] == writes
    assert {e["type"] for e in after} >= {"write", "commit", "mode", "spawn"}
    assert len(after) == len(before) + 2  # + the switch and the spawn
    times = [e["time"] for e in after]
    assert times == sorted(times, reverse=True)
    # -n counts every entry, storm writes included
    assert storm_json(r, "log", "-n", "3") == (0, after[:3])
