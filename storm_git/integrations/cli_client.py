"""``git storm VERB ...`` through the repository's resident process (the hook
daemon, :mod:`storm_git.integrations.hookd`), for the verbs an agent runs all
session long: standard library only, nothing of storm's beyond the hook client.

The client sends its argv, working directory, umask, environment and stream
encodings, and on READY attaches its stdin, stdout and stderr themselves to GO:
the daemon's child reads and writes them (:mod:`hookd_cli`), so nothing passes
through this process and a large ``write`` costs it nothing. It then waits for
the exit code, forwarding a Ctrl-C as ``INTR``.

When the daemon cannot take the call (none yet, ``STORM_NO_DAEMON=1``, another
storm version, another user's socket, a caller confined otherwise, a daemon
stopped or too slow to answer READY) :func:`via_daemon` returns None before
anything ran and the caller runs the verb in its own process. ``exec`` with a
terminal on a standard stream runs in its own process too: its command may want
the terminal as its foreground process group. Once GO is sent the verb may have
run, so it is never run again: a child that dies before its exit code (killed,
out of memory) is reported as such, exit 4.
"""
from __future__ import annotations

import _signal  # the C module: `import signal` builds its enums, a fifth of the client's start
import _socket
import os
import sys

from . import hook_client, hookd_place, hookd_wire

VERBS = frozenset(("read", "write", "edit", "rm", "status", "log", "release", "forget", "exec"))
DIED = ("git storm: the command's process ended before it finished (killed, or out of memory); what it did "
        "is crash-safe but may or may not have taken effect (see git storm status and git storm log)\n")
DIED_CODE = 4


def wanted(args: list[str]) -> bool:
    """A verb the resident process serves, with these standard streams."""
    if not args or args[0] not in VERBS or sys.stdin is None or sys.stdout is None or sys.stderr is None:
        return False
    if args[0] == "exec":
        try:
            return not any(os.isatty(fd) for fd in (0, 1, 2))
        except OSError:
            return False
    return True


class Interrupts:
    """Ctrl-C while the call is set up stops the client (nothing ran); once GO is
    sent it goes to the call's child. A client started with SIGINT ignored (under
    ``nohup``, or a shell's background job) ignores it, as the verb in its own
    process would."""

    def __init__(self, sock: "_socket.socket") -> None:
        self.sock, self.go, self.pending = sock, False, False
        self.old = _signal.getsignal(_signal.SIGINT)
        if self.old != _signal.SIG_IGN:
            _signal.signal(_signal.SIGINT, self.on_int)

    def on_int(self, _signum: int, _frame: object) -> None:
        if self.go:
            self.send()
        else:
            self.pending = True

    def send(self) -> None:
        try:
            self.sock.send(hookd_wire.INTR)
        except OSError:
            pass  # the child is gone: the connection's end says so

    def sent_go(self) -> None:
        self.go = True
        if self.pending:
            self.send()

    def restore(self) -> None:
        if self.old != _signal.SIG_IGN:
            _signal.signal(_signal.SIGINT, self.old)


def via_daemon(args: list[str]) -> int | None:
    """The verb's exit code after the daemon's child ran it on this process's
    streams, or None when it did not: the caller runs it in this process.
    Raises KeyboardInterrupt for a Ctrl-C before anything ran."""
    if not wanted(args):
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    found = hook_client.locate(cwd, os.environ)
    if found is None:
        return None
    common, fp = found
    path = hookd_place.socket_path(common, fp, os.environ)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    ints = Interrupts(sock)
    try:
        try:
            sock.settimeout(hook_client.CONNECT_TIMEOUT)
            try:
                sock.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                hook_client.start_daemon(common, fp, path)
                return None
            if hook_client.peer_uid(sock) != os.getuid():
                sock.close()
                return None  # another user's socket: never talk to it
            call = hook_client.request(fp, cwd, args, b"", hookd_wire.CLI_MAGIC)
            if not hook_client.hand_over(sock, call, lambda: ints.pending):
                sock.close()
                if ints.pending:
                    raise KeyboardInterrupt
                return None  # refused, or closed before taking the call: nothing ran
        except OSError:  # no READY in time, a reset, a bad descriptor: nothing ran
            sock.close()
            return None
        ints.sent_go()
        # from here on the verb may have run: never return None (the caller would run it again)
        try:
            kind = hookd_wire.recv_exact(sock, 1)
            fields = hookd_wire.recv_packed(sock, 1 << 10) if kind == hookd_wire.RESULT else None
            code = int(fields[0]) if fields is not None and len(fields) == 1 else None
        except (OSError, ValueError):
            code = None
        finally:
            sock.close()
    finally:
        ints.restore()
    if code is None:
        try:
            hook_client.write_all(2, DIED.encode())
        except OSError:
            pass
        return DIED_CODE
    return code
