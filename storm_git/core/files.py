"""Writing storm's own files so that a full disk leaves nothing torn behind.

A full file system (ENOSPC), a quota (EDQUOT) or a file size limit (EFBIG,
``ulimit -f``) can make ``write()`` store only part of what it was given and
return the shorter count, or fail after a temporary file was created. Storm's
append-only files (read-set journals, the disk record) must then hold whole lines
or nothing, and a replaced file must be the old one or the new one, with no
temporary file left over. Every such write in the library goes through here.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

# errors that say "the disk (or a limit on it) cannot take more", not "storm is broken"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def append_all(path: str, data: bytes) -> os.stat_result:
    """Append all of ``data`` to ``path`` or nothing; returns the file's stat after.

    The caller holds the lock that serialises this file's appenders, so the size
    found before the write is where the file is cut back to when the write comes
    up short. A process killed between a short write and that cut leaves a torn
    tail, which the readers of these files already leave out."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        before = os.fstat(fd).st_size
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                done += os.write(fd, view[done:])  # short only when the disk is full (or a signal came)
        except OSError:
            if done:
                os.ftruncate(fd, before)
            raise
        return os.fstat(fd)
    finally:
        os.close(fd)


def append_log_line(path: str, line: bytes, rotate_bytes: int) -> None:
    """Append ``line`` to a log in one ``O_APPEND`` write (several processes may append
    at once), moving the log to ``<path>.1`` first once it is past ``rotate_bytes``.
    Best effort: a failure to log never fails what is being logged."""
    try:
        if os.path.getsize(path) > rotate_bytes:
            os.replace(path, path + ".1")
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def append_rows(path: str, rows: bytes) -> None:
    """Append whole lines to ``path`` (created if absent; the caller holds the lock that
    serialises its appenders). A row torn by a writer killed mid-append stays a line of
    its own: the new rows start on a fresh line, and readers skip what is not a row."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            rows = b"\n" + rows
        view = memoryview(rows)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes, *, mode: int | None = None, tmp: str | None = None) -> None:
    """Put ``data`` at ``path`` through a temporary file and a rename: a reader sees
    the old content or the new, and a failed write removes the temporary file."""
    tmp = tmp or f"{path}.storm-tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path: str, dir_fd: int | None = None) -> None:
    """Delete a file storm made, if it is there (clean-up on a failure path)."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


# the same, as libgit2 words it (pygit2 raises its OS errors without an errno)
NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is the disk (or a quota, or a size limit) refusing more data."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return True
    return any(t in str(exc) for t in NO_SPACE_TEXT)


def reason(exc: BaseException) -> str:
    """The short why of a failure for an answer: an OS error's own words
    ("No space left on device"), else the exception's text."""
    return str(exc.strerror or exc) if isinstance(exc, OSError) else str(exc)


def stamp(path: str) -> tuple[int, int, int] | None:
    """(mtime, size, inode) of ``path``, None when absent: what a cache of a file's
    parsed content is checked against (git replaces files by rename: a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def size_limited() -> int:
    """This process's file size limit in bytes (``ulimit -f``), 0 when there is none:
    libgit2 reports a write it cut short without the reason, and this is then the cause."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return 0 if soft == resource.RLIM_INFINITY else soft


def copy_index(index: str, to: str) -> None:
    """Copy git's ``index`` file with its mode (a temporary file's 0600 would shut the
    other users of a shared repository out) and its time: git trusts an entry's stat
    data only if it was taken before the index file's mtime second, so a copy stamped
    now would pass an edit made in that second (same size) as unchanged."""
    shutil.copy2(index, to)


@contextlib.contextmanager
def index_copy(index: str) -> Iterator[str]:
    """A private copy of git's ``index`` beside it (no file when there is no index
    yet), for git commands run with GIT_INDEX_FILE set to it: the real index is
    replaced by renaming the copy over it, never half-written. Removed on the way out
    unless the caller renamed it."""
    fd, tmp = tempfile.mkstemp(prefix="index.storm-", dir=os.path.dirname(index))
    os.close(fd)
    try:
        if os.path.exists(index):
            copy_index(index, tmp)
        else:
            os.unlink(tmp)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class NotRegularFile(OSError):
    """A path that is not a regular file where storm reads one. ``own``: one of
    storm's own files (corrupt state, exit 3); else a path of the working tree
    (bad input, exit 2). storm_git.core.errors.classify answers both."""

    def __init__(self, message: str, *, own: bool = False, kind: str = "not a regular file") -> None:
        super().__init__(message)
        self.message, self.own, self.kind = message, own, kind


def _kind_of(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "not a regular file")


def open_regular(name: str, *, dir_fd: int | None = None, follow: bool = True) -> int:
    """A read-only descriptor of the regular file ``name``. Opened with O_NONBLOCK, so
    a FIFO (``mkfifo`` by an agent's command, or swapped in while storm looks) does
    not hang the command until some writer appears, as a plain open would
    (``git storm adopt pipe`` would never return); anything but a regular
    file raises NotRegularFile naming it. Reads of a regular file ignore O_NONBLOCK."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(name, flags, dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _kind_of(mode)
        raise NotRegularFile(f"{name!r} is {kind}, not a file storm can read", kind=kind)
    return fd


def read_regular(name: str, *, dir_fd: int | None = None, follow: bool = True) -> bytes:
    """The content of the regular file ``name`` (open_regular's rules)."""
    with open(open_regular(name, dir_fd=dir_fd, follow=follow), "rb", closefd=True) as fh:
        return fh.read()


def read_own(path: str) -> bytes | None:
    """One of storm's own files (a journal, the disk record's companions), None when
    absent. Never blocks on a FIFO put in its place (a plain open waits for a writer:
    every storm command hung); anything but a regular file is corrupt state, which
    ``git storm doctor --fix`` moves aside."""
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise NotRegularFile(f"storm's {path} is {exc.kind}, not the file storm keeps there", own=True) from None
