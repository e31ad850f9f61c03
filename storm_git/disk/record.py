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
"""
from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass, field

import pygit2

from ..core.errors import BadPath, CorruptState
from ..core.files import append_all, replace_file
from ..core.store import WORKSPACE_REF, Entry, Store
from .safe_fs import DiskState, same

RECORD_NAME = "disk-record"
HEADER = b"storm disk record 1\n"
FOLD_AT = 512  # journal entries before they are folded into the base tree


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


def encode(kind: str, path: str = "", entry: Entry | None = None, oid: pygit2.Oid | None = None) -> bytes:
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
    body = HEADER + f"base {base} {os.urandom(8).hex()}\n".encode("ascii") + (encode("s", oid=synced) if synced else b"")
    body += b"".join(encode("w", p, e) for p, e in (pending or {}).items())
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
    append(store, [encode("e" if e else "d", p, e) for p, e in entries.items()])
    rec.overlay.update(entries)
    rec.journal_len += len(entries)
    for p in entries:
        rec.pending.pop(p, None)


def intend(store: Store, rec: Record, path: str, want: Entry | None) -> None:
    """Record ``want`` as pending at ``path`` before the file is written (module
    docstring); raises OSError (a full disk) before anything on disk changed."""
    append(store, [encode("w", path, want)])
    rec.pending[path] = want
    rec.journal_len += 1

