"""Bringing the working tree to the shared head, path by path, never over an unmediated edit."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pygit2

from ..core import tree_rules
from ..core.convert import ConversionFailed, Conversions
from ..core.errors import CorruptState
from ..core.files import reason, stamp
from ..core.locks import flocked
from ..core.paths import tree_entry_refusal
from ..core.store import MODE_LINK, WORKSPACE_REF, Entry, Store
from ..core.tree_diff import changed_paths
from .record import FOLD_AT, Record, append, encode, entry_or_none, fold, intend, load, reset, set_entries
from .safe_fs import (
    DirFds,
    DiskState,
    Displaced,
    Expect,
    UnsafePath,
    disk_mode,
    disk_state,
    parent_fd,
    remove_path,
    same,
    state_at,
    write_at,
    write_file,
)

WRITTEN = "written"
CURRENT = "current"
KEPT = "kept-unmediated"
SPARSE = "outside-sparse-checkout"  # absent because git's sparse checkout leaves it off the disk
FAILED = "failed"
QUICK_AT = 8  # up to this many paths, a sync looks at and writes each through one directory chain
RESET_AT = 64  # from this many new entries, a sync that leaves the record equal to the head restarts it there


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
    items = [encode("e" if e else "d", p, e) for p, e in new.items()]
    if rec.synced != head:
        items.append(encode("s", oid=head))
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
        intend(store, rec, p, want)
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
    return lambda dfd, name: state_at(dfd, name, conv, path) == have


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
        from ..core.gitcmd import run_git

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
        with parent_fd(top, p, create=False) as (dfd, name, _):
            have = state_at(dfd, name, conv, p)
            if have is False:
                return None
            if same(have, want):
                return CURRENT
            if not rec.is_storms(store, p, have):
                return SPARSE if have is None and outside_sparse_checkout(store, p) else KEPT
            data = _content(store, p, want, contents, conv)
            intend(store, rec, p, want)
            write_at(dfd, name, data, disk_mode(want.mode, conv), _still(have, p, conv))
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
                intend(store, rec, p, want)
                if want is None:
                    remove_path(top, p)
                else:
                    write_file(top, p, _content(store, p, want, None, conv), disk_mode(want.mode, conv))
                out[p] = WRITTEN
            if rec.get(store, p) != want:
                new[p] = want
        set_entries(store, rec, new)
        return out
