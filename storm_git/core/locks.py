"""Process locks (``flock``) that serialise storm's writers.

Serialising writers with ``flock`` around read → validate → CAS gives no retries
and >1,000 updates/s, where bare CAS retries 2.5–4.5 times per success on two
cores. The kernel drops a flock when its holder dies, so the holder of a
lock may safely treat an old ``<ref>.lock`` file under the refs that lock guards
as left by a dead writer. The CAS on the ref stays underneath as the guard
against writers that do not take these locks.

Lock files live in ``<common git dir>/storm/locks/``:

* ``workspace`` guards the shared ref, reservations and the event log;
* ``agent-<id>`` guards one agent's notes refs (reads never contend across agents);
* ``worktree`` guards writing the shared working tree;
* ``remote`` (a clone of a workspace on a git server) guards every fetch and push of
  the storm refs and the copies of the server's refs (``refs/storm-remote/``); it is
  taken before ``workspace``, never inside it; its holder also holds
  ``remote-landing``, which queued writers wait on, shared;
* ``write-<id>`` (on such a clone) is held by one write of an agent from before it
  writes to its end, so that two processes of one agent write there in turn.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from .errors import Busy, UsageError

REMOTE_LOCK = "remote"
# Held exclusively by whoever holds REMOTE_LOCK; queued writers take it shared to
# sleep until the push (or fetch) in progress is over, then all wake at once.
LANDING_LOCK = "remote-landing"


def lock_dir(commondir: str) -> str:
    return os.path.join(commondir, "storm", "locks")


@dataclass
class LockWait:
    """A wait for one of storm's locks that another process holds."""

    name: str
    seconds: float  # waited so far
    holder: int | None  # the pid holding it (from /proc/locks), when the system says
    command: str  # that process's command line ("" unknown)

    def who(self) -> str:
        if self.holder is None:
            return "another process"
        return f"pid {self.holder}" + (f" ({self.command})" if self.command else "")


@dataclass
class WaitPolicy:
    """How long a storm command waits for a lock another process holds. The default
    (``timeout`` None, no ``on_wait``) waits as long as it takes, in the kernel, as a
    library caller expects; the command line, the MCP server and the harness hooks
    set one (``storm.lockTimeout``), so a holder stuck in a hook waiting for input,
    a stopped job or a hung mount makes them say who holds the lock and then give up,
    exit 3, never wait silently forever."""

    timeout: Callable[[str], float | None] | None = None  # commondir -> seconds (None: forever)
    notice_after: float = 3.0
    on_wait: Callable[[LockWait], None] | None = None


_policy = WaitPolicy()


def set_wait_policy(policy: WaitPolicy) -> WaitPolicy:
    """Install ``policy`` for this process; returns the one it replaces."""
    global _policy
    old, _policy = _policy, policy
    return old


class LockTimeout(Busy):
    """A lock another process held for longer than ``storm.lockTimeout``."""

    kind = "busy"


@contextmanager
def flocked(commondir: str, name: str, *, shared: bool = False, patient: bool = False) -> Iterator[None]:
    """Hold an exclusive (or ``shared``) flock on ``storm/locks/<name>`` for the block.
    Free: taken at once. Held by another process: waited for as the process's
    WaitPolicy says (``patient``: as long as it takes, whatever the policy: a
    foreground ``maintenance`` behind a background one)."""
    d = lock_dir(commondir)
    path = os.path.join(d, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except FileNotFoundError:
        os.makedirs(d, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    policy = _policy
    try:
        if patient or (policy.timeout is None and policy.on_wait is None):
            fcntl.flock(fd, op)  # the kernel's wait, as long as it takes (library callers' default)
        else:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                _wait(fd, op, commondir, name, path, policy)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _wait(fd: int, op: int, commondir: str, name: str, path: str, policy: WaitPolicy) -> None:
    """Wait for the lock, say once who holds it after ``notice_after``, give up after
    the policy's timeout. In the main thread the wait is the kernel's (a blocking
    flock, interrupted by a timer at each mark: the waiter keeps its place, wakes the
    moment the lock is free, and shows in /proc/locks); elsewhere (the MCP server's
    worker threads, where no signal can reach) the lock is polled, 1 ms doubling to 20."""
    timeout = policy.timeout(commondir) if policy.timeout is not None else None
    start = time.monotonic()
    told = policy.on_wait is None
    in_main = threading.current_thread() is threading.main_thread()
    while True:
        waited = time.monotonic() - start
        if not told and waited >= policy.notice_after:
            told = True
            policy.on_wait(LockWait(name, waited, *holder(fd)))  # type: ignore[misc]
        if timeout is not None and waited >= timeout:
            w = LockWait(name, waited, *holder(fd))
            raise LockTimeout(f"storm's {name} lock ({path}) is still held by {w.who()} after {waited:.0f}s; "
                              "nothing was changed",
                              hint="if that process is stuck (a hook waiting for input, a stopped job: fg or "
                                   "kill it), end it; git config storm.lockTimeout SECONDS waits longer (0: "
                                   "forever)")
        marks = ([] if told else [policy.notice_after - waited]) + ([] if timeout is None else [timeout - waited])
        if not marks:
            fcntl.flock(fd, op)
            return
        if (_flock_until if in_main else _poll_until)(fd, op, time.monotonic() + max(min(marks), 0.001)):
            return


class _Alarm(Exception):
    pass


def _flock_until(fd: int, op: int, deadline: float) -> bool:
    """A blocking flock that a timer interrupts at ``deadline``: True when taken. The
    handler raises only while armed, so a timer that fires as the flock returns is
    caught here (and the flock, already ours, is taken again at once), never later."""
    armed = [False]

    def on_alarm(signum: int, frame: object) -> None:
        if armed[0]:
            raise _Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        try:
            armed[0] = True
            signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
            fcntl.flock(fd, op)
            taken = True
        except _Alarm:
            taken = False
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        return taken
    finally:
        signal.signal(signal.SIGALRM, old)


def _poll_until(fd: int, op: int, deadline: float) -> bool:
    pause = 0.001
    while time.monotonic() < deadline:
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 0.02)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
    return False


def holder(fd: int) -> tuple[int | None, str]:
    """(pid, command line) of a process holding a flock on ``fd``'s file, from Linux's
    /proc/locks; (None, "") where the system does not say."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, ""
    me = os.getpid()
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == dev:
            try:
                pid = int(parts[4])
            except ValueError:
                continue
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                cmd = ""
            return pid, cmd[:200]
    return None, ""


@contextmanager
def try_flocked(commondir: str, name: str) -> Iterator[bool]:
    """Take lock ``name`` if nobody holds it; yields whether it was taken. For
    whoever must not wait on another process (``status`` beside a stopped agent)."""
    d = lock_dir(commondir)
    os.makedirs(d, exist_ok=True)
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def held_count(commondir: str, prefix: str) -> int:
    """How many of the locks whose names start with ``prefix`` some process holds now
    (a shared, non-blocking probe of each: probes never count each other)."""
    d = lock_dir(commondir)
    try:
        names = [e.name for e in os.scandir(d) if e.name.startswith(prefix) and e.is_file(follow_symlinks=False)]
    except OSError:
        return 0
    held = 0
    for name in names:
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return held


def is_locked(commondir: str, name: str) -> bool:
    """True if some live process holds lock ``name`` right now."""
    path = os.path.join(lock_dir(commondir), name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a leftover named by a pid is the dead's to clean)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- storm.lockTimeout
#
# ``storm.lockTimeout``: how long a command waits for one of storm's locks.
#
# Read only when a lock is actually waited for (the fast path never reads it), by
# the command line and by the harness hook alike (the hook caps it well inside the
# harness's own timeout).


DEFAULT_LOCK_TIMEOUT = 300.0


def lock_timeout(commondir: str, *, cap: float | None = None) -> float | None:
    """``storm.lockTimeout`` in seconds (None: wait as long as it takes), at most ``cap``."""
    from .store import git_env  # pygit2 only once a lock is waited for: a broken install still answers

    r = subprocess.run(["git", "--git-dir", commondir, "config", "--get", "storm.lockTimeout"],
                       capture_output=True, env=git_env())
    raw = r.stdout.decode("utf-8", "replace").strip()
    try:
        value = float(raw) if raw else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        value = -1.0
    if value < 0 or value != value:
        raise UsageError(f"storm.lockTimeout is {raw!r}, not a number of seconds",
                         hint="git config storm.lockTimeout 300 (0: wait as long as it takes)")
    out = None if value == 0 else value
    return out if cap is None else min(out if out is not None else cap, cap)
