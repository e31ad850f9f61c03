"""Arrival order on the server: pushes to the inbox take turns in the order they came.

Each ``proc-receive`` hook (one per push, storm_git.remote.server_order) takes a
numbered ticket as it starts: under a brief lock (``order-tickets``) it reads and
bumps a counter and creates its ticket file, locked (``flock``) by it until it is
done. It then waits for every lower ticket's lock in turn, and takes the server lock
(``order``, in ``<git dir>/storm/locks/``) for its work. A bare ``flock`` wakes its
waiters in no particular order; the tickets make the order the order of arrival,
so no clone can land twice while another waits, whatever its round trip.

A hook killed at any point lets go of its locks (the kernel drops them), so the
next in line goes on; the ticket files it left are removed by the next ticket
taken. A hook stopped (SIGSTOP) holds its turn: the others wait at most
``WAIT_SECONDS`` and answer that the server is busy, and their clones push again.
"""
from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.errors import Busy
from ..core.files import replace_file

ORDER_LOCK = "order"  # the server lock: one push's writes are applied under it
TICKETS_LOCK = "order-tickets"
WAIT_SECONDS = 100.0  # below a clone's push timeout (transport.PUSH_TIMEOUT): it hears why


def order_dir(gitdir: str) -> str:
    return os.path.join(gitdir, "storm", "order")


def lock_path(gitdir: str, name: str) -> str:
    return os.path.join(gitdir, "storm", "locks", name)


@contextmanager
def turn(gitdir: str, who: str, wait: float = WAIT_SECONDS) -> Iterator[int]:
    """Wait for this push's turn (its ticket, then the server lock); yields the ticket.
    Raises Busy when the turn does not come within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    ticket, fd = _take_ticket(gitdir, who)
    try:
        for earlier in _earlier(gitdir, ticket):
            try:
                other = os.open(earlier, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # done meanwhile
            try:
                _wait_lock(other, fcntl.LOCK_SH, deadline, f"ticket {os.path.basename(earlier)}")
            finally:
                os.close(other)
        lock = _open(lock_path(gitdir, ORDER_LOCK))
        try:
            _wait_lock(lock, fcntl.LOCK_EX, deadline, "the server lock")
            yield ticket
        finally:
            os.close(lock)
    finally:
        try:
            os.unlink(os.path.join(order_dir(gitdir), _name(ticket)))
        except FileNotFoundError:
            pass
        os.close(fd)


def _name(ticket: int) -> str:
    return f"{ticket:012d}"


def _open(path: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _take_ticket(gitdir: str, who: str) -> tuple[int, int]:
    """The next ticket and its file's descriptor, locked by this process."""
    d = order_dir(gitdir)
    os.makedirs(d, exist_ok=True)
    guard = _open(lock_path(gitdir, TICKETS_LOCK))
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # held for microseconds by whoever holds it
        _sweep(d)
        try:
            with open(os.path.join(d, "next"), "rb") as fh:
                ticket = int(fh.read().strip() or b"0")
        except (FileNotFoundError, ValueError):
            ticket = _highest(d) + 1
        fd = os.open(os.path.join(d, _name(ticket)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()} {who}\n".encode("utf-8", "replace"))
        replace_file(os.path.join(d, "next"), f"{ticket + 1}\n".encode("ascii"),
                     tmp=os.path.join(d, f"next.{os.getpid()}"))
        return ticket, fd
    finally:
        os.close(guard)


def _tickets(d: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.isdigit())


def _highest(d: str) -> int:
    names = _tickets(d)
    return int(names[-1]) if names else 0


def _earlier(gitdir: str, ticket: int) -> list[str]:
    d = order_dir(gitdir)
    return [os.path.join(d, n) for n in _tickets(d) if int(n) < ticket]


def _sweep(d: str) -> None:
    """Remove the ticket files of hooks that died (tickets lock held: every live
    ticket's owner holds its lock, so a ticket whose lock is free is a dead one's)."""
    for n in _tickets(d):
        path = os.path.join(d, n)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its owner is alive (or a waiter looks at it for a moment)
        else:
            os.unlink(path)
        finally:
            os.close(fd)


def _wait_lock(fd: int, op: int, deadline: float, what: str) -> None:
    """flock ``fd`` blocking, until ``deadline`` (then Busy)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Busy(f"the server's order waited {WAIT_SECONDS:.0f}s for {what}")

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        fcntl.flock(fd, op)
    except TimeoutError:
        raise Busy(f"the server's order waited {WAIT_SECONDS:.0f}s for {what} (a push stuck on the server)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
