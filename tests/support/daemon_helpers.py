"""Running the harness hook as a harness does (the installed ``git-storm``, the
event on stdin) with the hook daemon on, and finding, stopping and killing the
daemon and its per-call children by pid."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

GIT_STORM = shutil.which("git-storm") or "git-storm"


def daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STORM_NO_DAEMON"}
    env["STORM_HOOKD_IDLE"] = "60"
    env.update(extra)
    return env


def event(repo: Path, name: str, tool: str, tool_input: dict, use_id: str, session: str = "sess-a") -> bytes:
    e = {"session_id": session, "cwd": str(repo), "hook_event_name": name, "tool_name": tool,
         "tool_input": tool_input, "tool_use_id": use_id, "permission_mode": "default"}
    if name == "PostToolUse":
        e["tool_response"] = {"success": True}
    return json.dumps(e).encode()


def hook(repo: Path, data: bytes, env: dict[str, str], *args: str, cwd: Path | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([GIT_STORM, "harness", "hook", *args], input=data, cwd=cwd or repo, env=env,
                          capture_output=True, timeout=timeout)


def socket_of(repo: Path, env: dict[str, str] | None = None) -> Path:
    """Where the daemon for ``repo`` of the storm that ``env`` runs listens."""
    import storm_git
    from storm_git.integrations import hookd_place

    package = os.path.dirname(storm_git.__file__)
    if env and env.get("PYTHONPATH"):  # a copy of storm there, in the tests of upgrades
        package = os.path.join(env["PYTHONPATH"], "storm_git")
    fp = hookd_place.fingerprint(package, storm_git.__version__)
    name = hookd_place.name(fp, {os.fsencode(k): os.fsencode(v) for k, v in (env or os.environ).items()})
    return Path(hookd_place.socket_path(str(repo / ".git"), name, env or os.environ))


def sockets(repo: Path, env: dict[str, str] | None = None) -> list[Path]:
    """The daemon's socket of ``repo``, when there is one."""
    p = socket_of(repo, env)
    return [p] if p.exists() else []


def peer_pid(path: Path | str) -> int | None:
    """The pid of the process listening on the unix socket ``path`` (None: none)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(str(path))
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return int.from_bytes(creds[:4], "little")
    except OSError:
        return None
    finally:
        s.close()


def wait_daemon(repo: Path, timeout: float = 30, env: dict[str, str] | None = None) -> int:
    """The pid of the repository's daemon, once it listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in sockets(repo, env):
            if p is not None and p.exists():
                pid = peer_pid(p)
                if pid:
                    return pid
        time.sleep(0.05)
    raise AssertionError(f"no hook daemon came up for {repo}")


def started(repo: Path, env: dict[str, str]) -> int:
    """A daemon for ``repo`` (one call starts it), and its pid."""
    hook(repo, event(repo, "PreToolUse", "Read", {"file_path": str(repo / "src/api.py")}, "warm"), env)
    return wait_daemon(repo, env=env)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    """The daemon's calls' processes: its children but the spare waiting for the next call."""
    return [k for k in all_children(pid) if comm(k) != "storm-spare"]


def all_children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def spare(pid: int, timeout: float = 30) -> int:
    """The pid of daemon ``pid``'s spare, once there is one."""
    deadline = time.monotonic() + timeout
    while True:
        found = [k for k in all_children(pid) if comm(k) == "storm-spare" and alive(k)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"daemon {pid} keeps no spare"
        time.sleep(0.02)


def stop(pid: int) -> None:
    """End a daemon this test started (by its pid)."""
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_gone(pid)


def daemons_of(repo: Path) -> list[int]:
    """Live daemon processes started for ``repo`` (from their command lines)."""
    common = str(repo / ".git")
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if any(b"integrations.hookd import main" in a for a in argv) and common.encode() in argv and alive(int(d)):
            out.append(int(d))
    return [p for p in out if _parent(p) not in out]  # a call's forked child shares its daemon's command line


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Ran:
    """One ``git storm`` run: exit code, output bytes, and the modules it imported
    when PYTHONPROFILEIMPORTTIME=1 (its report is taken out of ``err``)."""
    code: int
    out: bytes
    err: bytes
    imported: set[str]

    @property
    def served(self) -> bool:
        """The verb ran in the daemon: the client relayed it and loaded no click."""
        return "storm_git.integrations.cli_client" in self.imported and "click" not in self.imported


def importtime_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the import-time report on (a PYTHON* variable: the daemon of
    callers that set it is its own)."""
    return dict(env, PYTHONPROFILEIMPORTTIME="1")


def cli(cwd: Path, *args: str | bytes, env: dict[str, str], input: bytes | None = None,
        timeout: float = 60, ignoring: tuple[int, ...] | None = None) -> Ran:
    """``git storm ARGS`` as its own process (the installed console script). With
    ``ignoring``, it starts with those of SIGINT and SIGQUIT ignored (as nohup or a
    shell's background job does) and the other at its default, whatever the test's
    own process has (a suite run in a background job starts with both ignored)."""

    def dispositions() -> None:
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN if sig in (ignoring or ()) else signal.SIG_DFL)

    r = subprocess.run([GIT_STORM, *args], cwd=cwd, env=env, input=input, capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL if input is None else None,
                       preexec_fn=None if ignoring is None else dispositions)
    kept, imported = [], set()
    for line in r.stderr.splitlines(keepends=True):
        if line.startswith(b"import time:"):
            imported.add(line.rsplit(b"|", 1)[-1].strip().decode())
        else:
            kept.append(line)
    return Ran(r.returncode, r.stdout, b"".join(kept), imported)


def syscall_reading_stdin(pid: int) -> bool:
    """Process ``pid`` is blocked in read(0, ...)."""
    try:
        with open(f"/proc/{pid}/syscall") as fh:
            fields = fh.read().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 0


@contextlib.contextmanager
def listening_as_another_user(path: Path) -> Iterator[int]:
    """A listener of uid 65534 at ``path`` (root only); yields a descriptor that
    reads ``got:`` and what a client sent it, once one connected."""
    r_fd, w_fd = os.pipe()
    imposter = os.fork()
    if imposter == 0:
        try:
            os.close(r_fd)
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path.unlink(missing_ok=True)
            s.bind(str(path))
            s.listen(1)
            os.write(w_fd, b"up")
            conn, _ = s.accept()
            conn.settimeout(5)
            got = conn.recv(100)
            os.write(w_fd, b"got:" + got)
        finally:
            os._exit(0)
    os.close(w_fd)
    try:
        assert os.read(r_fd, 2) == b"up"
        yield r_fd
    finally:
        os.close(r_fd)
        os.kill(imposter, signal.SIGKILL)
        os.waitpid(imposter, 0)
