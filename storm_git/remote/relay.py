"""The relay: a long-lived process per clone and ``git://`` server that storm's
``git`` commands reach over loopback, with ``TCP_NODELAY`` and ``TCP_QUICKACK``
set on both of its sockets.

Why: git sets neither on a ``git://`` socket, so every exchange waits on Nagle's
algorithm against the peer's delayed acknowledgement. A one-commit push waited
~40 ms for its pack to leave, a fetch's negotiation ~85 ms (docs/remote.md, "The
seventh session"). A proxy per connection (``core.gitProxy``) fixes the wait but
starts a Python per push; this process is started once and serves every fetch,
push and ``ls-remote`` of the clone until it has been idle ``storm.remoteRelayIdle``
seconds (default 30), then exits.

Correctness never depends on it: storm points ``git`` at the relay with a
``-c url.<relay>.insteadOf=<server>`` on the command line only while the relay
holds its lock (a flock held for its life: recorded, not inferred from a pid), and
a command the relay could not carry (stopped, killed, refused) runs again on
git's own connection. A push is leased, so running one again whose first copy
landed only finds the lease stale; a fetch or a listing changes nothing.
``storm.remoteRelay`` is ``auto`` (the default: on for ``git://`` URLs; other
transports cannot be relayed this way) or ``false``.

This file is also the relay's program: it is run by path (``python -I relay.py``),
without importing storm, so that starting it costs one bare interpreter.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

KEY = "storm.remoteRelay"  # auto | false
IDLE_KEY = "storm.remoteRelayIdle"  # seconds without a connection before the relay exits
IDLE_DEFAULT = 30.0
RESPAWN_AFTER = 30.0  # seconds: a start that did not come up is not tried again sooner
CONNECT_TIMEOUT = 10.0
GIT_PORT = 9418
LOCK_PREFIX = "relay-"  # + the destination's key, in storm's lock directory


@dataclass(frozen=True)
class Destination:
    """A ``git://`` server: where the relay connects, and the URL prefix it replaces."""

    host: str
    port: int
    prefix: str  # "git://host[:port]/" exactly as the configured URL spells it

    @property
    def key(self) -> str:
        return hashlib.sha1(f"{self.host}:{self.port}".encode()).hexdigest()[:16]


@dataclass
class RelayState:
    """What a running relay records in ``storm/relay/<key>.json`` (or, before it
    runs, only when a start was asked for: ``spawned``)."""

    pid: int = 0
    port: int = 0  # where it listens, on 127.0.0.1
    host: str = ""
    dport: int = 0  # the server's port
    started: float = 0.0
    served: int = 0  # connections carried
    last: float = 0.0  # when the last one ended (0: none yet)
    spawned: float = 0.0  # when a storm command started it

    def to_dict(self) -> dict:
        return asdict(self)


def destination(url: str) -> Destination | None:
    """The server of a ``git://`` URL, or None (another transport, a bad URL)."""
    if not url.startswith("git://"):
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or GIT_PORT
    except ValueError:
        return None
    end = url.find("/", len("git://"))
    if not host or end < 0:
        return None
    return Destination(host, port, url[:end + 1])


def enabled(value: str | None) -> bool:
    """``storm.remoteRelay``: auto (unset) or a true value: on; a false value: off.
    Raises ValueError on anything else."""
    text = (value or "auto").strip().lower()
    if text in ("auto", "true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(text)


def _state_file(commondir: str, key: str) -> str:
    return os.path.join(commondir, "storm", "relay", f"{key}.json")


def _lock_file(commondir: str, key: str) -> str:
    return os.path.join(commondir, "storm", "locks", LOCK_PREFIX + key)


def state_path(commondir: str, dest: Destination) -> str:
    return _state_file(commondir, dest.key)


def lock_path(commondir: str, dest: Destination) -> str:
    return _lock_file(commondir, dest.key)


def read_state(commondir: str, dest: Destination) -> RelayState | None:
    """The recorded state, or None (absent, unreadable, not storm's)."""
    raw = _read_json(state_path(commondir, dest))
    if raw is None:
        return None
    fields = RelayState.__dataclass_fields__
    try:
        return RelayState(**{k: type(getattr(RelayState, k))(v) for k, v in raw.items() if k in fields})
    except (ValueError, TypeError):
        return None


def _read_json(path: str) -> dict | None:
    """A JSON object from ``path``, or None (absent, unreadable, not an object)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def alive(commondir: str, dest: Destination) -> bool:
    """Whether a relay for ``dest`` runs now: its lock is held (held for its life)."""
    from ..core.locks import is_locked  # here, not at the top: the relay's own process imports no storm

    return is_locked(commondir, LOCK_PREFIX + dest.key)


def running(commondir: str, dest: Destination) -> RelayState | None:
    """The state of the relay that runs now for ``dest`` (it listens), else None."""
    if not alive(commondir, dest):
        return None
    st = read_state(commondir, dest)
    return st if st is not None and st.port > 0 and st.pid > 0 else None


def route(commondir: str, dest: Destination, idle: float) -> list[str]:
    """The ``git -c`` arguments that send a command to the running relay, or nothing
    (no relay yet: one is started for the commands after this one, unless a start
    was asked for less than RESPAWN_AFTER ago)."""
    if alive(commondir, dest):
        st = read_state(commondir, dest)  # none yet while it starts: this command goes direct
        return ["-c", f"url.git://127.0.0.1:{st.port}/.insteadOf={dest.prefix}"] if st and st.port > 0 else []
    old = read_state(commondir, dest)  # a dead relay's record has no spawn time: started again at once
    if old is None or abs(time.time() - old.spawned) > RESPAWN_AFTER:
        start(commondir, dest, idle)
    return []


def start(commondir: str, dest: Destination, idle: float) -> bool:
    """Start a relay for ``dest`` in the background, detached; it exits at once if
    another one holds the lock. Returns whether a process was started."""
    try:
        _write_state(state_path(commondir, dest), RelayState(spawned=time.time()))
        os.makedirs(os.path.dirname(lock_path(commondir, dest)), exist_ok=True)
        subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), commondir, dest.host, str(dest.port),
                          str(idle), dest.key], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/")
    except OSError:
        return False  # the relay is an optimisation: a command never fails for it
    return True


def stop(commondir: str, dest: Destination, timeout: float = 5.0) -> RelayState | None:
    """Ask the running relay for ``dest`` to exit (SIGTERM: it stops listening, lets
    its connections finish, then exits) and wait until its lock is free. Returns the
    state it had, or None when none ran. Only the process that holds the lock is
    signalled: a record whose pid is not the holder's (a reused pid, a hand-made
    record) names no relay, and nobody is killed for it."""
    from ..core.locks import holder  # (see alive)

    st = running(commondir, dest)
    if st is None:
        return None
    try:
        fd = os.open(lock_path(commondir, dest), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        pid, _cmd = holder(fd)
    finally:
        os.close(fd)
    if pid != st.pid:
        return None
    try:
        os.kill(st.pid, signal.SIGTERM)
    except ProcessLookupError:
        return st
    deadline = time.monotonic() + timeout
    while alive(commondir, dest) and time.monotonic() < deadline:
        time.sleep(0.02)
    return st


def _write_state(path: str, st: RelayState) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(st.to_dict(), f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk: no half-written record left behind
            os.unlink(tmp)
        raise


# -- the relay process ------------------------------------------------------------

def _fast(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _quickack(sock)


def _quickack(sock: socket.socket) -> None:
    # Linux only, and not sticky: the kernel may leave quick-ack mode, so it is set
    # again before every receive
    if hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then end ``dst``'s sending side."""
    try:
        while True:
            _quickack(src)
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class _Relay:
    def __init__(self, commondir: str, host: str, port: int, idle: float, key: str) -> None:
        self.commondir, self.host, self.port, self.idle = commondir, host, port, idle
        self.path = _state_file(commondir, key)
        self.mutex = threading.Lock()
        self.active = 0
        self.quit = False
        self.state = RelayState(pid=os.getpid(), host=host, dport=port, started=time.time())
        self.last_activity = time.monotonic()

    def carry(self, conn: socket.socket) -> None:
        try:
            try:
                up = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT)
            except OSError:
                return  # closing conn: git reports the connection failed, and storm retries without us
            up.settimeout(None)
            with up:
                _fast(conn)
                _fast(up)
                back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
                back.start()
                _pump(conn, up)
                back.join()
        finally:
            conn.close()
            with self.mutex:
                self.active -= 1
                self.state.served += 1
                self.state.last = time.time()
                self.last_activity = time.monotonic()
                try:
                    _write_state(self.path, self.state)
                except OSError:
                    pass

    def done(self) -> bool:
        with self.mutex:
            idle = self.active == 0 and time.monotonic() - self.last_activity >= self.idle
        return self.quit or idle or not os.path.isdir(self.commondir)

    def run(self, listener: socket.socket) -> None:
        self.state.port = listener.getsockname()[1]
        _write_state(self.path, self.state)
        listener.settimeout(0.5)
        while not self.done():
            try:
                conn, _addr = listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ECONNABORTED):
                    continue
                break
            conn.settimeout(None)
            with self.mutex:
                self.active += 1
                self.last_activity = time.monotonic()
            threading.Thread(target=self.carry, args=(conn,), daemon=True).start()
        listener.close()  # no new connection: a command that finds it refused goes direct
        try:  # the recorded state names a port nobody listens on any more
            if (_read_json(self.path) or {}).get("pid") == os.getpid():
                os.unlink(self.path)
        except OSError:
            pass
        while True:  # let the connections in flight finish
            with self.mutex:
                if self.active == 0:
                    break
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    """``relay.py COMMONDIR HOST PORT IDLE KEY``: serve until idle, then exit."""
    commondir, host, port, idle, key = argv[0], argv[1], int(argv[2]), float(argv[3]), argv[4]
    fd = os.open(_lock_file(commondir, key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another relay serves this destination
    relay = _Relay(commondir, host, port, idle, key)

    def _term(_sig: int, _frame: object) -> None:
        relay.quit = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
    except OSError:
        return 1  # the spawn record stays: no new start for RESPAWN_AFTER
    relay.run(listener)
    return 0  # the lock goes with the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
