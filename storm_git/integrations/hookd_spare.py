"""The hook daemon's next call's process, forked before the call comes.

A child forked at the call pays for the fork and then, as it runs, for a
copy-on-write fault on nearly every page of the daemon it touches: together
about three quarters of what the daemon's side of a call costs. So the daemon
keeps one child ready. While it waits, the spare makes its writable pages its
own (``MADV_POPULATE_WRITE``, Linux 5.14 and later; elsewhere it skips that
step), stopping the moment a call arrives, then takes the call's connection and
the caller's credentials from the daemon over a socket pair and runs the call
exactly as a child forked for it would.

The spare is a copy of the daemon from the moment it was forked: the daemon
checks its loaded files before every hand-over, as it does before a fork, and
a spare that died is replaced by forking for the call. When the daemon's end
of the pair closes (the daemon exits, however it ends) the spare exits. Its
process name (``/proc/PID/comm``) is ``storm-spare`` until it takes a call.
"""
from __future__ import annotations

import os
import select
import socket
import sys
from typing import Callable

SPARE_NAME = b"storm-spare"
CALL_NAME = b"storm-call"
MADV_POPULATE_WRITE = 23
CHUNK = 1 << 22  # bytes made its own between two looks for a call


def _libc() -> object | None:
    try:
        import ctypes
    except ImportError:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    except (OSError, AttributeError):
        return None
    return libc


def rename(libc: object | None, name: bytes) -> None:
    """This process's name as ps and /proc/PID/comm show it (PR_SET_NAME)."""
    if libc is not None:
        libc.prctl(15, name, 0, 0, 0)  # type: ignore[attr-defined]


def writable_ranges() -> list[tuple[int, int]]:
    """This process's private writable mappings, as /proc/self/maps lists them."""
    out = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 2 or fields[1][1] != "w" or fields[1][3] != "p":
                    continue
                if len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]", "[vdso]"):
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.append((start, end))
    except (OSError, ValueError):
        return []
    return out


def own_pages(libc: object | None, stop: Callable[[], bool]) -> None:
    """Copy, now, the pages the daemon shares with this process, until ``stop()``."""
    if libc is None:
        return
    for start, end in writable_ranges():
        for at in range(start, end, CHUNK):
            if stop():
                return
            if libc.madvise(at, min(CHUNK, end - at), MADV_POPULATE_WRITE) != 0:  # type: ignore[attr-defined]
                import ctypes
                import errno

                if ctypes.get_errno() == errno.EINVAL:
                    return  # a kernel without it: the call takes its faults as it goes
                break  # a range it cannot populate (unmapped since, say): the next one


class Spare:
    """The daemon's side of the spare: fork it, hand it a call, retire it."""

    def __init__(self) -> None:
        self.end: socket.socket | None = None
        self.pid = -1

    def fd(self) -> int:
        """Its socket's descriptor, which a child forked for a call must close."""
        return self.end.fileno() if self.end is not None else -1

    def start(self, run: Callable[[socket.socket, int, float], None], daemons_fds: Callable[[], list[int]]) -> None:
        """Fork the spare; ``run(conn, caller_pid, accepted)`` runs its call and never
        returns. ``daemons_fds()``, called in the spare: the daemon's own descriptors,
        which it closes at once."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return
        if pid == 0:
            try:
                ours.close()
                for fd in daemons_fds():
                    os.close(fd)
                _wait(theirs, run)
            finally:
                os._exit(0)
        theirs.close()
        self.end, self.pid = ours, pid

    def hand(self, conn: socket.socket, caller_pid: int, accepted: float) -> bool:
        """Pass the call to the spare; False when there is none or it is gone (the
        daemon forks for the call as without a spare). The spare is used up either way."""
        end, self.end, self.pid = self.end, None, -1
        if end is None:
            return False
        try:
            fds = conn.fileno().to_bytes(4, sys.byteorder, signed=True)
            end.sendmsg([f"{caller_pid} {accepted!r}".encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            return True
        except OSError:
            return False
        finally:
            end.close()

    def retire(self) -> None:
        """The spare exits (its end of the pair closes)."""
        if self.end is not None:
            self.end.close()
        self.end, self.pid = None, -1


def _wait(end: socket.socket, run: Callable[[socket.socket, int, float], None]) -> None:
    libc = _libc()
    rename(libc, SPARE_NAME)
    own_pages(libc, lambda: bool(select.select([end], [], [], 0)[0]))
    msg, anc, _, _ = end.recvmsg(64, socket.CMSG_LEN(4))
    fds = [int.from_bytes(d[:4], sys.byteorder, signed=True) for level, kind, d in anc
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(d) >= 4]
    end.close()
    if len(fds) != 1:
        return  # the daemon is gone (EOF), or sent what no daemon sends
    conn = socket.socket(fileno=fds[0])
    pid, accepted = msg.decode().split()
    rename(libc, CALL_NAME)
    run(conn, int(pid), float(accepted))
