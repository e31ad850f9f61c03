"""Linux inotify through the C library (ctypes): an instance, watches, events.

Only what :mod:`storm_git.disk.tree_watch` needs. :func:`available` is False
where there is no inotify (another system, no libc symbol); callers then walk.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

_HEADER = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    cookie: int
    name: bytes


class WatchLimit(OSError):
    """The user's inotify watches (fs.inotify.max_user_watches) are all taken."""


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            return None
        _libc = lib
    return _libc


def available() -> bool:
    return _lib() is not None


def init() -> int:
    """A new inotify instance: a non-blocking, close-on-exec file descriptor."""
    lib = _lib()
    if lib is None:
        raise OSError(errno.ENOSYS, "inotify is not available")
    fd = lib.inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


def add_watch(fd: int, path: bytes, mask: int) -> int:
    lib = _lib()
    assert lib is not None
    wd = lib.inotify_add_watch(fd, path, mask)
    if wd < 0:
        e = ctypes.get_errno()
        if e == errno.ENOSPC:
            raise WatchLimit(e, "the inotify watch limit (fs.inotify.max_user_watches) is reached")
        raise OSError(e, os.strerror(e), os.fsdecode(path))
    return int(wd)


def rm_watch(fd: int, wd: int) -> None:
    lib = _lib()
    assert lib is not None
    lib.inotify_rm_watch(fd, wd)  # a watch already gone (its directory removed) is fine


def read_events(fd: int, limit: int = 1 << 20) -> list[Event]:
    """Every event queued now (none: an empty list), at most ``limit`` bytes of them per read."""
    out: list[Event] = []
    while True:
        try:
            buf = os.read(fd, limit)
        except BlockingIOError:
            return out
        if not buf:
            return out
        i = 0
        while i + _HEADER.size <= len(buf):
            wd, mask, cookie, n = _HEADER.unpack_from(buf, i)
            i += _HEADER.size
            out.append(Event(wd, mask, cookie, buf[i:i + n].rstrip(b"\0")))
            i += n
