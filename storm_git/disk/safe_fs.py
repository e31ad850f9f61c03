"""Reading and writing files of the working tree without ever following a symbolic link.

Every disk write walks the path one directory at a time with ``O_NOFOLLOW``
directory descriptors and renames a temporary file inside the directory it
checked, so a directory swapped for a symbolic link while a writer waited can
never send a write outside the working tree.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_mod
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeAlias

import pygit2

from ..core.convert import ConversionFailed, Conversions
from ..core.errors import BadPath
from ..core.files import NotRegularFile, open_regular, read_regular, remove_quietly
from ..core.store import MODE_BLOB, MODE_EXEC, MODE_LINK, Entry

TEMP_PREFIX = ".storm-tmp-"
HASH_CHUNK = 1 << 20

# A path's state on disk: (blob id, mode), None when absent, False when something
# storm does not manage is there (a directory, a fifo, a path through a symlink).
DiskState: TypeAlias = "tuple[pygit2.Oid, int] | None | bool"
# The mode of a regular file whose exec bit the file system does not keep
# (core.fileMode=false): either file mode, as git then takes it from the index.
# Where links are checked out as plain files (core.symlinks=false) a regular file
# may also stand for a link: the modes such a file can be recorded as.
MODE_REGULAR = -1
MODE_BLOB_OR_LINK = -2
MODE_EXEC_OR_LINK = -3
MODE_ANY_FILE = -4
ACCEPTS = {MODE_REGULAR: (MODE_BLOB, MODE_EXEC), MODE_BLOB_OR_LINK: (MODE_BLOB, MODE_LINK),
           MODE_EXEC_OR_LINK: (MODE_EXEC, MODE_LINK), MODE_ANY_FILE: (MODE_BLOB, MODE_EXEC, MODE_LINK)}


class UnsafePath(BadPath):
    """A disk write refused at the moment of writing (a component is a symlink or a file)."""

    kind = "unsafe_path"


# -- reading the disk without following symlinks ----------------------------------
@contextmanager
def parent_fd(top: str, path: str, *, create: bool) -> Iterator[tuple[int, str, list[int]]]:
    """Open the directory holding ``path`` below ``top`` one component at a time,
    never following a symlink. Yields (dir fd, final name, fds of the chain).
    Raises UnsafePath when a component is a symlink or not a directory, and
    FileNotFoundError when one is missing and ``create`` is False."""
    parts = path.split("/")
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for i, part in enumerate(parts[:-1]):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(part, flags, dir_fd=fds[-1])
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fds[-1])
                except FileExistsError:
                    pass
                fd = _open_dir(part, flags, fds[-1], parts[:i + 1])
            except OSError as exc:
                raise _unsafe(exc, parts[:i + 1], fds[-1]) from None
            fds.append(fd)
        yield fds[-1], parts[-1], fds
    finally:
        for fd in fds:
            os.close(fd)


def _open_dir(part: str, flags: int, dir_fd: int, shown: list[str]) -> int:
    try:
        return os.open(part, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _unsafe(exc, shown, dir_fd) from None


def _unsafe(exc: OSError, parts: list[str], dir_fd: int | None = None) -> Exception:
    where = "/".join(parts)
    if exc.errno == errno.ENOTDIR and dir_fd is not None:
        try:  # Linux answers ENOTDIR, not ELOOP, for O_DIRECTORY|O_NOFOLLOW on a link
            if stat_mod.S_ISLNK(os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode):
                exc = OSError(errno.ELOOP, "symbolic link")
        except OSError:
            pass
    if exc.errno == errno.ELOOP:
        return UnsafePath(f"{where!r} is a symbolic link; storm never writes through one",
                          hint="replace the link by a directory, or name the file by its real path")
    if exc.errno == errno.ENOTDIR:
        return UnsafePath(f"{where!r} is not a directory on disk",
                          hint="git storm status shows what is there; move it away")
    return exc


def _git_hash_fd(fd: int, size: int) -> pygit2.Oid:
    h = hashlib.sha1(b"blob %d\0" % size)
    while True:
        chunk = os.read(fd, HASH_CHUNK)
        if not chunk:
            break
        h.update(chunk)
    return pygit2.Oid(hex=h.hexdigest())


class DirFds:
    """Directory descriptors for a batch of disk *reads* (hashing, reading), each
    directory opened once, one component at a time, never through a symlink
    (as parent_fd). Checking the paths of a 2,000-file command opened and closed
    the chain of every path's directories once per path; this opens each once.
    Writes keep parent_fd: they must look at the directory at the moment of writing."""

    LIMIT = 256

    def __init__(self, top: str) -> None:
        self.top = top
        self.fds: dict[str, int | Exception] = {}

    def __enter__(self) -> "DirFds":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for fd in self.fds.values():
            if isinstance(fd, int):
                os.close(fd)
        self.fds.clear()

    def get(self, d: str) -> int:
        """The descriptor of directory ``d`` ('' = the top). Raises UnsafePath when a
        component is a symlink or not a directory, FileNotFoundError when one is missing."""
        fd = self.fds.get(d)
        if fd is None:
            if len(self.fds) >= self.LIMIT:
                self.close()
            try:
                fd = self._open(d)
            except (UnsafePath, OSError) as exc:
                fd = exc
            self.fds[d] = fd
        if isinstance(fd, Exception):
            raise fd.with_traceback(None)  # the same failure, without piling up tracebacks
        return fd

    def _open(self, d: str) -> int:
        if not d:
            return os.open(self.top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        cut = d.rfind("/")
        parent = self.get(d[:cut] if cut >= 0 else "")
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(d[cut + 1:], flags, dir_fd=parent)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _unsafe(exc, d.split("/"), parent) from None


def _split(path: str) -> tuple[str, str]:
    cut = path.rfind("/")
    return (path[:cut], path[cut + 1:]) if cut >= 0 else ("", path)


def disk_state(top: str, path: str, dirs: DirFds | None = None, conv: Conversions | None = None) -> DiskState:
    """(blob id, mode) of ``path`` under ``top`` as git would record it, without
    following symlinks anywhere; None if absent; False if not a file or link.
    ``dirs``: directory descriptors shared by a batch (see DirFds). ``conv``: the
    repository's conversions, so a file is hashed as ``git add`` would store it
    (a CRLF checkout of an LF blob is that blob); without it, the bytes as they are."""
    try:
        if dirs is not None:
            d, name = _split(path)
            return state_at(dirs.get(d), name, conv, path)
        with parent_fd(top, path, create=False) as (dfd, name, _):
            return state_at(dfd, name, conv, path)
    except FileNotFoundError:
        return None
    except (UnsafePath, OSError, ConversionFailed):  # a file that cannot be compared is not storm's to touch
        return False


def state_at(dfd: int, name: str, conv: Conversions | None = None, path: str = "") -> DiskState:
    """disk_state of ``name`` (``path`` in the tree) in the open directory ``dfd``."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat_mod.S_ISLNK(st.st_mode):
        return pygit2.hash(os.fsencode(os.readlink(name, dir_fd=dfd))), MODE_LINK
    if not stat_mod.S_ISREG(st.st_mode):
        return False
    try:
        fd = open_regular(name, dir_fd=dfd, follow=False)
    except NotRegularFile:  # swapped for a FIFO, a directory … since the stat: not a file storm records
        return False
    try:
        if conv is not None and conv.applies(path):
            with open(fd, "rb", closefd=False) as fh:
                oid = conv.odb_id(path, fh.read())
        else:
            oid = _git_hash_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    mode = MODE_EXEC if st.st_mode & 0o100 else MODE_BLOB
    if conv is not None:
        if not conv.symlinks:
            mode = MODE_ANY_FILE if not conv.exec_bit else MODE_EXEC_OR_LINK if mode == MODE_EXEC else MODE_BLOB_OR_LINK
        elif not conv.exec_bit:
            mode = MODE_REGULAR
    return oid, mode


def disk_oid(full: str) -> pygit2.Oid | None | bool:
    """Blob id of the file at ``full`` (kept for callers that need only the id)."""
    top, name = os.path.split(full)
    s = disk_state(top or ".", name)
    return s[0] if isinstance(s, tuple) else s


def same(state: DiskState, entry: Entry | None) -> bool:
    if entry is None:
        return state is None or state is False
    return isinstance(state, tuple) and state[0] == entry.oid and (
        state[1] == entry.mode or entry.mode in ACCEPTS.get(state[1], ()))


def recorded_mode(state_mode: int, base: Entry | None) -> int:
    """The mode git records for a file on disk of ``state_mode`` (a state_at mode):
    where the disk cannot say (no exec bits, links as plain files), the mode the
    path had (``base``) if the disk is compatible with it, else a plain file's."""
    accepts = ACCEPTS.get(state_mode)
    if accepts is None:
        return state_mode
    if base is not None and base.mode in accepts:
        return base.mode
    return MODE_EXEC if state_mode == MODE_EXEC_OR_LINK else MODE_BLOB


def disk_mode(mode: int, conv: Conversions) -> int:
    """How storm writes an entry of ``mode``: a link as a plain file holding its
    target where the file system takes no links (core.symlinks=false), as git does."""
    return MODE_BLOB if mode == MODE_LINK and not conv.symlinks else mode


def read_disk(top: str, path: str, limit: int | None = None, dirs: DirFds | None = None) -> bytes | None:
    """Content of a regular file (or a link's text), read without following
    symlinks; None if absent. Raises TooLarge-sized ValueError over ``limit``.
    ``dirs``: directory descriptors shared by a batch (see DirFds)."""
    try:
        if dirs is not None:
            d, name = _split(path)
            return _read_at(dirs.get(d), name, limit)
        with parent_fd(top, path, create=False) as (dfd, name, _):
            return _read_at(dfd, name, limit)
    except FileNotFoundError:
        return None


def _read_at(dfd: int, name: str, limit: int | None) -> bytes:
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat_mod.S_ISLNK(st.st_mode):
        return os.fsencode(os.readlink(name, dir_fd=dfd))
    if limit is not None and st.st_size > limit:
        raise ValueError(st.st_size)
    return read_regular(name, dir_fd=dfd, follow=False)


# -- writing the disk ------------------------------------------------------------------
class Displaced(OSError):
    """What storm was replacing (or removing) changed between its check and the
    replacement: an edit saved in that window. The edit was put back, untouched."""


# Asked of the file storm displaced, at the moment it displaced it: is it still what
# storm checked (its own version)? (open directory, name of the displaced file) -> bool
Expect = Callable[[int, str], bool]


def write_file(top: str, path: str, data: bytes, mode: int = MODE_BLOB, expect: Expect | None = None) -> None:
    """Replace ``path`` with ``data`` by a rename inside its (checked) directory.
    ``expect``: see write_at."""
    with parent_fd(top, path, create=True) as (dfd, name, _):
        write_at(dfd, name, data, mode, expect)


def write_at(dfd: int, name: str, data: bytes, mode: int, expect: Expect | None = None) -> None:
    """write_file of ``name`` in the open directory ``dfd``.

    ``expect``: the caller checked that ``name`` holds storm's own version (or is
    absent, when it recorded none); the check is repeated on the file the swap
    displaces, at the moment it is displaced, so an edit saved since the check is
    put back and Displaced raised, never deleted. Without it (``checkout``, an
    agent's own worktree) the file is replaced whatever it holds."""
    tmp = f"{TEMP_PREFIX}{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=dfd)
    except FileNotFoundError:
        pass
    try:
        if mode == MODE_LINK:
            os.symlink(os.fsdecode(data), tmp, dir_fd=dfd)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o777 if mode == MODE_EXEC else 0o666, dir_fd=dfd)
            with open(fd, "wb", closefd=True) as fh:
                fh.write(data)
        if expect is not None and _libc_renameat2():
            _swap_checked(dfd, tmp, name, expect, data)
        elif not _swap_in(dfd, tmp, name):
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:  # a full disk, a size limit, a refused rename, ^C: no temporary file stays
        remove_quietly(tmp, dfd)
        raise


# renameat2(2) flags (linux/fs.h)
_RENAME_EXCHANGE = 2
_renameat2: Any = None  # resolved on first use; False when the platform has none


def _libc_renameat2() -> Any:
    global _renameat2
    if _renameat2 is None:
        _renameat2 = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.5
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _renameat2 = fn
            except (OSError, AttributeError):
                pass
    return _renameat2


def _swap_in(dfd: int, tmp: str, name: str) -> bool:
    """Put ``tmp`` in place of an existing file ``name`` by an atomic exchange, then
    delete the old file (now at ``tmp``). False: not done, the caller renames.

    Why not a plain rename over the file: ext4 (its default ``auto_da_alloc``)
    flushes the data of a file renamed over another, about 0.3 ms per write here,
    more than the rest of the disk write. An exchange is just as atomic for a
    reader (the old content or the new, never a mix or nothing) and ext4 skips
    that flush; git's own checkout, which unlinks and re-creates, skips it too.
    Only a regular file or a link is swapped: anything else goes through
    ``os.replace``, which refuses it as before."""
    fn = _libc_renameat2()
    if not fn:
        return False
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False  # a new file: a plain rename, with nothing to flush
    if not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISLNK(st.st_mode)):
        return False
    if fn(dfd, tmp.encode(), dfd, os.fsencode(name), _RENAME_EXCHANGE) != 0:
        err = ctypes_errno()
        if err == errno.ENOENT:  # removed since the stat: a plain rename
            return False
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without exchange
            return False
        raise OSError(err, os.strerror(err), name)
    try:
        os.unlink(tmp, dir_fd=dfd)
    except IsADirectoryError:  # swapped for a directory since the stat: put it back
        fn(dfd, tmp.encode(), dfd, os.fsencode(name), _RENAME_EXCHANGE)
        raise
    return True


_RENAME_NOREPLACE = 1


def _rename2(dfd: int, src: str, dst: str, flags: int) -> int:
    """renameat2 in ``dfd``: 0, or the errno."""
    fn = _libc_renameat2()
    if fn(dfd, os.fsencode(src), dfd, os.fsencode(dst), flags) != 0:
        return ctypes_errno()
    return 0


def _swap_checked(dfd: int, tmp: str, name: str, expect: Expect, data: bytes) -> None:
    """Put ``tmp`` at ``name`` and delete what it displaces only if ``expect`` says
    that is still storm's version. A new file goes in by RENAME_NOREPLACE (a file
    created since the check is someone's); an existing one by RENAME_EXCHANGE, after
    which the displaced file, now at ``tmp``, is checked; someone's edit is exchanged
    back and Displaced raised. If yet another save replaced ``name`` in between, what
    comes back at ``tmp`` is not storm's content either: it is kept beside ``name``
    (``name.storm-kept-PID``), never deleted."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is None:
        err = _rename2(dfd, tmp, name, _RENAME_NOREPLACE)
        if err == 0:
            return
        if err == errno.EEXIST:
            raise Displaced(errno.EEXIST, "created by someone else since storm looked", name)
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return
        raise OSError(err, os.strerror(err), name)
    if not (stat_mod.S_ISREG(st.st_mode) or stat_mod.S_ISLNK(st.st_mode)):
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # refuses a directory, as before
        return
    err = _rename2(dfd, tmp, name, _RENAME_EXCHANGE)
    if err == errno.ENOENT:  # removed since the stat: the absence is someone's too
        raise Displaced(errno.ENOENT, "removed by someone else since storm looked", name)
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        if not expect(dfd, name):
            raise Displaced(errno.EBUSY, "changed by someone else since storm looked", name)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return
    if err:
        raise OSError(err, os.strerror(err), name)
    try:
        mine = expect(dfd, tmp)
    except OSError:
        mine = False
    if mine:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except IsADirectoryError:  # swapped for a directory since the stat: put it back
            _rename2(dfd, tmp, name, _RENAME_EXCHANGE)
            raise
        return
    _rename2(dfd, tmp, name, _RENAME_EXCHANGE)  # the edit goes back where it was saved
    if not _holds(dfd, tmp, data):
        kept = f"{name}.storm-kept-{os.getpid()}"
        if _rename2(dfd, tmp, kept, _RENAME_NOREPLACE) != 0:
            os.replace(tmp, kept, src_dir_fd=dfd, dst_dir_fd=dfd)
    raise Displaced(errno.EBUSY, "changed by someone else since storm looked", name)


def _holds(dfd: int, name: str, data: bytes) -> bool:
    """Whether ``name`` is storm's temporary file: a link with target ``data``, or a
    file with exactly ``data``."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat_mod.S_ISLNK(st.st_mode):
            return os.fsencode(os.readlink(name, dir_fd=dfd)) == data
        return st.st_size == len(data) and read_regular(name, dir_fd=dfd, follow=False) == data
    except (OSError, NotRegularFile):
        return False


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()


def remove_path(top: str, path: str, expect: Expect | None = None) -> None:
    """Delete ``path`` and the directories it leaves empty, as git does.

    ``expect``: delete the file only if it says the file is storm's version at the
    moment it is taken away: it is first renamed aside (atomic), checked there, and
    put back (Displaced raised) if someone's edit was saved since the caller looked."""
    try:
        with parent_fd(top, path, create=False) as (dfd, name, fds):
            if expect is None:
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
            elif not _take_aside(dfd, name, expect):
                return
            parts = path.split("/")[:-1]
            for i in range(len(parts) - 1, -1, -1):
                try:
                    os.rmdir(parts[i], dir_fd=fds[i])
                except OSError:
                    break
    except FileNotFoundError:
        pass


def _take_aside(dfd: int, name: str, expect: Expect) -> bool:
    """Remove ``name`` if ``expect`` holds for it once renamed aside; False: it was gone."""
    aside = f"{TEMP_PREFIX}{os.getpid()}"
    remove_quietly(aside, dfd)
    try:
        os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
    except FileNotFoundError:
        return False
    try:
        mine = expect(dfd, aside)
    except OSError:
        mine = False
    if not mine:
        if not _libc_renameat2():
            os.rename(aside, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        elif _rename2(dfd, aside, name, _RENAME_NOREPLACE) != 0:  # another file there since
            os.rename(aside, f"{name}.storm-kept-{os.getpid()}", src_dir_fd=dfd, dst_dir_fd=dfd)
        raise Displaced(errno.EBUSY, "changed by someone else since storm looked", name)
    os.unlink(aside, dir_fd=dfd)
    return True

