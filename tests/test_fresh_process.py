"""The suite's storm() runs ``git storm`` as a process forked from the test worker
(tests/support/helpers.py, FRESH), not as a new interpreter. These tests run commands both
ways and require the same answers, so that the faster way stays a faithful one."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import storm

CASES = [
    ("--help",),
    ("read", "src/api.py", "--json"),
    ("read", "src/api.py"),
    ("write", "../outside.py"),  # exit 2, one line
    ("write", "src/api.py", "--agent", "bad id"),  # exit 2
    ("log", "-n", "1", "--json"),
    ("doctor", "--json"),
    ("no-such-command",),
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(a) for a in CASES])
def test_a_forked_call_answers_as_a_new_interpreter_does(repo: Path, args: tuple[str, ...]) -> None:
    fresh = storm(repo, *args, agent="e1", input="x\n", fresh=True)
    forked = storm(repo, *args, agent="e1", input="x\n")
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_outside_a_repository_both_ways(tmp_path: Path) -> None:
    fresh = storm(tmp_path, "status", fresh=True)
    forked = storm(tmp_path, "status")
    assert fresh.returncode == forked.returncode == 3
    assert forked.stderr == fresh.stderr and "not a git repository" in fresh.stderr


def test_a_forked_call_reads_the_global_git_config_of_its_own_environment(repo: Path, tmp_path: Path) -> None:
    """libgit2 reads HOME once, when it starts: the forked child must look where a new
    process with its environment would (here, a HOME whose .gitconfig caps file sizes)."""
    home = tmp_path / "home2"
    home.mkdir()
    (home / ".gitconfig").write_text("[storm]\n\tmaxFileBytes = 3\n")
    env = {"HOME": str(home), "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")}
    assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
    for fresh in (True, False):
        r = storm(repo, "write", "src/api.py", input="too long\n", agent="e1", env=env, fresh=fresh)
        assert r.returncode == 2 and "storm.maxFileBytes (3 bytes)" in r.stderr, (fresh, r.stderr)
    assert storm(repo, "write", "src/api.py", input="fine\n", agent="e1").returncode == 0


def test_a_forked_call_that_is_killed_is_reported_as_killed(repo: Path) -> None:
    r = storm(repo, "exec", "--", "sh", "-c", "kill -9 $PPID", agent="e1")
    assert r.returncode == -9
