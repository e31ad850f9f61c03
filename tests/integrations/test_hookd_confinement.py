"""The hook daemon serves only callers confined exactly as it is: a sandboxed
caller (its own mount and network namespaces, a read-only ``.git``, a ``PATH``
to programs it wrote) never has its hook run outside the sandbox, and a caller
with other resource limits never has its hook run under the daemon's.

Real processes: the installed ``git-storm`` as a harness runs it, a sandbox made
by ``unshare -m -n`` (root only), limits set by the shell's ``ulimit``."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon_helpers import GIT_STORM, daemon_env, daemons_of, event, started, stop, wait_daemon


@pytest.fixture
def drepo(repo: Path):
    yield repo
    for pid in daemons_of(repo):
        stop(pid)


def _can_unshare() -> str | None:
    """Why a sandbox cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making a mount and network namespace needs root"
    if not shutil.which("unshare"):
        return "no unshare(1)"
    r = subprocess.run(["unshare", "-m", "-n", "true"], capture_output=True)
    return None if r.returncode == 0 else f"unshare -m -n fails here: {r.stderr.decode().strip()}"


SANDBOX = """set -e
mount --make-rprivate /
mount --bind "$REPO/.git" "$REPO/.git"
mount -o remount,bind,ro "$REPO/.git"
readlink /proc/self/ns/net > "$OUT/sandbox-net"
[ -n "$KEEP_PATH" ] || export PATH="$FAKE:$PATH"
exec "$@"
"""
FAKE_GIT = """#!/bin/sh
echo "$(readlink /proc/self/ns/net) $PPID $*" >> "$OUT/fake-git-ran"
exec {git} "$@"
"""
# a client that names the daemon of the host (what the ordinary client computes
# outside the sandbox), so the daemon's own check of its peer is what refuses it
FORGED = ("import sys; from storm_git.integrations import hookd_place, hook_client; "
          "name = open(sys.argv[1]).read(); hookd_place.name = lambda fp, env: name; "
          "sys.exit(hook_client.main([]))")


def _sandbox(repo: Path, out: Path, data: bytes, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """``argv`` run in a sandbox of Codex's Linux workspace-write shape: its own mount
    and network namespaces, ``.git`` read-only, ``PATH`` led by a directory it wrote."""
    fake = out / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "git").write_text(FAKE_GIT.format(git=shlex.quote(shutil.which("git") or "git")))
    (fake / "git").chmod(0o755)
    return subprocess.run(["unshare", "-m", "-n", "sh", "-c", SANDBOX, "sandbox", *argv], input=data, cwd=repo,
                          env=dict(env, REPO=str(repo), OUT=str(out), FAKE=str(fake)), capture_output=True,
                          timeout=60)


def _state(repo: Path) -> bytes:
    """Everything storm shares and records under the git dir."""
    refs = subprocess.run(["git", "for-each-ref"], cwd=repo, capture_output=True, check=True).stdout
    files = sorted((str(p.relative_to(repo)), p.read_bytes()) for p in (repo / ".git/storm").rglob("*")
                   if p.is_file() and "hookd" not in p.parts)
    return refs + repr(files).encode()


CALLS = {
    "Bash before the tool (runs git)": ("PreToolUse", "Bash", {"command": "ls"}),
    "Read after the tool (records it)": ("PostToolUse", "Read", {"file_path": "src/api.py"}),
}


@pytest.mark.parametrize("client", ["ordinary", "forged", "forged, the host's PATH"])
@pytest.mark.parametrize("call", list(CALLS))
def test_a_sandboxed_caller_never_has_its_hook_run_outside_the_sandbox(drepo: Path, tmp_path: Path, call: str,
                                                                       client: str) -> None:
    why = _can_unshare()
    if why:
        pytest.skip(why)
    env = daemon_env()
    host = started(drepo, env)  # a daemon of the host, started by an ordinary call outside
    if client.endswith("PATH"):  # only the confinement tells this caller from the host's
        env["KEEP_PATH"] = "1"
    name_file = tmp_path / "host-name"
    name_file.write_text(_host_name(env))
    name, tool, tool_input = CALLS[call]
    if "file_path" in tool_input:
        tool_input = {"file_path": str(drepo / tool_input["file_path"])}
    data = event(drepo, name, tool, tool_input, "s1")
    argv = [GIT_STORM, "harness", "hook"] if client == "ordinary" else [_python(), "-c", FORGED, str(name_file)]
    alone = tmp_path / "alone"
    alone.mkdir()
    expected = _sandbox(drepo, alone, data, dict(env, STORM_NO_DAEMON="1"), *argv)
    assert expected.returncode == 0 and b"Read-only file system" in expected.stdout, expected
    before = _state(drepo)
    through = tmp_path / "through"
    through.mkdir()
    r = _sandbox(drepo, through, data, env, *argv)
    sandbox_net = (through / "sandbox-net").read_text().strip()
    ran = (through / "fake-git-ran").read_text().splitlines() if (through / "fake-git-ran").exists() else []
    outside = [line for line in ran if not line.startswith(sandbox_net + " ")]
    assert outside == [], f"the sandbox's git ran outside it: {outside}"
    assert (r.returncode, r.stdout) == (expected.returncode, expected.stdout), r.stderr
    assert _state(drepo) == before  # nothing landed in the read-only .git
    assert wait_daemon(drepo) == host  # the host's daemon still serves the host


def _python() -> str:
    import sys

    return sys.executable


def _host_name(env: dict[str, str]) -> str:
    import storm_git
    from storm_git.integrations import hookd_place

    fp = hookd_place.fingerprint(os.path.dirname(storm_git.__file__), storm_git.__version__)
    return hookd_place.name(fp, {os.fsencode(k): os.fsencode(v) for k, v in env.items()})


def test_a_caller_in_the_same_confinement_with_its_own_path_is_not_served_with_it(drepo: Path,
                                                                                    tmp_path: Path) -> None:
    """A client that names the daemon but sends another PATH (or LD_PRELOAD, or
    GIT_CONFIG_*): refused, so its hook runs in its own process, as without a daemon."""
    env = daemon_env()
    host = started(drepo, env)
    name_file = tmp_path / "host-name"
    name_file.write_text(_host_name(env))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text(FAKE_GIT.format(git=shlex.quote(shutil.which("git") or "git")))
    (fake / "git").chmod(0o755)
    data = event(drepo, "PreToolUse", "Bash", {"command": "ls"}, "s1")
    p = subprocess.Popen([_python(), "-c", FORGED, str(name_file)], cwd=drepo, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(env, PATH=f"{fake}:{env['PATH']}", OUT=str(tmp_path)))
    out, err = p.communicate(data, timeout=60)
    assert p.returncode == 0 and b"deny" not in out, (out, err)
    parents = {line.split()[1] for line in (tmp_path / "fake-git-ran").read_text().splitlines()}
    assert parents == {str(p.pid)}, "the fake git ran in a daemon's child, not in the caller's own process"
    assert wait_daemon(drepo) == host


def _write_1mib(repo: Path, use_id: str) -> bytes:
    """A PostToolUse Write of 1 MiB the harness has just written (incompressible:
    its blob is about as large)."""
    path = repo / f"big-{use_id}.bin"
    path.write_bytes(os.urandom(1 << 20).hex()[:1 << 20].encode())
    return event(repo, "PostToolUse", "Write", {"file_path": str(path), "content": ""}, use_id)


def _limited(repo: Path, data: bytes, env: dict[str, str], blocks: int | None) -> subprocess.CompletedProcess:
    """The hook run as a harness under ``ulimit -f BLOCKS`` (None: unlimited) runs it."""
    limit = f"ulimit -f {blocks}; " if blocks else ""
    return subprocess.run(["bash", "-c", f"{limit}exec {shlex.quote(GIT_STORM)} harness hook"], input=data, cwd=repo,
                          env=env, capture_output=True, timeout=60)


def _wait_for_daemon_of(repo: Path, known: set[int]) -> int:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = set(daemons_of(repo)) - known
        if new and any(_listening(pid) for pid in new):
            return next(pid for pid in new if _listening(pid))
        time.sleep(0.05)
    raise AssertionError("no second daemon came up")


def _listening(pid: int) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _fsize(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as fh:
        return next(line for line in fh if line.startswith("Max file size")).split()[3]


def _landed(repo: Path, name: str) -> bool:
    r = subprocess.run(["git", "ls-tree", "--name-only", "refs/storm/workspace", name], cwd=repo, capture_output=True)
    return r.stdout.strip() == name.encode()


def test_a_later_caller_is_never_held_to_the_first_callers_limits(drepo: Path) -> None:
    """The first call ran under ``ulimit -f 64`` (64 KiB) and started the daemon; a
    later session without that limit records a 1 MiB write, which lands."""
    env = daemon_env()
    _limited(drepo, event(drepo, "PreToolUse", "Read", {"file_path": str(drepo / "src/api.py")}, "w0"), env, 64)
    small = _wait_for_daemon_of(drepo, set())
    assert _fsize(small) == str(64 * 1024)
    r = _limited(drepo, _write_1mib(drepo, "late"), env, None)
    assert r.returncode == 0 and r.stdout == b"", (r.stdout, r.stderr)
    assert _landed(drepo, "big-late.bin")


def test_a_limited_caller_is_never_served_above_its_own_limits(drepo: Path) -> None:
    """A daemon started without limits; a caller under ``ulimit -f 64`` records a
    1 MiB write: refused as in its own process (the limit holds), never landed."""
    env = daemon_env()
    big = started(drepo, env)
    assert _fsize(big) == "unlimited"
    expected = _limited(drepo, _write_1mib(drepo, "alone"), dict(env, STORM_NO_DAEMON="1"), 64)
    assert json.loads(expected.stdout)["decision"] == "block" and b"cut short" in expected.stdout, expected
    r = _limited(drepo, _write_1mib(drepo, "tight"), env, 64)
    assert (r.returncode, r.stdout) == (expected.returncode, expected.stdout.replace(b"alone", b"tight")), r
    assert not _landed(drepo, "big-tight.bin")


@pytest.mark.parametrize("var", ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "GIT_CONFIG_COUNT", "GIT_EXEC_PATH",
                                 "PYTHONPATH", "HOME", "XDG_CONFIG_HOME", "BASH_ENV", "TMPDIR"])
def test_the_child_serves_no_caller_that_brings_its_own_programs_or_configuration(var: str) -> None:
    """The check the call's child makes, over a real socket whose peer is this
    process: the same confinement and environment is served; another value (or a
    variable the daemon does not have) of any that choose programs, libraries or
    git configuration is not; the agent id and other variables are the caller's."""
    import socket
    import sys

    from storm_git.integrations import hookd, hookd_peer

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        mine = hookd.Peer(hookd_peer.confinement() or (), hookd_peer.exec_env(os.environb))
        creds = a.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        caller = hookd.Caller(int.from_bytes(creds[:4], sys.byteorder), hookd_peer.boottime())

        def req(env: dict[bytes, bytes]) -> hookd.Request:
            return hookd.Request("", b"/", 0o22, [], [], [], env, b"", frozenset())

        env = dict(os.environb)
        assert hookd.serves(a, mine, caller, req(env))
        assert hookd.serves(a, mine, caller, req({**env, b"STORM_AGENT": b"someone-else", b"CLAUDE_SESSION": b"2"}))
        assert not hookd.serves(a, mine, caller, req({**env, var.encode(): b"/tmp/the-callers-own"}))
        assert not hookd.serves(a, hookd.Peer(mine.confinement[:-1] + (b"another label",), mine.exec_env), caller,
                                req(env))
        assert not hookd.serves(a, mine, hookd.Caller(0, caller.accepted), req(env))  # a pid it cannot see
    finally:
        a.close()
        b.close()
