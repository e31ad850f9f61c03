"""The suite's own shortcuts, checked against what they stand for, so that the faster
way stays a faithful one: storm() runs ``git storm`` as a process forked from the test
worker (tests/support/helpers.py, FRESH), not as a new interpreter, and these tests run
commands both ways and require the same answers; make_repo, seed and clone copy a
set-up made earlier in the worker, and these tests compare a copy with a build."""
from __future__ import annotations

from pathlib import Path

import pytest

import helpers
from helpers import git, storm
from servers import bare, clone, install_guard, seed

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


def _state(repo: Path) -> tuple:
    """All but the commit's time (a build made in another second has another commit id)."""
    return (repo.stat().st_mode, (repo / ".git").stat().st_mode,  # another user reaches it as it would a build
            git(repo, "for-each-ref", "--format=%(tree) %(subject) %(refname)").stdout,
            git(repo, "config", "--local", "--list").stdout,
            (repo / ".git" / "hooks" / "pre-commit").read_bytes(),
            git(repo, "status", "--porcelain", "--ignored").stdout)


def test_a_copied_repository_is_the_one_a_build_makes(tmp_path: Path) -> None:
    helpers.make_repo(tmp_path / "first")  # the worker's copy of these files exists now
    copied = helpers.make_repo(tmp_path / "copied")
    built = helpers._build_repo(tmp_path / "built", helpers.DEFAULT_FILES, True)
    for repo in (copied, built):  # before anything refreshes git's index (git status does)
        assert git(repo, "diff-files", "--name-only").stdout == b"", repo  # its stat data is the copy's
    assert _state(copied) == _state(built)
    for repo in (copied, built):
        assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
        r = storm(repo, "write", "src/api.py", input="changed\n", agent="e1")
        assert r.returncode == 0, r.stderr
        assert git(repo, "show", "refs/storm/workspace:src/api.py").stdout == b"changed\n"
        assert helpers.fsck(repo).returncode == 0


def test_a_directory_with_files_is_built_in_place_with_them(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "extra.txt").write_text("mine\n")
    repo = helpers.make_repo(tmp_path / "r")
    assert git(repo, "show", "HEAD:extra.txt").stdout == b"mine\n"


def test_a_copied_seed_and_clone_belong_to_their_own_server(tmp_path: Path) -> None:
    sites = []
    for name in ("one", "two"):  # the second is copied from the first
        base = tmp_path / name
        base.mkdir()
        srv = bare(base / "proj.git")
        install_guard(srv)
        url = f"file://{srv}"
        sites.append((srv, seed(base, url), clone(base, url, "b"), url))
    (srv1, a1, b1, url1), (srv2, a2, b2, url2) = sites
    assert git(b2, "config", "remote.origin.url").stdout.decode().strip() == url2
    assert git(a2, "config", "remote.origin.url").stdout.decode().strip() == url2
    for top in (srv2, a2 / ".git", b2 / ".git"):
        for f in top.rglob("*"):
            if f.is_file() and "logs" not in f.parts:  # reflogs keep a clone's message
                assert str(tmp_path / "one").encode() not in f.read_bytes(), f
    before = helpers.rev(srv1, "refs/storm/workspace")
    assert before == helpers.rev(srv2, "refs/storm/workspace")
    assert storm(b2, "read", "src/api.py", agent="e2").returncode == 0
    r = storm(b2, "write", "src/api.py", input="from two\n", agent="e2")
    assert r.returncode == 0, r.stderr
    assert git(srv2, "show", "refs/storm/workspace:src/api.py").stdout == b"from two\n"
    assert helpers.rev(srv1, "refs/storm/workspace") == before  # the first site's server is untouched
    assert storm(a2, "sync").returncode == 0
    assert (a2 / "src" / "api.py").read_text() == "from two\n"
