"""The hook daemon: a preloading fork server for ``git storm harness hook``.

Started on demand by :mod:`storm_git.integrations.hook_client` (never by hand),
one per repository and installed storm (:mod:`storm_git.integrations.hookd_place`
names it). It imports pygit2 and storm's hook code once, then for each
connection forks a child that takes on the client's working directory,
environment, umask, argv and standard streams and runs the very same
``hook_main.main`` a new process would, from a fresh process state: every call
is its own process, as without the daemon, so locks, crash safety and
concurrent calls behave the same. The daemon itself touches no repository state.
It serves only a caller of its own user confined exactly as it is, with the same
variables that choose programs and configuration (:mod:`hookd_peer`); any other
caller is refused before anything runs and runs the hook in its own process.

It exits when idle (``STORM_HOOKD_IDLE`` seconds, default 600), when its socket
or lock file is gone or replaced (the git dir deleted or moved), when the storm
package or a loaded module's file changes (an upgrade), and on SIGTERM. Killed
at any point it loses nothing: a call's child runs on alone and answers its
client; a stale socket is replaced by the next daemon.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import os
import pkgutil
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..storm import tree_watch
from . import hookd_cli, hookd_peer, hookd_place, hookd_spare, hookd_wire

IDLE_SECONDS = 600.0
TICK_SECONDS = 5.0
REQUEST_TIMEOUT = 30.0
# Loaded in advance so that a call's child imports nothing; a module missing here
# costs that call its import, never a different answer.
PRELOAD_PACKAGES = ("storm_git.core", "storm_git.disk", "storm_git.deps", "storm_git.storm", "storm_git.worktree",
                    "storm_git.remote")  # the layers the hook may use
PRELOAD_MODULES = ("storm_git.api", "storm_git.integrations.harness", "storm_git.integrations.hook_main",
                   "datetime", "resource", "difflib", "shlex", "subprocess", "traceback", "tempfile", "json",
                   "pygit2", "unidiff")


@dataclass
class Request:
    """One hook call as the client sent it."""
    fingerprint: str
    cwd: bytes
    umask: int
    streams: list[tuple[str, str]]  # (encoding, errors) of stdin, stdout, stderr
    argv: list[str]
    args: list[str]
    env: dict[bytes, bytes]
    data: bytes
    ignored: frozenset[int]  # of hookd_wire.INHERITED_SIGNALS, those the client ignores


def decode_request(fields: list[bytes]) -> Request:
    fp, cwd, umask, streams, argv, args, env, data, ignored = fields
    s = [x.decode() for x in hookd_wire.unpack(streams[8:])]
    return Request(fp.decode("utf-8", "surrogateescape"), cwd, int(umask), list(zip(s[::2], s[1::2], strict=False)),
                   [os.fsdecode(a) for a in hookd_wire.unpack(argv[8:])],
                   [os.fsdecode(a) for a in hookd_wire.unpack(args[8:])], hookd_wire.env_from(env), data,
                   hookd_wire.ignored_from(ignored))


def preload(more: tuple[str, ...] = ()) -> None:
    for name in PRELOAD_MODULES + more:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the call's child meets the same error, as a new process would
            pass
    for pkg_name in PRELOAD_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except Exception:  # noqa: BLE001
            continue
        for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001
                pass


def _stdlib_dir() -> str:
    return os.path.dirname(os.__file__)


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def changed(files: dict[str, tuple[int, int]]) -> bool:
    """Some file the daemon loaded is no longer what it loaded."""
    return any(_stat(f) != was for f, was in files.items())


def loaded_files() -> dict[str, tuple[int, int]]:
    """(size, mtime) of every loaded module's file outside the standard library
    (pygit2, its libraries, storm): an upgrade of any of them retires the daemon."""
    std = _stdlib_dir()
    out = {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if not f or (f.startswith(std) and "-packages" not in f):
            continue
        out[f] = _stat(f)
    return out


class Daemon:
    """The listening socket and the loop that forks a child per call."""

    def __init__(self, common: str, path: str, fp: str, name: str, idle: float,
                 cli: hookd_cli.Main | None = None) -> None:
        self.common, self.path, self.fp, self.name, self.idle = common, path, fp, name, idle
        self.cli = cli
        self.peer = Peer(hookd_peer.confinement() or (), hookd_peer.exec_env(os.environb))
        self.files = loaded_files()
        self.sock: socket.socket | None = None
        self.ident: tuple[int, int] | None = None
        self.lock_fd = -1
        self.lock_ident: tuple[int, int] | None = None
        self.watch: tree_watch.TreeWatch | None = None
        self.wsock: socket.socket | None = None
        self.spare = hookd_spare.Spare()
        self.pages = hookd_place.pages_path(common, name)  # this daemon's alone: its addresses are its own

    def take_lock(self) -> bool:
        lock = hookd_place.lock_path(self.common, self.name)
        try:
            os.mkdir(os.path.dirname(lock), 0o700)
        except OSError:
            pass  # there already, or storm's directory is gone: the open says which
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        st = os.fstat(fd)
        self.lock_fd, self.lock_ident = fd, (st.st_dev, st.st_ino)
        return True

    def bind(self) -> None:
        parent = os.path.dirname(self.path)
        if parent != hookd_place.hookd_dir(self.common):
            try:
                os.mkdir(parent, 0o700)
            except FileExistsError:
                pass
            if not hookd_place.dir_is_private(parent):
                raise SystemExit(0)  # someone else's directory: no daemon, calls run in their own process
        for left in (self.path, self.pages):  # a killed daemon's (we hold the lock: no live one uses them)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(left)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            s.bind(self.path)
        finally:
            os.umask(old)
        s.listen(64)
        st = os.stat(self.path)
        self.sock, self.ident = s, (st.st_dev, st.st_ino)

    def sweep(self) -> None:
        """Remove the lock files (and sockets) of other versions' daemons that no
        daemon holds: each upgrade, or edit of an editable install, names a new one."""
        d = hookd_place.hookd_dir(self.common)
        mine = os.path.basename(hookd_place.lock_path(self.common, self.name))
        try:
            names = os.listdir(d)
        except OSError:
            return
        for name in names:
            if not name.endswith(".lock") or name == mine:
                continue
            path = os.path.join(d, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                stem = path[:-len(".lock")]
                for victim in (stem + ".sock", stem + ".w", stem + ".pages", path):  # a daemon starting now exits on
                    try:  # its first tick, finding its lock file gone
                        os.unlink(victim)
                    except OSError:
                        pass
            except OSError:
                pass  # held: that daemon is alive
            finally:
                os.close(fd)

    def still_ours(self) -> bool:
        """The socket and lock at their paths are this daemon's, and storm's
        directory is still there (the git dir was not deleted or moved)."""
        try:
            st = os.stat(self.path)
            lk = os.stat(hookd_place.lock_path(self.common, self.name))
        except OSError:
            return False
        return ((st.st_dev, st.st_ino) == self.ident and (lk.st_dev, lk.st_ino) == self.lock_ident
                and os.path.isdir(os.path.join(self.common, "storm")))

    def current(self) -> bool:
        """Storm and every loaded module are still the files it started from."""
        import storm_git

        pkg = os.path.dirname(os.path.abspath(storm_git.__file__))
        return not changed(self.files) and hookd_place.fingerprint(pkg, storm_git.__version__) == self.fp

    def start_watch(self) -> None:
        """Watch the main working tree and answer its children's questions about it
        on a socket of its own (:mod:`storm_git.storm.tree_watch`); without inotify, a
        working tree or a socket, calls walk."""
        top = os.path.dirname(os.path.abspath(self.common))
        if (os.environ.get("STORM_NO_WATCH") or os.path.basename(self.common) != ".git"
                or not self.path.endswith(".sock") or not tree_watch.available()):
            return
        limit = int(os.environ.get("STORM_WATCH_MAX_CHANGED") or tree_watch.MAX_CHANGED)  # tests shrink it
        w = tree_watch.TreeWatch(top, limit)
        try:
            w.start()
        except OSError as exc:
            w.close()
            tree_watch.write_state(self.common, None, f"inotify: {exc.strerror or exc}")
            return
        wpath = self.path[:-len(".sock")] + ".w"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            try:
                os.unlink(wpath)
            except FileNotFoundError:
                pass
            s.bind(wpath)
            s.listen(64)
        except OSError:
            s.close()
            w.close()
            return
        finally:
            os.umask(old)
        self.watch, self.wsock = w, s
        tree_watch.serve_at(wpath, top)
        tree_watch.write_state(self.common, w)

    def answer_watch(self) -> None:
        """One child's question: what changed since its token (read the queue first)."""
        assert self.wsock is not None and self.watch is not None
        try:
            conn, _ = self.wsock.accept()
        except OSError:
            return
        with conn:
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
                    return
                conn.settimeout(2.0)
                line = b""
                while not line.endswith(b"\n") and len(line) < 256:
                    b = conn.recv(256)
                    if not b:
                        return
                    line += b
                q = tree_watch.parse_query(line)
                if q is None:
                    return
                conn.sendall(tree_watch.encode(self.watch.changed_since(*q)))
            except OSError:
                return

    def wait(self, timeout: float) -> list[Any]:
        """What is ready: the call socket, the watch's socket, the watch's events."""
        assert self.sock is not None
        fds: list[Any] = [self.sock]
        if self.wsock is not None and self.watch is not None and self.watch.fd >= 0:
            fds += [self.wsock, self.watch.fd]
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return []
        return ready

    def serve(self) -> None:
        assert self.sock is not None
        self.sock.settimeout(min(TICK_SECONDS, self.idle))
        last = time.monotonic()
        while True:
            ready = self.wait(min(TICK_SECONDS, self.idle))
            if self.watch is not None:
                broken = self.watch.broken
                if self.watch.fd in ready:
                    self.watch.drain()  # the queue kept short: an overflow costs the next call a walk
                if self.wsock is not None and self.wsock in ready:
                    self.answer_watch()
                if self.watch.broken != broken:
                    tree_watch.write_state(self.common, self.watch)  # for git storm doctor
            if self.sock not in ready:
                if not ready:
                    reap()
                    if time.monotonic() - last > self.idle or not self.still_ours() or not self.current():
                        return
                continue
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            last = time.monotonic()
            reap()
            conn.settimeout(None)
            accepted = hookd_peer.boottime()
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
                conn.close()  # another user's process: not served
                continue
            peer_pid = int.from_bytes(creds[0:4], sys.byteorder, signed=True)
            if changed(self.files):  # pygit2 upgraded, say (the child checks storm's own files)
                conn.close()  # before READY: the client runs the call itself (and the spare is as stale)
                return
            if not self.spare.hand(conn, peer_pid, accepted) and os.fork() == 0:
                child(conn, self.name, self.peer, Caller(peer_pid, accepted), self.own_fds(), self.pages,
                      self.cli)  # never returns
            conn.close()
            self.fork_spare()

    def own_fds(self) -> list[int]:
        """In a call's process: the daemon's descriptors, detached, for it to close first."""
        assert self.sock is not None
        own = [self.sock.detach(), self.lock_fd]
        if self.watch is not None and self.wsock is not None:
            own += [self.wsock.detach(), self.watch.fd]  # the watch stays the daemon's
        return own

    def fork_spare(self) -> None:
        """The next call's process, forked now (:mod:`hookd_spare`)."""
        def run(conn: socket.socket, pid: int, accepted: float) -> None:
            child(conn, self.name, self.peer, Caller(pid, accepted), [], self.pages, self.cli)

        self.spare.start(run, self.own_fds, self.pages)

    def close(self) -> None:
        """Remove the socket if it is still this daemon's."""
        self.spare.retire()
        if self.still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.pages)
        if self.wsock is not None:
            tree_watch.clear_state(self.common)
            try:
                os.unlink(self.path[:-len(".sock")] + ".w")
            except OSError:
                pass
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self.ident:
                os.unlink(self.path)
        except OSError:
            pass


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become(req: Request) -> tuple[io.BytesIO, io.BytesIO]:
    """Take on the client's process state; returns the buffers that collect what
    the hook writes on sys.stdout and sys.stderr."""
    become_process(req)
    (ienc, ierr), (oenc, oerr), (eenc, eerr) = req.streams
    out, err = io.BytesIO(), io.BytesIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(req.data), encoding=ienc, errors=ierr)
    sys.stdout = io.TextIOWrapper(out, encoding=oenc, errors=oerr)
    sys.stderr = io.TextIOWrapper(err, encoding=eenc, errors=eerr, line_buffering=True)
    return out, err


def become_process(req: Request) -> None:
    """Take on the client's working directory, umask, environment, argv and the
    signals it ignores (the daemon's own, inherited from whichever client started
    it, are not the caller's)."""
    import pwd

    import pygit2
    from pygit2.enums import ConfigLevel

    os.chdir(req.cwd)
    os.umask(req.umask)
    for sig in hookd_wire.INHERITED_SIGNALS:
        if sig in req.ignored:
            signal.signal(sig, signal.SIG_IGN)
        else:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    os.environb.clear()
    os.environb.update(req.env)
    time.tzset()
    # libgit2 read HOME and XDG_CONFIG_HOME when the daemon started: look where a
    # new process with this environment would
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    pygit2.settings.search_path[ConfigLevel.GLOBAL] = home
    pygit2.settings.search_path[ConfigLevel.XDG] = os.path.join(xdg, "git")
    sys.argv = req.argv


def run_hook(args: list[str], data: bytes) -> int:
    """``sys.exit(hook_main(args))`` as the interpreter runs it: the exit code it
    would end with, the traceback of an uncaught exception on stderr."""
    from .hook_main import main as hook_main

    return hookd_cli.exit_status(lambda: hook_main(args, data))


@dataclass(frozen=True)
class Peer:
    """What a caller must share with the daemon to be served (hookd_peer)."""
    confinement: tuple[bytes, ...]
    exec_env: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class Caller:
    """The connecting process, from the socket's credentials."""
    pid: int
    accepted: float  # CLOCK_BOOTTIME when its connection was accepted


def serves(conn: socket.socket, mine: Peer, caller: Caller, req: Request) -> bool:
    """The caller is confined as the daemon is and asks for its programs, libraries
    and configuration: its hook would run here as in its own process."""
    return (bool(mine.confinement) and hookd_peer.exec_env(req.env) == mine.exec_env
            and hookd_peer.same_as_peer(conn, caller.pid, mine.confinement, caller.accepted))


def child(conn: socket.socket, name: str, mine: Peer, caller: Caller, daemons_fds: list[int], pages: str,
          cli: hookd_cli.Main | None = None) -> None:
    """One call (a hook's, or with ``cli`` a command line's), in the process forked
    for it (or waiting for it: hookd_spare), then the pages it wrote to, for the
    next spares. Never returns."""
    code = 0
    try:
        for fd in daemons_fds:  # the listening socket and the daemon's lock are not the call's
            os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.settimeout(REQUEST_TIMEOUT)
        magic = hookd_wire.recv_exact(conn, len(hookd_wire.MAGIC))
        if magic not in (hookd_wire.MAGIC, hookd_wire.CLI_MAGIC):
            return
        fields = hookd_wire.recv_packed(conn)
        if fields is None or len(fields) != 9:
            return
        req = decode_request(fields)
        if req.fingerprint != name or not serves(conn, mine, caller, req) or (
                magic == hookd_wire.CLI_MAGIC and cli is None):
            conn.sendall(hookd_wire.REFUSED)  # another storm, or a caller confined otherwise: it runs the call itself
            return
        if magic == hookd_wire.CLI_MAGIC:
            assert cli is not None
            if hookd_cli.serve(conn, cli, req.args, req.streams, lambda: become_process(req)):
                hookd_spare.learn(pages)
            return
        try:
            out, err = become(req)
        except OSError:
            conn.sendall(hookd_wire.REFUSED)  # its directory is gone, say: the client meets that itself
            return
        conn.sendall(hookd_wire.READY)
        if not hookd_cli.receive_streams(conn):
            return  # the client gave up waiting and runs the call itself
        conn.settimeout(None)
        status = run_hook(req.args, req.data)  # (the hook registers no atexit handler: os._exit skips none)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            status = 120  # what the interpreter exits with when it cannot flush at exit
        null = os.open(os.devnull, os.O_RDWR)  # the harness's pipes: only the client holds them now
        for target in (0, 1, 2):
            os.dup2(null, target)
        conn.sendall(hookd_wire.RESULT + hookd_wire.pack([str(status).encode(), out.getvalue(), err.getvalue()]))
        hookd_spare.learn(pages)
    except BaseException:  # noqa: BLE001 - the client sees the connection end and answers for itself
        code = 1
    finally:
        os._exit(code)


def main(argv: list[str], cli: hookd_cli.Main | None = None, preload_more: tuple[str, ...] = ()) -> None:
    """``hookd COMMON_DIR SOCKET_PATH``, as the client starts it; with ``cli`` (the
    command line's ``main``, which this layer cannot import) it serves the
    command line's agent verbs too, with ``preload_more`` loaded in advance."""
    common, path = argv
    os.chdir("/")
    import storm_git

    fp_dir = os.path.dirname(os.path.abspath(storm_git.__file__))
    fp = hookd_place.fingerprint(fp_dir, storm_git.__version__)
    name = hookd_place.name(fp, os.environb)
    if hookd_place.socket_path(common, name, os.environ) != path:
        return  # this interpreter sees another storm, or another confinement, than the client did
    idle = float(os.environ.get("STORM_HOOKD_IDLE") or IDLE_SECONDS)
    d = Daemon(common, path, fp, name, idle, cli)
    if not d.take_lock():
        return  # another daemon of this name is starting or running
    preload(preload_more)
    import gc

    gc.freeze()  # a child's collections then never touch (and copy) the daemon's objects
    d.files = loaded_files()
    if hookd_place.fingerprint(fp_dir, storm_git.__version__) != fp:
        return  # changed while loading: the next call's client names the new version
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        d.bind()
        d.start_watch()  # before the first call is served: every call has the watch to ask
        d.sweep()
        d.fork_spare()
        d.serve()
    finally:
        d.close()
