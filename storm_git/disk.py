"""Writing the shared head into the working tree (DESIGN §4).

After each accepted write the changed paths are written from the *current*
shared head, under the worktree lock, so the disk converges to the shared ref
even when writers finish out of order. A file whose content on disk is not any
version storm recently had for that path was edited by something else (an
editor, a formatter): it is kept, and reported, never silently overwritten.
"""
from __future__ import annotations

import os

import pygit2

from .errors import BadPath
from .locks import flocked
from .store import MODE_EXEC, MODE_LINK, WORKSPACE_REF, Entry, Store

WRITTEN = "written"
CURRENT = "current"
KEPT = "kept-unmediated"
FAILED = "failed"

HISTORY_DEPTH = 64


def disk_oid(full: str) -> pygit2.Oid | None | bool:
    """Blob id of the file at ``full``; None if absent; False if not a file."""
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return None
    except OSError:  # a parent is a file, permission denied, ...
        return False
    try:
        if os.path.islink(full):
            return pygit2.hash(os.fsencode(os.readlink(full)))
        if os.path.isdir(full) or not os.path.isfile(full):
            return False
        if st.st_size == 0:
            return pygit2.hash(b"")
        return pygit2.hashfile(full)
    except (OSError, KeyError, pygit2.GitError):  # vanished meanwhile
        return None if not os.path.lexists(full) else False


def known_version(store: Store, head: pygit2.Oid, path: str, oid: pygit2.Oid | None,
                  depth: int = HISTORY_DEPTH) -> bool:
    """Was ``oid`` (None: absent) the shared version of ``path`` recently?"""
    c = store.commit(head)
    for _ in range(depth):
        if not c.parent_ids:
            return False
        c = store.commit(c.parent_ids[0])
        try:
            e = store.entry(c.tree, path)
        except BadPath:
            e = None
        if (e.oid if e else None) == oid:
            return True
    return False


def write_atomic(full: str, data: bytes, *, executable: bool = False, link: bool = False) -> None:
    """Replace ``full`` with ``data`` in one rename, so no reader sees half a file."""
    os.makedirs(os.path.dirname(full), exist_ok=True)
    # a short temporary name: a 255-byte file name plus a suffix would not fit the filesystem
    tmp = os.path.join(os.path.dirname(full), f".storm-tmp-{os.getpid()}")
    if link:
        os.symlink(os.fsdecode(data), tmp)
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o777 if executable else 0o666)
        with open(fd, "wb", closefd=True) as fh:
            fh.write(data)
    os.replace(tmp, full)


def remove_file(top: str, full: str) -> None:
    """Delete ``full`` and the directories it leaves empty below ``top``, as git does."""
    os.unlink(full)
    d = os.path.dirname(full)
    while d != top and d.startswith(top):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)


def _write_file(store: Store, full: str, entry: Entry) -> None:
    write_atomic(full, store.blob_bytes(entry.oid), executable=entry.mode == MODE_EXEC,
                 link=entry.mode == MODE_LINK)


def materialize(store: Store, paths: list[str]) -> dict[str, str]:
    """Bring ``paths`` on disk to the current shared head; {path: outcome}."""
    out: dict[str, str] = {}
    top = store.main_workdir
    with flocked(store.commondir, "worktree"):
        head = store.ref_target(WORKSPACE_REF)
        if head is None:
            return out
        tree = store.commit(head).tree
        for path in paths:
            try:
                want = store.entry(tree, path)
            except BadPath:
                out[path] = FAILED
                continue
            full = os.path.join(top, path)
            have = disk_oid(full)
            if have == (want.oid if want else None):
                out[path] = CURRENT
                continue
            if have is False or not known_version(store, head, path, have):
                out[path] = KEPT
                continue
            try:
                if want is None:
                    remove_file(top, full)
                else:
                    _write_file(store, full, want)
                out[path] = WRITTEN
            except OSError:
                out[path] = FAILED
    return out
