"""The branch moves outside storm (a person's git pull, merge, commit): the manager's
commit merges what it gained into the shared workspace instead of undoing it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import git, hold, make_repo, rev, show, storm, storm_json

WS = "refs/storm/workspace"


def _upstream(tmp_path: Path) -> tuple[Path, Path]:
    """(storm repository cloned from a bare upstream, a second clone of that upstream)."""
    seed = make_repo(tmp_path / "seed", init_storm=False)
    git(tmp_path, "clone", "-q", "--bare", str(seed), "up.git")
    for name in ("repo", "other"):
        git(tmp_path, "clone", "-q", str(tmp_path / "up.git"), name)
        git(tmp_path / name, "config", "user.email", f"{name}@example.com")
        git(tmp_path / name, "config", "user.name", name)
    repo = tmp_path / "repo"
    assert storm(repo, "init").returncode == 0
    return repo, tmp_path / "other"


def _push_change(other: Path, path: str, text: str, message: str) -> str:
    git(other, "pull", "-q", "--no-rebase")
    (other / path).write_text(text)
    git(other, "commit", "-qam", message)
    git(other, "push", "-q", "origin", "main")
    return rev(other, "HEAD")


def test_a_pulled_commit_is_merged_in_not_undone(tmp_path):
    """The shared tree put on top of the pulled commit would revert the upstream change
    in history. Status says what the branch gained and the commit merges it in (as the
    manager's write: agents who read the file see it as stale)."""
    repo, other = _upstream(tmp_path)
    assert storm(repo, "read", "README.md", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, timeout=10):\n    pass\n",
                 agent="engineer_1").returncode == 0
    up = _push_change(other, "README.md", "# service (upstream)\n", "docs: upstream")
    git(repo, "pull", "-q", "--no-rebase", "origin", "main")
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["branch_news"]["count"] == 1 and st["branch_news"]["commits"][0].endswith("docs: upstream")
    assert [(u["path"], u["state"]) for u in st["unmediated"]] == [("README.md", "modified")]  # not "reverted"
    assert "1 commit(s) made outside storm" in storm(repo, "status").stdout

    code, res = storm_json(repo, "commit", "-m", "integrate", agent="manager")
    assert code == 0, res
    assert res["branch_news"]["paths"] == ["README.md"] and res["unmediated"] == []
    assert show(repo, "HEAD", "README.md") == b"# service (upstream)\n"  # kept
    assert show(repo, "HEAD", "src/api.py") == b"def fetch(url, timeout=10):\n    pass\n"
    assert rev(repo, "HEAD^") == up
    assert show(repo, WS, "README.md") == b"# service (upstream)\n"
    assert git(repo, "status", "--porcelain").stdout == b""
    assert rev(repo, "refs/storm/integrated") == rev(repo, "HEAD")
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert "branch_news" not in st
    assert {a["agent"]: a["stale"] for a in st["agents"]}["engineer_1"] == ["README.md"]


def test_a_commit_made_with_plain_git_is_kept(tmp_path):
    """A person's `git commit --no-verify` (the guard bypassed): the next manager's
    commit keeps its change instead of committing the older shared version over it."""
    repo = make_repo(tmp_path / "r")
    (repo / "README.md").write_text("# service, by hand\n")
    git(repo, "commit", "-q", "--no-verify", "-am", "by hand")
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    r = storm(repo, "commit", "-m", "integrate", agent="manager")
    assert r.returncode == 0, r.stderr
    assert "merged first into the shared workspace: 1 commit(s) main gained outside storm" in r.stdout
    assert show(repo, "HEAD", "README.md") == b"# service, by hand\n"
    assert show(repo, "HEAD", "src/util.py") == b"x = 1\n"


def test_a_change_both_sides_made_is_refused_until_resolved(tmp_path):
    """The branch gained a change of a path the agents changed too: refused (exit 3,
    nothing changed, the path named); the manager writes the resolution into the shared
    workspace and commits with --keep-shared; the branch's other changes are merged."""
    repo, other = _upstream(tmp_path)
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, timeout=10):\n    return http_get(url)\n",
                 agent="engineer_1").returncode == 0
    git(other, "pull", "-q")
    (other / "src/api.py").write_text("def fetch(url, retries=3):\n    return http_get(url)\n")
    (other / "README.md").write_text("# service 2\n")
    git(other, "commit", "-qam", "retries")
    git(other, "push", "-q", "origin", "main")
    git(repo, "fetch", "-q", "origin")
    git(repo, "reset", "-q", "--soft", "origin/main")  # the branch moves; the disk keeps the shared state
    before = (rev(repo, WS), rev(repo, "HEAD"))
    code, err = storm_json(repo, "commit", "-m", "integrate", agent="manager")
    assert code == 3 and err["error"]["kind"] == "branch_conflict", err
    assert "src/api.py" in err["error"]["message"] and "--keep-shared" in err["error"]["hint"]
    assert (rev(repo, WS), rev(repo, "HEAD")) == before
    both = "def fetch(url, timeout=10, retries=3):\n    return http_get(url)\n"
    assert storm(repo, "read", "src/api.py", agent="manager").returncode == 0
    assert storm(repo, "write", "src/api.py", input=both, agent="manager").returncode == 0
    code, res = storm_json(repo, "commit", "-m", "integrate", "--keep-shared", agent="manager")
    assert code == 0, res
    assert show(repo, "HEAD", "src/api.py") == both.encode()
    assert show(repo, "HEAD", "README.md") == b"# service 2\n"
    assert rev(repo, "HEAD^") == rev(repo, "origin/main")
    # the merged-in file reached the disk (the integration is a write like any other)
    assert (repo / "README.md").read_text() == "# service 2\n" and git(repo, "status", "--porcelain").stdout == b""


def test_a_branch_moved_back_undoes_nothing(tmp_path):
    """`git reset --soft HEAD~` to redo the manager's commit: the branch gained
    nothing, the shared workspace keeps the agents' work, and the commit puts it back."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "commit", "-m", "first try", agent="manager").returncode == 0
    git(repo, "reset", "-q", "--soft", "HEAD~")
    assert "branch_news" not in json.loads(storm(repo, "status", "--json").stdout)
    code, res = storm_json(repo, "commit", "-m", "second try", agent="manager")
    assert code == 0 and res["branch_news"] is None, res
    assert show(repo, "HEAD", "src/util.py") == b"x = 1\n"
    assert git(repo, "log", "-1", "--format=%s").stdout.decode().strip() == "second try"


def test_a_manager_commit_rewritten_by_pull_rebase_is_storms_own_work(tmp_path):
    """`git pull --rebase --autostash` rewrites the manager's commit onto upstream: its
    version of src/util.py comes back as a change 'made outside storm', older than the
    shared one. It is storm's own (a version the shared workspace had), not a conflict:
    the commit keeps the newer shared version and merges the upstream change."""
    repo, other = _upstream(tmp_path)
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "commit", "-m", "first", agent="manager").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 2\n", agent="engineer_1").returncode == 0
    _push_change(other, "README.md", "# service (upstream)\n", "docs: upstream")
    r = git(repo, "pull", "-q", "--rebase", "--autostash", "origin", "main", check=False)
    assert r.returncode == 0, r.stderr
    code, res = storm_json(repo, "commit", "-m", "second", agent="manager")
    assert code == 0, res
    assert res["branch_news"]["paths"] == ["README.md"]
    assert show(repo, "HEAD", "src/util.py") == b"x = 2\n"
    assert show(repo, "HEAD", "README.md") == b"# service (upstream)\n"
    assert git(repo, "status", "--porcelain").stdout == b""


def test_a_branch_moved_while_the_commit_waits_for_its_lock_is_not_undone(tmp_path):
    """The branch moves after the commit looked for news and before it holds the
    workspace lock (held here by another process): the commit refuses, nothing moves."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    holder = hold(repo, "workspace", seconds=60)
    try:
        p = subprocess.Popen([sys.executable, "-m", "storm_git", "commit", "-m", "integrate"], cwd=repo,
                             env={**os.environ, "STORM_AGENT": "manager"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not (repo / ".git/index.lock").exists():  # past its look for news, at the lock
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.01)
        tree = git(repo, "rev-parse", "HEAD^{tree}").stdout.decode().strip()
        moved = git(repo, "commit-tree", "-p", "HEAD", "-m", "by hand", tree).stdout.decode().strip()
        git(repo, "update-ref", "refs/heads/main", moved)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3 and b"moved outside storm while committing" in err, err
    assert rev(repo, "HEAD") == moved
    r = storm(repo, "commit", "-m", "integrate", agent="manager")
    assert r.returncode == 0 and rev(repo, "HEAD^") == moved, r.stderr


def test_a_repository_from_before_the_record_is_read_from_its_history(tmp_path):
    """No refs/storm/integrated (initialised by an older storm): the last branch commit
    the shared workspace holds is read from the history (the manager's last commit,
    by its Storm-Workspace trailer; else where the histories meet), then recorded."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "commit", "-m", "first", agent="manager").returncode == 0
    git(repo, "update-ref", "-d", "refs/storm/integrated")
    (repo / "README.md").write_text("# by hand\n")
    git(repo, "commit", "-q", "--no-verify", "-am", "by hand")
    assert storm(repo, "write", "src/util.py", input="x = 2\n", agent="engineer_1").returncode == 0
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["branch_news"]["count"] == 1 and st["branch_news"]["commits"][0].endswith("by hand")
    assert storm(repo, "commit", "-m", "second", agent="manager").returncode == 0
    assert show(repo, "HEAD", "README.md") == b"# by hand\n" and show(repo, "HEAD", "src/util.py") == b"x = 2\n"
    assert rev(repo, "refs/storm/integrated") == rev(repo, "HEAD")
    # never committed by a manager: where the histories meet (init's HEAD)
    repo2 = make_repo(tmp_path / "r2")
    git(repo2, "update-ref", "-d", "refs/storm/integrated")
    (repo2 / "README.md").write_text("# by hand\n")
    git(repo2, "commit", "-q", "--no-verify", "-am", "by hand")
    assert json.loads(storm(repo2, "status", "--json").stdout)["branch_news"]["count"] == 1


def test_a_branch_rewritten_past_what_storm_held_is_refused(tmp_path):
    """A history rewrite (here an orphan branch without README.md, as `git filter-repo`
    leaves one): no merge base, so no 'news'; committing the shared tree on top would
    bring README.md back. Refused, exit 3, until the record says storm holds it."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_1").returncode == 0
    git(repo, "checkout", "-q", "--orphan", "clean")
    git(repo, "rm", "-q", "--cached", "README.md")
    git(repo, "commit", "-q", "--no-verify", "-m", "rewritten without README")
    before = rev(repo, "HEAD")
    code, err = storm_json(repo, "commit", "-m", "integrate", agent="manager")
    assert code == 3 and err["error"]["kind"] == "branch_unrelated", err
    assert "update-ref refs/storm/integrated clean" in err["error"]["hint"] and rev(repo, "HEAD") == before
    git(repo, "update-ref", "refs/storm/integrated", "clean")
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    assert show(repo, "HEAD", "src/util.py") == b"x = 1\n"
