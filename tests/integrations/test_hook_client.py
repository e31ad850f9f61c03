"""The hook's client: the same answers through the daemon as without it, the
switches that turn it off, and failing closed when the call's process dies.

Real processes throughout: the installed ``git-storm`` with the event on stdin,
a real daemon, and its per-call child killed or stopped at a chosen moment."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from daemon_helpers import (
    alive,
    children,
    daemon_env,
    daemons_of,
    event,
    hook,
    listening_as_another_user,
    sockets,
    started,
    stop,
    wait_daemon,
    wait_gone,
)
from helpers import flock_waiters, git, hold, make_repo, release


@pytest.fixture
def drepo(repo: Path):
    yield repo
    for pid in daemons_of(repo):
        stop(pid)


def _edit(repo: Path, old: str, new: str) -> dict:
    return {"file_path": str(repo / "src/api.py"), "old_string": old, "new_string": new}


def _session(repo: Path, env: dict[str, str]) -> list[tuple[int, str, str]]:
    """A run of events two sessions send (reads, edits, a conflict refused with its
    diff, a shell command, a failed tool, bad input), each answer with the
    repository's path taken out."""
    api = str(repo / "src/api.py")
    calls = [
        (event(repo, "PostToolUse", "Read", {"file_path": api}, "r1", "sess-a"), ()),
        (event(repo, "PostToolUse", "Read", {"file_path": api}, "r2", "sess-b"), ()),
        (event(repo, "PreToolUse", "Edit", _edit(repo, "url", "uri"), "e1", "sess-b"), ()),
        ("disk", ()),
        (event(repo, "PostToolUse", "Edit", _edit(repo, "url", "uri"), "e1", "sess-b"), ()),
        (event(repo, "PreToolUse", "Edit", _edit(repo, "http_get", "get"), "e2", "sess-a"), ()),  # refused
        (event(repo, "PreToolUse", "Bash", {"command": "true"}, "b1", "sess-a"), ("--harness", "codex")),
        (event(repo, "PostToolUse", "Bash", {"command": "true"}, "b1", "sess-a"), ("--harness", "codex")),
        (event(repo, "PostToolUseFailure", "Write", {"file_path": str(repo / "new.py"), "content": "x"}, "w1"),
         ()),
        (b"not json", ()),
        (event(repo, "PreToolUse", "Edit", _edit(repo, "a", "b"), "e3"), ("--harness", "bogus")),
        (event(repo, "PreToolUse", "Edit", _edit(repo, "a", "b"), "e4"), ("--agent", "bad id")),
    ]
    out = []
    for data, args in calls:
        if data == "disk":  # the Edit tool's own write
            (repo / "src/api.py").write_text((repo / "src/api.py").read_text().replace("url", "uri"))
            continue
        r = hook(repo, data, env, *args)
        out.append((r.returncode, r.stdout.decode().replace(str(repo), "<repo>"),
                    r.stderr.decode().replace(str(repo), "<repo>")))
    return out


def test_the_daemon_answers_every_call_as_the_hook_in_its_own_process(tmp_path: Path) -> None:
    plain, served = make_repo(tmp_path / "a" / "repo"), make_repo(tmp_path / "b" / "repo")
    env = daemon_env()
    pid = started(served, env)
    try:
        without = _session(plain, dict(env, STORM_NO_DAEMON="1"))
        with_daemon = _session(served, env)
        assert with_daemon == without
        assert any("deny" in o and "uri" in o for _, o, _ in without)  # the conflict, with its diff
        assert wait_daemon(served) == pid  # the same daemon served them all
        assert git(served, "rev-parse", "refs/storm/workspace^{tree}").stdout == \
            git(plain, "rev-parse", "refs/storm/workspace^{tree}").stdout
    finally:
        stop(pid)


def test_through_the_daemon_the_client_imports_neither_pygit2_nor_the_hook(drepo: Path) -> None:
    env = daemon_env(PYTHONPROFILEIMPORTTIME="1")  # (a PYTHON* variable: a daemon of callers that set it)
    started(drepo, env)
    data = event(drepo, "PostToolUse", "Read", {"file_path": str(drepo / "src/api.py")}, "r1")
    served = hook(drepo, data, env)
    here = hook(drepo, data, dict(env, STORM_NO_DAEMON="1"))
    assert served.returncode == here.returncode == 0
    assert b"hook_client" in served.stderr and b"pygit2" not in served.stderr
    assert b"harness" not in served.stderr.replace(b"integrations.hook", b"")
    assert b"pygit2" in here.stderr


@pytest.mark.parametrize("switch", ["env", "repo config", "included config"])
def test_switched_off_no_daemon_starts_and_the_answer_is_the_same(drepo: Path, tmp_path: Path, switch: str) -> None:
    env = daemon_env()
    if switch == "env":
        env["STORM_NO_DAEMON"] = "1"
    elif switch == "repo config":
        git(drepo, "config", "storm.hookDaemon", "false")
    else:
        inc = tmp_path / "inc.config"
        inc.write_text("[storm]\n\thookDaemon = off\n")
        git(drepo, "config", "include.path", str(inc))
    data = event(drepo, "PostToolUse", "Read", {"file_path": str(drepo / "src/api.py")}, "r1")
    for _ in range(2):
        r = hook(drepo, data, env)
        assert r.returncode == 0 and r.stderr == b"", r.stderr
    time.sleep(1)
    assert daemons_of(drepo) == [] and sockets(drepo) == []
    if switch != "env":  # and back on: the next calls start one
        git(drepo, "config", "--unset", "storm.hookDaemon") if switch == "repo config" else \
            git(drepo, "config", "--unset", "include.path")
        hook(drepo, data, env)
        wait_daemon(drepo)


def _blocked_call(repo: Path, env: dict[str, str], data: bytes) -> tuple[subprocess.Popen, int, subprocess.Popen,
                                                                          int]:
    """A hook call through the daemon, held inside the hook at one of storm's locks;
    returns the client, the pid of the daemon's child running the call, the lock's
    holder and the daemon's pid."""
    daemon = started(repo, env)
    holder = hold(repo, "worktree", "workspace")
    client = subprocess.Popen(["git-storm", "harness", "hook"], cwd=repo, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdin is not None
    client.stdin.write(data)
    client.stdin.close()
    client.stdin = None  # communicate() must not flush it again
    locks = [repo / ".git/storm/locks" / n for n in ("worktree", "workspace")]
    deadline = time.monotonic() + 30
    while True:
        waiting = [k for k in children(daemon) if any(flock_waiters(lock, k) for lock in locks)]
        if waiting:
            break
        assert time.monotonic() < deadline and client.poll() is None, "the call never reached the lock"
        time.sleep(0.02)
    [child] = waiting
    return client, child, holder, daemon


@pytest.mark.parametrize("when", ["PreToolUse", "PostToolUse"])
def test_a_call_whose_process_is_killed_fails_closed(drepo: Path, when: str) -> None:
    env = daemon_env()
    data = event(drepo, when, "Edit", _edit(drepo, "url", "uri"), "e1")
    client, child, holder, _ = _blocked_call(drepo, env, data)
    try:
        os.kill(child, signal.SIGKILL)
        out, err = client.communicate(timeout=30)
    finally:
        release(holder)
    assert client.returncode == 0, err
    if when == "PreToolUse":
        assert b'"permissionDecision": "deny"' in out and b"died before it answered" in out
    else:
        assert b'"decision": "block"' in out and b"NOT part of the shared state" in out


def test_killing_the_daemon_mid_call_loses_nothing(drepo: Path) -> None:
    """The call's child runs on alone and answers its client; the next call starts
    a new daemon."""
    env = daemon_env()
    api = str(drepo / "src/api.py")
    data = event(drepo, "PostToolUse", "Read", {"file_path": api}, "r1")
    expected = hook(drepo, data, dict(env, STORM_NO_DAEMON="1"))
    client, child, holder, daemon = _blocked_call(drepo, env, data)
    os.kill(daemon, signal.SIGKILL)
    wait_gone(daemon)
    release(holder)
    out, err = client.communicate(timeout=30)
    assert (client.returncode, out) == (expected.returncode, expected.stdout), err
    again = hook(drepo, data, env)  # a stale socket: answered here, a new daemon started
    assert (again.returncode, again.stdout) == (expected.returncode, expected.stdout)
    assert wait_daemon(drepo) != daemon


def test_a_stopped_daemon_costs_time_not_a_second_run(drepo: Path, tmp_path: Path) -> None:
    """No READY in time: the client runs the call itself. The daemon, resumed, finds
    its client gone and does not run the call again."""
    log = tmp_path / "hook.log"
    env = daemon_env(STORM_HOOK_LOG=str(log))
    daemon = started(drepo, env)
    log.unlink(missing_ok=True)
    data = event(drepo, "PostToolUse", "Read", {"file_path": str(drepo / "src/api.py")}, "r1")
    os.kill(daemon, signal.SIGSTOP)
    try:
        t = time.monotonic()
        r = hook(drepo, data, env)
        assert r.returncode == 0 and time.monotonic() - t >= 2  # waited for READY, then ran here
    finally:
        os.kill(daemon, signal.SIGCONT)
    r2 = hook(drepo, data, env)  # queued after the abandoned connection, which the daemon took first
    assert r2.returncode == 0
    deadline = time.monotonic() + 30
    while any(alive(k) for k in children(daemon)):  # the abandoned connection's child too
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert len(log.read_text().splitlines()) == 2  # the call here and r2: the abandoned one never ran


def test_a_socket_of_another_user_is_never_used() -> None:
    """A listener of another uid at the daemon's path: the client hangs up at once,
    sends it nothing, and runs the call itself."""
    if os.getuid() != 0:
        pytest.skip("needs root to listen as another user")
    top = Path(tempfile.mkdtemp(prefix="hk", dir="/tmp"))  # short: the socket goes in the git dir
    top.chmod(0o755)  # the other user reaches the directory
    try:
        _imposter(make_repo(top / "r"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _imposter(drepo: Path) -> None:
    env = daemon_env()
    pid = started(drepo, env)
    [path] = sockets(drepo)
    assert path.parent == drepo / ".git/storm/hookd"
    stop(pid)
    os.chmod(drepo / ".git/storm/hookd", 0o777)
    with listening_as_another_user(path) as told:
        data = event(drepo, "PostToolUse", "Read", {"file_path": str(drepo / "src/api.py")}, "r1")
        r = hook(drepo, data, env)
        assert r.returncode == 0 and b"additionalContext" not in r.stderr
        assert os.read(told, 100) == b"got:"  # connected, checked, hung up: nothing sent


def test_two_sessions_calls_run_at_once_through_the_daemon(drepo: Path) -> None:
    """One call held inside the hook at a lock does not hold up another session's call:
    each call is its own forked process."""
    env = daemon_env()
    data = event(drepo, "PreToolUse", "Edit", _edit(drepo, "url", "uri"), "e1")
    client, child, holder, daemon = _blocked_call(drepo, env, data)
    try:
        other = hook(drepo, event(drepo, "PostToolUseFailure", "Bash", {"command": "false"}, "b1", "sess-b"), env,
                     timeout=30)
        assert other.returncode == 0 and b"hookEventName" in other.stdout, other.stderr  # answered
        assert client.poll() is None and child in children(daemon)  # still waiting at the lock
    finally:
        release(holder)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 0 and b"You had not read this file" in out, (out, err)  # its own decision, after


def test_a_call_with_its_own_home_is_served_by_a_daemon_that_reads_its_git_config(drepo: Path,
                                                                                   tmp_path: Path) -> None:
    """HOME chooses the git configuration a call reads (here a .gitconfig that caps
    file sizes, so a Write is refused): a caller with another HOME is never served by
    the daemon of the first; it gets one of its own, whose answer is the one a new
    process with the call's environment gives."""
    home = tmp_path / "home2"
    home.mkdir()
    (home / ".gitconfig").write_text("[storm]\n\tmaxFileBytes = 3\n")
    env = daemon_env(PYTHONPROFILEIMPORTTIME="1")
    first = started(drepo, env)
    call_env = {k: v for k, v in env.items() if k != "GIT_CONFIG_GLOBAL"}
    call_env["HOME"] = str(home)
    second = started(drepo, call_env)
    assert second != first and sorted(daemons_of(drepo)) == sorted([first, second])
    data = event(drepo, "PreToolUse", "Write", {"file_path": str(drepo / "new.py"), "content": "too long\n"}, "w1")
    served = hook(drepo, data, call_env)
    assert b"pygit2" not in served.stderr  # a daemon's child answered
    here = hook(drepo, data, dict(call_env, STORM_NO_DAEMON="1"))
    assert served.returncode == here.returncode == 0
    assert served.stdout == here.stdout and b"maxFileBytes" in here.stdout, here.stdout


def test_the_answer_is_encoded_as_the_clients_own_stdout_would(drepo: Path) -> None:
    """The child writes the answer with the client's stream encoding (here latin-1),
    byte for byte what the hook in its own process writes."""
    env = daemon_env(PYTHONIOENCODING="latin-1")
    started(drepo, env)
    git(drepo, "config", "storm.maxFileBytes", "3")
    data = event(drepo, "PreToolUse", "Write", {"file_path": str(drepo / "café.py"), "content": "too long"}, "w1")
    served = hook(drepo, data, env)
    here = hook(drepo, data, dict(env, STORM_NO_DAEMON="1"))
    assert (served.returncode, served.stdout, served.stderr) == (here.returncode, here.stdout, here.stderr)
    assert "é".encode("latin-1") in here.stdout and "é".encode() not in here.stdout
