"""Which callers a hook daemon may serve: only those confined exactly as it is.

A daemon's child runs a call with the daemon's kernel-side state: its
namespaces, root, cgroup, resource limits, scheduling, capabilities, seccomp
filters and security label, whatever the caller's were. A caller confined
differently (a sandbox's own mount or network namespace, a tighter
``ulimit``, another cgroup) would have its hook run outside its confinement, or
under another caller's limits. So the daemon serves a caller only when the
caller's :func:`confinement`, read from ``/proc/<pid>`` of the socket's peer,
is its own, and when the caller's :func:`exec_env` (the variables that choose
which programs, libraries and git configuration a hook runs) is its own. Every
other variable (the agent id, the harness's session variables, ``STORM_*``)
is the caller's, as are its working directory, umask, argv and streams.

The client puts :func:`key` in the daemon's name, so a caller confined
differently looks for (and starts, from inside its confinement) a daemon of its
own; the daemon checks the peer itself, so a caller that names another
confinement's daemon is refused and runs the hook in its own process. A few
small ``/proc`` reads: standard library only, the client runs this first.
"""
from __future__ import annotations

import os

NAMESPACES = ("mnt", "net", "pid", "pid_for_children", "user", "ipc", "uts", "cgroup", "time",
              "time_for_children")
STATUS_ROWS = (b"Uid:", b"Gid:", b"Groups:", b"NoNewPrivs:", b"Seccomp:", b"Seccomp_filters:", b"CapInh:",
               b"CapPrm:", b"CapEff:", b"CapBnd:", b"CapAmb:")
# variables that choose the programs, libraries, shell start-up files and git
# configuration a hook's subprocesses run with
EXEC_NAMES = frozenset((b"PATH", b"HOME", b"XDG_CONFIG_HOME", b"XDG_CONFIG_DIRS", b"SHELL", b"BASH_ENV", b"ENV",
                        b"IFS", b"TMPDIR", b"GCONV_PATH", b"LOCPATH", b"NLSPATH", b"HOSTALIASES", b"GLIBC_TUNABLES",
                        b"PERL5LIB", b"PERL5OPT", b"PERLLIB", b"RUBYOPT", b"RUBYLIB", b"NODE_OPTIONS",
                        b"SSH_ASKPASS", b"PAGER", b"EDITOR", b"VISUAL", b"LANG", b"LANGUAGE"))
# (LC_: the locale a process sets up at its start, and git's messages)
EXEC_PREFIXES = (b"LD_", b"GIT_", b"PYTHON", b"MALLOC_", b"LC_")
SO_PEERPIDFD = 77  # Linux 6.5 on; older kernels refuse it and the start time stands in
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def confinement(pid: int | str = "self") -> tuple[bytes, ...] | None:
    """What the kernel confines process ``pid`` by, or None when it cannot be read
    (gone, or not ours to inspect)."""
    base = f"/proc/{pid}/"
    try:
        rows = [os.readlink(base + "root").encode("utf-8", "surrogateescape")]
        for name in NAMESPACES:
            try:
                rows.append(os.readlink(base + "ns/" + name).encode())
            except FileNotFoundError:
                rows.append(b"-")  # a kernel without that namespace: the same for every process
        rows.append(_read(base + "cgroup"))
        rows.append(_read(base + "limits"))
        stat = _read(base + "stat").rsplit(b")", 1)[1].split()
        rows += [stat[15], stat[16], stat[37], stat[38]]  # priority, nice, rt_priority, policy
        rows += [r for r in _read(base + "status").splitlines() if r.startswith(STATUS_ROWS)]
        try:
            rows.append(_read(base + "attr/current"))
        except OSError as exc:
            if isinstance(exc, PermissionError):
                return None
            rows.append(b"-")  # no security module with a label
    except (OSError, IndexError):
        return None
    return tuple(rows)


def exec_env(env: "dict[bytes, bytes] | os._Environ[bytes]") -> tuple[tuple[bytes, bytes], ...]:
    """The variables of ``env`` that choose what a hook's subprocesses run."""
    return tuple(sorted((k, v) for k, v in env.items() if k in EXEC_NAMES or k.startswith(EXEC_PREFIXES)))


def key(env: "dict[bytes, bytes] | os._Environ[bytes]") -> str:
    """This process's confinement and ``env``'s :func:`exec_env`, as text for the
    daemon's name (callers with another key look for another daemon)."""
    rows = confinement() or (b"?",)
    rows += tuple(k + b"=" + v for k, v in exec_env(env))
    return b"\n".join(rows).decode("utf-8", "surrogateescape")


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in seconds of CLOCK_BOOTTIME, or None."""
    try:
        stat = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return int(stat[19]) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


def peer_pidfd(sock) -> int | None:  # noqa: ANN001 - a socket.socket
    """A pidfd of the process that connected ``sock`` (None: the kernel has none)."""
    try:
        return int(sock.getsockopt(1, SO_PEERPIDFD))  # SOL_SOCKET
    except OSError:
        return None


def same_as_peer(sock, pid: int, mine: tuple[bytes, ...], accepted: float) -> bool:  # noqa: ANN001
    """The process that connected ``sock`` (``pid`` from its credentials) is
    confined as ``mine`` says; ``accepted`` is CLOCK_BOOTTIME at accept. A pid
    whose process died and was reused is caught by the pidfd (the process is still
    alive after the reads) or, without one, by a start after the accept."""
    import errno
    import signal

    if pid <= 0:
        return False  # in a pid namespace the daemon cannot see into
    pidfd = peer_pidfd(sock)
    try:
        born = started_at(pid)
        if born is None or born > accepted:
            return False  # not the process that connected
        if confinement(pid) != mine:
            return False
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, 0)  # still that process: what was read was its
            except OSError as exc:
                return exc.errno == errno.ENOSYS  # a kernel (or valgrind) without the call: the start time stands
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def boottime() -> float:
    import time

    return time.clock_gettime(time.CLOCK_BOOTTIME)
