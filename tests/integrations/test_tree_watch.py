"""The resident process's watch of the working tree: a snapshot it answers finds
exactly what a walk finds, and every way the watch can miss something makes the
next snapshot walk instead: a queue overflow, more changed paths than the watch
keeps, a change made while the resident process is stopped or not running, an
ignore file or the configuration changed, a nested repository.

Real processes throughout: the installed ``git-storm``, the daemon it starts,
real inotify, real signals. Each daemon-served answer is compared with the same
command run in its own process (``STORM_NO_DAEMON=1``, which always walks). How a
snapshot was found is read from storm's record of it (``.git/storm/exec-watch``)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon_helpers import cli, daemon_env, daemons_of, stop, wait_daemon, wait_gone
from helpers import git, strace_works

REPO_FILES = {"src/api.py": "def fetch(url):\n    return url\n", "src/util.py": "X = 1\n",
              "docs/a.md": "# a\n", "docs/deep/b.md": "# b\n", ".gitignore": "*.o\nbuild/\n"}


@pytest.fixture
def drepo(repo: Path):
    yield repo
    for pid in daemons_of(repo):
        stop(pid)


def served(repo: Path, **extra: str) -> tuple[dict[str, str], int]:
    env = daemon_env(STORM_AGENT="w1", **extra)
    cli(repo, "status", env=env)
    pid = wait_daemon(repo, env=env)
    r = cli(repo, "status", env=env)  # a snapshot under the daemon's token from here on
    assert r.code == 0, r.err
    # a walk, or the watch when the first call, in its own process, already found the
    # daemon it started up and walked under its token (a slow machine)
    assert how(repo) in ("walk", "watch")
    return env, pid


def how(repo: Path) -> str | None:
    p = repo / ".git" / "storm" / "exec-watch"
    return json.loads(p.read_text())["how"] if p.exists() else None


def status(repo: Path, env: dict[str, str]) -> bytes:
    r = cli(repo, "status", "--json", env=env)
    assert r.code == 0, r.err
    return r.out


def walked(repo: Path) -> bytes:
    return status(repo, daemon_env(STORM_AGENT="w1", STORM_NO_DAEMON="1"))


def same_as_walk(repo: Path, env: dict[str, str], expect_how: str | tuple[str, ...]) -> dict:
    got = status(repo, env)
    assert how(repo) in ((expect_how,) if isinstance(expect_how, str) else expect_how)
    assert got == walked(repo)
    return json.loads(got)


def unmediated(st: dict) -> set[str]:
    return {e["path"] for e in st.get("unmediated", [])}


def test_watched_snapshots_find_what_a_walk_finds(drepo: Path):
    env, _ = served(drepo)
    st = same_as_walk(drepo, env, "watch")
    assert unmediated(st) == set()
    (drepo / "src" / "api.py").write_text("changed\n")
    (drepo / "new.txt").write_text("new\n")
    (drepo / "x.o").write_text("ignored\n")
    (drepo / "docs" / "a.md").unlink()
    os.makedirs(drepo / "fresh" / "inner")
    (drepo / "fresh" / "inner" / "f.py").write_text("f\n")
    (drepo / "build").mkdir()
    (drepo / "build" / "out.txt").write_text("ignored\n")
    st = same_as_walk(drepo, env, "watch")
    assert unmediated(st) == {"src/api.py", "new.txt", "docs/a.md", "fresh/inner/f.py"}
    os.rename(drepo / "docs", drepo / "moved")  # a directory moved: its files gone here, there untracked
    (drepo / "moved" / "deep" / "c.md").write_text("c\n")  # inside the moved directory, after the move
    st = same_as_walk(drepo, env, "watch")
    assert {"docs/a.md", "docs/deep/b.md", "moved/deep/b.md", "moved/deep/c.md"} <= unmediated(st)
    os.rename(drepo / "moved", drepo / "docs")
    (drepo / "docs" / "deep" / "c.md").unlink()
    (drepo / "docs" / "a.md").write_text("# a\n")
    for p in ("new.txt", "x.o"):
        (drepo / p).unlink()
    subprocess.run(["rm", "-rf", str(drepo / "fresh")], check=True)
    (drepo / "src" / "api.py").write_text("def fetch(url):\n    return url\n")
    (drepo / "src" / "util.py").chmod(0o755)  # the exec bit alone
    st = same_as_walk(drepo, env, "watch")
    assert unmediated(st) == {"src/util.py"}


def test_a_change_made_while_the_daemon_is_stopped_is_seen(drepo: Path):
    env, pid = served(drepo)
    os.kill(pid, signal.SIGSTOP)
    try:
        (drepo / "src" / "util.py").write_text("X = 2\n")
        os.makedirs(drepo / "made" / "while")
        (drepo / "made" / "while" / "stopped.py").write_text("s\n")
    finally:
        os.kill(pid, signal.SIGCONT)
    st = same_as_walk(drepo, env, "watch")  # the kernel queued the events: the watch answers
    assert unmediated(st) == {"src/util.py", "made/while/stopped.py"}
    (drepo / "made" / "while" / "later.py").write_text("l\n")  # in the directory made while stopped
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"src/util.py", "made/while/stopped.py",
                                                             "made/while/later.py"}


def test_a_queue_overflow_makes_the_next_snapshot_walk(drepo: Path):
    env, pid = served(drepo)
    same_as_walk(drepo, env, "watch")
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    a, b = drepo / "src" / "api.py", drepo / "docs" / "a.md"
    os.kill(pid, signal.SIGSTOP)  # nothing reads the queue: it overflows
    try:
        for i in range(limit + 100):
            os.utime(a if i % 2 else b, ns=(i, i))  # alternating: the kernel merges no two events
        os.makedirs(drepo / "lost" / "dir")  # made while events were dropped: watched after the rebuild
        (drepo / "src" / "util.py").write_text("X = 3\n")
    finally:
        os.kill(pid, signal.SIGCONT)
    st = same_as_walk(drepo, env, "walk")
    assert unmediated(st) == {"src/util.py"}
    (drepo / "lost" / "dir" / "after.py").write_text("a\n")
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"src/util.py", "lost/dir/after.py"}


def test_more_changed_paths_than_the_watch_keeps_makes_it_walk(drepo: Path):
    env, _ = served(drepo, STORM_WATCH_MAX_CHANGED="3")
    same_as_walk(drepo, env, "watch")
    for i in range(5):
        (drepo / f"n{i}.txt").write_text(f"{i}\n")
    assert len(unmediated(same_as_walk(drepo, env, "walk"))) == 5
    (drepo / "n0.txt").unlink()
    assert len(unmediated(same_as_walk(drepo, env, "watch"))) == 4


def test_a_change_made_while_no_daemon_runs_is_seen(drepo: Path):
    env, pid = served(drepo)
    same_as_walk(drepo, env, "watch")
    stop(pid)
    wait_gone(pid)
    (drepo / "src" / "util.py").write_text("X = 4\n")
    cli(drepo, "status", env=env)  # runs itself, starts a new daemon: a new watch, another epoch
    wait_daemon(drepo, env=env)
    # a walk under the new epoch; or, when the new daemon was up before that first call
    # looked (a slow machine), that call walked under its token and this one is the watch's
    assert unmediated(same_as_walk(drepo, env, ("walk", "watch"))) == {"src/util.py"}
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"src/util.py"}


def test_ignore_rules_and_configuration_changes_make_it_walk(drepo: Path):
    env, _ = served(drepo)
    (drepo / "keep.log").write_text("l\n")
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"keep.log"}
    (drepo / ".gitignore").write_text("*.o\nbuild/\n*.log\n")
    assert unmediated(same_as_walk(drepo, env, "walk")) == {".gitignore"}
    (drepo / "info.tmp").write_text("t\n")
    assert unmediated(same_as_walk(drepo, env, "watch")) == {".gitignore", "info.tmp"}
    (drepo / ".git" / "info").mkdir(exist_ok=True)
    (drepo / ".git" / "info" / "exclude").write_text("*.tmp\n")  # outside the tree: its stat is compared
    assert unmediated(same_as_walk(drepo, env, "walk")) == {".gitignore"}
    git(drepo, "config", "storm.watch", "false")
    (drepo / "off.txt").write_text("o\n")
    status(drepo, env)
    assert how(drepo) == "walk"  # not asked: the record of the last look stays as it was
    assert unmediated(json.loads(status(drepo, env))) == {".gitignore", "off.txt"}


def test_a_nested_repository_is_found_as_a_walk_finds_it(drepo: Path):
    env, _ = served(drepo)
    git(drepo / "src", "init", "-q", "inner")  # a walk, or a listing of the new directory, finds it
    (drepo / "src" / "inner" / "f.py").write_text("f\n")
    st = status(drepo, env)
    assert st == walked(drepo) and b"src/inner" in st
    (drepo / "src" / "inner" / "g.py").write_text("g\n")  # inside the nested repository: not storm's
    assert same_as_walk(drepo, env, "watch") == json.loads(st)


def test_exec_through_the_daemon_records_what_the_command_changed(drepo: Path):
    env, _ = served(drepo)
    r = cli(drepo, "exec", "--json", "--", "sh", "-c", "echo changed > src/util.py; mkdir -p gen && echo g > gen/o.py",
            env=env)
    assert r.code == 0, r.err
    assert how(drepo) == "watch"  # the command's changes came from the watch, asked after it ran
    assert sorted(json.loads(r.out)["paths"]) == ["gen/o.py", "src/util.py"]
    assert (drepo / "src" / "util.py").read_text() == "changed\n"
    assert unmediated(same_as_walk(drepo, env, "watch")) == set()


def test_a_process_of_its_own_asks_the_running_daemon(drepo: Path):
    """The manager's commit runs in its own process: it asks the daemon's watch for
    the unmediated edits it reports; a stopped daemon that does not answer makes it walk."""
    env, pid = served(drepo)
    menv = dict(env, STORM_AGENT="manager")
    (drepo / "src" / "util.py").write_text("X = 5\n")
    r = cli(drepo, "commit", "-m", "one", env=menv)
    assert r.code == 0, r.err
    assert how(drepo) == "watch" and b"src/util.py" in r.out + r.err
    base = (drepo / ".git" / "storm" / "exec-watch").read_bytes()
    os.kill(pid, signal.SIGSTOP)
    try:
        (drepo / "src" / "api.py").write_text("changed\n")
        r = cli(drepo, "commit", "-m", "two", env=menv)
        assert r.code == 0, r.err
        assert b"src/api.py" in r.out + r.err  # found by a walk
        assert (drepo / ".git" / "storm" / "exec-watch").read_bytes() == base  # no token: the base stays
    finally:
        os.kill(pid, signal.SIGCONT)
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"src/util.py", "src/api.py"}


def test_a_file_become_a_directory_and_links_are_found_as_a_walk_finds_them(drepo: Path):
    env, _ = served(drepo)
    (drepo / "src" / "util.py").unlink()
    (drepo / "src" / "util.py").mkdir()
    (drepo / "src" / "util.py" / "inner.py").write_text("i\n")
    os.symlink("api.py", drepo / "src" / "link.py")
    os.symlink("../docs", drepo / "src" / "docs-link")  # a link to a directory: a link, never entered
    st = same_as_walk(drepo, env, "watch")
    assert {"src/util.py", "src/util.py/inner.py", "src/link.py", "src/docs-link"} <= unmediated(st)
    subprocess.run(["rm", "-rf", str(drepo / "src" / "util.py")], check=True)
    (drepo / "src" / "util.py").write_text("X = 1\n")
    (drepo / "src" / "link.py").unlink()
    assert unmediated(same_as_walk(drepo, env, "watch")) == {"src/docs-link"}


def no_watch_answer(repo: Path, env: dict[str, str]) -> dict:
    """A snapshot that asked the watch, got no answer (it keeps no token base) and
    walked: what a walk finds."""
    base = repo / ".git" / "storm" / "exec-watch"
    base.unlink(missing_ok=True)
    got = status(repo, env)
    assert not base.exists() and got == walked(repo)
    return json.loads(got)


@pytest.mark.skipif(not strace_works(), reason="needs strace with ptrace allowed")
def test_the_watch_limit_reached_makes_snapshots_walk_and_doctor_say_why(drepo: Path):
    """inotify_add_watch failing with ENOSPC (every watch of the user taken) for a
    directory made after the start: the watch gives no more answers, each snapshot
    walks, and doctor names the limit."""
    env, pid = served(drepo)
    same_as_walk(drepo, env, "watch")
    tracer = subprocess.Popen(["strace", "-qq", "-o", "/dev/null", "-p", str(pid), "-e", "trace=inotify_add_watch",
                               "-e", "inject=inotify_add_watch:error=ENOSPC"])
    try:
        deadline = time.monotonic() + 30
        while "TracerPid:\t0\n" in Path(f"/proc/{pid}/status").read_text():
            assert time.monotonic() < deadline and tracer.poll() is None, "strace never attached"
            time.sleep(0.02)
        os.makedirs(drepo / "past" / "limit")
        (drepo / "past" / "limit" / "f.py").write_text("f\n")
        assert unmediated(no_watch_answer(drepo, env)) == {"past/limit/f.py"}
    finally:
        tracer.terminate()
        tracer.wait(timeout=30)
    (drepo / "past" / "limit" / "g.py").write_text("g\n")  # in the directory never watched
    assert unmediated(no_watch_answer(drepo, env)) == {"past/limit/f.py", "past/limit/g.py"}
    r = cli(drepo, "doctor", "--json", env=daemon_env(STORM_NO_DAEMON="1"))
    found = [f for f in json.loads(r.out)["findings"] if f["kind"] == "tree_watch_unavailable"]
    assert len(found) == 1 and found[0]["detail"].startswith(
        "the resident process (pid %d) has no watch of the working tree: the inotify watch limit" % pid), r.out
