"""The hook daemon's next call's process, forked before the call comes.

A child forked at the call pays for the fork and then, as it runs, for a
copy-on-write fault on each page of the daemon it writes to (about 1,400 of its
6,000 writable pages for a ``read``): together about three quarters of what the
daemon's side of a call costs. So the daemon keeps one child ready. While it
waits, the spare copies, ahead of time, the pages calls have written to before
(``MADV_POPULATE_WRITE``, Linux 5.14 and later; elsewhere it skips that step),
stopping the moment a call arrives; then it takes the call's connection and the
caller's credentials from the daemon over a socket pair and runs the call exactly
as a child forked for it would.

Which pages: each call's process, once its caller has its answer, lists the pages
it holds alone (``/proc/self/pagemap``'s exclusive bit: those it copied or made)
and adds the new ones to the daemon's ``<name>.pages`` file; the next spares copy
those. Copying every page instead would cost four times the faults it saves. The
file only ever saves or wastes a spare's time: any content is safe.

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
PAGE = os.sysconf("SC_PAGE_SIZE")
CHUNK = 1 << 20  # bytes copied between two looks for a call
EXCLUSIVE = 1 << 56  # pagemap: the page is mapped by this process alone (Linux 4.2+)
MAX_RANGES = 1 << 16
GAP = 2 * PAGE  # listed ranges this close are copied as one (fewer calls, a few pages more)
FEW_FAULTS = 300  # a call's process that took fewer found its pages copied (a read takes ~1,200 without)


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


def own_pages(libc: object | None, ranges: list[tuple[int, int]], stop: Callable[[], bool]) -> None:
    """Copy, now, the pages of ``ranges`` this process shares with the daemon,
    until ``stop()`` (asked after each CHUNK bytes)."""
    if libc is None:
        return
    since = 0
    for start, end in ranges:
        for at in range(start, end, CHUNK):
            if since >= CHUNK:
                if stop():
                    return
                since = 0
            size = min(CHUNK, end - at)
            since += size
            if libc.madvise(at, size, MADV_POPULATE_WRITE) != 0:  # type: ignore[attr-defined]
                import ctypes
                import errno

                if ctypes.get_errno() == errno.EINVAL:
                    return  # a kernel without it: the call takes its faults as it goes
                break  # a range it cannot populate (unmapped since, say): the next one


def exclusive_ranges() -> list[tuple[int, int]]:
    """The pages of this process's private writable mappings that it holds alone."""
    import struct

    out: list[tuple[int, int]] = []
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return out
    try:
        for start, end in writable_ranges():
            data = os.pread(fd, (end - start) // PAGE * 8, start // PAGE * 8)
            run = -1
            for i, (entry,) in enumerate(struct.iter_unpack("=Q", data)):
                at = start + i * PAGE
                if entry & EXCLUSIVE:
                    if run < 0:
                        run = at
                elif run >= 0:
                    out.append((run, at))
                    run = -1
            if run >= 0:
                out.append((run, start + len(data) // 8 * PAGE))
    except OSError:
        return []
    finally:
        os.close(fd)
    return out


def load_pages(path: str) -> list[tuple[int, int]]:
    """The ranges in ``path`` (hex ``START END`` lines); none when it is unreadable."""
    out = []
    try:
        with open(path, "rb") as fh:
            for line in fh.read(MAX_RANGES * 34).splitlines()[:MAX_RANGES]:
                a, _, b = line.partition(b" ")
                start, end = int(a, 16), int(b, 16)
                if 0 <= start < end:
                    out.append((start, end))
    except (OSError, ValueError):
        return []
    return out


def merge(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """``ranges`` sorted, those closer than ``gap`` bytes joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + gap:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def within(ranges: list[tuple[int, int]], allowed: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``ranges`` inside ``allowed`` (both sorted, no overlaps)."""
    out, i = [], 0
    for start, end in merge(ranges, GAP):
        while i < len(allowed) and allowed[i][1] <= start:
            i += 1
        j = i
        while j < len(allowed) and allowed[j][0] < end:
            lo, hi = max(start, allowed[j][0]), min(end, allowed[j][1])
            if lo < hi:
                out.append((lo, hi))
            j += 1
    return out


def learn(path: str) -> None:
    """Add the pages this call's process wrote to (beyond those already listed) to
    ``path``, for the next spares. Run after the caller has its answer; a process
    that took few page faults (its spare had copied what it needed) skips it."""
    import resource

    if resource.getrusage(resource.RUSAGE_SELF).ru_minflt < FEW_FAULTS:
        return
    known = load_pages(path)
    mine = exclusive_ranges()
    both = merge(known + mine)
    if not mine or both == merge(known):
        return
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(b"".join(b"%x %x\n" % r for r in both[:MAX_RANGES]))
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class Spare:
    """The daemon's side of the spare: fork it, hand it a call, retire it."""

    def __init__(self) -> None:
        self.end: socket.socket | None = None
        self.pid = -1

    def start(self, run: Callable[[socket.socket, int, float], None], daemons_fds: Callable[[], list[int]],
              pages: str) -> None:
        """Fork the spare; ``run(conn, caller_pid, accepted)`` runs its call and never
        returns. ``daemons_fds()``, called in the spare: the daemon's own descriptors,
        which it closes at once. ``pages``: the file of pages calls wrote to."""
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
                _wait(theirs, run, pages)
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


def _wait(end: socket.socket, run: Callable[[socket.socket, int, float], None], pages: str) -> None:
    libc = _libc()
    rename(libc, SPARE_NAME)
    own_pages(libc, within(load_pages(pages), writable_ranges()), lambda: bool(select.select([end], [], [], 0)[0]))
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
