"""The shared working tree as a recorded state.

Storm records, per path, what it last put on disk: the *disk record*, a tree
(``base``) plus an append-only journal of later entries, kept in
``<common git dir>/storm/disk-record`` and changed only under the ``worktree``
flock. With it the state of every path is known, not guessed:

* disk equal to the record, record equal to the shared head: in step;
* disk equal to the record, record behind the head: *behind*; storm brings it
  forward (every command that touches the disk does, so a writer killed
  between its CAS and its disk write is repaired by the next command);
* disk different from the record: *unmediated* (an editor, a formatter, a
  person); the record's version is the base that edit was made on, and storm
  never overwrites it.

Before storm writes or deletes a file it records the version it is about to put
there as *pending* (a ``w``/``x`` entry), and once the file is written, the
version itself (``e``/``d``). Until then the disk may hold either, and both are
storm's: a writer killed between the file and its entry, or a disk that took the
file but refused the entry (full, over quota, over a size limit), leaves a state
that is recorded, not one that the next command would mistake for an edit.

``synced`` is the shared head the disk was last brought to in full: a writer
then only has to look at the paths that changed between ``synced`` and the
current head (its own, and those of writers that finished out of order or
died), not at the whole tree.

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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pygit2

from . import tree_rules
from .convert import ConversionFailed, Conversions
from .errors import BadPath, CorruptState
from .files import NotRegularFile, append_all, open_regular, read_regular, reason, remove_quietly, replace_file, stamp
from .locks import flocked
from .paths import tree_entry_refusal
from .store import MODE_BLOB, MODE_EXEC, MODE_LINK, MODE_TREE, WORKSPACE_REF, Entry, Store

WRITTEN = "written"
CURRENT = "current"
KEPT = "kept-unmediated"
SPARSE = "outside-sparse-checkout"  # absent because git's sparse checkout leaves it off the disk
FAILED = "failed"

RECORD_NAME = "disk-record"
HEADER = b"storm disk record 1\n"
FOLD_AT = 512  # journal entries before they are folded into the base tree
QUICK_AT = 8  # up to this many paths, a sync looks at and writes each through one directory chain
RESET_AT = 64  # from this many new entries, a sync that leaves the record equal to the head restarts it there
TEMP_PREFIX = ".storm-tmp-"
BIG_DIR_ENTRIES = 1024  # from here on, a pair of directories is compared by libgit2 (tree_changes)
FLAT_DIR_ENTRIES = 128  # ... and from here on, a pair without subdirectories (tree_changes)
HASH_CHUNK = 1 << 20

# A path's state on disk: (blob id, mode), None when absent, False when something
# storm does not manage is there (a directory, a fifo, a path through a symlink).
DiskState = "tuple[pygit2.Oid, int] | None | bool"
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
def _parent_fd(top: str, path: str, *, create: bool) -> Iterator[tuple[int, str, list[int]]]:
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
    (as _parent_fd). Checking the paths of a 2,000-file command opened and closed
    the chain of every path's directories once per path; this opens each once.
    Writes keep _parent_fd: they must look at the directory at the moment of writing."""

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


def disk_state(top: str, path: str, dirs: DirFds | None = None, conv: Conversions | None = None) -> "DiskState":
    """(blob id, mode) of ``path`` under ``top`` as git would record it, without
    following symlinks anywhere; None if absent; False if not a file or link.
    ``dirs``: directory descriptors shared by a batch (see DirFds). ``conv``: the
    repository's conversions, so a file is hashed as ``git add`` would store it
    (a CRLF checkout of an LF blob is that blob); without it, the bytes as they are."""
    try:
        if dirs is not None:
            d, name = _split(path)
            return _state_at(dirs.get(d), name, conv, path)
        with _parent_fd(top, path, create=False) as (dfd, name, _):
            return _state_at(dfd, name, conv, path)
    except FileNotFoundError:
        return None
    except (UnsafePath, OSError, ConversionFailed):  # a file that cannot be compared is not storm's to touch
        return False


def _state_at(dfd: int, name: str, conv: Conversions | None = None, path: str = "") -> "DiskState":
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


def same(state: "DiskState", entry: Entry | None) -> bool:
    if entry is None:
        return state is None or state is False
    return isinstance(state, tuple) and state[0] == entry.oid and (
        state[1] == entry.mode or entry.mode in ACCEPTS.get(state[1], ()))


def recorded_mode(state_mode: int, base: Entry | None) -> int:
    """The mode git records for a file on disk of ``state_mode`` (a _state_at mode):
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
        with _parent_fd(top, path, create=False) as (dfd, name, _):
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
    ``expect``: see _write_at."""
    with _parent_fd(top, path, create=True) as (dfd, name, _):
        _write_at(dfd, name, data, mode, expect)


def _write_at(dfd: int, name: str, data: bytes, mode: int, expect: Expect | None = None) -> None:
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
        with _parent_fd(top, path, create=False) as (dfd, name, fds):
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


# -- the record ---------------------------------------------------------------------------
@dataclass
class Record:
    """What storm last put on disk: ``base`` tree + ``overlay`` journal entries."""

    base: pygit2.Oid
    synced: pygit2.Oid | None
    overlay: dict[str, Entry | None] = field(default_factory=dict)
    journal_len: int = 0
    # path -> the version storm was putting there when it last wrote the record (see module docstring)
    pending: dict[str, Entry | None] = field(default_factory=dict)

    def get(self, store: Store, path: str) -> Entry | None:
        if path in self.overlay:
            return self.overlay[path]
        return entry_or_none(store, store.repo[self.base], path)

    def is_storms(self, store: Store, path: str, have: "DiskState") -> bool:
        """Whether the disk state ``have`` of ``path`` is one storm put there: the
        recorded version, or the one a write left pending."""
        return same(have, self.get(store, path)) or (path in self.pending and same(have, self.pending[path]))

    def copy(self) -> "Record":
        return Record(self.base, self.synced, dict(self.overlay), self.journal_len, dict(self.pending))


def entry_or_none(store: Store, tree: pygit2.Tree, path: str) -> Entry | None:
    """The file entry at ``path``; None when absent or not a file there."""
    try:
        return store.entry(tree, path)
    except BadPath:
        return None


def record_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", RECORD_NAME)


def _encode(kind: str, path: str = "", entry: Entry | None = None, oid: pygit2.Oid | None = None) -> bytes:
    """One entry: ``s`` synced head; ``e``/``d`` a file (or its absence) on disk;
    ``w``/``x`` the same about to be put there (pending)."""
    if kind == "s":
        return f"s {oid}".encode("ascii") + b"\0"
    if entry is None:
        return (b"x " if kind == "w" else b"d ") + path.encode("utf-8", "surrogateescape") + b"\0"
    return f"{kind} {entry.mode:o} {entry.oid} ".encode("ascii") + path.encode("utf-8", "surrogateescape") + b"\0"


def _default_base(store: Store) -> tuple[pygit2.Oid, pygit2.Oid | None]:
    """No record yet (a repository initialised by an older storm): git's own
    HEAD tree is what a checkout put on disk; the next full sync compares it with
    the shared head (a path already equal to the head is simply recorded)."""
    try:
        if not store.repo.head_is_unborn:
            return store.repo.head.peel(pygit2.Commit).tree.id, None
    except (pygit2.GitError, KeyError):
        pass
    head = store.ref_target(WORKSPACE_REF)
    return (store.commit(head).tree.id, head) if head is not None else (store.empty_tree(), None)


def load(store: Store) -> Record:
    """The record (caller holds the worktree lock). A missing file starts one.
    Parsed once per process and then only what was appended since (keyed by the
    file's inode and size: every rewrite is a new file, renamed over)."""
    path = record_path(store)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO here must not hang us
    except FileNotFoundError:
        base, synced = _default_base(store)
        reset(store, base, synced)
        return Record(base, synced)
    cache = store.caches.setdefault("disk", {})
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise CorruptState(f"storm's disk record {path} is not a file",
                               hint="git storm doctor --fix moves it aside")
        known = cache.get("record")
        if (known is not None and known[0] == st.st_ino and known[1] <= st.st_size
                and os.pread(fd, len(known[3]), 0) == known[3]):  # same file: its header names a unique reset
            _ino, start, cached, _head = known
            os.lseek(fd, start, os.SEEK_SET)
            data = b""
            while len(data) < st.st_size - start:
                chunk = os.read(fd, st.st_size - start - len(data))
                if not chunk:
                    break
                data += chunk
            rec = cached.copy()
            rest, offset = data, start
        else:
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
            rec, rest, offset = None, b"", 0
    finally:
        os.close(fd)
    try:
        if rec is None:
            if not data.startswith(HEADER):
                raise ValueError("header")
            first, _, rest = data[len(HEADER):].partition(b"\n")
            if not first.startswith(b"base "):
                raise ValueError("base")
            rec = Record(pygit2.Oid(hex=first[5:].split(b" ")[0].decode("ascii")), None)
            offset = len(data) - len(rest)
            header = data[:offset]
        else:
            header = known[3]
        items = rest.split(b"\0")
        for item in items[:-1]:  # the last piece is '' or a torn (killed) append
            kind, _, body = item.partition(b" ")
            if kind == b"s":
                rec.synced = pygit2.Oid(hex=body.decode("ascii"))
            elif kind in (b"d", b"x"):
                p = body.decode("utf-8", "surrogateescape")
                (rec.overlay if kind == b"d" else rec.pending)[p] = None
                if kind == b"d":
                    rec.pending.pop(p, None)
            elif kind in (b"e", b"w"):
                mode, oid, raw = body.split(b" ", 2)
                p = raw.decode("utf-8", "surrogateescape")
                (rec.overlay if kind == b"e" else rec.pending)[p] = Entry(pygit2.Oid(hex=oid.decode("ascii")),
                                                                          int(mode, 8))
                if kind == b"e":
                    rec.pending.pop(p, None)
            else:
                raise ValueError(kind)
            rec.journal_len += 1
        if not isinstance(store.repo.get(rec.base), pygit2.Tree):
            raise ValueError("base tree missing")
    except (ValueError, UnicodeDecodeError):
        cache.pop("record", None)
        raise CorruptState(f"storm's disk record {path} is unreadable",
                           hint="git storm doctor --fix rebuilds it") from None
    consumed = offset + len(rest) - len(items[-1])  # up to the last complete entry
    cache["record"] = (st.st_ino, consumed, rec.copy(), header)
    cache["checked"] = (st.st_ino, consumed)  # check_record: the file up to here parses
    return rec


def check_record(store: Store) -> None:
    """Refuse (CorruptState) before a write lands if the disk record is unreadable:
    the write would otherwise move the shared ref and then fail to put its file on
    disk. Parsed once per process, then only what was appended: cheap in a long run.

    Without the worktree lock (a writer must not queue behind another's disk write
    for this, and the lock order stays workspace, then worktree): a concurrent append
    is a torn tail, which load leaves out; a concurrent rewrite is a new inode, which
    the next load parses afresh. A missing record is created by the disk write, under
    its lock, as before."""
    try:
        st = os.stat(record_path(store))
    except FileNotFoundError:
        return
    if store.caches.get("disk", {}).get("checked") != (st.st_ino, st.st_size):
        load(store)  # what was appended since this process last looked (usually one entry)


def reset(store: Store, base: pygit2.Oid, synced: pygit2.Oid | None,
          pending: dict[str, Entry | None] | None = None) -> None:
    """Start the record afresh at ``base`` (init, doctor, folding); ``pending``
    entries carry over (a fold must not forget a write still in doubt)."""
    path = record_path(store)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # a fresh token: a cached parse can tell this file from an earlier one with the same inode
    body = HEADER + f"base {base} {os.urandom(8).hex()}\n".encode("ascii") + (_encode("s", oid=synced) if synced else b"")
    body += b"".join(_encode("w", p, e) for p, e in (pending or {}).items())
    replace_file(path, body, tmp=f"{path}.{os.getpid()}")


def append(store: Store, items: list[bytes]) -> None:
    """One ``write()`` of journal entries: a killed writer leaves at most a torn tail."""
    if not items:
        return
    data = b"".join(items)
    st = append_all(record_path(store), data)  # all or nothing: a full disk leaves no torn entry
    cache = store.caches.setdefault("disk", {})
    if cache.get("checked") == (st.st_ino, st.st_size - len(data)):  # the worktree lock held: nobody appended
        cache["checked"] = (st.st_ino, st.st_size)  # our own entries parse: check_record need not re-read


def fold(store: Store, rec: Record) -> Record:
    """Fold the journal into a new base tree (an ordinary git tree object)."""
    if rec.overlay:
        changes = {p: (None if e is None else (e.oid, e.mode)) for p, e in rec.overlay.items()}
        base = store.tree_with(store.repo[rec.base], changes)
    else:
        base = rec.base
    reset(store, base, rec.synced, rec.pending)
    return Record(base, rec.synced, journal_len=len(rec.pending), pending=dict(rec.pending))


def set_entries(store: Store, rec: Record, entries: dict[str, Entry | None]) -> None:
    """Record ``entries`` as what is now on disk (caller holds the worktree lock)."""
    append(store, [_encode("e" if e else "d", p, e) for p, e in entries.items()])
    rec.overlay.update(entries)
    rec.journal_len += len(entries)
    for p in entries:
        rec.pending.pop(p, None)


def _intend(store: Store, rec: Record, path: str, want: Entry | None) -> None:
    """Record ``want`` as pending at ``path`` before the file is written (module
    docstring); raises OSError (a full disk) before anything on disk changed."""
    append(store, [_encode("w", path, want)])
    rec.pending[path] = want
    rec.journal_len += 1


# -- bringing the disk forward --------------------------------------------------------------
def changed_paths(store: Store, old: pygit2.Tree, new: pygit2.Tree) -> list[str]:
    """Files that differ between two trees (see tree_changes). libgit2's tree-to-tree
    diff walks every entry of both trees: 21 ms for one changed file among 100,000,
    where this takes 0.4 ms."""
    return [p for p, _ in tree_changes(store, old, new)]


def tree_changes(store: Store, old: pygit2.Tree, new: pygit2.Tree, prefix: str = "",
                  out: list[tuple[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """Blob-level differences old → new as [(path, (oid, mode) or None)], skipping
    identical subtrees (cost grows with what changed, not with the tree). A pair
    of large directories is compared by libgit2 instead (see _big_changes)."""
    out = [] if out is None else out
    entries = len(old) + len(new)
    if entries >= BIG_DIR_ENTRIES or (entries >= FLAT_DIR_ENTRIES and _flat(old) and _flat(new)):
        _big_changes(old, new, prefix, out)
        return out
    repo = store.repo
    old_e = {e.name: e for e in old}
    new_e = {e.name: e for e in new}
    for name in old_e.keys() | new_e.keys():
        a, b = old_e.get(name), new_e.get(name)
        if a is not None and b is not None and a.id == b.id and a.filemode == b.filemode:
            continue
        path = prefix + name
        a_tree = a is not None and a.filemode == MODE_TREE
        b_tree = b is not None and b.filemode == MODE_TREE
        if a_tree and b_tree:
            tree_changes(store, repo[a.id], repo[b.id], path + "/", out)
            continue
        if a_tree:
            _all_blobs(store, repo[a.id], path + "/", out, delete=True)
        elif a is not None and (b is None or b_tree):
            out.append((path, None))
        if b_tree:
            _all_blobs(store, repo[b.id], path + "/", out, delete=False)
        elif b is not None:
            out.append((path, (b.id, b.filemode)))
    return out


_FLAT: dict[pygit2.Oid, bool] = {}  # tree -> it holds no subtree (this process's answers)


def _flat(tree: pygit2.Tree) -> bool:
    """Whether ``tree`` holds no subtree: then libgit2's diff walks nothing more than
    its entries, ~0.02 ms for 320 files where the walk below takes ~0.36 ms (a flat
    directory of a few hundred files, synced after every write). Read from the raw
    tree (a subtree's entry starts ``40000 ``; a name or id that holds those bytes only
    sends the pair to the walk), once per tree: the old side is usually the tree the
    last sync brought."""
    known = _FLAT.get(tree.id)
    if known is None:
        known = b"40000 " not in tree.read_raw()
        if len(_FLAT) >= 4096:
            _FLAT.clear()
        _FLAT[tree.id] = known
    return known


def _big_changes(old: pygit2.Tree, new: pygit2.Tree, prefix: str, out: list[tuple[str, Any]]) -> None:
    """tree_changes of two large directories through libgit2's tree diff: in Python
    each entry costs ~4 µs (an object and an enum per ``filemode``), so a directory
    of 20,000 entries took ~80 ms where libgit2 takes ~4 ms. libgit2 also walks
    identical subtrees (~0.2 µs an entry), which is why only large pairs come here."""
    found: dict[str, Any] = {}
    for d in old.diff_to_tree(new).deltas:
        status = d.status_char()  # a str: ``status`` builds an enum (~1.5 µs)
        if status == "D":
            found.setdefault(prefix + d.old_file.path, None)
        else:  # added, modified (a file replaced by a link: a deletion, then this addition)
            nf = d.new_file
            if status != "A" and d.old_file.path != nf.path:
                found.setdefault(prefix + d.old_file.path, None)
            found[prefix + nf.path] = (nf.id, nf.mode)
    out.extend(found.items())


def _all_blobs(store: Store, tree: pygit2.Tree, prefix: str, out: list, *, delete: bool) -> None:
    for e in tree:
        if e.filemode == MODE_TREE:
            _all_blobs(store, store.repo[e.id], prefix + e.name + "/", out, delete=delete)
        else:
            out.append((prefix + e.name, None if delete else (e.id, e.filemode)))


@dataclass
class SyncResult:
    """Outcome per path of bringing the disk to the shared head."""

    head: pygit2.Oid | None
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # the files were settled but their entries could not be appended (a full disk): the
    # pending entries written before each file keep the state recorded (``keep_going``)
    record_error: str | None = None


def sync_locked(store: Store, paths: list[str] = (), *, full: bool = False,
                contents: dict[pygit2.Oid, bytes] | None = None,
                step: tuple[pygit2.Oid, pygit2.Oid] | None = None,
                entries: dict[str, Entry | None] | None = None, keep_going: bool = False,
                conv: Conversions | None = None) -> SyncResult:
    """Bring ``paths`` — and every path that changed since the last sync — on disk
    to the current shared head. ``full`` compares the whole record with the head
    (repairs anything left behind). Caller holds the worktree lock.

    ``keep_going``: a failure to append the final entries is reported in
    ``record_error`` instead of raised (a write that has landed reports what it did).

    ``step`` = (parent, commit) of the caller's own write and ``entries`` what it
    put at ``paths``: when the disk was synced to the parent and the head is still
    that commit, those are all that changed, and the new trees are not read back.
    ``conv``: the caller's Conversions (a write made one for its blobs), else a new one."""
    head = store.ref_target(WORKSPACE_REF)
    if head is None:
        return SyncResult(None)
    rec = load(store)
    if full or rec.synced is None or rec.journal_len >= FOLD_AT:
        rec = fold(store, rec)
    clean = False
    if step is not None and not full and rec.synced == step[0] and head == step[1]:
        candidates = list(paths)  # the head is exactly the caller's commit on the synced one: no diff
        if entries is not None and all(p in entries for p in candidates):
            wants = {p: entries[p] for p in candidates}
        else:
            htree = store.commit(head).tree
            wants = {p: entry_or_none(store, htree, p) for p in candidates}
    else:
        htree = store.commit(head).tree
        since = store.repo[rec.base] if full or rec.synced is None else store.commit(rec.synced).tree
        # the record is exactly ``since`` (journal folded): the candidates below are then every
        # path where the record and the head differ
        clean = not rec.overlay and rec.base == since.id
        candidates = list(dict.fromkeys([*paths, *changed_paths(store, since, htree)]))
        wants = {p: entry_or_none(store, htree, p) for p in candidates}
    res = SyncResult(head)
    top = store.main_workdir
    new: dict[str, Entry | None] = {}
    conv = conv or Conversions(store)
    if len(candidates) <= QUICK_AT:  # a writer's own paths: one directory chain each, looked at and written
        _settle_few(store, top, candidates, wants, rec, contents, res, new, conv)
    else:  # a sync of many paths: each directory opened once for the looks
        _settle_many(store, top, candidates, wants, rec, contents, res, new, conv)
    if clean and len(new) >= RESET_AT and all(o in (CURRENT, WRITTEN) for o in res.outcomes.values()):
        # every path that changed since is now on disk as at the head: the record *is* the
        # head's tree. Starting it afresh there spares the next full sync a fold (a
        # tree_with of each directory touched: ~40 ms for 2,000 paths among 20,000)
        reset(store, htree.id, head, {p: e for p, e in rec.pending.items() if p not in new})
        return res
    items = [_encode("e" if e else "d", p, e) for p, e in new.items()]
    if rec.synced != head:
        items.append(_encode("s", oid=head))
    try:
        append(store, items)  # one write: the entries and the new synced head
    except OSError as exc:
        if not keep_going:
            raise
        res.record_error = reason(exc)
        return res
    rec.overlay.update(new)
    rec.journal_len += len(new)
    for p in new:
        rec.pending.pop(p, None)
    return res


def _settle_few(store: Store, top: str, candidates: list[str], wants: dict[str, Entry | None], rec: Record,
                contents: dict[pygit2.Oid, bytes] | None, res: SyncResult, new: dict[str, Entry | None],
                conv: Conversions) -> None:
    # removals first: a file that becomes a directory (or the reverse) frees its name
    for p in sorted(candidates, key=lambda p: wants[p] is not None):
        want = wants[p]
        quick = _settle_in_place(store, top, p, want, rec, contents, conv) if want is not None else None
        if quick is not None:
            res.outcomes[p] = quick
            if quick == WRITTEN or (quick == CURRENT and rec.get(store, p) != want):
                new[p] = want
            continue
        _settle_one(store, top, p, want, disk_state(top, p, conv=conv), rec, contents, res, new, conv)


def _settle_many(store: Store, top: str, candidates: list[str], wants: dict[str, Entry | None], rec: Record,
                 contents: dict[pygit2.Oid, bytes] | None, res: SyncResult, new: dict[str, Entry | None],
                 conv: Conversions) -> None:
    with DirFds(top) as dirs:
        for p in sorted(candidates, key=lambda p: wants[p] is not None):
            if _settle_one(store, top, p, wants[p], disk_state(top, p, dirs, conv), rec, contents, res, new, conv):
                dirs.close()  # the directories changed: later reads open them afresh


def _settle_one(store: Store, top: str, p: str, want: Entry | None, have: "DiskState", rec: Record,
                contents: dict[pygit2.Oid, bytes] | None, res: SyncResult, new: dict[str, Entry | None],
                conv: Conversions) -> bool:
    """Bring one path from ``have`` to ``want`` unless someone else edited it;
    returns whether it wrote (or tried to) on disk."""
    why = refused_entry(store, p, want, res.head)
    if why is not None:  # reported whatever the disk holds: the shared head holds what storm refuses
        res.outcomes[p] = FAILED
        res.errors[p] = f"refused to put it on disk: {why}"
        return False
    if same(have, want):
        res.outcomes[p] = CURRENT
        if rec.get(store, p) != want:
            new[p] = want
        return False
    if not rec.is_storms(store, p, have):
        res.outcomes[p] = SPARSE if have is None and outside_sparse_checkout(store, p) else KEPT
        return False
    try:
        _intend(store, rec, p, want)
        expect = _still(have, p, conv)
        if want is None:
            remove_path(top, p, expect)
        else:
            write_file(top, p, _content(store, p, want, contents, conv), disk_mode(want.mode, conv), expect)
    except Displaced:  # an edit saved while storm wrote: kept, as any unmediated edit
        res.outcomes[p] = KEPT
        return True
    except (UnsafePath, ConversionFailed, OSError) as exc:
        res.outcomes[p] = FAILED
        res.errors[p] = reason(exc) if isinstance(exc, OSError) else exc.message
        return True
    res.outcomes[p] = WRITTEN
    new[p] = want
    return True


def _still(have: "DiskState", path: str, conv: Conversions) -> Expect:
    """The check a disk write repeats on the file it displaces: still ``have``, the
    state the caller found to be storm's own version of ``path``."""
    return lambda dfd, name: _state_at(dfd, name, conv, path) == have


def refused_entry(store: Store, path: str, want: Entry | None, head: pygit2.Oid | None) -> str | None:
    """Why the entry ``want`` of the shared head must not be put on disk at ``path``
    (storm_git.core.tree_rules: the rules of a local write), or None. The shared ref
    of a clone holds what its server accepted; a server without storm's guard accepts
    ``.GIT/hooks/pre-commit`` or a link out of the tree, and no sync writes them.
    A link is resolved through the other links of ``head``'s tree (``None``: the
    current shared head)."""
    if want is None:
        return None
    if want.mode != MODE_LINK:
        return tree_entry_refusal(path, want.mode)
    head = head if head is not None else store.ref_target(WORKSPACE_REF)
    if head is None:
        return None
    return tree_rules.entry_refusal(store.repo, store.commit(head).tree, path, want.oid, want.mode)


def outside_sparse_checkout(store: Store, path: str) -> bool:
    """Whether git's sparse checkout leaves ``path`` off the disk (its index entry is
    skip-worktree). Asked only of a file that is missing where storm recorded one,
    and only when core.sparseCheckout is on; the index's skip-worktree paths are
    read by one ``git ls-files`` and kept on the Store while the index is unchanged."""
    if not store.config_bool("core.sparseCheckout", False):
        return False
    index_stamp = stamp(os.path.join(store.commondir, "index"))  # the shared working tree is the main one
    if index_stamp is None:
        return False
    cache = store.caches.setdefault("sparse", {})
    if cache.get("stamp") != index_stamp:
        from .gitcmd import run_git

        try:
            r = run_git(["ls-files", "-t", "-z"], store.main_workdir, check=False)
        except OSError:
            return False
        if r.returncode != 0:
            return False
        cache["paths"] = {e[2:].decode("utf-8", "surrogateescape") for e in r.stdout.split(b"\0")
                          if e.startswith(b"S ")}
        cache["stamp"] = index_stamp
    return path in cache["paths"]


def _content(store: Store, path: str, want: Entry, contents: dict[pygit2.Oid, bytes] | None,
             conv: Conversions) -> bytes:
    """What goes on disk for ``want`` at ``path``: the blob as ``git checkout`` writes it."""
    data = contents.get(want.oid) if contents else None
    if data is None:
        data = store.blob_bytes(want.oid)
    return data if want.mode == MODE_LINK else conv.to_worktree(path, data, want.oid)


def _settle_in_place(store: Store, top: str, p: str, want: Entry, rec: Record,
                     contents: dict[pygit2.Oid, bytes] | None, conv: Conversions) -> str | None:
    """The common case of sync_locked for one file, with its directory opened once
    for both the look and the write: CURRENT, KEPT or WRITTEN. None when anything
    is unusual (a directory missing or not plain, something not a file there, a
    failed write): the caller then takes the general path, which reports it."""
    if refused_entry(store, p, want, None) is not None:
        return None  # the general path says why
    try:
        with _parent_fd(top, p, create=False) as (dfd, name, _):
            have = _state_at(dfd, name, conv, p)
            if have is False:
                return None
            if same(have, want):
                return CURRENT
            if not rec.is_storms(store, p, have):
                return SPARSE if have is None and outside_sparse_checkout(store, p) else KEPT
            data = _content(store, p, want, contents, conv)
            _intend(store, rec, p, want)
            _write_at(dfd, name, data, disk_mode(want.mode, conv), _still(have, p, conv))
            return WRITTEN
    except (UnsafePath, ConversionFailed, OSError):
        return None


def sync(store: Store, paths: list[str] = (), *, full: bool = False,
         contents: dict[pygit2.Oid, bytes] | None = None,
         step: tuple[pygit2.Oid, pygit2.Oid] | None = None,
         entries: dict[str, Entry | None] | None = None, keep_going: bool = False,
         conv: Conversions | None = None) -> SyncResult:
    with flocked(store.commondir, "worktree"):
        return sync_locked(store, paths, full=full, contents=contents, step=step, entries=entries,
                           keep_going=keep_going, conv=conv)


def materialize(store: Store, paths: list[str], contents: dict[pygit2.Oid, bytes] | None = None,
                step: tuple[pygit2.Oid, pygit2.Oid] | None = None,
                entries: dict[str, Entry | None] | None = None, conv: Conversions | None = None) -> SyncResult:
    """After an accepted write: bring ``paths`` (and anything else behind) forward.
    ``step`` = (parent, commit) of that write and ``entries`` what it wrote: when the
    disk was synced to the parent and the head is still the commit, ``paths`` are
    all that changed.

    Never raises for the disk: the write is already on the shared ref, and a full
    disk or an unwritable record must not turn it into an error. What could not be
    done is FAILED with its reason; the next storm command brings the disk forward."""
    try:
        return sync(store, paths, contents=contents, step=step, entries=entries, keep_going=True, conv=conv)
    except (OSError, pygit2.GitError, CorruptState, ConversionFailed) as exc:
        return SyncResult(None, {p: FAILED for p in paths}, {p: reason(exc) for p in paths})


def record_tree(store: Store) -> tuple[pygit2.Tree, Record]:
    """The record folded into one tree (caller holds the worktree lock)."""
    rec = fold(store, load(store))
    return store.repo[rec.base], rec


def restore(store: Store, paths: list[str]) -> dict[str, str]:
    """Overwrite ``paths`` on disk with the shared head (``git storm checkout``):
    the one place storm discards an unmediated edit, on the user's explicit word."""
    with flocked(store.commondir, "worktree"):
        head = store.ref_target(WORKSPACE_REF)
        htree = store.commit(head).tree
        rec = load(store)
        out, new = {}, {}
        top = store.main_workdir
        conv = Conversions(store)
        for p in paths:
            want = entry_or_none(store, htree, p)
            have = disk_state(top, p, conv=conv)
            if same(have, want):
                out[p] = CURRENT
            else:
                if (have is False and want is None) or refused_entry(store, p, want, head) is not None:
                    out[p] = FAILED
                    continue
                _intend(store, rec, p, want)
                if want is None:
                    remove_path(top, p)
                else:
                    write_file(top, p, _content(store, p, want, None, conv), disk_mode(want.mode, conv))
                out[p] = WRITTEN
            if rec.get(store, p) != want:
                new[p] = want
        set_entries(store, rec, new)
        return out
