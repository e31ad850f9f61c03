"""A command line call in the hook daemon's child: ``git storm VERB ...`` run there
as its own process would run it.

The client (:mod:`storm_git.integrations.cli_client`) attaches its very standard
streams to GO, so the verb reads the caller's stdin as it comes (nothing is
spooled: a large ``write`` costs the client nothing and the child what it costs
in its own process), writes to the caller's stdout and stderr in the order it
would, and sees the same terminal or pipe (``isatty``, the terminal's width).
The streams are rebuilt as the interpreter builds them at start-up, from the
client's encodings, so the bytes are the same.

Interrupts: the child is in the daemon's session, out of reach of the caller's
terminal, so the client forwards its Ctrl-C as ``INTR`` on the connection, and
the end of the connection (the client killed) counts as one too. Either raises
SIGINT in the child, which then does what Ctrl-C does to ``git storm`` in its own
process: a verb still reading its stdin stops with nothing written, ``exec``
forwards it to its command. Once the verb has returned, interrupts are ignored
until its exit code is sent.

This layer runs the command line's ``main`` without importing it (the command
line sits above it): :mod:`storm_git.cli.resident` hands it in.
"""
from __future__ import annotations

import fcntl
import io
import os
import signal
import socket
import sys
from typing import Any, Callable, Sequence

from . import hookd_wire

Main = Callable[[list[str]], object]


def exit_status(run: Callable[[], object]) -> int:
    """``sys.exit(run())`` as the interpreter ends with it: the exit code, the
    traceback of an uncaught exception on stderr."""
    try:
        code = run()
        return code if isinstance(code, int) else 0 if code is None else 1
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")  # as the interpreter does with sys.exit("text")
        return 1
    except BaseException as exc:  # noqa: BLE001 - what a new interpreter does with it
        import traceback

        traceback.print_exc()
        return 130 if isinstance(exc, KeyboardInterrupt) else 1


def receive_streams(conn: socket.socket) -> bool:
    """Wait for GO and put the client's stdin, stdout and stderr on 0, 1 and 2;
    False when the client sent no GO (it gave up and runs the call itself)."""
    go, anc, _, _ = conn.recvmsg(1, socket.CMSG_LEN(3 * 4))
    fds = [int.from_bytes(d[i:i + 4], sys.byteorder, signed=True) for level, kind, d in anc
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS for i in range(0, len(d) - 3, 4)]
    if go != hookd_wire.GO or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return False
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    return True


def std_streams(streams: Sequence[tuple[str, str]]) -> None:
    """sys.stdin, sys.stdout and sys.stderr on descriptors 0, 1 and 2, built as the
    interpreter builds them at start-up, with the client's encodings."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # (-u: stdout and stderr only)
    made = []
    for fd, (encoding, errors), name in zip((0, 1, 2), streams, ("<stdin>", "<stdout>", "<stderr>"), strict=True):
        buffered = fd == 0 or not unbuffered
        buf: Any = io.open(fd, "rb" if fd == 0 else "wb", -1 if buffered else 0, closefd=False)  # noqa: UP020
        raw = buf.raw if buffered else buf
        raw.name = name
        text = io.TextIOWrapper(buf, encoding=encoding, errors=errors, newline="\n",
                                line_buffering=buffered and (raw.isatty() or fd == 2), write_through=not buffered)
        text.mode = "r" if fd == 0 else "w"  # type: ignore[misc]
        made.append(text)
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made  # type: ignore[misc]


def interrupt_when_told(conn: socket.socket) -> None:
    """SIGINT to this process when the client sends INTR or its connection ends. A
    client that ignores SIGINT sends no INTR, but once it is gone the call stops
    all the same (KeyboardInterrupt, as the verb in a killed client would not go on)."""
    fd = conn.fileno()

    def on_io(_signum: int, _frame: object) -> None:
        try:
            got = conn.recv(1, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return  # woken for something else (room to write)
        except OSError:
            got = b""
        if not got:  # the client is gone: one interrupt, then no more wake-ups
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_ASYNC)
            if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
                raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGIO, on_io)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    on_io(signal.SIGIO, None)  # whatever came before the watch


def serve(conn: socket.socket, main: Main, args: list[str], streams: Sequence[tuple[str, str]],
          become: Callable[[], None]) -> bool:
    """The call from READY to RESULT (its exit code), True once it ran and the
    client was told; raises when the client cannot be told (it then sees its
    connection end)."""
    try:
        become()
    except OSError:
        conn.sendall(hookd_wire.REFUSED)  # its directory is gone, say: the client meets that itself
        return False
    conn.sendall(hookd_wire.READY)
    if not receive_streams(conn):
        return False
    conn.settimeout(None)
    std_streams(streams)
    interrupt_when_told(conn)
    status = exit_status(lambda: main(args))
    for sig in (signal.SIGIO, signal.SIGINT):  # done: from here only its answer matters
        signal.signal(sig, signal.SIG_IGN)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        status = 120  # what the interpreter exits with when it cannot flush at exit
    null = os.open(os.devnull, os.O_RDWR)  # the caller's streams: only the client holds them now
    for target in (0, 1, 2):
        os.dup2(null, target)
    conn.sendall(hookd_wire.RESULT + hookd_wire.pack([str(status).encode()]))
    return True
