"""The hook daemon's life: one per repository and storm, started on demand by
the first call, replaced when killed or upgraded, gone when idle or when its git
dir goes, its socket somewhere private when the git dir's path is too long, and
nothing doctor calls damage.

Real processes: the installed ``git-storm`` as a harness runs it, the daemon it
starts, pids from the socket's peer credentials."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from daemon_helpers import (
    alive,
    daemon_env,
    daemons_of,
    event,
    hook,
    peer_pid,
    socket_of,
    started,
    stop,
    wait_daemon,
    wait_gone,
)
from helpers import make_repo, storm_json


@pytest.fixture
def drepo(repo: Path):
    yield repo
    for pid in daemons_of(repo):
        stop(pid)


def _read(repo: Path, use_id: str = "r1") -> bytes:
    return event(repo, "PostToolUse", "Read", {"file_path": str(repo / "src/api.py")}, use_id)


def test_clients_starting_at_once_start_one_daemon(drepo: Path) -> None:
    env = daemon_env()
    procs = [subprocess.Popen(["git-storm", "harness", "hook"], cwd=drepo, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(6)]
    for i, p in enumerate(procs):
        out, err = p.communicate(_read(drepo, f"r{i}"), timeout=60)
        assert p.returncode == 0, err
    pid = wait_daemon(drepo)
    deadline = time.monotonic() + 30
    while daemons_of(drepo) != [pid]:  # any other one gives up at the lock, without listening
        assert time.monotonic() < deadline, daemons_of(drepo)
        time.sleep(0.05)
    assert wait_daemon(drepo) == pid


def test_a_killed_daemon_is_replaced_and_its_socket_reused(drepo: Path) -> None:
    env = daemon_env()
    pid = started(drepo, env)
    sock = socket_of(drepo)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    deadline = time.monotonic() + 10  # (a call's child holds the listening socket for its first moment)
    while peer_pid(sock) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert sock.exists()  # a socket with no one behind it
    expected = hook(drepo, _read(drepo), dict(env, STORM_NO_DAEMON="1"))
    r = hook(drepo, _read(drepo), env)  # answered in its own process; starts a new daemon
    assert (r.returncode, r.stdout, r.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    new = wait_daemon(drepo)
    assert new != pid and daemons_of(drepo) == [new]


def test_an_idle_daemon_exits_and_removes_its_socket(drepo: Path) -> None:
    pid = started(drepo, daemon_env(STORM_HOOKD_IDLE="1"))
    wait_gone(pid, timeout=15)
    assert not socket_of(drepo).exists()


def test_a_daemon_exits_when_its_git_dir_goes(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    pid = started(repo, daemon_env())
    try:
        shutil.rmtree(repo / ".git")
        wait_gone(pid, timeout=15)
    finally:
        stop(pid)


def test_an_upgraded_storm_gets_a_new_daemon_and_the_old_one_exits(drepo: Path, tmp_path: Path) -> None:
    """A copy of storm on PYTHONPATH stands for an installed package; changing one of
    its files is an upgrade. No call reaches the old daemon after it."""
    import storm_git

    copy = tmp_path / "site"
    shutil.copytree(os.path.dirname(storm_git.__file__), copy / "storm_git",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = daemon_env(PYTHONPATH=str(copy))
    old = started(drepo, env)
    assert any(str(copy).encode() in x for x in _maps(old))  # the copy is what it runs
    r = hook(drepo, b"not json", env)
    assert r.returncode == 2 and r.stderr.startswith(b"git storm harness hook: "), r.stderr
    hm = copy / "storm_git" / "integrations" / "hook_main.py"
    hm.write_text(hm.read_text().replace('f"git storm harness hook: {what}"', 'f"git storm harness hook (new): {what}"'))
    for _ in range(3):  # at once, and from then on: never the old daemon's answer
        r = hook(drepo, b"not json", env)
        assert r.returncode == 2 and r.stderr.startswith(b"git storm harness hook (new): "), r.stderr
    wait_gone(old, timeout=15)  # it notices its files changed
    new = wait_daemon(drepo, env=env)
    assert new != old
    r = hook(drepo, b"not json", env)
    assert r.returncode == 2 and r.stderr.startswith(b"git storm harness hook (new): "), r.stderr
    stop(new)


def _maps(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read().split(b"\0")


def test_a_long_git_dir_path_puts_the_socket_in_a_private_directory(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / ("d" * 60) / "repo")
    private = Path(tempfile.mkdtemp(prefix="run", dir="/tmp"))  # short: the socket fits there
    env = daemon_env(XDG_RUNTIME_DIR=str(private))
    pid = started(repo, dict(env))
    try:
        sock = socket_of(repo, env)
        assert sock.parent == private / "storm-hookd" and stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert wait_daemon(repo, env=env) == pid
        r = hook(repo, _read(repo), env)
        assert r.returncode == 0, r.stderr
    finally:
        stop(pid)
    assert not sock.exists()
    shutil.rmtree(private)


def test_a_private_directory_open_to_others_gets_no_daemon(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / ("d" * 60) / "repo")
    run = Path(tempfile.mkdtemp(prefix="run", dir="/tmp"))
    (run / "storm-hookd").mkdir(parents=True)
    (run / "storm-hookd").chmod(0o777)
    env = daemon_env(XDG_RUNTIME_DIR=str(run))
    for i in range(2):
        r = hook(repo, _read(repo, f"r{i}"), env)
        assert r.returncode == 0, r.stderr
    time.sleep(2)
    assert not any(p for p in daemons_of(repo) if alive(p)) and not list((run / "storm-hookd").iterdir())
    shutil.rmtree(run)


def test_doctor_finds_nothing_wrong_with_a_daemons_files(drepo: Path) -> None:
    pid = started(drepo, daemon_env())
    code, rep = storm_json(drepo, "doctor", "--json")
    assert code == 0 and rep["findings"] == [], rep
    os.kill(pid, signal.SIGKILL)  # and what a killed one leaves
    wait_gone(pid)
    code, rep = storm_json(drepo, "doctor", "--json")
    assert code == 0 and rep["findings"] == [], rep


def test_the_daemon_started_by_a_call_holds_none_of_the_harness_pipes(drepo: Path) -> None:
    """A harness waits for the hook's stdout and stderr to close: the daemon the
    call starts in the background must not keep them open."""
    p = subprocess.Popen(["git-storm", "harness", "hook"], cwd=drepo, env=daemon_env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t = time.monotonic()
    p.communicate(_read(drepo), timeout=60)  # returns only once every holder closed them
    assert p.returncode == 0
    pid = wait_daemon(drepo)
    assert alive(pid) and time.monotonic() - t < 60
    assert os.getsid(pid) == pid  # its own session


def test_a_starting_daemon_removes_what_other_versions_left_unless_one_still_runs(drepo: Path) -> None:
    import fcntl

    d = drepo / ".git/storm/hookd"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("0000000000000001", "0000000000000002"):
        (d / f"{name}.lock").write_bytes(b"")
        (d / f"{name}.sock").write_bytes(b"")
    held = os.open(d / "0000000000000002.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # a daemon of another version, alive
    try:
        started(drepo, daemon_env())
        deadline = time.monotonic() + 10
        while (d / "0000000000000001.lock").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not (d / "0000000000000001.sock").exists()
        assert (d / "0000000000000002.lock").exists() and (d / "0000000000000002.sock").exists()
    finally:
        os.close(held)
