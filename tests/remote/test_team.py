"""A team's day over a remote: set-up as docs/remote.md tells it (a plain ``git init
--bare`` server, plain ``git clone``), agents writing in two clones, the manager's
commit pushed from one clone and taken by the other with ``git storm sync``, and
harness hooks in a clone validating and leasing against the server."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import ROOT, git, make_repo, rev, storm, storm_json

WS = "refs/storm/workspace"


def _server(tmp_path: Path) -> Path:
    """A server made as people make one: ``git init --bare`` (its HEAD names master)."""
    srv = tmp_path / "proj.git"
    git(tmp_path, "init", "-q", "--bare", str(srv))
    git(srv, "symbolic-ref", "HEAD", "refs/heads/master")
    return srv


def _first_clone(tmp_path: Path, srv: Path) -> Path:
    a = make_repo(tmp_path / "a", init_storm=False)  # the project, on branch main
    git(a, "remote", "add", "origin", str(srv))
    git(a, "push", "-q", "-u", "origin", "main")
    r = storm(a, "init", "--remote", "origin")
    assert r.returncode == 0, r.stderr
    return a


def _team(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The server, the first clone and a teammate's clone that joined it."""
    srv = _server(tmp_path)
    a = _first_clone(tmp_path, srv)
    git(tmp_path, "clone", "-q", str(srv), "b")
    b = tmp_path / "b"
    assert storm(b, "join", "origin").returncode == 0
    return srv, a, b


def _status(repo: Path) -> str:
    return git(repo, "status", "--porcelain").stdout.decode()


def _write(repo: Path, agent: str, path: str, text: str) -> dict:
    assert storm(repo, "read", path, agent=agent).returncode == 0
    code, res = storm_json(repo, "write", path, input=text, agent=agent)
    assert code == 0 and res["accepted"], res
    return res


def test_a_clone_of_a_server_whose_head_names_no_branch_joins_on_the_server_branch(tmp_path):
    srv = _server(tmp_path)
    _first_clone(tmp_path, srv)
    git(tmp_path, "clone", "-q", str(srv), "b")  # warns: remote HEAD refers to nonexistent ref
    b = tmp_path / "b"
    code, res = storm_json(b, "join", "origin")
    assert code == 0, res
    assert git(b, "symbolic-ref", "HEAD").stdout.decode().strip() == "refs/heads/main"
    assert rev(b, "main") == rev(srv, "main")
    assert git(b, "config", "branch.main.merge").stdout.decode().strip() == "refs/heads/main"
    assert _status(b) == ""  # the index is the branch's tree, the disk the shared head's (the same here)
    assert (b / "src/api.py").exists()
    assert any("now on main" in w for w in res["warnings"]), res
    st = storm(b, "status").stdout
    assert "reverted" not in st and "unmediated edits: none" in st, st


def test_join_refuses_an_ambiguous_branch_and_changes_nothing(tmp_path):
    srv = _server(tmp_path)
    a = _first_clone(tmp_path, srv)
    git(a, "push", "-q", "origin", "main:refs/heads/release")
    git(tmp_path, "clone", "-q", str(srv), "b")
    b = tmp_path / "b"
    before = sorted(p.name for p in b.iterdir())
    r = storm(b, "join", "origin")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "several branches (main, release)" in r.stderr and "git checkout -b NAME --track origin/NAME" in r.stderr
    assert sorted(p.name for p in b.iterdir()) == before
    assert git(b, "config", "--get", "storm.mode", check=False).returncode == 1


def test_the_managers_commit_reaches_every_clone(tmp_path):
    srv, a, b = _team(tmp_path)
    _write(a, "eng_a", "src/api.py", "A = 1\n")
    _write(b, "eng_b", "src/util.py", "B = 1\n")
    assert storm(a, "sync").returncode == 0
    r = storm(a, "commit", "-m", "integrate the morning")
    assert r.returncode == 0, r.stderr
    git(a, "push", "-q", "origin", "main")
    # b takes it: the branch and the index move, the disk is storm's; plain git then agrees
    code, res = storm_json(b, "sync")
    assert code == 0, res
    assert res["branch"]["state"] == "fast_forward" and res["branch"]["integrated"], res
    assert rev(b, "main") == rev(srv, "main") == rev(a, "main")
    assert _status(b) == ""
    assert "Already up to date" in git(b, "merge", "--ff-only", "origin/main").stdout.decode()
    text = storm(b, "sync").stdout
    assert "branch main: up to date with refs/remotes/origin/main" in text, text
    # b's manager commits next, on top: a fast-forward for the server; it lists only the new write
    _write(b, "eng_b", "src/util.py", "B = 2\n")
    assert storm(b, "sync").returncode == 0
    code, res = storm_json(b, "commit", "-m", "integrate the afternoon")
    assert code == 0 and res["writes"] == 1 and res["agents"] == ["eng_b"], res
    assert git(b, "push", "-q", "origin", "main").returncode == 0
    assert git(b, "rev-parse", "main^").stdout.decode().strip() == rev(a, "main")
    assert storm(a, "sync").returncode == 0 and rev(a, "main") == rev(srv, "main") and _status(a) == ""


def test_sync_reports_a_branch_ahead_or_diverged_and_never_rewrites_it(tmp_path):
    srv, a, b = _team(tmp_path)
    _write(a, "eng_a", "src/api.py", "A = 1\n")
    assert storm(a, "commit", "-m", "one").returncode == 0
    mine = rev(a, "main")
    code, res = storm_json(a, "sync")
    assert res["branch"]["state"] == "ahead" and res["branch"]["commits"] == 1 and rev(a, "main") == mine
    git(b, "commit", "-q", "--allow-empty", "--no-verify", "-m", "b's own")
    git(a, "push", "-q", "origin", "main")
    theirs = rev(b, "main")
    code, res = storm_json(b, "sync")
    assert code == 0 and res["branch"]["state"] == "diverged" and rev(b, "main") == theirs, res


def _hook(repo: Path, event: dict) -> dict | None:
    r = storm(repo, "harness", "hook", input=json.dumps(event), env={"STORM_AGENT": ""})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout) if r.stdout.strip() else None


def _claude(repo: Path, session: str, event: str, tool: str, tool_input: dict, use_id: str) -> dict:
    e = {"session_id": session, "transcript_path": f"/tmp/{session}.jsonl", "cwd": str(repo),
         "permission_mode": "default", "hook_event_name": event, "tool_name": tool, "tool_input": tool_input,
         "tool_use_id": use_id}
    if event == "PostToolUse":
        e["tool_response"] = {"filePath": tool_input.get("file_path"), "success": True}
    return e


def test_harness_hooks_in_a_clone_validate_and_lease_against_the_server(tmp_path):
    srv, a, b = _team(tmp_path)
    api = str(b / "src/api.py")
    assert _hook(b, _claude(b, "sess-b", "PostToolUse", "Read", {"file_path": api}, "r1")) is None
    _write(a, "eng_a", "src/api.py", "A = 1\n")  # lands on the server; b's local copy is older
    edit = {"file_path": api, "old_string": "def fetch(url):", "new_string": "def fetch(url, t=1):"}
    out = _hook(b, _claude(b, "sess-b", "PreToolUse", "Edit", edit, "e1"))
    decision = (out or {}).get("hookSpecificOutput", {}).get("permissionDecision")
    assert decision == "deny", out  # validated on the server's head, not the clone's stale copy
    reason = out["hookSpecificOutput"]["permissionDecisionReason"]
    assert "eng_a" in reason and "A = 1" in reason, reason
    # read again (the disk is now the server's head), then the edit is leased on the server
    assert _hook(b, _claude(b, "sess-b", "PostToolUse", "Read", {"file_path": api}, "r2")) is None
    edit = {"file_path": api, "old_string": "A = 1", "new_string": "A = 2"}
    out = _hook(b, _claude(b, "sess-b", "PreToolUse", "Edit", edit, "e2"))
    assert (out or {}).get("hookSpecificOutput", {}).get("permissionDecision") != "deny", out
    leased = git(srv, "ls-tree", "-r", "--name-only", "refs/storm/reservations").stdout.decode().split()
    assert leased, "the lease did not reach the server"
    (b / "src/api.py").write_text("A = 2\n")  # the harness's own Edit tool
    assert _hook(b, _claude(b, "sess-b", "PostToolUse", "Edit", edit, "e2")) is None
    assert git(srv, "show", f"{WS}:src/api.py").stdout.decode() == "A = 2\n"
    after = git(srv, "ls-tree", "-r", "--name-only", "refs/storm/reservations").stdout.decode().split()
    assert after == [], "the lease outlived the write on the server"


def test_log_shows_a_write_moved_onto_a_newer_head_in_landing_order(tmp_path):
    """A write queued on one clone and moved onto a head another clone wrote meanwhile
    keeps the time it was validated, earlier than its new parent's: the log lists the
    chain in landing order with times that never go back (its own kept as written)."""
    repo = make_repo(tmp_path / "r")
    _write(repo, "eng_a", "src/api.py", "A = 1\n")
    parent = rev(repo, WS)
    t = float(git(repo, "log", "-1", "--format=%(trailers:key=Storm-Time,valueonly)", WS).stdout.decode())
    tree = git(repo, "rev-parse", f"{WS}^{{tree}}").stdout.decode().strip()
    msg = (f"eng_b: moved write\n\nStorm-Agent: eng_b\nStorm-Op: write\nStorm-Path: src/api.py\n"
           f"Storm-Time: {t - 60:.6f}\n")
    moved = git(repo, "commit-tree", tree, "-p", parent, input=msg.encode()).stdout.decode().strip()
    git(repo, "update-ref", WS, moved, parent)
    code, entries = storm_json(repo, "log")
    writes = [e for e in entries if e["type"] == "write"]
    assert code == 0 and [w["commit"] for w in writes[:2]] == [moved, parent], writes
    times = [e["time"] for e in entries]
    assert times == sorted(times, reverse=True), times
    assert writes[0]["time"] == writes[1]["time"] and abs(writes[0]["written"] - (t - 60)) < 1e-3, writes[:2]


def _doc_block(name: str) -> str:
    """The shell block docs/remote.md marks ``<!-- run: NAME -->``, as written."""
    text = (ROOT / "docs" / "remote.md").read_text()
    after = text.split(f"<!-- run: {name}", 1)[1].split("-->", 1)[1]
    body = after.split("```sh\n", 1)[1].split("```", 1)[0]
    return body


def test_the_set_up_and_the_day_in_docs_remote_run_verbatim(tmp_path):
    import subprocess

    make_repo(tmp_path / "myproject", {"src/api.py": "def fetch(url):\n    return url\n"}, init_storm=False)
    for name in ("remote-setup", "remote-day"):
        r = subprocess.run(["bash", "-e", "-c", _doc_block(name)], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stdout, r.stderr)
    team, me = tmp_path / "teammate", tmp_path / "myproject"
    # the last lines are sync's; git status --short in the teammate's clone printed nothing
    assert r.stdout.strip().splitlines()[-1].startswith("branch main: fast-forwarded 1 commit(s)"), r.stdout
    assert (team / "version.py").read_text() == 'VERSION = "2"\n'
    assert rev(team, "main") == rev(me, "main") == rev(tmp_path / "project.git", "main")
    assert git(team, "symbolic-ref", "HEAD").stdout.decode().strip() == "refs/heads/main"


def test_join_never_moves_a_local_branch_of_the_servers_name(tmp_path):
    """A clone with no commit on its checked-out branch but a branch of its own named
    like the server's, at another commit: join would have to move it; it refuses,
    exit 2, and the branch and the clone are as they were."""
    srv = _server(tmp_path)
    _first_clone(tmp_path, srv)
    git(tmp_path, "clone", "-q", str(srv), "b")
    b = tmp_path / "b"
    tree = git(b, "mktree", input=b"").stdout.decode().strip()
    own = git(b, "commit-tree", tree, "-m", "mine", input=None).stdout.decode().strip()
    git(b, "update-ref", "refs/heads/main", own)
    r = storm(b, "join", "origin")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "would have to move it" in r.stderr, r.stderr
    assert rev(b, "refs/heads/main") == own
    assert git(b, "config", "--get", "storm.mode", check=False).returncode == 1


def test_sync_refuses_to_follow_a_branch_that_moved_while_it_waited(tmp_path):
    """The window between sync reading the branch and moving it: the follow step waits
    for storm's workspace lock (held here with flock), the branch moves meanwhile (a
    person's commit), and the follow then refuses -- one line, exit 3 -- leaving the
    person's commit where it is and the index to git."""
    import subprocess
    import sys

    from helpers import flock_waiters, hold, release

    srv, a, b = _team(tmp_path)
    _write(a, "eng_a", "src/api.py", "A = 1\n")
    assert storm(a, "commit", "-m", "one").returncode == 0
    git(a, "push", "-q", "origin", "main")
    script = ("import json, sys; from storm_git.core.store import Store; "
              "from storm_git.remote.branch_follow import follow; from storm_git.core.errors import StormError\n"
              "try:\n    print(json.dumps(follow(Store.discover('.'), 'origin').to_dict()))\n"
              "except StormError as e:\n    print(json.dumps({'error': e.message})); sys.exit(3)\n")
    holder = hold(b, "workspace")
    try:
        p = subprocess.Popen([sys.executable, "-c", script], cwd=b, stdout=subprocess.PIPE, text=True)
        lock = b / ".git" / "storm" / "locks" / "workspace"
        deadline = time.monotonic() + 60
        while flock_waiters(lock, p.pid) == 0:  # fetched, read the branch, now waiting for the lock
            assert p.poll() is None and time.monotonic() < deadline, "the follow never waited for the lock"
            time.sleep(0.02)
        tree = git(b, "rev-parse", "HEAD^{tree}").stdout.decode().strip()
        mine = git(b, "commit-tree", tree, "-p", "HEAD", "-m", "a person's commit").stdout.decode().strip()
        git(b, "update-ref", "refs/heads/main", mine)
    finally:
        release(holder)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3 and "moved while storm was following" in json.loads(out)["error"], out
    assert rev(b, "refs/heads/main") == mine


@pytest.mark.slow
def test_the_day_in_docs_remote_runs_on_a_project_that_already_has_its_file(tmp_path):
    """The day's write of version.py was refused (unread_target) on a project that
    already had one, and the commit then found nothing to commit."""
    import subprocess

    make_repo(tmp_path / "myproject", {"version.py": 'VERSION = "1"\n'}, init_storm=False)
    for name in ("remote-setup", "remote-day"):
        r = subprocess.run(["bash", "-e", "-c", _doc_block(name)], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stdout, r.stderr)
    assert (tmp_path / "teammate" / "version.py").read_text() == 'VERSION = "2"\n'
