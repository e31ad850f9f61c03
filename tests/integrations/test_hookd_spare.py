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


def _private_share(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        kb = {line.split(":")[0]: int(line.split()[1]) for line in fh if line.split()[-1:] == ["kB"]}
    return kb["Private_Dirty"] / kb["Rss"]


def test_the_spare_makes_its_pages_its_own_while_it_waits(served) -> None:
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux 5.14")
    _repo, _env, daemon = served
    waiting = spare(daemon)
    deadline = time.monotonic() + 30
    while _private_share(waiting) < 0.5:  # a spare fresh from fork shares nearly every page
        assert time.monotonic() < deadline, _private_share(waiting)
        time.sleep(0.05)
