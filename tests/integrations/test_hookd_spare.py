"""The daemon's spare, the next call's process forked before the call: it takes
the call, a new one is forked for the one after, and a spare killed, stopped or
outlived by its daemon never loses a call nor runs one twice.

Real processes: the installed ``git-storm``, the daemon it starts, the spare
found among the daemon's children by its process name."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from daemon_helpers import (
    GIT_STORM,
    alive,
    children,
    cli,
    comm,
    daemon_env,
    daemons_of,
    importtime_env,
    spare,
    stop,
    syscall_reading_stdin,
    wait_daemon,
    wait_gone,
)

NEW_API = b"def fetch(uri):\n    return http_get(uri)\n"


@pytest.fixture
def served(repo: Path):
    """(repo, a served caller's environment, the daemon's pid)."""
    env = importtime_env(daemon_env(STORM_AGENT="e9"))
    cli(repo, "status", env=env)
    pid = wait_daemon(repo, env=env)
    yield repo, env, pid
    for d in daemons_of(repo):
        stop(d)


def _writes(repo: Path, message: str) -> int:
    r = cli(repo, "log", "--json", env=daemon_env(STORM_NO_DAEMON="1"))
    assert r.code == 0, r.err
    return sum(1 for e in json.loads(r.out) if message in json.dumps(e))


def test_the_spare_takes_the_call_and_a_new_one_waits_for_the_next(served) -> None:
    repo, env, daemon = served
    assert cli(repo, "read", "src/api.py", env=env).code == 0
    ready = spare(daemon)
    client = subprocess.Popen([GIT_STORM, "write", "src/api.py", "-m", "by the spare"], cwd=repo, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not [k for k in children(daemon) if syscall_reading_stdin(k)]:
            assert time.monotonic() < deadline and client.poll() is None, "no call's process read the stdin"
            time.sleep(0.02)
        [reader] = [k for k in children(daemon) if syscall_reading_stdin(k)]
        assert reader == ready  # the verb runs in the process that was waiting for it
        following = spare(daemon)
        assert following != ready and alive(following)
    finally:
        out, err = client.communicate(NEW_API, timeout=60)
    assert client.returncode == 0 and out.startswith(b"accepted"), err
    assert (repo / "src/api.py").read_bytes() == NEW_API


def test_a_killed_spare_costs_nothing_the_call_is_forked_for(served) -> None:
    repo, env, daemon = served
    victim = spare(daemon)
    os.kill(victim, signal.SIGKILL)
    wait_gone(victim)
    r = cli(repo, "read", "src/api.py", env=env)
    assert r.code == 0 and r.served and r.out == b"def fetch(url):\n    return http_get(url)\n", r.err
    assert spare(daemon) != victim  # and the daemon keeps a spare again


def test_a_stopped_spare_makes_the_call_wait_and_never_run_twice(served) -> None:
    repo, env, daemon = served
    assert cli(repo, "read", "src/api.py", env=env).code == 0
    stopped = spare(daemon)
    os.kill(stopped, signal.SIGSTOP)
    try:
        t = time.monotonic()
        r = cli(repo, "write", "src/api.py", "-m", "once only", env=env, input=NEW_API)
        assert r.code == 0 and not r.served and time.monotonic() - t >= 2, r.err  # READY never came: ran itself
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_gone(stopped)  # it took the abandoned call, found its client gone, and ended
    assert _writes(repo, "once only") == 1
    assert (repo / "src/api.py").read_bytes() == NEW_API


def test_the_spare_ends_with_its_daemon(served) -> None:
    _repo, _env, daemon = served
    waiting = spare(daemon)
    os.kill(daemon, signal.SIGKILL)
    wait_gone(waiting, timeout=10)


def _private_dirty_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        return sum(int(line.split()[1]) for line in fh if line.startswith("Private_Dirty:"))


def _learned_kb(repo: Path) -> int:
    [f] = (repo / ".git" / "storm" / "hookd").glob("*.pages")
    return sum(int(b, 16) - int(a, 16) for a, b in (ln.split() for ln in f.read_text().splitlines())) // 1024


def test_spares_copy_ahead_the_pages_calls_wrote_to(served) -> None:
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    repo, env, daemon = served
    assert cli(repo, "read", "src/api.py", env=env).code == 0  # its process lists the pages it wrote to
    deadline = time.monotonic() + 30
    while children(daemon) or not list((repo / ".git" / "storm" / "hookd").glob("*.pages")):
        assert time.monotonic() < deadline, "no call listed its pages"
        time.sleep(0.02)
    learned = _learned_kb(repo)
    assert learned > 256  # a call writes to a good part of what the daemon imported
    assert cli(repo, "read", "src/api.py", env=env).code == 0  # taken by a spare forked before the list
    waiting = spare(daemon)  # forked after it: copies what is listed
    while _private_dirty_kb(waiting) < learned * 0.8:
        assert time.monotonic() < deadline, (_private_dirty_kb(waiting), learned)
        time.sleep(0.05)
    while children(daemon):  # the calls' processes list their pages after their answer
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stop(daemon)
    assert not list((repo / ".git" / "storm" / "hookd").glob("*.pages"))  # the addresses were that daemon's


def test_any_page_list_is_safe(served) -> None:
    """The page list is only ever a spare's hint: garbage, ranges outside any
    mapping, or one over the whole address space cost time, never a call."""
    repo, env, daemon = served
    [lock] = (repo / ".git" / "storm" / "hookd").glob("*.lock")
    pages = lock.with_suffix(".pages")
    for content in (b"not hex at all\n\x00\xff\n", b"-1 5\nffffffffffffffff 0\n10 20 30\n", b"0 7fffffffffff\n"):
        pages.write_bytes(content)
        assert cli(repo, "read", "src/api.py", env=env).code == 0  # the spare forked after it reads this list
        after = spare(daemon)
        time.sleep(0.3)  # long enough to have read the list and copied what it names
        assert alive(after) and comm(after) == "storm-spare"
        r = cli(repo, "read", "src/api.py", env=env)
        assert r.code == 0 and r.served and r.out == b"def fetch(url):\n    return http_get(url)\n", r.err
