"""``git storm merge --test CMD``: the test-gated merge queue (storm_git.worktree.queue).

Agents are merged in the order their work depends on each other (not by name), each
candidate is tested in a scratch worktree, a failing agent stays unmerged with its
output in the report and the log, and the scratch worktree goes away whatever happens
to the command or to storm."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import git, make_repo, ok as _ok, rev, show, storm, storm_json

FILES = {
    "lib/__init__.py": "",
    "lib/core.py": "def base():\n    return 1\n",
    "app/__init__.py": "",
    "app/main.py": "from lib.core import base\n\n\ndef run():\n    return base()\n",
    "notes.txt": "fine\n",
    "check.py": ("import sys\nimport app.main\n\nprint('run() =', app.main.run())\n"
                 "if 'BROKEN' in open('notes.txt').read():\n    print('notes are BROKEN', file=sys.stderr)\n"
                 "    sys.exit(5)\n"),
}
TEST = f"{sys.executable} check.py"


def _work(repo: Path, agent: str, path: str, content: str, glob: str) -> None:
    _ok(storm(repo, "spawn", agent))
    _ok(storm(repo, "assign", agent, glob))
    _ok(storm(repo, "write", path, input=content, agent=agent))
    _ok(storm(repo, "commit", "-m", f"{agent} work", agent=agent))


def _scratch(repo: Path) -> list[str]:
    root = repo / ".git" / "storm" / "scratch"
    listed = git(repo, "worktree", "list", "--porcelain").stdout.decode()
    return (sorted(os.listdir(root)) if root.exists() else []) + [ln for ln in listed.splitlines() if "scratch" in ln]


@pytest.fixture
def qrepo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "r", FILES)
    _ok(storm(repo, "mode", "worktree"))
    # a_app uses what z_lib adds: by name it would go first and fail; by dependency it goes after
    _work(repo, "a_app", "app/main.py",
          "from lib.core import base, extra\n\n\ndef run():\n    return base() + extra()\n", "app/**")
    _work(repo, "z_lib", "lib/core.py", "def base():\n    return 1\n\n\ndef extra():\n    return 2\n", "lib/**")
    _work(repo, "bad", "notes.txt", "BROKEN\n", "notes.txt")
    return repo


def test_queue_merges_passing_agents_in_dependency_order_and_keeps_the_failing_one_out(qrepo):
    before = rev(qrepo, "main")
    code, out = storm_json(qrepo, "merge", "--test", TEST)
    assert code == 1, out
    assert out["queue"]["order"] == ["bad", "z_lib", "a_app"]
    assert out["queue"]["depends_on"] == {"a_app": ["z_lib"]}
    assert out["merged"] == ["z_lib", "a_app"] and out["test_failed"] == ["bad"] and not out["ok"]
    bad = next(r for r in out["results"] if r["agent"] == "bad")
    assert bad["status"] == "test_failed" and bad["commit"] is None
    assert bad["test"]["returncode"] == 5 and "notes are BROKEN" in bad["test"]["tail"]
    assert all(r["test"]["passed"] for r in out["results"] if r["agent"] != "bad")
    # the target has the passing agents' work and not the failing one's
    assert rev(qrepo, "main") != before
    assert b"extra" in show(qrepo, "main", "app/main.py") and b"extra" in show(qrepo, "main", "lib/core.py")
    assert show(qrepo, "main", "notes.txt") == b"fine\n"
    r = subprocess.run([sys.executable, "check.py"], cwd=qrepo, capture_output=True)  # main's checkout passes
    assert r.returncode == 0 and b"run() = 3" in r.stdout
    # the output is in the log too
    code, log = storm_json(qrepo, "log")
    [ev] = [e for e in log if e["type"] == "merge" and e["agent"] == "bad"]
    assert ev["status"] == "test_failed" and "notes are BROKEN" in ev["test"]["tail"]
    text = storm(qrepo, "log").stdout
    assert "test failed" in text and "notes are BROKEN" in text
    assert _scratch(qrepo) == []


def test_without_the_dependency_order_the_dependent_agent_fails(qrepo):
    """The control: named in name order, a_app's candidate lacks extra() and fails."""
    r = storm(qrepo, "merge", "a_app", "z_lib", "--test", TEST)
    assert r.returncode == 1
    assert "test failed a_app" in r.stdout and "ImportError" in r.stdout and "merged      z_lib" in r.stdout
    assert "order (as named): a_app, z_lib" in r.stdout
    assert _scratch(qrepo) == []


def test_killed_or_timed_out_test_fails_the_agent_and_removes_the_scratch_worktree(qrepo):
    code, out = storm_json(qrepo, "merge", "z_lib", "--test", "kill -9 $$")
    assert code == 1 and out["test_failed"] == ["z_lib"]
    assert out["results"][0]["test"]["returncode"] == -9
    assert _scratch(qrepo) == []
    t0 = time.monotonic()
    code, out = storm_json(qrepo, "merge", "z_lib", "--test", "sleep 60", "--test-timeout", "1")
    assert code == 1 and out["results"][0]["test"]["timed_out"] and time.monotonic() - t0 < 30
    assert _scratch(qrepo) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_storm_interrupted_during_a_test_removes_the_scratch_worktree_and_the_test(qrepo, tmp_path, sig):
    pidfile = tmp_path / "pid"
    before = rev(qrepo, "main")
    env = dict(os.environ)
    env.pop("STORM_AGENT", None)
    # Ctrl-C reaches a foreground job, whose SIGINT is at its default: restore it, since
    # a test run started as a background job (`cmd &` in a script) inherits it ignored
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "merge", "z_lib", "--test", f"echo $$ > {pidfile}; sleep 60"],
                         cwd=qrepo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.exists(), p.communicate(timeout=30)
    assert len(_scratch(qrepo)) == 2  # the directory and git's record of it
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    pid = int(pidfile.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the test command outlived storm")
    assert _scratch(qrepo) == [] and rev(qrepo, "main") == before


def test_leftover_of_a_killed_storm_is_removed_by_the_next_queue(qrepo):
    root = qrepo / ".git" / "storm" / "scratch"
    leftover = root / "999999999-z_lib-deadbeef"  # named after a pid that is not running
    _ok(git(qrepo, "worktree", "add", "--detach", "--quiet", str(leftover), "main"))
    assert len(_scratch(qrepo)) == 2
    code, out = storm_json(qrepo, "merge", "z_lib", "--test", "true")
    assert code == 0 and out["merged"] == ["z_lib"]
    assert _scratch(qrepo) == []


def test_merge_without_test_is_unchanged(qrepo):
    code, out = storm_json(qrepo, "merge", "--dry-run")
    assert code == 0 and "queue" not in out and "test_failed" not in out
    assert [r["agent"] for r in out["results"]] == ["a_app", "z_lib", "bad"]  # order of completion
    assert json.dumps(out)  # plain data
