"""The agent verbs through the resident process: the same bytes and exit codes as
``git storm`` in its own process, and the same guarantees when the daemon is
absent, stale, stopped or killed, when the client is interrupted or killed, and
when another user listens at the socket.

Real processes throughout: the installed ``git-storm`` console script, the
daemon it starts, its per-call children found by pid. A client served by the
daemon is told from one that ran the verb itself by its peak memory (pygit2 and
click never imported, in its import-time report)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from daemon_helpers import (
    GIT_STORM,
    Ran,
    alive,
    children,
    cli,
    daemon_env,
    daemons_of,
    importtime_env,
    listening_as_another_user,
    sockets,
    stop,
    syscall_reading_stdin,
    wait_daemon,
    wait_gone,
)
from helpers import make_repo

NEW_API = b"def fetch(uri):\n    return http_get(uri)\n"


@pytest.fixture
def drepo(repo: Path):
    yield repo
    for pid in daemons_of(repo):
        stop(pid)


def served_env(repo: Path) -> tuple[dict[str, str], int]:
    """The environment of a caller the daemon serves, and the daemon's pid (the
    first call starts it)."""
    env = importtime_env(daemon_env(STORM_AGENT="e9"))
    cli(repo, "status", env=env)
    return env, wait_daemon(repo, env=env)


@pytest.fixture(params=["in-process", "daemon"])
def path(request: pytest.FixtureRequest, drepo: Path) -> dict[str, str]:
    """A caller's environment for each way a verb runs: STORM_NO_DAEMON=1, or a
    started daemon."""
    if request.param == "in-process":
        return importtime_env(daemon_env(STORM_AGENT="e9", STORM_NO_DAEMON="1"))
    return served_env(drepo)[0]


def _cases() -> list[tuple[tuple[str | bytes, ...], bytes | None]]:
    binary = bytes(range(256)) * 3 + b"\xff\xfe not utf-8\n"
    return [
        (("read", "src/api.py", "--agent", "e1"), None),
        (("read", "src/api.py", "README.md", "--json", "--agent", "e2"), None),
        (("read", "missing.py", "--agent", "e1"), None),
        (("read", "--bogus"), None),
        (("read", b"\xff.py", "--agent", "e1"), None),
        (("read", "--help"), None),
        (("write", "src/api.py", "-m", "e1: uri", "--agent", "e1"), NEW_API),
        (("write", "src/api.py", "-m", "e2: stale", "--agent", "e2"), b"x = 1\n"),  # rejected: e2 read the old one
        (("write", "src/data.bin", "-m", "bytes", "--agent", "e1"), binary),
        (("read", "src/data.bin", "--agent", "e1"), None),
        (("write", "src/api.py", "--agent", "e1"), b""),  # empty stdin: refused
        (("edit", "src/client.py", "--old", "fetch(url)", "--new", "fetch(url)  # e1", "-m", "e1", "--agent", "e1"),
         None),
        (("edit", "src/client.py", "--old", "not there", "--new", "y", "--agent", "e1"), None),
        (("rm", "src/util.py", "-m", "e1: unused", "--agent", "e1"), None),
        (("status",), None),
        (("status", "-v", "--json"), None),
        (("log",), None),
        (("log", "--json", "-n", "2"), None),
        (("release", "src/api.py", "--agent", "e2"), None),
        (("forget", "--all", "--agent", "e1"), None),
        (("exec", "--agent", "e1", "-m", "e1: made", "--", "sh", "-c", "cat > src/made.txt; echo out; echo err >&2; "
          "exit 3"), b"from stdin\n"),
        (("exec", "--agent", "e1", "--", "no-such-program-here"), None),
        (("status", "--json"), None),
    ]


HEX = re.compile(rb"\b[0-9a-f]{7,40}\b")
CLOCK = re.compile(rb"\d+\.\d+|\d\d:\d\d:\d\d|\b20\d\d-\d\d-\d\dT[0-9:.+Z-]+")  # seconds left on a reservation, times


def _transcript(repo: Path, env: dict[str, str]) -> tuple[list[tuple[int, bytes, bytes]], list[Ran]]:
    """Every case's exit code and output, with the repository's path taken out and
    each commit or version id numbered by first appearance (commit ids hold the
    clock's seconds), and times taken out."""
    ids: dict[bytes, bytes] = {}

    def norm(b: bytes) -> bytes:
        b = CLOCK.sub(b"<t>", b.replace(str(repo).encode(), b"<repo>"))
        return HEX.sub(lambda m: ids.setdefault(m.group(0), b"<id%d>" % len(ids)), b)

    runs = [cli(repo, *args, env=env, input=data) for args, data in _cases()]
    return [(r.code, norm(r.out), norm(r.err)) for r in runs], runs


def test_every_verb_answers_through_the_daemon_as_in_its_own_process(tmp_path: Path) -> None:
    plain, served = make_repo(tmp_path / "a" / "repo"), make_repo(tmp_path / "b" / "repo")
    env, pid = served_env(served)
    try:
        without, here = _transcript(plain, dict(env, STORM_NO_DAEMON="1"))
        with_daemon, runs = _transcript(served, env)
        assert [r.served for r in runs] == [True] * len(runs)  # all of them
        assert not any(r.served for r in here)
        for case, a, b in zip(_cases(), without, with_daemon, strict=True):
            assert b == a, case
        codes = [c for c, _, _ in without]
        assert codes == [0, 0, 0, 2, 2, 0, 0, 1, 0, 0, 2, 1, 2, 1, 0, 0, 0, 0, 0, 0, 3, 127, 0], without
        assert runs[9].out == _cases()[8][1]  # binary content, byte for byte
        assert b"from stdin" in (served / "src/made.txt").read_bytes()  # exec's command read the caller's stdin
        assert wait_daemon(served, env=env) == pid  # one daemon served them all
    finally:
        stop(pid)


def _reader(repo: Path, env: dict[str, str], client: subprocess.Popen) -> int:
    """The pid of the process that reads the client's stdin (the client itself, or
    the daemon's child running its verb), once it blocks there."""
    deadline = time.monotonic() + 30
    while True:
        pids = [client.pid] + [k for d in daemons_of(repo) for k in children(d)]
        reading = [p for p in pids if syscall_reading_stdin(p)]
        if reading:
            return reading[0]
        assert time.monotonic() < deadline and client.poll() is None, "the verb never read its stdin"
        time.sleep(0.02)


def _streamed_write(repo: Path, env: dict[str, str], sigint=signal.SIG_DFL) -> tuple[subprocess.Popen, int]:
    """A ``write`` whose stdin has delivered half its content and waits for more.
    ``sigint``: its SIGINT at start, the default as in a foreground job (this test may
    run in a background job, whose children start with it ignored)."""
    assert cli(repo, "read", "src/api.py", "--agent", "e1", env=env).code == 0
    client = subprocess.Popen([GIT_STORM, "write", "src/api.py", "-m", "half", "--agent", "e1"], cwd=repo, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    assert client.stdin is not None
    client.stdin.write(NEW_API[:10])
    client.stdin.flush()
    return client, _reader(repo, env, client)


def _no_report(err: bytes) -> bytes:
    """``err`` without the import-time report."""
    return b"".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith(b"import time:"))


def _unchanged(repo: Path) -> bool:
    r = cli(repo, "read", "src/api.py", "--agent", "e1", env=daemon_env(STORM_NO_DAEMON="1"))
    log = cli(repo, "log", "--json", env=daemon_env(STORM_NO_DAEMON="1"))
    return r.code == 0 and r.out == b"def fetch(url):\n    return http_get(url)\n" and b"half" not in log.out


def _finish(client: subprocess.Popen, rest: bytes) -> tuple[bytes, bytes]:
    assert client.stdin is not None
    try:
        client.stdin.write(rest)
        client.stdin.close()
    except BrokenPipeError:
        pass
    client.stdin = None
    return client.communicate(timeout=60)


def _children_gone(repo: Path, daemons: list[int]) -> None:
    deadline = time.monotonic() + 30
    while any(alive(k) for d in daemons for k in children(d)):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_ctrl_c_during_a_streamed_write_writes_nothing(drepo: Path, path: dict[str, str]) -> None:
    client, _ = _streamed_write(drepo, path)
    client.send_signal(signal.SIGINT)
    out, err = _finish(client, NEW_API[10:])
    assert (client.returncode, out, _no_report(err)) == (130, b"", b"\naborted\n")  # click's newline, then main's word
    _children_gone(drepo, daemons_of(drepo))
    assert _unchanged(drepo)


def test_a_client_started_with_ctrl_c_ignored_ignores_it_both_ways(drepo: Path, path: dict[str, str]) -> None:
    """Under nohup (or in a shell's background job) SIGINT is ignored from the start:
    the verb then ignores a Ctrl-C in its own process, and the client does not
    forward it to the daemon's child either."""
    client, _ = _streamed_write(drepo, path, sigint=signal.SIG_IGN)
    client.send_signal(signal.SIGINT)
    out, err = _finish(client, NEW_API[10:])
    assert client.returncode == 0 and out.startswith(b"accepted"), err
    assert (drepo / "src/api.py").read_bytes() == NEW_API


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["", "sigint-ignored"])
def test_a_client_killed_during_a_streamed_write_leaves_no_write(drepo: Path, path: dict[str, str],
                                                                  sigint: signal.Handlers) -> None:
    """Killed, the client's verb stops, whether or not it ignores Ctrl-C (the daemon's
    child then ignores it too, and is stopped all the same)."""
    client, reader = _streamed_write(drepo, path, sigint=sigint)
    client.kill()
    _finish(client, NEW_API[10:])  # the rest arrives after the client died
    wait_gone(reader)
    assert _unchanged(drepo)


def _ignored(status: bytes) -> set[int]:
    """The signals ``/proc/PID/status`` says its process ignores."""
    mask = next(int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith(b"SigIgn:"))
    return {sig for sig in (signal.SIGINT, signal.SIGQUIT) if mask & (1 << (sig - 1))}


def test_a_command_exec_runs_ignores_the_signals_its_caller_ignores_and_no_others(drepo: Path) -> None:
    """Under nohup or in a shell's background job a command starts with SIGINT (and
    there SIGQUIT) ignored; ``git storm exec`` hands that on through the daemon as in
    its own process. The daemon is started by such a caller here: what it inherited
    is not handed to the next caller's command."""
    both = (signal.SIGINT, signal.SIGQUIT)
    own = importtime_env(daemon_env(STORM_AGENT="e1", STORM_NO_DAEMON="1"))
    served = importtime_env(daemon_env(STORM_AGENT="e1"))
    assert cli(drepo, "status", env=served, ignoring=both).code == 0
    wait_daemon(drepo, env=served)
    for ignoring in (both, (signal.SIGINT,), ()):
        for env in (own, served):
            r = cli(drepo, "exec", "--agent", "e1", "--", "cat", "/proc/self/status", env=env, ignoring=ignoring)
            assert r.code == 0 and r.served == (env is served), r.err
            assert _ignored(r.out) == set(ignoring), (ignoring, r.served)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_the_daemon_killed_or_stopped_during_a_call_loses_nothing(drepo: Path, how: signal.Signals) -> None:
    env, daemon = served_env(drepo)
    client, reader = _streamed_write(drepo, env)
    assert reader != client.pid
    os.kill(daemon, how)
    try:
        out, err = _finish(client, NEW_API[10:])
    finally:
        os.kill(daemon, signal.SIGCONT)
    assert client.returncode == 0 and out.startswith(b"accepted: src/api.py"), err
    r = cli(drepo, "read", "src/api.py", env=env)
    assert r.code == 0 and r.out == NEW_API


def test_the_calls_process_killed_says_so_and_half_of_nothing_is_written(drepo: Path) -> None:
    env, _ = served_env(drepo)
    client, reader = _streamed_write(drepo, env)
    os.kill(reader, signal.SIGKILL)
    out, err = _finish(client, NEW_API[10:])
    assert client.returncode == 4 and out == b""
    err = _no_report(err)
    assert err.startswith(b"git storm: the command's process ended before it finished") and err.count(b"\n") == 1
    assert _unchanged(drepo)


def test_a_killed_daemon_between_calls_costs_one_call_in_its_own_process(drepo: Path) -> None:
    env, daemon = served_env(drepo)
    os.kill(daemon, signal.SIGKILL)
    wait_gone(daemon)
    r = cli(drepo, "read", "src/api.py", env=env)
    assert r.code == 0 and r.out.startswith(b"def fetch(url)") and not r.served
    assert wait_daemon(drepo, env=env) != daemon  # and it started the next one
    r = cli(drepo, "read", "src/api.py", env=env)
    assert r.code == 0 and r.out.startswith(b"def fetch(url)") and r.served


def test_a_stopped_daemon_costs_time_not_a_second_run(drepo: Path) -> None:
    env, daemon = served_env(drepo)
    assert cli(drepo, "read", "src/api.py", env=env).code == 0
    os.kill(daemon, signal.SIGSTOP)
    try:
        t = time.monotonic()
        r = cli(drepo, "write", "src/api.py", "-m", "once", env=env, input=NEW_API)
        assert r.code == 0 and not r.served and time.monotonic() - t >= 2, r.err
    finally:
        os.kill(daemon, signal.SIGCONT)
    _children_gone(drepo, [daemon])  # the abandoned call's child, resumed, finds its client gone
    log = cli(drepo, "log", "--json", env=env)
    assert log.code == 0 and log.out.count(b'"once') == 1 and log.served


def test_a_stale_daemon_is_never_used(drepo: Path, tmp_path: Path) -> None:
    """A copy of storm on PYTHONPATH stands for an installed package; changing one
    of its files is an upgrade: from then on no call reaches the old daemon."""
    import storm_git

    copy = tmp_path / "site" / "storm_git"
    shutil.copytree(os.path.dirname(storm_git.__file__), copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(__file__).resolve().parents[2] / "cli", copy / "cli",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = importtime_env(daemon_env(PYTHONPATH=str(copy.parent)))
    cli(drepo, "status", env=env)
    old = wait_daemon(drepo, env=env)
    r = cli(drepo, "read", "--bogus", env=env)
    assert r.code == 2 and r.err.startswith(b"git storm: ") and r.served
    app = copy / "cli" / "app.py"
    was = 'f"git storm: {message} ({hint})"'
    app.write_text(app.read_text().replace(was, 'f"git storm (new): {message} ({hint})"'))
    for _ in range(3):
        r = cli(drepo, "read", "--bogus", env=env)
        assert r.code == 2 and r.err.startswith(b"git storm (new): "), r.err
    wait_gone(old, timeout=15)


def test_a_socket_of_another_user_is_never_used() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to listen as another user")
    top = Path(tempfile.mkdtemp(prefix="cl", dir="/tmp"))  # short: the socket goes in the git dir
    top.chmod(0o755)
    try:
        repo = make_repo(top / "r")
        env, pid = served_env(repo)
        [sock] = sockets(repo, env)
        stop(pid)
        os.chmod(repo / ".git/storm/hookd", 0o777)
        with listening_as_another_user(sock) as told:
            r = cli(repo, "read", "src/api.py", env=env)
            assert r.code == 0 and r.out.startswith(b"def fetch(url)") and not r.served
            assert os.read(told, 100) == b"got:"  # connected, checked, hung up: nothing sent
    finally:
        for pid in daemons_of(top / "r"):
            stop(pid)
        shutil.rmtree(top, ignore_errors=True)
