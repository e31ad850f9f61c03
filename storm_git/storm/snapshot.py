"""What differs on disk from what storm last put there: one snapshot.

Where the resident process watches the working tree, a snapshot asks it what
changed since the last one and looks only at those paths (:mod:`.watched`);
otherwise, and whenever the watch cannot be sure, it walks, as follows.

Storm does not keep git's own index in step with the shared head (that would
cost a full index write per accepted write at 100k files). To find what differs
on disk it keeps a *private* index, ``<common git dir>/storm/exec-index``, whose
entries are storm's disk record and whose stat data git refreshes itself. A
snapshot is one ``git status`` run against that index (with git's untracked
cache, so unchanged directories are not re-read): the cost floor of finding
changed files by stat, without reading every file. When the record moves, only
the entries of the paths that changed are replaced (``update-index
--index-info``), so the stat data of everything else stays valid.

Also here: the file-system clock mark a command's changes are dated against
(:func:`clock_mark`), and what a path on disk becomes when storm records it
(:func:`with_mode`, :func:`check_recordable`).
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.convert import ConversionFailed, Conversions
from ..core.errors import BadPath, CorruptState, NotInitialised
from ..core.files import copy_index, read_own, replace_file
from ..core.gitcmd import GitFailed
from ..core.paths import check_on_disk, normalize, tree_entry_refusal
from ..core.store import MODE_BLOB, MODE_LINK, Entry, Store, git_env as store_git_env
from ..core.tree_diff import tree_changes
from ..disk import safe_fs, sync as disk_sync
from ..disk.record import entry_or_none
from ..disk.safe_fs import TEMP_PREFIX, disk_state, same
from . import private_index, watched
from .private_index import INDEX_NAME, STATE_NAME
from .validated_writer import ValidatedWriter

MISSING_NAME = "exec-index.missing"
CLOCK_NAME = "exec-clock"
CLOCK_PATIENCE_SECONDS = 0.05
# Above this many changed entries, re-reading the whole tree is cheaper than --index-info.
FULL_REREAD_THRESHOLD = 20000

@dataclass
class Snapshot:
    """Which paths differ on disk from storm's disk record (and their state), after
    every path that was merely behind the shared head ``head`` was brought forward."""

    head: pygit2.Oid
    tree: pygit2.Tree
    record: pygit2.Tree  # what storm last put on disk, as one tree
    dirty: dict[str, Any]  # path -> DiskState
    nested: list[str] = field(default_factory=list)  # git repositories of their own (not recorded)


# -- the private index --------------------------------------------------------------
def _storm_dir(store: Store) -> str:
    d = os.path.join(store.commondir, "storm")
    os.makedirs(d, exist_ok=True)
    return d


def git_env(store: Store, index: str | None) -> dict[str, str]:
    """Environment for git commands on the main (shared) working tree."""
    env = store_git_env(GIT_DIR=store.commondir, GIT_WORK_TREE=store.main_workdir, LC_ALL="C")
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    return env


def _clear_index_lock(index: str | None) -> None:
    """Only storm uses its private index, always under the worktree flock, which the
    caller holds: a ``<index>.lock`` seen now was left by a killed process."""
    if index is not None:
        try:
            os.unlink(index + ".lock")
        except FileNotFoundError:
            pass


def _git(store: Store, args: list[str], *, index: str | None, input: bytes | None = None) -> bytes:
    _clear_index_lock(index)
    r = subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=store.main_workdir,
                       env=git_env(store, index), input=input, capture_output=True)
    if r.returncode != 0:
        if index is not None and index == private_index.index_path(store):
            bad = private_index.problem(store)
            if bad:
                raise CorruptState(f"storm's private index .git/storm/{INDEX_NAME} is corrupt: {bad}",
                                   hint=private_index.FIX_HINT)
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        sub = next(x for x in args if not x.startswith("-") and "=" not in x)
        raise GitFailed(f"git {sub} failed: {err[-1] if err else r.returncode}",
                        hint="run git storm doctor; storm's private index is "
                             f"{index or os.path.join(store.commondir, 'index')}")
    return r.stdout


def _sync_index(store: Store, tree: pygit2.Tree) -> str:
    """Make the private index hold ``tree``, keeping valid stat data. Caller holds
    the worktree lock. Returns the index path."""
    d = _storm_dir(store)
    index = os.path.join(d, INDEX_NAME)
    state = os.path.join(d, STATE_NAME)
    have = (read_own(state) or b"").decode("ascii", "replace").strip()
    if have == str(tree.id) and os.path.exists(index):
        return index
    old = None
    if have and os.path.exists(index):
        try:
            old = store.repo[pygit2.Oid(hex=have)]
        except (KeyError, ValueError):
            old = None
    changes = tree_changes(store, old, tree) if isinstance(old, pygit2.Tree) else None
    if changes is None or len(changes) > FULL_REREAD_THRESHOLD:
        # First use: start from git's own index (its stat data is valid for HEAD,
        # usually almost the shared tree), then a one-tree --reset keeps the stat
        # data of every entry whose content matches.
        main_index = os.path.join(store.commondir, "index")
        if changes is None and not os.path.exists(index) and os.path.exists(main_index):
            copy_index(main_index, index)
        if os.path.exists(index):
            _git(store, ["read-tree", "--reset", str(tree.id)], index=index)
        else:
            _git(store, ["read-tree", str(tree.id)], index=index)
    elif changes:
        lines = []
        for path, value in sorted(changes, key=lambda c: c[1] is not None):  # removals first
            if value is None:
                lines.append(b"0 " + b"0" * 40 + b"\t" + path.encode("utf-8") + b"\0")
            else:
                lines.append(f"{value[1]:o} {value[0]}\t".encode() + path.encode("utf-8") + b"\0")
        _git(store, ["update-index", "-z", "--index-info"], index=index, input=b"".join(lines))
    replace_file(state, f"{tree.id}\n".encode("ascii"), tmp=f"{state}.{os.getpid()}")
    return index


def snapshot(store: Store) -> Snapshot:
    """Bring behind paths forward, then find every path whose disk state differs
    from storm's disk record (tracked or untracked-not-ignored), with its disk
    state. Caller holds the worktree lock."""
    synced = disk_sync.sync_locked(store, full=True)
    if synced.head is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    head = synced.head
    tree = store.commit(head).tree
    rtree, _ = disk_sync.record_tree(store)
    lk = watched.look(store)  # the watch's token is taken before the disk is looked at
    conv = Conversions(store)
    found = watched.find(store, rtree, lk, git_env(store, None), conv) if lk is not None else None
    if found is not None:
        dirty, nested = found
        how = watched.WATCHED
    else:
        dirty, nested = _walk(store, rtree, conv)
        how = watched.WALK
    dirty = {p: v for p, v in dirty.items() if not _storm_temp(p)}
    if lk is not None:
        watched.save_base(store, lk, rtree, dirty, nested, how)
    _save_missing(store, [p for p, v in dirty.items() if v is None])
    return Snapshot(head, tree, rtree, dirty, nested)


def _walk(store: Store, rtree: pygit2.Tree, conv: Conversions) -> tuple[dict[str, Any], list[str]]:
    """Every path whose disk state differs from the record ``rtree``, by one ``git
    status`` against the private index, and the nested repositories."""
    index = _sync_index(store, rtree)
    raw = _git(store, ["-c", "core.untrackedCache=true", "-c", "core.fsmonitor=false",
                       "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=normal",
                       "--ignore-submodules=all"], index=index)
    candidates: list[str] = []
    untracked_dirs: list[str] = []
    for item in raw.split(b"\0"):
        if len(item) < 4:
            continue
        xy, path = item[:2], item[3:].decode("utf-8", "surrogateescape")
        if xy == b"??":
            if path.endswith("/"):
                untracked_dirs.append(path)
            else:
                candidates.append(path)
        elif xy[1:2] in (b"M", b"D", b"T"):
            candidates.append(path)
    dirty: dict[str, Any] = {}
    nested: list[str] = []
    top = store.main_workdir
    with safe_fs.DirFds(top) as dirs:  # read only: each directory opened once
        for path in candidates:
            have = disk_state(top, path, dirs, conv)
            if not same(have, entry_or_none(store, rtree, path)) or (have is False and entry_at(store, rtree, path)):
                dirty[path] = have
                if have is False and os.path.isdir(os.path.join(top, path)):
                    untracked_dirs.append(path + "/")  # a directory where a recorded file was
        if untracked_dirs:
            more = _git(store, ["ls-files", "-z", "--others", "--exclude-standard", "--", *untracked_dirs],
                        index=index)
            for p in more.split(b"\0"):
                if p.endswith(b"/"):
                    # a directory holding a .git of its own (git init, git clone, cargo new run
                    # in the tree): git add would record it as a gitlink. Storm records files:
                    # it is reported, not taken for a deleted file.
                    nested.append(p[:-1].decode("utf-8", "surrogateescape"))
                elif p:
                    path = p.decode("utf-8", "surrogateescape")
                    dirty[path] = disk_state(top, path, dirs, conv)
    return dirty, nested


def _storm_temp(path: str) -> bool:
    """Storm's own temporary file, mid-rename (or left by a killed writer: doctor)."""
    return path.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)


def _save_missing(store: Store, missing: list[str]) -> None:
    """Remember which paths were missing on disk at the last snapshot (caller
    holds the worktree lock): a deletion has no timestamp of its own."""
    path = os.path.join(_storm_dir(store), MISSING_NAME)
    replace_file(path, b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in missing),
                 tmp=f"{path}.{os.getpid()}")


def load_missing(store: Store) -> set[str] | None:
    data = read_own(os.path.join(_storm_dir(store), MISSING_NAME))
    if data is None:
        return None
    return {p.decode("utf-8", "surrogateescape") for p in data.split(b"\0") if p}


def clock_mark(store: Store, worktree_dev: int) -> int | None:
    """A file-system timestamp T such that files changed from now on get a ctime
    above T (and files changed before have one at most T), or None when this
    file system cannot give one (another device, coarse timestamps).

    The kernel stamps files with a coarse clock (a few ms per tick): touch a
    marker, then touch it again until its timestamp moves past the first one."""
    path = os.path.join(_storm_dir(store), CLOCK_NAME)

    def touch() -> os.stat_result:
        with open(path, "wb") as fh:
            fh.write(b"storm exec clock\n")
        return os.stat(path)

    first = touch()
    if first.st_dev != worktree_dev:
        return None
    deadline = time.monotonic() + CLOCK_PATIENCE_SECONDS
    while time.monotonic() < deadline:
        if touch().st_ctime_ns > first.st_ctime_ns:
            return first.st_ctime_ns
        time.sleep(0.0005)
    return None


def entry_at(store: Store, tree: pygit2.Tree, path: str) -> Entry | None:
    return entry_or_none(store, tree, path)


def version_at(store: Store, tree: pygit2.Tree, path: str) -> pygit2.Oid | None:
    e = entry_at(store, tree, path)
    return e.oid if e else None


def read_disk_content(store: Store, path: str, dirs: safe_fs.DirFds | None = None) -> bytes | None:
    try:
        return safe_fs.read_disk(store.main_workdir, path, dirs=dirs)
    except (safe_fs.UnsafePath, OSError):  # OSError includes a FIFO or the like (files.NotRegularFile)
        return None


def raise_failed_conversion(store: Store, conv: Conversions, path: str) -> None:
    """A regular file that disk_state could not compare because git's conversion of it
    failed (a required filter driver that fails): raise that failure, in git's words,
    rather than call the file "not a regular file"."""
    content = read_disk_content(store, path)
    if content is not None and not os.path.islink(os.path.join(store.main_workdir, path)) and conv.applies(path):
        conv.odb_id(path, content)


def converted(conv: Conversions, path: str, data: bytes) -> bytes:
    try:
        return conv.to_odb(path, data)
    except ConversionFailed:
        return data


def with_mode(content: bytes | None, state: Any, base: Entry | None) -> Any:
    """What ``apply`` records: None (deleted), or (content, mode) so that the exec
    bit and symlinks reach the shared tree as git records them. ``base``: the
    version the disk held before; where the file system keeps no exec bit
    (core.fileMode=false) a file keeps its mode, and a new one is not executable,
    as ``git add`` does."""
    if content is None:
        return None
    if not isinstance(state, tuple):
        return content, MODE_BLOB
    return content, safe_fs.recorded_mode(state[1], base)


def check_recordable(store: Store, path: str, state: Any, ws: ValidatedWriter) -> None:
    """Every path that exec or adopt records passes the refusals of ``write``:
    a bad name, a link leading out, a file over the size limit (exit 2)."""
    try:
        normalize(path)
    except BadPath as exc:
        raise BadPath(f"the working tree has a file storm cannot record: {exc.message}",
                      hint="rename or remove it; nothing was recorded") from None
    if isinstance(state, tuple) and state[1] == MODE_LINK:
        top = store.main_workdir
        check_on_disk(path, top, for_write=False)  # refuses a link leading out
        why = tree_entry_refusal(path, MODE_LINK, link_target=os.fsencode(os.readlink(os.path.join(top, path))),
                                 links=lambda p: _disk_link(top, p))
        if why is not None:  # the rules a pushed tree obeys: no link into .git, none for .gitmodules
            raise BadPath(f"the working tree has a file storm cannot record: {why}",
                          hint="rename or remove it; nothing was recorded")


def _disk_link(top: str, path: str) -> bytes | None:
    """The target of the link at ``path`` in the working tree, None when it is not a link."""
    try:
        return os.fsencode(os.readlink(os.path.join(top, path)))
    except OSError:
        return None


# Searched for "reverted" content: the shared history this far back, plus git's HEAD.
