"""The manager's ``git storm commit`` and the pre-commit guard, with real ``git commit``."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import yaml

from helpers import ROOT, accepted_write, commit_env, git, git_commit, make_repo, rev, show, storm, storm_json


def test_manager_commit_has_shared_tree_trailers_and_clean_status(repo):
    accepted_write(repo, "e1", "src/api.py", "def fetch(url, timeout):\n    pass\n")
    accepted_write(repo, "e2", "src/util.py", "def clamp(x):\n    return x\n")
    accepted_write(repo, "e1", "docs/new é.md", "hello\n")
    base = rev(repo, "HEAD")
    code, res = storm_json(repo, "commit", "-m", "Integrate timeouts and clamp")
    assert code == 0, res
    assert res["agents"] == ["e1", "e2"] and res["writes"] == 3 and res["branch"] == "main"
    head = rev(repo, "HEAD")
    assert res["commit"] == head and rev(repo, "main") == head
    assert rev(repo, "HEAD^") == base
    assert rev(repo, "HEAD^{tree}") == rev(repo, "refs/storm/workspace^{tree}")
    msg = git(repo, "log", "-1", "--format=%B").stdout.decode()
    trailers = git(repo, "interpret-trailers", "--parse", input=msg.encode()).stdout.decode()
    assert "Storm-Agents: e1, e2" in trailers
    assert "Storm-Agent: e1\nStorm-Agent: e2" in trailers
    assert f"Storm-Workspace: {rev(repo, 'refs/storm/workspace')}" in trailers
    assert git(repo, "status", "--porcelain").stdout == b""  # index and HEAD consistent, disk clean
    # the log shows which writes the commit contains
    _, log = storm_json(repo, "log")
    [ev] = [e for e in log if e["type"] == "commit"]
    writes = [e["commit"] for e in log if e["type"] == "write"]
    assert ev["commit"] == head and sorted(ev["writes"]) == sorted(writes) and ev["agents"] == ["e1", "e2"]
    assert "commit" in storm(repo, "log").stdout
    # the next commit lists only the writes since
    accepted_write(repo, "e3", "src/client.py", "import api\n")
    code, res = storm_json(repo, "commit", "-m", "Second")
    assert code == 0 and res["agents"] == ["e3"] and res["writes"] == 1
    assert git(repo, "rev-list", "--count", "HEAD").stdout.decode().strip() == "3"
    assert git(repo, "status", "--porcelain").stdout == b""
    # nothing new: no commit
    code, res = storm_json(repo, "commit", "-m", "Third")
    assert code == 0 and res["commit"] is None and rev(repo, "HEAD") == rev(repo, "HEAD")


def test_the_index_after_a_commit_is_the_tree_with_valid_stat_data(repo):
    """The index is the commit's tree entry for entry (a staged change and a staged
    new file are gone, a file the agents removed is gone), and the entries that
    changed carry stat data: git's plumbing, which refreshes nothing, sees a clean tree."""
    accepted_write(repo, "e1", "src/api.py", "def fetch(url, timeout):\n    pass\n")
    storm(repo, "rm", "src/util.py", agent="e1")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    git(repo, "update-index", "--add", "--cacheinfo", f"100644,{rev(repo, 'HEAD:README.md')},docs/elsewhere.md")
    code, res = storm_json(repo, "commit", "-m", "integrate")
    assert code == 0, res
    assert git(repo, "ls-files", "-s").stdout == git(repo, "ls-tree", "-r", "--format=%(objectmode) %(objectname) 0\t"
                                                     "%(path)", "HEAD").stdout
    assert git(repo, "diff-files", "--quiet", check=False).returncode == 0
    assert git(repo, "diff-index", "--cached", "--quiet", "HEAD", check=False).returncode == 0


def test_commit_warns_about_unmediated_edits_refuses_with_strict_and_adopts(repo):
    accepted_write(repo, "e1", "src/api.py", "x = 1\n")
    (repo / "src/util.py").write_text("edited outside storm\n")
    (repo / ".env").write_text("SECRET=1\n")  # untracked: never committed, never printed
    base = rev(repo, "HEAD")
    r = storm(repo, "commit", "-m", "Integrate", "--strict")
    assert r.returncode == 3 and "unmediated" in r.stderr and "src/util.py" in r.stderr
    assert rev(repo, "HEAD") == base
    # without --strict: the shared tree is committed; the edits stay on disk, named in a warning
    r = storm(repo, "commit", "-m", "Integrate")
    assert r.returncode == 0, r.stderr
    assert "src/util.py (modified)" in r.stderr and "SECRET" not in r.stderr
    # the .env is named with the .gitignore line that keeps it out, never with --adopt
    [env_line] = [ln for ln in r.stderr.splitlines() if ".env" in ln]
    assert "add it to .gitignore (/.env)" in env_line and "--adopt" not in env_line
    assert git(repo, "show", "HEAD:src/api.py").stdout == b"x = 1\n"
    assert git(repo, "show", "HEAD:src/util.py").stdout != b"edited outside storm\n"
    assert (repo / "src/util.py").read_text() == "edited outside storm\n"
    code, res = storm_json(repo, "commit", "-m", "Integrate", "--adopt")
    assert code == 0 and res["agents"] == ["manager"] and res["adopted"] == ["src/util.py"]
    assert git(repo, "show", "HEAD:src/util.py").stdout == b"edited outside storm\n"
    assert git(repo, "status", "--porcelain").stdout == b"?? .env\n"  # --adopt leaves the secret out


def test_only_the_manager_commits(repo):
    accepted_write(repo, "e1", "src/api.py", "x = 1\n")
    base = rev(repo, "HEAD")
    r = storm(repo, "commit", "-m", "mine", agent="e1")
    assert r.returncode == 2 and "not the manager" in r.stderr
    git(repo, "config", "storm.manager", "lead")
    r = storm(repo, "commit", "-m", "mine", agent="manager")
    assert r.returncode == 2
    assert storm(repo, "commit", "-m", "by the lead", agent="lead").returncode == 0
    assert rev(repo, "HEAD") != base


def test_engineers_git_commit_is_refused_by_the_hook(repo):
    accepted_write(repo, "e1", "src/api.py", "x = 1\n")
    git(repo, "add", "src/api.py")  # staged content equals the shared head
    base = rev(repo, "HEAD")
    r = git_commit(repo, "-m", "my own commit", agent="e1")
    assert r.returncode != 0
    assert "STORM_AGENT=e1 is an engineer" in r.stderr and "git storm commit" in r.stderr
    assert rev(repo, "HEAD") == base
    # the manager (or a human) may commit exactly the shared content
    r = git_commit(repo, "-m", "manager commit", agent="manager")
    assert r.returncode == 0, r.stderr
    r = git_commit(repo, "--allow-empty", "-m", "human")
    assert r.returncode == 0, r.stderr


def test_hook_refuses_staged_content_that_differs_from_shared_head(repo):
    odd = "dir with space/naïve ü.py"
    (repo / "dir with space").mkdir()
    (repo / odd).write_text("unmediated\n")
    (repo / "src/util.py").write_text("stale or unmediated\n")
    git(repo, "add", odd, "src/util.py")
    base = rev(repo, "HEAD")
    r = git_commit(repo, "-m", "sneak it in")
    assert r.returncode != 0
    assert "'dir with space/naïve ü.py'" in r.stderr and "src/util.py" in r.stderr
    assert "git storm adopt" in r.stderr and "git storm commit" in r.stderr
    assert rev(repo, "HEAD") == base
    # from a subdirectory too
    r = git_commit(repo / "src", "-m", "sneak it in")
    assert r.returncode != 0 and "src/util.py" in r.stderr
    # adopt the edits: then the staged content equals the shared head and the commit passes
    storm(repo, "read", "src/util.py", agent="e1")
    assert storm(repo, "adopt", odd, "src/util.py", agent="e1").returncode == 0
    r = git_commit(repo / "src", "-m", "now it is shared")
    assert r.returncode == 0, r.stderr


def test_hook_in_a_linked_worktree_and_with_a_minimal_path(repo, tmp_path):
    wt = tmp_path / "linked wt"
    git(repo, "worktree", "add", "-q", "-b", "side", str(wt))
    (wt / "src/api.py").write_text("side edit\n")
    git(wt, "add", "src/api.py")
    r = git_commit(wt, "-m", "side")
    assert r.returncode != 0 and "src/api.py" in r.stderr
    r = git_commit(wt, "-m", "side", agent="e1")
    assert r.returncode != 0 and "is an engineer" in r.stderr
    # minimal PATH: the shim names its interpreter; git itself by absolute path
    gitexe = shutil.which("git")
    r = subprocess.run([gitexe, "commit", "-m", "side"], cwd=wt, capture_output=True, text=True,
                       env=commit_env("e1", PATH="/nonexistent"))
    assert r.returncode != 0 and "is an engineer" in r.stderr, r.stderr


def test_hook_chains_an_existing_hook_and_uninstall_restores_it(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    hooks = repo / ".git/hooks"
    marker = tmp_path / "ran"
    (hooks / "pre-commit").write_text(f"#!/bin/sh\necho ran >> '{marker}'\nexit 0\n")
    (hooks / "pre-commit").chmod(0o755)
    r = storm(repo, "init")
    assert r.returncode == 0, r.stderr
    assert (hooks / "pre-commit.storm-chained").exists()
    assert "git-storm-shim" in (hooks / "pre-commit").read_text()
    assert git_commit(repo, "--allow-empty", "-m", "ok").returncode == 0
    assert marker.read_text() == "ran\n"  # the old hook still runs
    r = git_commit(repo, "--allow-empty", "-m", "no", agent="e1")
    assert r.returncode != 0 and marker.read_text() == "ran\n"  # guard first
    # init again (idempotent) does not chain the shim to itself
    assert storm(repo, "init").returncode == 0
    assert "ran" in (hooks / "pre-commit.storm-chained").read_text()
    code, res = storm_json(repo, "uninstall-hooks")
    assert code == 0 and res["removed"] == ["pre-commit"] and res["restored"] == ["pre-commit"]
    assert (hooks / "pre-commit").read_text().startswith("#!/bin/sh\necho ran")
    assert not (hooks / "pre-commit.storm-chained").exists()
    assert git_commit(repo, "--allow-empty", "-m", "after", agent="e1").returncode == 0


def test_install_respects_core_hooks_path(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    custom = tmp_path / "my hooks"
    custom.mkdir()
    (custom / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (custom / "pre-commit").chmod(0o755)
    git(repo, "config", "core.hooksPath", str(custom))
    assert storm(repo, "init").returncode == 0
    assert git(repo, "config", "core.hooksPath").stdout.decode().strip() == str(custom)
    assert "git-storm-shim" in (custom / "pre-commit").read_text()
    assert (custom / "pre-commit.storm-chained").exists()
    assert not (repo / ".git/hooks/pre-commit").exists()
    r = git_commit(repo, "--allow-empty", "-m", "no", agent="e1")
    assert r.returncode != 0 and "is an engineer" in r.stderr


def test_hook_command_and_pre_commit_framework_manifest(repo):
    r = storm(repo, "hook", "pre-commit", agent="e1")
    assert r.returncode == 1 and "is an engineer" in r.stderr
    assert storm(repo, "hook", "pre-commit").returncode == 0
    [entry] = yaml.safe_load(open(ROOT / ".pre-commit-hooks.yaml"))
    assert entry["id"] == "storm-guard" and entry["entry"] == "git-storm hook pre-commit"
    assert entry["pass_filenames"] is False and entry["always_run"] is True


def test_storm_mode_content_rule_does_not_apply_in_worktree_mode(repo):
    # (worktree mode has its own rules for engineers: storm_git.coordination.assignments)
    git(repo, "config", "storm.mode", "worktree")
    (repo / "src/util.py").write_text("anything\n")
    git(repo, "add", "src/util.py")
    r = git_commit(repo, "-m", "a human commit, not in the shared workspace")
    assert r.returncode == 0, r.stderr


def test_the_managers_commit_refuses_while_a_merge_is_in_progress(repo):
    """It once reset the index over the person's conflicted merge (the conflict stages
    gone, MERGE_HEAD still there: their next git commit would record a merge of the
    wrong content)."""
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "README.md").write_text("# theirs\n")
    git(repo, "commit", "-q", "-am", "theirs", "--no-verify")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("# ours\n")
    git(repo, "commit", "-q", "-am", "ours", "--no-verify")
    assert storm(repo, "status").returncode == 0  # storm brings its record to the new checkout
    accepted_write(repo, "e1", "src/api.py", "x = 1\n")
    assert git(repo, "merge", "other", check=False).returncode != 0  # a conflict in README.md
    stages_before = git(repo, "ls-files", "-s", "README.md").stdout
    assert len(stages_before.splitlines()) == 3
    head_before = rev(repo, "HEAD")
    code, res = storm_json(repo, "commit", "-m", "integrate")
    assert code == 3 and res["error"]["kind"] == "operation_in_progress", res
    assert "a merge is in progress" in res["error"]["message"] and "git merge --abort" in res["error"]["hint"]
    assert "git storm adopt" in res["error"]["hint"]
    assert git(repo, "ls-files", "-s", "README.md").stdout == stages_before  # nothing changed
    assert rev(repo, "HEAD") == head_before and (repo / ".git" / "MERGE_HEAD").exists()
    # the way out the hint names: record the resolution, then git's own merge commit
    (repo / "README.md").write_text("# both\n")
    assert storm(repo, "adopt", "README.md", agent="e1").returncode == 0
    git(repo, "add", "README.md")
    done = git_commit(repo, "--no-edit", agent=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert git(repo, "rev-list", "--parents", "-n", "1", "HEAD").stdout.decode().count(" ") == 2  # a merge
    assert git(repo, "show", "HEAD:README.md").stdout == b"# both\n"
    assert storm(repo, "commit", "-m", "integrate").returncode == 0  # nothing left in progress
    assert git(repo, "show", "HEAD:src/api.py").stdout == b"x = 1\n"  # the shared state, on top
    assert git(repo, "show", "HEAD:README.md").stdout == b"# both\n"


def test_the_managers_commit_waits_its_turn_for_gits_index_lock(repo, tmp_path):
    """A git command holding ``index.lock`` (here a person's ``git commit`` whose
    editor is still open) let the manager's commit move the branch and then fail to
    reset the index: exit 3 "the commit was made", the index still holding the old
    tree, so the person's next ``git commit`` would have recorded a revert of the
    agents' work. Now the commit is refused first and nothing changes."""
    import time

    accepted_write(repo, "e1", "src/api.py", "x = 1  # e1: new\n")
    started = tmp_path / "editor-started"  # git commit -a holds the lock until the message is in
    env = dict(commit_env(), GIT_EDITOR=f"sh -c 'touch {started}; sleep 60'")
    person = subprocess.Popen(["git", "commit", "-a", "--no-verify", "--allow-empty"], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not started.exists():  # git holds index.lock while its editor runs
            assert time.monotonic() < deadline and person.poll() is None
            time.sleep(0.02)
        assert (repo / ".git" / "index.lock").exists()
        head, index = rev(repo, "HEAD"), (repo / ".git" / "index").read_bytes()
        code, res = storm_json(repo, "commit", "-m", "integrate")
        assert code == 3 and res["error"]["kind"] == "busy" and "index.lock" in res["error"]["message"], res
        assert rev(repo, "HEAD") == head and (repo / ".git" / "index").read_bytes() == index
    finally:
        os.killpg(person.pid, 15)
        person.wait(timeout=30)
    assert not (repo / ".git" / "index.lock").exists()  # git removed its lock as it died
    r = storm(repo, "commit", "-m", "integrate")
    assert r.returncode == 0, r.stderr
    assert git(repo, "show", "HEAD:src/api.py").stdout == b"x = 1  # e1: new\n"
    assert git(repo, "status", "--porcelain").stdout == b""  # the index has the new tree
    assert not list((repo / ".git").glob("index.storm-*")) and not (repo / ".git" / "index.lock").exists()


def test_the_managers_commit_runs_the_repositorys_commit_msg_and_post_commit_hooks(repo):
    """git commit runs commit-msg (Gerrit's adds the Change-Id its server requires;
    others refuse a message format) and post-commit; the manager's commit ran
    neither. Now it does, as git does, and --no-verify skips them."""
    hooks = repo / ".git" / "hooks"
    (hooks / "commit-msg").write_text('#!/bin/sh\ngrep -q "^Change-Id:" "$1" || echo "Change-Id: I0123abcd" >> "$1"\n')
    (hooks / "post-commit").write_text('#!/bin/sh\ngit rev-parse HEAD > "$(git rev-parse --git-dir)/post-commit-ran"\n')
    for h in ("commit-msg", "post-commit"):
        (hooks / h).chmod(0o755)
    accepted_write(repo, "e1", "src/api.py", "x = 1\n")
    r = storm(repo, "commit", "-m", "integrate")
    assert r.returncode == 0, r.stderr
    body = git(repo, "log", "-1", "--format=%B").stdout.decode()
    assert body.startswith("integrate\n") and "Storm-Writes: 1" in body and "Change-Id: I0123abcd" in body, body
    assert (repo / ".git" / "post-commit-ran").read_text().strip() == rev(repo, "HEAD")

    (hooks / "commit-msg").write_text('#!/bin/sh\necho "message must name a ticket" >&2\nexit 1\n')
    storm(repo, "read", "src/api.py", agent="e1")
    assert storm(repo, "write", "src/api.py", input="x = 2\n", agent="e1").returncode == 0
    head = rev(repo, "HEAD")
    code, res = storm_json(repo, "commit", "-m", "integrate again")
    assert code == 3 and res["error"]["kind"] == "hook_refused", res
    assert "message must name a ticket" in res["error"]["message"] and "--no-verify" in res["error"]["hint"]
    assert rev(repo, "HEAD") == head and not list((repo / ".git").glob("STORM_COMMIT_EDITMSG*"))
    r = storm(repo, "commit", "-m", "integrate again", "--no-verify")
    assert r.returncode == 0, r.stderr
    assert "Change-Id" not in git(repo, "log", "-1", "--format=%B").stdout.decode()


def test_a_manager_commit_killed_holding_gits_index_lock_is_repaired_by_doctor(repo, tmp_path):
    """Killed while its commit-msg hook runs (git's index.lock held, the branch not moved
    yet): every git command that writes the index refused, and nothing told a storm lock
    from git's. The lock now names storm and its pid: doctor reports it, --fix removes
    it, and the commit then goes through."""
    entered = tmp_path / "hook-entered"
    hook = repo / ".git/hooks/commit-msg"
    hook.write_text(f"#!/bin/sh\ntouch '{entered}'\nsleep 60\n")
    hook.chmod(0o755)
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    before = rev(repo, "HEAD")
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "commit", "-m", "integrate"], cwd=repo,
                         env={**os.environ, "STORM_AGENT": "manager"}, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not entered.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert entered.exists()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert (repo / ".git/index.lock").exists() and rev(repo, "HEAD") == before
    assert git(repo, "add", "README.md", check=False).returncode != 0  # git refuses, as after any crash
    code, rep = storm_json(repo, "doctor")
    [f] = [f for f in rep["findings"] if f["kind"] == "stale_index_lock"]
    assert code == 3 and f"pid {p.pid}" in f["detail"] and "before the branch moved" in f["detail"]
    r = storm(repo, "commit", "-m", "again", "--no-verify", agent="manager")
    assert r.returncode == 3 and "doctor --fix" in r.stderr, r.stderr
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["ok"], rep
    assert not (repo / ".git/index.lock").exists()
    assert storm(repo, "commit", "-m", "again", "--no-verify", agent="manager").returncode == 0
    assert show(repo, "HEAD", "src/util.py") == b"x = 1\n" and git(repo, "status", "--porcelain").stdout == b""


def test_doctor_finishes_a_manager_commit_killed_after_the_branch_moved(repo):
    """The state a kill between the branch's move and the index reset leaves (planted:
    that window has no hook to hold it open): the branch on the new commit, the index
    on the old tree (the person's next git commit would revert the agents' work), the
    lock naming the commit. doctor --fix gives the index the branch's tree."""
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    git(repo, "read-tree", "HEAD~1")  # the index as the dead commit left it
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"git-storm manager-commit pid={dead.pid} new={rev(repo, 'HEAD')}\n"
    (repo / ".git/index.lock").write_bytes(stale.encode())
    code, rep = storm_json(repo, "doctor")
    [f] = [f for f in rep["findings"] if f["kind"] == "stale_index_lock"]
    assert "after the branch moved" in f["detail"]
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["ok"], rep
    assert not (repo / ".git/index.lock").exists()
    assert git(repo, "diff", "--cached", "--name-only").stdout == b""  # the index holds HEAD's tree
    assert git(repo, "status", "--porcelain").stdout == b""
