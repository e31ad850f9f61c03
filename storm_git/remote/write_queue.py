"""The clone's queue of writes: what is queued on the local copy of the shared ref,
what landed, and moving the queue onto a newer server head.

A validated write is queued on the local ``refs/storm/workspace`` (its commit on top
of the server's head as last fetched) and lands when a push carries it. Every
writer of a busy clone asks after each exchange whether its write is queued,
landed or dropped; the queue record (``remote-queue``) and the record of moved
writes (``remote-rebased``) answer without walking history. After another machine's
write, the queue is moved onto the new head by the rule both the clone and the
server apply (:mod:`.queue_move`).
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pygit2

from ..core import provenance, readsets, reservations, trailers
from ..core.files import append_rows, read_own, remove_quietly, replace_file

# REMOTE_LOCK: taken around every exchange with the server (fetch, push) and before the
# workspace lock, never inside it: the tracking refs only move under it, and a network
# round trip never holds up this clone's local validation.
from ..core.readsets import agent_ref
from ..core.store import WORKSPACE_REF, Store
from . import queue_move, transport
from .state_files import QUEUE_FILE, REBASED_FILE
from .transport import tracking_ref

RETRY_SECONDS = 120.0  # storm.remoteRetrySeconds: how long one write keeps losing leases before exit 3
LANDED, QUEUED, DROPPED = "landed", "queued", "dropped"


def write_state(store: Store, remote: str, commit: pygit2.Oid) -> tuple[str, pygit2.Oid]:
    """Where a queued write stands (workspace lock held), and its commit now (the same,
    or the one it became when its queue was moved onto a newer head): on the server's
    head as last known (LANDED), still queued on the local ref on top of it (QUEUED),
    or neither: dropped (DROPPED)."""
    moved = rebased(store)
    chain = [commit]
    while chain[-1] in moved and len(chain) <= len(moved):
        chain.append(moved[chain[-1]])
    record = _queue_record(store, remote)
    if record is not None:  # the common case: answered without reading a commit
        for commit in reversed(chain):
            if commit in record.queued:
                return QUEUED, commit
            if commit in record.landed:
                return LANDED, commit
    # the newest first; an older one only where a move was recorded and its writer was
    # killed before it moved the local ref (the rows name commits no ref has)
    for commit in reversed(chain):
        state = _where(store, remote, commit)
        if state is not None:
            return state, commit
    return DROPPED, chain[-1]


def _where(store: Store, remote: str, commit: pygit2.Oid) -> str | None:
    """LANDED or QUEUED for ``commit`` itself, or None (workspace lock held)."""
    tracked = tracked_head(store, remote)
    if tracked is not None and (tracked == commit or store.descends(tracked, commit)):
        return LANDED
    # Still on the local ref: queued, even when the tracking ref has just moved past it.
    # A fetch moves the tracking ref before the queue is moved onto the new head
    # (fetch_adopt: the git fetch, then the workspace lock): a writer that called it
    # dropped in that window would write it again, and the queue's move would land
    # it a second time.
    local = store.ref_target(WORKSPACE_REF)
    if local is not None and (local == commit or store.descends(local, commit)):
        return QUEUED
    return None


def hops(store: Store, commit: pygit2.Oid, now: pygit2.Oid) -> int:
    """How many times ``commit`` was moved onto a newer head before it became ``now``."""
    moved, n = rebased(store), 0
    while commit != now and commit in moved:
        commit, n = moved[commit], n + 1
    return n


QUEUE_WALK_STEPS = 1024  # first parents walked to rebuild the record (a longer queue goes without)


@dataclass(frozen=True)
class _QueueRecord:
    """What is queued on the local ref, and what the last push landed, as of the two
    refs it names. Every writer of a busy clone asks after each exchange whether its
    write is queued, landed or dropped; answered by walking the two refs' histories,
    each of 32 processes read every commit a push or a move made (a first read ~7 µs
    from the object database, ~0.6 ms of CPU a question in an aged clone: a quarter of
    a writer's Python). The process that moves a ref records the answer instead.

    A record is only believed while both refs still have the values it names: the
    queued commits are then exactly the first-parent chain between them, and the
    landed ones are ancestors of the tracked head, whoever wrote it and whenever. A
    process killed before it rewrote the record leaves one that names older values:
    ignored, and the question answered by walking (``_where``)."""

    tracked: pygit2.Oid
    local: pygit2.Oid
    order: tuple[pygit2.Oid, ...]  # the queued commits, oldest first
    landed: frozenset[pygit2.Oid] = frozenset()
    queued: frozenset[pygit2.Oid] = field(init=False)  # ``order`` as a set, for the writers' lookups

    def __post_init__(self) -> None:
        object.__setattr__(self, "queued", frozenset(self.order))


def _queue_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", QUEUE_FILE)


def _queue_record(store: Store, remote: str) -> _QueueRecord | None:
    """The record, if it names the refs' current values (workspace lock held)."""
    return record_for(store, tracked_head(store, remote), store.ref_target(WORKSPACE_REF))


def record_for(store: Store, tracked: pygit2.Oid | None, local: pygit2.Oid | None) -> _QueueRecord | None:
    """The record, if it names these values of the tracked head and the local ref."""
    if tracked is None or local is None:
        return None
    try:
        data = read_own(_queue_path(store))  # a FIFO in its place is not waited on
        if data is None:
            return None
        head, *rows = data.decode("ascii").splitlines()
        names = head.split()
        if len(names) != 2 or names != [str(tracked), str(local)]:
            return None
        queued = [pygit2.Oid(hex=r[2:]) for r in rows if r.startswith("q ")]
        landed = frozenset(pygit2.Oid(hex=r[2:]) for r in rows if r.startswith("l "))
    except (OSError, ValueError):  # not a file, torn by hand: walk instead
        return None
    return _QueueRecord(tracked, local, tuple(queued), landed)


def put_queue_record(store: Store, tracked: pygit2.Oid | None, local: pygit2.Oid | None,
                      queued: Iterable[pygit2.Oid] | None, landed: Iterable[pygit2.Oid] = ()) -> None:
    """Record the queue between ``tracked`` and ``local`` (workspace lock held, both
    refs just read or set to these values); ``queued`` None: not known, found by
    walking the first parents (at most QUEUE_WALK_STEPS). A record that cannot be
    made is removed (the questions are then answered by walking)."""
    path = _queue_path(store)
    if tracked is not None and local is not None and queued is None:
        queued = _chain_between(store, tracked, local)
    if tracked is None or local is None or queued is None:
        remove_quietly(path)
        return
    rows = [f"{tracked} {local}"] + [f"q {c}" for c in queued] + [f"l {c}" for c in landed]
    try:
        replace_file(path, ("\n".join(rows) + "\n").encode("ascii"), tmp=f"{path}.{os.getpid()}")
    except OSError:
        remove_quietly(path)


def record_landing(store: Store, base: pygit2.Oid, tip: pygit2.Oid) -> None:
    """After a push of ``base``..``tip`` landed (workspace lock held, the tracked head
    now ``tip``): those writes are landed, what was queued above ``tip`` meanwhile stays
    queued."""
    local = store.ref_target(WORKSPACE_REF)
    before = record_for(store, base, local)
    if before is not None and tip in before.queued:
        at = before.order.index(tip) + 1
        put_queue_record(store, tip, local, before.order[at:], before.order[:at])
    else:
        put_queue_record(store, tip, local, None, _chain_between(store, base, tip) or ())


def _chain_between(store: Store, base: pygit2.Oid, tip: pygit2.Oid) -> list[pygit2.Oid] | None:
    """The one-parent commits from ``base`` (excluded) up to ``tip``, oldest first; None
    when ``tip`` is not above ``base`` by first parents within QUEUE_WALK_STEPS."""
    out: list[pygit2.Oid] = []
    at = tip
    try:
        for _ in range(QUEUE_WALK_STEPS):
            if at == base:
                return out[::-1]
            parents = store.commit(at).parent_ids
            if len(parents) != 1:
                return None
            out.append(at)
            at = parents[0]
    except (KeyError, ValueError):
        pass
    return None


REBASED_KEEP_SECONDS = 2 * RETRY_SECONDS  # longer than any write waits for its landing


def rebased_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", REBASED_FILE)


def rebased(store: Store) -> dict[pygit2.Oid, pygit2.Oid]:
    """Queued commits that were moved onto a newer head, to what they became (workspace
    lock held, or for a count only).

    The file only grows between compactions (``record_rebased``), and on a busy
    clone it holds tens of thousands of rows: every writer reads it each time it
    wakes, and reading it whole each time made a clone's writers three times
    costlier after a few minutes of work (8 clones x 32 writers on tmpfs: 104-106
    writes/s on a fresh workspace, 35-43 in the next runs). Each process keeps what
    it parsed and reads only the bytes appended since. A compaction writes a new file
    whose first row differs (it drops the oldest rows, and appends never change the
    first), so a file with another first row is read again from the start, even where
    its inode number is an old one reused. Only whole lines are taken: a row being
    appended is read once it is complete."""
    path = rebased_path(store)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        first = os.pread(fd, 128, 0).split(b"\n", 1)[0]
        cached = _REBASED_CACHE.get(path)
        if cached is None or cached[0] != first:
            cached = (first, 0, {})
        _first, offset, moved = cached
        chunks, at = [], offset
        while chunk := os.pread(fd, 1 << 20, at):
            chunks.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    whole = data.rfind(b"\n") + 1  # a row still being appended waits for the next read
    for line in data[:whole].split(b"\n"):
        row = line.split()
        if len(row) == 3:
            try:
                moved[pygit2.Oid(hex=row[0].decode("ascii"))] = pygit2.Oid(hex=row[1].decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                continue
    _REBASED_CACHE[path] = (first, offset + whole, moved)
    return moved


# path -> (its first row, bytes parsed, the map so far): this process's copy of the map
_REBASED_CACHE: dict[str, tuple[bytes, int, dict[pygit2.Oid, pygit2.Oid]]] = {}
REBASED_COMPACT_BYTES = 256 * 1024  # a compaction is tried past this size


def record_rebased(store: Store, pairs: list[tuple[pygit2.Oid, pygit2.Oid]]) -> None:
    """Add ``pairs`` to the map (workspace lock held), appended. Past
    REBASED_COMPACT_BYTES, once its oldest row is half as old again as any write's
    wait (REBASED_KEEP_SECONDS), the file is rewritten without the rows older than
    that wait: a new file, which every reader parses again from its start, so at most
    one compaction per half of that wait on a busy clone."""
    path = rebased_path(store)
    now = time.time()
    rows = "".join(f"{old} {new} {now}\n" for old, new in pairs).encode("ascii")
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = 0
    if size > REBASED_COMPACT_BYTES and (_oldest_row(path) or 0.0) < now - 1.5 * REBASED_KEEP_SECONDS:
        with open(path, "rb") as fh:
            keep = [ln for ln in fh if ln.endswith(b"\n") and now - (_row_time(ln) or 0.0) < REBASED_KEEP_SECONDS]
        replace_file(path, b"".join(keep) + rows, tmp=f"{path}.{os.getpid()}")
        return
    append_rows(path, rows)  # a row torn by a killed writer stays a line of its own


def _row_time(line: bytes) -> float | None:
    """The time of a row of the map; None for a line that is not one (a torn row)."""
    row = line.split()
    try:
        return float(row[2]) if len(row) == 3 else None
    except ValueError:
        return None


def _oldest_row(path: str) -> float | None:
    """The time of the file's first row (rows are appended in time order)."""
    try:
        with open(path, "rb") as fh:
            return _row_time(fh.readline())
    except OSError:
        return None


def rebase_queue(store: Store, remote: str) -> int:
    """Move the writes queued on the local ref onto the server's head as just fetched
    (workspace lock held); returns how many moved. They were queued on an older
    server head ``old``: the last commit the local ref shares with the server's
    history (found, not remembered: a fetch killed halfway has moved the tracking
    ref already). The rule is the server's too (:mod:`.queue_move`): a write already
    on the new head is landed (the server applied it and its answer was lost), one
    whose scope and targets did not move is rebuilt on the new head, any other is
    dropped and its writer validates it again."""
    new = tracked_head(store, remote)
    local = store.ref_target(WORKSPACE_REF)
    if new is None or local is None or local == new or store.descends(local, new):
        return 0
    old = store.repo.merge_base(local, new)
    if old is None or old == local:
        return 0
    walker = store.repo.walk(local, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    walker.hide(old)
    mv = queue_move.move(store.repo, list(walker), new, lambda c, _prov: _read_set_paths(store, c),
                         landed=queue_move.landed_since(store.repo, new, old),
                         reserved_ahead=reservations.max_ahead(store))
    pairs = mv.moved + [(q, now) for q, now in mv.landed if q != now]
    for q, now in mv.moved:
        if q in _SCOPES:
            _remember_scope(now, _SCOPES[q])
    if pairs:
        record_rebased(store, pairs)
    if mv.placed or mv.landed:
        force(store, WORKSPACE_REF, mv.tip)
    return len(mv.moved)


# queued commit -> the paths of the read set it was validated against (its scope when it
# names no Storm-Dep). A queued write moves ~4 times at 8 clones x 32 writers, and its
# moved commit keeps its read set: the move records it under the new commit, so the
# read set is resolved from the notes and journal once, not at every move (that was
# ~a quarter of the moves' cost). Keyed by commit, not by Storm-Read-Set: a journal put
# back after a dropped write can name other reads under the same base and count.
_SCOPES: dict[pygit2.Oid, frozenset[str]] = {}
SCOPES_KEEP = 4096


def _read_set_paths(store: Store, c: pygit2.Commit) -> frozenset[str]:
    """The paths of the read set queued write ``c`` was validated against."""
    paths = _SCOPES.get(c.id)
    if paths is None:
        paths = frozenset(e.path for e in (provenance.load(store, None, str(c.id)) or ({}, None))[1] or ())
        _remember_scope(c.id, paths)
    return paths


def _remember_scope(commit: pygit2.Oid, paths: frozenset[str]) -> None:
    if len(_SCOPES) >= SCOPES_KEEP:
        _SCOPES.clear()
    _SCOPES[commit] = paths


def queued_writes(store: Store, remote: str) -> tuple[pygit2.Oid | None, pygit2.Oid | None, list[str], int]:
    """What is queued (workspace lock held): the local ref's tip, the server's head it
    is leased on, the agents whose writes are queued, and how many writes. (None,
    base, [], 0) when nothing is: a local ref that is not ahead of the server's head
    is never pushed (a forced push of it would rewrite the server's history)."""
    tip, base = store.ref_target(WORKSPACE_REF), tracked_head(store, remote)
    if tip is None or base is None or tip == base or not store.descends(tip, base):
        return None, base, [], 0
    agents: list[str] = []
    count = 0
    walker = store.repo.walk(tip, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    for c in walker:
        count += 1
        who = trailers.parse(c.message).get("Storm-Agent")
        if who and who[0] not in agents:
            agents.append(who[0])
    return tip, base, agents, count


def to_fold(store: Store, tip: pygit2.Oid, base: pygit2.Oid) -> list[str]:
    """The agents whose queued writes (``base``..``tip``) name reads of a journal not
    folded yet: the server needs those reads (in the pushed notes) to resolve the
    writes' read sets. A write validated right after a fold names none."""
    out: list[str] = []
    walker = store.repo.walk(tip, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    for c in walker:
        found = trailers.parse(c.message)
        try:
            prov = trailers.provenance(found)
        except ValueError:
            prov = None
        agent = (found.get("Storm-Agent") or [""])[0]
        if agent and agent not in out and (prov is None or (prov.reads and readsets.unfolded(store, agent, prov.base))):
            out.append(agent)
    return out


def push_updates(store: Store, remote: str, tip: pygit2.Oid, base: pygit2.Oid,
             agents: list[str]) -> list[tuple[str, str, str | None]]:
    """One push's ref updates: the shared ref leased on ``base``, then the notes refs of
    the queued agents (the journals their writes' provenance names land with them), fast-forward only."""
    updates: list[tuple[str, str, str | None]] = [(str(tip), WORKSPACE_REF, str(base))]
    for a in agents:
        notes = store.ref_target(agent_ref(a))
        if notes is not None and notes != store.ref_target(tracking_ref(remote, agent_ref(a))):
            updates.append((str(notes), agent_ref(a), None))
    return updates


def notes_refused(out: transport.PushOutcome, updates: list[tuple[str, str, str | None]]) -> str | None:
    """The agent notes ref the server refused as not a fast-forward (one agent on two clones)."""
    for _src, dst, _lease in updates[1:]:
        if out.non_fast_forward(dst) or out.stale(dst):
            return dst
    return None




def force(store: Store, name: str, oid: pygit2.Oid) -> None:
    """Set ``name`` (caller holds the lock that guards it; a brief lock of git's is waited out)."""
    store.force(name, oid)


def tracked_head(store: Store, remote: str) -> pygit2.Oid | None:
    """The server's shared head as last fetched here."""
    return store.ref_target(tracking_ref(remote, WORKSPACE_REF))


