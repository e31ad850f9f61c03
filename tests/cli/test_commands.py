"""The ``git storm`` command line: real subprocesses, exit codes, --json, -h."""
from __future__ import annotations

import os
import shutil
import subprocess

from unidiff import PatchSet

from helpers import git, make_repo, rev, snapshot_refs, storm, storm_json


def test_help_explains_every_command_with_an_example(repo):
    r = storm(repo, "-h")
    assert r.returncode == 0 and "Exit codes" in r.stdout
    listing = r.stdout.split("\nAgent verbs (")[1]  # the command list, in sections
    commands = [ln.split()[0] for ln in listing.splitlines() if ln.startswith("  ") and not ln.startswith("   ")]
    assert {"init", "read", "write", "edit", "rm", "release", "forget", "status", "log", "demo"} <= set(commands)
    for cmd in commands:
        h = storm(repo, cmd, "-h")
        assert h.returncode == 0 and "Example" in h.stdout, cmd


def test_git_storm_runs_as_a_git_subcommand_from_a_subdirectory(repo):
    assert shutil.which("git-storm"), "git-storm is not on PATH: the suite runs the installed command"
    env = dict(os.environ, STORM_AGENT="e1")
    r = subprocess.run(["git", "storm", "read", "api.py"], cwd=repo / "src", capture_output=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith(b"def fetch")
    assert b"src/api.py version" in r.stderr


def test_init_is_idempotent_and_refuses_unborn_and_bare(tmp_path, repo):
    head = rev(repo, "refs/storm/workspace")
    r = storm(repo, "init")
    assert r.returncode == 0 and "already initialised" in r.stdout and rev(repo, "refs/storm/workspace") == head
    empty = tmp_path / "empty"
    git(tmp_path, "init", "-q", str(empty))
    r = storm(empty, "init")
    assert r.returncode == 3 and "no commits" in r.stderr
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    r = storm(bare, "init")
    assert r.returncode == 3 and "bare" in r.stderr
    nowhere = tmp_path / "plain"
    nowhere.mkdir()
    r = storm(nowhere, "status")
    assert r.returncode == 3 and "not a git repository" in r.stderr


def test_init_with_base_and_bad_base(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    r = storm(repo, "init", "--base", "nosuchref")
    assert r.returncode == 2 and "does not name a commit" in r.stderr
    assert git(repo, "rev-parse", "-q", "--verify", "refs/storm/workspace", check=False).returncode != 0
    assert storm(repo, "init", "--base", "HEAD~1").returncode == 0
    assert rev(repo, "refs/storm/workspace") == rev(repo, "HEAD~1")


def test_not_initialised_is_exit_3(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    r = storm(repo, "read", "README.md", agent="e1")
    assert r.returncode == 3 and "git storm init" in r.stderr


def test_read_write_round_trip_json(repo):
    code, out = storm_json(repo, "read", "src/api.py", "missing.py", agent="e1")
    assert code == 0
    files = {f["path"]: f for f in out["files"]}
    assert files["missing.py"]["exists"] is False and files["src/api.py"]["content"].startswith("def fetch")
    code, out = storm_json(repo, "write", "src/api.py", "-m", "e1: why", input="new\n", agent="e1")
    assert code == 0 and out["accepted"] and out["commit"] == rev(repo, "refs/storm/workspace")
    assert (repo / "src/api.py").read_text() == "new\n"


def test_rejection_exit_1_with_parseable_payload(repo):
    storm(repo, "read", "src/api.py", agent="e1")
    storm(repo, "read", "src/api.py", agent="e2")
    assert storm(repo, "write", "src/api.py", input="def fetch(url, t):\n    pass\n", agent="e1").returncode == 0
    code, out = storm_json(repo, "write", "src/api.py", input="x\n", agent="e2")
    assert code == 1 and out["accepted"] is False
    rej = out["rejection"]
    assert rej["reason"] == "direct_conflict" and rej["changed_by"] == ["e1"] and rej["versions_behind"] == 1
    assert PatchSet(rej["diff"])[0].path == "src/api.py"
    assert rej["reservation"]["holder"] == "e2"
    # human form shows the diff and the current content
    storm(repo, "read", "src/api.py", agent="e3")
    r = storm(repo, "write", "src/api.py", "--no-wait", input="y\n", agent="e3")
    assert r.returncode == 1 and "reserved" in r.stdout and "e2" in r.stdout


def test_edit_and_rm_and_release_and_forget(repo):
    storm(repo, "read", "src/util.py", agent="e1")
    r = storm(repo, "edit", "src/util.py", "--old", "lo, hi", "--new", "low, high", agent="e1")
    assert r.returncode == 0, r.stderr
    assert "low, high" in (repo / "src/util.py").read_text()
    r = storm(repo, "edit", "src/util.py", "--old", "not there", "--new", "x", agent="e1")
    assert r.returncode == 2 and "not found" in r.stderr
    assert storm(repo, "rm", "src/util.py", agent="e1").returncode == 0
    assert not (repo / "src/util.py").exists()
    r = storm(repo, "release", "src/util.py", agent="e1")
    assert r.returncode == 0 and "nothing to release" in r.stdout
    code, out = storm_json(repo, "forget", agent="e1")
    assert code == 0 and "src/util.py" in out["forgotten"]


def test_status_and_log_json(repo):
    storm(repo, "read", "README.md", agent="e1")
    storm(repo, "write", "README.md", "-m", "e1: title", input="# t\n", agent="e1")
    code, st = storm_json(repo, "status")
    assert code == 0 and st["mode"] == "storm" and st["agents"][0]["agent"] == "e1"
    code, log = storm_json(repo, "log")
    assert code == 0 and log[0]["type"] == "write" and log[0]["intent"] == "e1: title"
    assert "e1" in storm(repo, "log").stdout


def test_write_from_file_and_missing_content(repo, tmp_path):
    src = tmp_path / "content.txt"
    src.write_bytes(b"from file\n")
    assert storm(repo, "write", "new.txt", "--file", str(src), agent="e1").returncode == 0
    assert (repo / "new.txt").read_bytes() == b"from file\n"
    r = storm(repo, "write", "new2.txt", "--file", str(tmp_path / "nope"), agent="e1")
    assert r.returncode == 2 and "cannot read --file" in r.stderr


def test_json_error_object(repo):
    code, out = storm_json(repo, "read", "/etc/passwd", agent="e1")
    assert code == 2 and out["error"]["kind"] == "bad_path" and out["error"]["exit_code"] == 2


def test_nothing_changes_on_refused_write(repo):
    before = snapshot_refs(repo)
    r = storm(repo, "write", "../outside.txt", input="x", agent="e1")
    assert r.returncode == 2 and snapshot_refs(repo) == before


def test_git_dir_option_is_respected(repo, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = storm(other, "read", "README.md", agent="e1",
              env={"GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(repo)})
    assert r.returncode == 0 and r.stdout == "# service\n"
