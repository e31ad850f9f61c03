"""The harness hook's front door: hand the call to the repository's hook daemon
(:mod:`storm_git.integrations.hookd`), or run it here when there is none.

A hook call in a new process pays for starting Python and importing pygit2 and
storm, several times the work of the call itself. The daemon has paid that once;
this client only reads the event, finds the daemon's socket and relays. It uses
the standard library's fastest pieces (``_socket`` rather than ``socket``, whose
import costs as much again as everything else here) and imports nothing of
storm's on the fast path.

Whatever happens the harness gets the answer a hook run here would give:

* no daemon (none started yet, ``STORM_NO_DAEMON=1``, ``storm.hookDaemon``
  false, not a storm repository, GIT_DIR set, a socket of another user, a
  daemon that refuses a caller confined otherwise (:mod:`hookd_peer`), no READY
  in time): the hook runs in this process, exactly as without a daemon, and a
  daemon is started in the background for the next call;
* the daemon's child died after it was told to go (killed, crashed): a refusal,
  as the hook gives for any failure -- a deny before the tool, a block after it.
"""
from __future__ import annotations

import _socket  # the C module: `import socket` would cost as much as the rest of the client
import os
import sys

from . import hookd_place, hookd_wire, repo_probe

TYPE_CHECKING = False  # typing's own import would cost the hook's fast path
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

CONNECT_TIMEOUT = 2.0  # seconds; a live daemon accepts at once
READY_TIMEOUT = 2.0  # seconds for the child to take on the call before the client runs it itself
OFF_WORDS = (b"hookdaemon", b"include")
# The daemon serves the command line's agent verbs too (storm_git.cli.resident);
# when the command line cannot be imported it still serves the hooks.
DAEMON_MAIN = ("import sys; del sys.path[0]\n"
               "try:\n    from storm_git.cli.resident import main\n"
               "except Exception:\n    from storm_git.integrations.hookd import main\n"
               "main(sys.argv[1:])")


def disabled(env: "os._Environ[str]") -> bool:
    v = env.get("STORM_NO_DAEMON", "")
    return v not in ("", "0")


def _git_config_off(cwd: str) -> bool:
    """``git config --type=bool storm.hookDaemon`` is false (or cannot be read)."""
    import subprocess

    try:
        r = subprocess.run(["git", "config", "--type=bool", "--get", "storm.hookDaemon"], cwd=cwd,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return True
    if r.returncode == 1 and not r.stdout:
        return False  # not set
    return r.returncode != 0 or r.stdout.strip() != b"true"


def off_by_config(cwd: str, gitdir: str, common: str, env: "os._Environ[str]") -> bool:
    """``storm.hookDaemon`` is false. Git is asked only when a config file mentions
    the key or includes another file (or config comes from the environment)."""
    if "GIT_CONFIG_PARAMETERS" in env or "GIT_CONFIG_COUNT" in env:
        return _git_config_off(cwd)
    files = repo_probe.config_files(gitdir, common, env)
    if any(repo_probe.config_mentions(f, OFF_WORDS) for f in files):
        return _git_config_off(cwd)
    return False


def locate(cwd: str, env: "os._Environ[str]") -> tuple[str, str] | None:
    """(common dir, name) of the daemon for this call, or None: run here. The name
    is the storm's fingerprint and this process's confinement (hookd_peer)."""
    if disabled(env) or "GIT_DIR" in env or "GIT_COMMON_DIR" in env:
        return None
    found = repo_probe.git_dirs(cwd)
    if not isinstance(found, tuple):
        return None
    gitdir, common = found
    if not os.path.isdir(os.path.join(common, "storm")) or off_by_config(cwd, gitdir, common, env):
        return None
    import storm_git

    fp = hookd_place.fingerprint(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 storm_git.__version__)
    return common, hookd_place.name(fp, os.environb)


def request(fp: str, cwd: str, args: list[str], data: bytes, magic: bytes = hookd_wire.MAGIC) -> bytes:
    """The call as the daemon's child takes it on: this process's storm, working
    directory, umask, stream encodings, argv, arguments, environment and the
    signals it was started with ignored (a command the call runs inherits them)."""
    streams = []
    for s in (sys.stdin, sys.stdout, sys.stderr):
        streams += [(getattr(s, "encoding", None) or "utf-8").encode(),
                    (getattr(s, "errors", None) or "strict").encode()]
    umask = os.umask(0o022)
    os.umask(umask)
    fields = [fp.encode("utf-8", "surrogateescape"), os.fsencode(cwd), str(umask).encode(),
              hookd_wire.pack(streams), hookd_wire.pack([os.fsencode(a) for a in sys.argv]),
              hookd_wire.pack([os.fsencode(a) for a in args]), hookd_wire.env_fields(dict(os.environb)), data,
              hookd_wire.ignored_field()]
    return magic + hookd_wire.pack(fields)


def hand_over(sock: "_socket.socket", payload: bytes, stop: "Callable[[], bool] | None" = None) -> bool:
    """Send the call, wait for the daemon's READY, then pass this process's standard
    streams with GO. False, with nothing sent past the call, when the daemon does not
    take it or ``stop()`` says the caller gave up: nothing ran. OSError as the socket's."""
    sock.sendall(payload)
    sock.settimeout(READY_TIMEOUT)
    if sock.recv(1) != hookd_wire.READY or (stop is not None and stop()):
        return False
    sock.settimeout(None)
    # the standard streams go only with GO: a daemon that never takes the call
    # must not hold the caller's pipes open
    fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
    sock.sendmsg([hookd_wire.GO], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    return True


def peer_uid(sock: "_socket.socket") -> int:
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def via_daemon(args: list[str], data: bytes) -> int | None:
    """The call's exit code after the daemon answered it (its output written), or
    None when it was not run there: the caller runs it in this process."""
    if sys.stdout is None or sys.stderr is None or sys.stdin is None:
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    found = locate(cwd, os.environ)
    if found is None:
        return None
    common, fp = found
    path = hookd_place.socket_path(common, fp, os.environ)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            start_daemon(common, fp, path)
            return None
        if peer_uid(sock) != os.getuid():
            sock.close()
            return None  # another user's socket: never talk to it
        if not hand_over(sock, request(fp, cwd, args, data)):
            sock.close()
            return None  # refused, or closed before taking the call: nothing ran
    except OSError:  # no READY in time, a reset, a bad descriptor: nothing ran
        sock.close()
        return None
    # from here on the call may have run: never return None (the caller would run it again)
    try:
        kind = hookd_wire.recv_exact(sock, 1)
        fields = hookd_wire.recv_packed(sock) if kind == hookd_wire.RESULT else None
        code = int(fields[0]) if fields is not None and len(fields) == 3 else None
    except (OSError, ValueError):
        code = None
    finally:
        sock.close()
    if code is None:
        try:
            return died(args, data)
        except Exception:  # noqa: BLE001 - exit 2 blocks the tool in both harnesses
            return 2
    assert fields is not None  # a code was read from them
    try:
        write_all(1, fields[1])
        write_all(2, fields[2])
    except OSError:
        pass  # the harness stopped reading: as a hook in its own process, it cannot say more
    return code


def died(args: list[str], data: bytes) -> int:
    """The call's process died after it took the call: whatever it did is
    crash-safe, but the answer is lost, so the call fails closed."""
    from .hook_main import emit, failure, parse_args

    parsed = parse_args(args)
    harness = parsed[0] if isinstance(parsed, tuple) else "claude"
    out, err, code = failure(data, harness, "the hook's process died before it answered (killed, or out of "
                                           "memory); rerun the tool call")
    emit(out, err)
    return code


def start_daemon(common: str, fp: str, path: str) -> None:
    """Start the daemon for the next call, in the background, unless one is
    already starting (it holds its lock from its first moment)."""
    import fcntl

    parent = os.path.dirname(path)
    if parent != hookd_place.hookd_dir(common) and os.path.lexists(parent) and not hookd_place.dir_is_private(parent):
        return  # a socket directory others may enter: the daemon would refuse it
    lock = hookd_place.lock_path(common, fp)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        try:
            os.mkdir(hookd_place.hookd_dir(common), 0o700)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # a daemon holds it: starting, or alive but not yet listening
    os.close(fd)
    argv = [sys.executable, "-c", DAEMON_MAIN, common, path]
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:  # the daemon-to-be: its own session, no descriptor of the harness's
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)


def main(args: list[str], relayed: "Callable[[int], None] | None" = None) -> int:
    """``git storm harness hook ARGS``: through the daemon when it can, else here.
    ``relayed`` is given the exit code of a call the daemon answered (the command
    line ends the process with it at once: nothing of storm's was loaded here)."""
    data = sys.stdin.buffer.read()
    try:
        code = via_daemon(args, data)
    except Exception:  # noqa: BLE001 - only before GO can it raise: nothing ran, so the hook runs here
        code = None
    if code is not None:
        if relayed is not None:
            relayed(code)
        return code
    from .hook_main import main as hook_main

    return hook_main(args, data)
