"""The remote validated write, and joining, syncing and pushing reads.

:class:`RemoteWorkspace` is storm mode (:class:`SharedWorkspace`) whose shared ref
lives on a git server, which does the compare-and-swap. A write:

1. is validated, under the workspace lock, against the clone's local copy of the
   shared head, with the local code unchanged; the commit, its provenance in its
   trailers, is *queued*: the local ref moves to it (``queue_write``);
2. lands (``land``), the workspace lock released, under the clone's ``remote``
   lock: the first queued writer to get it pushes everything queued on the local
   ref — its write and those other processes of this clone queued meanwhile, with
   their agents' notes refs, each agent's journal folded first (the read set its
   writes' ``Storm-Read-Set`` names) — in one ``git push --atomic`` with a lease on the
   server's head as last known. The others find theirs landed (group commit: one
   round trip carries many writes).

A stale lease is another machine's write: the server's new head is fetched and the
queue moved onto it (``_rebase_queue``): a queued write whose scope and targets the
new head did not change keeps its place, rebuilt on the new head; any other is
dropped, its writer's journal and notes put back as they were, and it validates
again on the new head — a real conflict becomes the usual rejection. The clone
backs off (a jittered window that doubles with each stale lease in a row), bounded
by ``storm.remoteRetrySeconds`` (:mod:`.backoff`).
A verdict that pushes nothing (a rejection, a write that changes nothing, a
reservation to wait for) is given only once the write has fetched, so it is always
the server's verdict. The server unreachable or refusing:
the queue is dropped, everything put back, exit 3. A push whose answer was lost is
found on the next fetch: the write's commit is then on the server's ref, and
re-running the same write changes nothing.

Lock order: ``write-<agent>`` (one remote write of that agent at a time, from its
snapshot to its end), then ``remote`` (fetches, pushes, the tracking refs), then
``workspace`` (the local refs), then an agent's lock; never the other way round.

Reads are recorded locally (the journal) and travel with the agent's next write,
or with ``push_reads``; validation never needs another machine's read set.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core import readsets, trailers
from ..core.agents import record_seen, seen_agents, validate_agent
from ..core.tree_diff import changed_paths
from ..core.errors import Busy, NotInitialised, RepoStateError, StormError
from ..core.files import append_rows, read_own, remove_quietly, replace_file
# REMOTE_LOCK: taken around every exchange with the server (fetch, push) and before the
# workspace lock, never inside it: the tracking refs only move under it, and a network
# round trip never holds up this clone's local validation.
from ..core.locks import LANDING_LOCK, REMOTE_LOCK, flocked, try_flocked
from ..core.readsets import agent_lock, agent_ref, journal_path
from .state_files import QUEUE_FILE, REBASED_FILE
from ..storm.publication import Publication
from ..storm.workspace import SharedWorkspace
from ..core.store import AGENTS_PREFIX, RESERVATIONS_REF, WORKSPACE_REF, Store
from . import backoff, transport
from .branch_follow import follow
from .transport import SHARED_REFS, RemoteRefused, Unreachable, tracking_ref

RETRY_SECONDS = 120.0  # storm.remoteRetrySeconds: how long one write keeps losing leases before exit 3
LANDED, QUEUED, DROPPED = "landed", "queued", "dropped"


def remote_of(store: Store) -> str | None:
    """The remote named by ``storm.remote`` (None: local mode)."""
    name = store.config_get("storm.remote")
    return str(name) if name else None


@dataclass
class _Snapshot:
    """An agent's read-set state before a write attempt, to put back if it fails."""

    journal: bytes | None
    notes: pygit2.Oid | None


class RemotePublication(Publication):
    """A validated write's commit is queued on the local copy of the shared ref and
    lands when the server takes a push (storm_git.storm.publication)."""

    lands_later = True

    def __init__(self, ws: RemoteWorkspace) -> None:
        super().__init__(ws.store)
        self.ws = ws

    def publish(self, ref: pygit2.Reference, commit: pygit2.Oid, head: pygit2.Oid, agent: str, op: str) -> bool:
        return self.ws.queue_write(ref, commit, head, agent, op)

    def land(self, agent: str, commit: pygit2.Oid) -> pygit2.Oid | None:
        return self.ws.land(agent, commit)

    def verdict_is_final(self) -> bool:
        return self.ws.on_server_head()

    def refresh_for_verdict(self, agent: str) -> None:
        self.ws.refresh_for_verdict(agent)


class RemoteWorkspace(SharedWorkspace):
    """Storm mode whose shared ref lives on ``remote`` (module docstring)."""

    def __init__(self, store: Store, remote: str) -> None:
        super().__init__(store)
        self.publication = RemotePublication(self)
        self.remote = remote
        self._snap: dict[str, _Snapshot] = {}
        self.stale_leases = 0  # over the life of this object: retries caused by other machines
        self.pushes = 0
        self.batched = 0  # writes of other processes that landed in this object's pushes
        self.rebased = 0  # queued writes this object moved onto a newer server head
        self._stale_now = 0  # stale leases of the write in progress
        self._unclear = 0  # pushes of the write in progress whose answer was lost
        self._started = time.monotonic()  # when it started (bounded by storm.remoteRetrySeconds)
        self._fresh = False  # the write in progress has fetched: its verdicts are the server's
        self._queued: pygit2.Oid | None = None  # its commit, on the local ref, not yet landed

    # -- keeping the local copies current ------------------------------------------
    def refresh(self, *, disk: bool = True, agent: str | None = None, notes: bool = False) -> pygit2.Oid:
        """Fetch the storm refs and bring the local copies (and the disk) to them; with
        ``agent``, that agent's notes ref too (another clone may have moved it: the
        agent's reads here then extend it); ``notes``: every agent's."""
        with exchanging(self.store):
            self.fetch_adopt(None if notes else self._own_notes(agent))
        if disk:
            from ..disk.sync import sync

            sync(self.store)
        return self.head()

    def fetch_adopt(self, agents: Iterable[str] | None = ()) -> None:
        """Fetch, then copy the server's values onto the local refs (remote lock held);
        what is queued here moves onto the server's new head where it still holds.
        ``agents``: whose notes refs to fetch (transport.fetch; the write path: none)."""
        transport.fetch(self.store, self.remote, agents)
        store = self.store
        with flocked(store.commondir, "workspace"):
            learn_writers(store, self.remote)
            self.rebased += _rebase_queue(store, self.remote)
            adopt_tracking(store, self.remote)
            _put_queue_record(store, tracked_head(store, self.remote), store.ref_target(WORKSPACE_REF), None)

    def _own_notes(self, agent: str | None) -> list[str]:
        """Whose notes a read (or edit, rm, exec, adopt, release) of ``agent`` fetches:
        the agent's own when the server may have notes of it that this clone lacks
        (another clone moved them: the agent's reads here must extend them) — it wrote
        from some clone, this clone tracks its notes, or it is new here. An agent that
        only reads here and never wrote (its notes on no server) fetches none."""
        if agent is None:
            return []
        validate_agent(agent)  # before it names a ref: a bad id is the usual error, not a failed fetch
        store = self.store
        if agent in seen_agents(store.commondir) or store.ref_target(tracking_ref(self.remote, agent_ref(agent))):
            return [agent]
        new_here = store.ref_target(agent_ref(agent)) is None and not os.path.exists(journal_path(store, agent))
        return [agent] if new_here else []

    def on_server_head(self) -> bool:
        # A verdict that pushes nothing is the server's only when it was reached on the
        # server's head: once this write has fetched (the local copy may be older than
        # what the agent read: a push whose answer was lost), and with nothing queued
        # on top (a queued write of another process may still be dropped).
        store = self.store
        return self._fresh and store.ref_target(WORKSPACE_REF) == tracked_head(store, self.remote)

    def refresh_for_verdict(self, agent: str) -> None:
        """Fetch (after pushing what is queued) so the next verdict is the server's."""
        self._put_back(agent)  # a write that changed nothing journaled its versions: not yet
        with exchanging(self.store):
            with flocked(self.store.commondir, "workspace"):
                queued = _queue(self.store, self.remote)[0] is not None
            if queued:
                self._push_queue(None)  # what is queued lands or is dropped first
            self.fetch_adopt()
        self._fresh = True

    # -- the compare-and-swap, done by the server ------------------------------------
    def queue_write(self, ref: pygit2.Reference, commit: pygit2.Oid, head: pygit2.Oid, agent: str, op: str) -> bool:
        """Queue the write on the local ref (workspace lock held). Its provenance is in
        its commit; the journal its ``Storm-Read-Set`` points into is folded by whichever
        process pushes the queue, before it pushes (``_push_queue``)."""
        store = self.store
        if not store.cas(ref, WORKSPACE_REF, commit, f"storm: {agent} {op} (queued for {self.remote})"):
            return False
        self._queued = commit
        tracked = tracked_head(store, self.remote)
        before = _record_for(store, tracked, head)
        queued = None if before is None or store.commit(commit).parent_ids != [head] else [*before.order, commit]
        _put_queue_record(store, tracked, commit, queued)
        return True

    def land(self, agent: str, commit: pygit2.Oid) -> pygit2.Oid | None:
        """Group commit: the first queued writer to take the remote lock pushes every
        write queued on the local ref (its own and those other processes of this
        clone queued before or behind it) in one atomic push with a lease on the
        server's head; the others sleep on the landing lock until that attempt is
        over, then find theirs landed. After a stale lease the queue is moved onto
        the server's new head (``_rebase_queue``); a write whose scope the new head
        changed is dropped, and its writer validates again."""
        store = self.store
        seen: tuple[pygit2.Oid | None, pygit2.Oid | None] | None = None
        while True:
            # A busy clone's writers all wake whenever an exchange ends, most of them to
            # find their write still queued. Neither ref moved since the last look (read
            # without the lock: a landing moves the one, a move or a drop the other): it
            # still is, and the look under the workspace lock is spared.
            refs = (tracked_head(store, self.remote), store.ref_target(WORKSPACE_REF))
            if refs == seen:
                state = QUEUED
            else:
                state, now = self._state_of(commit)
                seen = refs if state == QUEUED else None
            if state == LANDED:
                self._queued = None
                self._snap.pop(agent, None)
                self._moves += _hops(store, commit, now)
                return now
            if state == DROPPED:
                self._queued = None
                self._put_back(agent)
                self._repair()
                self._check_budget()
                return None
            if self._over_budget() and (self._stale_now or backoff.read(store).streak):
                # still queued after losing for too long -- its own pushes, or those of the
                # clone's other processes that pushed it (a writer that never took the remote
                # lock counts none of its own, and waited without bound behind a clone that
                # kept landing back to back): given up, so it must not land. Taken off the
                # queue with the remote lock held: a push of this clone in flight may be
                # carrying it, and would land it after its writer was told it failed.
                with exchanging(store, wait=False) as idle:
                    if idle and self._unqueue(commit):
                        self._put_back(agent)
                        self._check_budget()
                if idle:  # landed or dropped meanwhile: its state says which
                    seen = None
                    continue
                # a push in flight: wait for it below, then look again
            with exchanging(store, wait=False) as pusher:
                if pusher:
                    backoff.wait(store)  # a back-off another process opened and has not waited out
                    self._push_queue(agent)
                    continue
            t0 = time.monotonic()
            # patient: the exchange in progress is bounded by its own network timeouts and budget
            with flocked(store.commondir, LANDING_LOCK, shared=True, patient=True):
                pass  # another process's exchange is over (or it has not taken this lock yet)
            if time.monotonic() - t0 < 0.001:
                # The remote lock's holder has not taken the landing lock yet, or has let it
                # go and not the remote lock (a process descheduled between the two, on a
                # busy machine, for milliseconds): wait for the remote lock itself rather
                # than look again and again (every writer of the clone would spin)
                with flocked(store.commondir, REMOTE_LOCK, patient=True):
                    pass

    def _over_budget(self) -> bool:
        return time.monotonic() - self._started > self.store.config_float("storm.remoteRetrySeconds", RETRY_SECONDS)

    def _check_budget(self) -> None:
        """Exit 3 for a write that kept losing leases for storm.remoteRetrySeconds."""
        if self._over_budget():
            lost = (f"moved {self._stale_now} times during one write" if self._stale_now else
                    f"kept moving: this clone's pushes lost {backoff.read(self.store).streak} leases in a row "
                    "while the write waited")
            raise Busy(f"{WORKSPACE_REF} on {self.remote} {lost}",
                       hint="other machines kept writing first; retry the write (or raise storm.remoteRetrySeconds)")

    def _after_landing(self, pushed: list[tuple[str, str, str]]) -> None:
        """The tracking refs after a push of ``pushed`` landed (workspace lock held)."""
        for src, dst, _lease in pushed:
            if src:
                _force(self.store, tracking_ref(self.remote, dst), pygit2.Oid(hex=src))
            else:
                self.store.delete_ref(tracking_ref(self.remote, dst))

    def _lost_round(self) -> None:
        """After a stale lease (remote lock held): back off, then fetch, so that the
        fetch and the next push follow each other at once."""
        store = self.store
        backoff.write(store, backoff.after_push(backoff.read(store), stale=True))
        backoff.wait(store)
        self.fetch_adopt()
        self._fresh = True

    def _state_of(self, commit: pygit2.Oid) -> tuple[str, pygit2.Oid]:
        with flocked(self.store.commondir, "workspace"):
            return _state(self.store, self.remote, commit)

    def _push_queue(self, agent: str | None) -> None:
        """Push what is queued on the local ref (remote lock held); on failure the queue
        is dropped, or the server's answer is learnt by a fetch. Raises when the
        server cannot be reached or refuses: nothing of the queue then lands."""
        store = self.store
        with flocked(store.commondir, "workspace"):
            tip, base, agents, count = _queue(store, self.remote)
        if tip is None:  # the server's head was never fetched here: learn it (the queue is judged again)
            self.fetch_adopt()
            self._fresh = True
            return
        for a in _to_fold(store, tip, base):
            readsets.fold(store, a)  # the journal reads each queued write names travel with it
        updates = _updates(store, self.remote, tip, base, agents)
        out = transport.push(store, self.remote, updates)
        self.pushes += 1
        if out.ok:
            with flocked(store.commondir, "workspace"):
                self._after_landing(updates)
                _record_landing(store, base, tip)
            self.batched += count - 1
            self._fresh = True
            backoff.write(store, backoff.after_push(backoff.read(store), stale=False))
            return
        if out.stale(WORKSPACE_REF) or out.lost_race:
            # another machine wrote: its head replaces the queue, every queued write is
            # validated again
            self.stale_leases += 1
            self._stale_now += 1
            self._lost_round()
            return
        if not out.unreachable and not out.remote_rejected() and not _notes_refused(out, updates):
            # An unclear failure (the push died or lost its connection after sending): the
            # server may have taken it, or may still be taking it (its hooks run after the
            # pack arrived). A fetch now could see the old head and call the write lost,
            # and it would land a moment later. The same queue is pushed again instead,
            # leased on the same head: whatever became of the first copy, the write lands
            # once, and the answer to a push that completes is the server's verdict.
            self._unclear += 1
            try:
                self._lost_round()
            except Unreachable as e:
                raise Unreachable(e.message, hint=self._unreachable_hint()) from None
            return
        self._drop_queue(base)
        if agent is not None:
            self._queued = None
            self._put_back(agent)
        notes_ref = _notes_refused(out, updates)
        if notes_ref:
            raise RepoStateError(
                f"{notes_ref} on {self.remote} was written from another clone: agent "
                f"{notes_ref[len(AGENTS_PREFIX):]} has notes there that this clone does not have",
                hint="an agent id works from one clone at a time; use another --agent here")
        refused = out.remote_rejected()
        if refused:
            why = [ln.split("remote:", 1)[1].strip() for ln in out.stderr.splitlines() if "git storm guard" in ln]
            raise RemoteRefused(f"{self.remote} refused the write: {why[0] if why else refused}",
                                hint="nothing was changed; see docs/remote.md (the server's guard)")
        raise Unreachable(f"cannot push the write to {self.remote}: {transport.describe_failure(out)}",
                          hint=self._unreachable_hint())

    def _unreachable_hint(self) -> str:
        """What a writer that could not reach the server may say of its write: nothing
        landed, unless an earlier push of it was cut off (the server may have it)."""
        if self._unclear:
            return ("an earlier push of this write was cut off and the server may have taken it: "
                    "run git storm sync when the server is back, then git storm log shows whether it landed")
        return "check that the server is up and reachable, then retry the write; nothing was changed here"

    def _repair(self) -> None:
        """A local ref that is not on the server's head as last known (edited by hand,
        left by a crash) goes back to it: no write can be queued on it."""
        store = self.store
        with flocked(store.commondir, "workspace"):
            local, tracked = store.ref_target(WORKSPACE_REF), tracked_head(store, self.remote)
            if tracked is not None and local != tracked and (
                    local is None or not store.descends(local, tracked)):
                _force(store, WORKSPACE_REF, tracked)

    def _unqueue(self, commit: pygit2.Oid) -> bool:
        """A write given up while still queued (its writer is told it failed) must not
        land later: the local ref goes back to the server's head as last known (the
        other queued writes are validated again by their writers). False when it was
        no longer queued (landed or dropped meanwhile: its state says which)."""
        with flocked(self.store.commondir, "workspace"):
            tracked = tracked_head(self.store, self.remote)
            queued = tracked is not None and _state(self.store, self.remote, commit)[0] == QUEUED
            if queued:
                _force(self.store, WORKSPACE_REF, tracked)
        if queued:
            self._queued = None
        return queued

    def _drop_queue(self, base: pygit2.Oid | None) -> None:
        """Take the local ref back to the server's head as last known: no queued write
        may land after its writer was told it failed."""
        with flocked(self.store.commondir, "workspace"):
            if base is not None and self.store.ref_target(WORKSPACE_REF) != base:
                _force(self.store, WORKSPACE_REF, base)

    def flush(self) -> int:
        """Push writes queued on the local ref by processes that stopped before pushing
        them (``sync``, ``status``); returns how many landed."""
        with exchanging(self.store):
            with flocked(self.store.commondir, "workspace"):
                tip, _base, _agents, count = _queue(self.store, self.remote)
                behind = tip is None and self.store.ref_target(WORKSPACE_REF) != tracked_head(self.store, self.remote)
            if behind:  # a queue on an older server head (a fetch stopped halfway): move it first
                self.fetch_adopt()
                with flocked(self.store.commondir, "workspace"):
                    tip, _base, _agents, count = _queue(self.store, self.remote)
            if tip is None:
                return 0
            self._push_queue(None)
            return count if self._state_of(tip)[0] == LANDED else 0

    # -- the agent's read set around an attempt -------------------------------------
    def _take_snapshot(self, agent: str) -> None:
        with flocked(self.store.commondir, agent_lock(agent)):
            journal = read_own(journal_path(self.store, agent))
            self._snap[agent] = _Snapshot(journal, self.store.ref_target(agent_ref(agent)))

    def _put_back(self, agent: str) -> None:
        """Undo what a failed attempt did to the agent's journal and notes: the write's
        new versions must not count as read when it did not land."""
        snap = self._snap.get(agent)
        self.valid_cache.pop(agent, None)
        if snap is None:
            return
        store = self.store
        with flocked(store.commondir, agent_lock(agent)):
            path = journal_path(store, agent)
            if snap.journal is None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            else:
                replace_file(path, snap.journal, tmp=f"{path}.put-back-{os.getpid()}")
            if snap.notes is None:
                if store.ref(agent_ref(agent)) is not None:
                    store.repo.references.delete(agent_ref(agent))
            else:
                _force(store, agent_ref(agent), snap.notes)
            readsets.drop_cached(store, agent)

    # -- verbs that change shared state ---------------------------------------------
    def apply(self, agent: str, changes: dict[str, Any], **kw: Any) -> Any:
        """The validated write, one per agent at a time on this clone. A write dropped
        after a stale lease puts the agent's journal and notes back to the snapshot it
        took before it wrote: with two writes of one agent in flight, that would take
        the other write's versions out of the read set, or (the other's snapshot put
        back last) bring the dropped write's versions back as read."""
        # patient: the write ahead is this agent's own, bounded by storm.remoteRetrySeconds
        with flocked(self.store.commondir, write_lock(agent), patient=True):
            return self._apply(agent, changes, **kw)

    def _apply(self, agent: str, changes: dict[str, Any], **kw: Any) -> Any:
        self._stale_now, self._started, self._fresh, self._queued = 0, time.monotonic(), False, None
        self._unclear = 0
        self._moves = 0
        self._take_snapshot(agent)
        try:
            res = super().apply(agent, changes, **kw)
        except BaseException:
            if self._queued is not None:  # queued, not landed: it must not land after this failure
                self._unqueue(self._queued)
            self._put_back(agent)
            raise
        finally:
            self._snap.pop(agent, None)
        res.cas_retries += self._moves  # a push refused, the write moved onto the newer head: a retry
        self._push_reservations()
        if res.commit is None:  # no commit of ours was materialized: the fetch may have moved the head
            from ..disk.sync import sync

            sync(self.store)
        return res

    # edit and rm look at the head before the write (is the file there?), exec runs a
    # command on the disk: each starts from the remote's head, not the local copy's
    def edit(self, *args: Any, **kw: Any) -> Any:
        self.refresh(disk=False, agent=kw.get("agent"))
        return super().edit(*args, **kw)

    def rm(self, *args: Any, **kw: Any) -> Any:
        self.refresh(disk=False, agent=kw.get("agent"))
        return super().rm(*args, **kw)

    def exec(self, *args: Any, **kw: Any) -> Any:
        self.refresh(agent=kw.get("agent"))
        return super().exec(*args, **kw)

    def adopt(self, *args: Any, **kw: Any) -> Any:
        self.refresh(agent=kw.get("agent"))
        return super().adopt(*args, **kw)

    def release(self, path: str, *, agent: str | None) -> Any:
        self.refresh(disk=False, agent=agent)
        r = super().release(path, agent=agent)
        self._push_reservations()
        return r

    def catch_up(self, agent: str | None = None) -> None:
        self.refresh(agent=agent)

    def publish_reservations(self) -> None:
        self._push_reservations()

    def _push_reservations(self) -> None:
        """Best effort: a reservation granted or ended here reaches the server by lease.
        If another machine moved them meanwhile, the next fetch wins (a reservation is
        advice against livelock, not a guarantee: the validation is)."""
        store = self.store
        if store.ref_target(RESERVATIONS_REF) == store.ref_target(tracking_ref(self.remote, RESERVATIONS_REF)):
            return  # nothing to send (the usual case): no need to wait for a push in progress
        with exchanging(store):  # the tracking refs only move under it
            local = store.ref_target(RESERVATIONS_REF)
            remote = store.ref_target(tracking_ref(self.remote, RESERVATIONS_REF))
            if local is None or local == remote:
                return
            try:
                out = transport.push(store, self.remote, [(str(local), RESERVATIONS_REF, str(remote or ""))])
            except Unreachable:
                return
            if out.ok:
                with flocked(store.commondir, "workspace"):
                    _force(store, tracking_ref(self.remote, RESERVATIONS_REF), local)

    # -- reads and reports see the remote's head -------------------------------------
    def read(self, paths: Iterable[str], *, agent: str | None) -> Any:
        self.refresh(agent=agent)
        return super().read(paths, agent=agent)

    def status(self, **kw: Any) -> Any:
        self.flush()
        self.refresh(notes=True)  # status reports every agent's read set
        st = super().status(**kw)
        st.extra["remote"] = self.remote
        return st

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        self.refresh(disk=False, notes=True)  # the provenance of every agent's writes
        return super().log(limit)


def write_lock(agent: str) -> str:
    """The lock one remote write of ``agent`` holds from its snapshot to its end."""
    return f"write-{agent}"


@contextmanager
def exchanging(store: Store, *, wait: bool = True) -> Iterator[bool]:
    """Hold the remote lock and the landing lock for a fetch or a push (see
    storm_git.core.locks). ``wait=False``: yield False at once if another process
    holds the remote lock."""
    if wait:
        with flocked(store.commondir, REMOTE_LOCK), flocked(store.commondir, LANDING_LOCK):
            yield True
        return
    with try_flocked(store.commondir, REMOTE_LOCK) as taken:
        if not taken:
            yield False
            return
        with flocked(store.commondir, LANDING_LOCK):
            yield True


def _state(store: Store, remote: str, commit: pygit2.Oid) -> tuple[str, pygit2.Oid]:
    """Where a queued write stands (workspace lock held), and its commit now (the same,
    or the one it became when its queue was moved onto a newer head): on the server's
    head as last known (LANDED), still queued on the local ref on top of it (QUEUED),
    or neither: dropped (DROPPED)."""
    moved = _rebased(store)
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


def _hops(store: Store, commit: pygit2.Oid, now: pygit2.Oid) -> int:
    """How many times ``commit`` was moved onto a newer head before it became ``now``."""
    moved, n = _rebased(store), 0
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
    return _record_for(store, tracked_head(store, remote), store.ref_target(WORKSPACE_REF))


def _record_for(store: Store, tracked: pygit2.Oid | None, local: pygit2.Oid | None) -> _QueueRecord | None:
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


def _put_queue_record(store: Store, tracked: pygit2.Oid | None, local: pygit2.Oid | None,
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


def _record_landing(store: Store, base: pygit2.Oid, tip: pygit2.Oid) -> None:
    """After a push of ``base``..``tip`` landed (workspace lock held, the tracked head
    now ``tip``): those writes are landed, what was queued above ``tip`` meanwhile stays
    queued."""
    local = store.ref_target(WORKSPACE_REF)
    before = _record_for(store, base, local)
    if before is not None and tip in before.queued:
        at = before.order.index(tip) + 1
        _put_queue_record(store, tip, local, before.order[at:], before.order[:at])
    else:
        _put_queue_record(store, tip, local, None, _chain_between(store, base, tip) or ())


def _chain_between(store: Store, base: pygit2.Oid, tip: pygit2.Oid) -> list[pygit2.Oid] | None:
    """The one-parent commits from ``base`` (excluded) up to ``tip``, oldest first; None
    when ``tip`` is not above ``base`` by first parents within QUEUE_WALK_STEPS."""
    out: list[pygit2.Oid] = []
    at = tip
    try:
        for _ in range(QUEUE_WALK_STEPS):
            if at == base:
                return out[::-1]
            parents = store.repo[at].parent_ids
            if len(parents) != 1:
                return None
            out.append(at)
            at = parents[0]
    except (KeyError, ValueError):
        pass
    return None


REBASED_KEEP_SECONDS = 2 * RETRY_SECONDS  # longer than any write waits for its landing


def _rebased_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", REBASED_FILE)


def _rebased(store: Store) -> dict[pygit2.Oid, pygit2.Oid]:
    """Queued commits that were moved onto a newer head, to what they became (workspace
    lock held, or for a count only).

    The file only grows between compactions (``_record_rebased``), and on a busy
    clone it holds tens of thousands of rows: every writer reads it each time it
    wakes, and reading it whole each time made a clone's writers three times
    costlier after a few minutes of work (8 clones x 32 writers on tmpfs: 104-106
    writes/s on a fresh workspace, 35-43 in the next runs). Each process keeps what
    it parsed and reads only the bytes appended since. A compaction writes a new file
    whose first row differs (it drops the oldest rows, and appends never change the
    first), so a file with another first row is read again from the start, even where
    its inode number is an old one reused. Only whole lines are taken: a row being
    appended is read once it is complete."""
    path = _rebased_path(store)
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


def _record_rebased(store: Store, pairs: list[tuple[pygit2.Oid, pygit2.Oid]]) -> None:
    """Add ``pairs`` to the map (workspace lock held), appended. Past
    REBASED_COMPACT_BYTES, once its oldest row is half as old again as any write's
    wait (REBASED_KEEP_SECONDS), the file is rewritten without the rows older than
    that wait: a new file, which every reader parses again from its start, so at most
    one compaction per half of that wait on a busy clone."""
    path = _rebased_path(store)
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


_VALIDATED_AT = re.compile(r"^Storm-Validated-At: [0-9a-f]+$", re.MULTILINE)


def _rebase_queue(store: Store, remote: str) -> int:
    """Move the writes queued on the local ref onto the server's head as just fetched
    (workspace lock held); returns how many moved. They were queued on an older
    server head ``old``: the last commit the local ref shares with the server's
    history (found, not remembered: a fetch killed halfway has moved the tracking
    ref already).

    A queued write moves when nothing it was validated against changed: none of the
    paths of its scope (its ``Storm-Dep`` paths, or its whole read set) nor its
    targets differ between ``old`` and the new head, nor were written by a write
    dropped before it in the queue. It then has, on the new parent, exactly the
    versions it was validated against: its commit is rebuilt there (its own
    changes on the new tree, ``Storm-Validated-At`` the new parent), and the
    server's guard checks it like any write. Any other write is dropped, and its
    writer validates it again."""
    new = tracked_head(store, remote)
    local = store.ref_target(WORKSPACE_REF)
    if new is None or local is None or local == new or store.descends(local, new):
        return 0
    old = store.repo.merge_base(local, new)
    if old is None or old == local:
        return 0
    walker = store.repo.walk(local, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    walker.hide(old)
    changed = set(changed_paths(store, store.commit(old).tree, store.commit(new).tree))
    parent, pairs = new, []
    for c in walker:
        found = trailers.parse(c.message)
        try:
            prov = trailers.provenance(found)
            whole = prov is not None and prov.deps is None
            paths = _read_set_paths(store, c) if whole else frozenset()
            scope = None if prov is None else set(prov.deps) if not whole else set(paths)
        except (StormError, ValueError):
            prov = scope = None
            whole = False
        targets = set(found.get("Storm-Path", []))
        if prov is None or scope is None or len(c.parent_ids) != 1 or (scope | targets) & changed:
            changed |= targets  # later writes that read these saw this write's versions
            continue
        placed = {p: (e.oid, e.mode) if (e := store.entry(c.tree, p)) else None for p in targets}
        tree = store.tree_with(store.commit(parent).tree, placed)
        message = _VALIDATED_AT.sub(f"Storm-Validated-At: {parent}", c.message, count=1)
        parent = store.make_commit(tree, [parent], found["Storm-Agent"][0], message)
        pairs.append((c.id, parent))
        if whole:
            _remember_scope(parent, paths)
    if pairs:
        _record_rebased(store, pairs)
        _force(store, WORKSPACE_REF, parent)
    return len(pairs)


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
        paths = frozenset(e.path for e in (readsets.load_provenance(store, None, str(c.id)) or ({}, None))[1] or ())
        _remember_scope(c.id, paths)
    return paths


def _remember_scope(commit: pygit2.Oid, paths: frozenset[str]) -> None:
    if len(_SCOPES) >= SCOPES_KEEP:
        _SCOPES.clear()
    _SCOPES[commit] = paths


def _queue(store: Store, remote: str) -> tuple[pygit2.Oid | None, pygit2.Oid | None, list[str], int]:
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


def _to_fold(store: Store, tip: pygit2.Oid, base: pygit2.Oid) -> list[str]:
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


def _updates(store: Store, remote: str, tip: pygit2.Oid, base: pygit2.Oid,
             agents: list[str]) -> list[tuple[str, str, str | None]]:
    """One push's ref updates: the shared ref leased on ``base``, then the notes refs of
    the queued agents (the journals their writes' provenance names land with them), fast-forward only."""
    updates: list[tuple[str, str, str | None]] = [(str(tip), WORKSPACE_REF, str(base))]
    for a in agents:
        notes = store.ref_target(agent_ref(a))
        if notes is not None and notes != store.ref_target(tracking_ref(remote, agent_ref(a))):
            updates.append((str(notes), agent_ref(a), None))
    return updates


def _notes_refused(out: transport.PushOutcome, updates: list[tuple[str, str, str | None]]) -> str | None:
    """The agent notes ref the server refused as not a fast-forward (one agent on two clones)."""
    for _src, dst, _lease in updates[1:]:
        if out.non_fast_forward(dst) or out.stale(dst):
            return dst
    return None


_AGENT_TRAILER = re.compile(r"^Storm-Agent: (\S+)$", re.MULTILINE)


def learn_writers(store: Store, remote: str) -> None:
    """Record the agents whose writes the fetched head brought: the tracked head's
    commits that the local ref has not taken yet (workspace lock held, before the queue
    moves and the local ref is adopted). The clone does not fetch their notes refs, and
    intent comments are recognised by agent id (storm_git.core.agents.record_seen).
    Counted from the local ref, not from the tracked head before the fetch: a process
    killed between its fetch and this leaves the local ref behind, and the next fetch
    learns what it missed."""
    new, local = tracked_head(store, remote), store.ref_target(WORKSPACE_REF)
    if new is None or local is None or new == local:
        return
    try:
        walker = store.repo.walk(new, pygit2.enums.SortMode.NONE)
        walker.hide(local)
        names = {m.group(1) for c in walker for m in _AGENT_TRAILER.finditer(c.message)}
    except (KeyError, ValueError, pygit2.GitError):
        return  # the local ref names a commit that is gone (a hand-made repair): nothing to learn from
    record_seen(store.commondir, names)


def _force(store: Store, name: str, oid: pygit2.Oid) -> None:
    """Set ``name`` (caller holds the lock that guards it; a brief lock of git's is waited out)."""
    store.force(name, oid)


def adopt_tracking(store: Store, remote: str) -> None:
    """Copy the fetched values onto the local refs (workspace lock held). The shared
    refs take the server's value; an agent's notes ref only moves forward (local
    folds not yet pushed stay: they travel with that agent's next push)."""
    for name in SHARED_REFS:
        theirs = store.ref_target(tracking_ref(remote, name))
        mine = store.ref_target(name)
        if theirs is None:
            if name == WORKSPACE_REF:
                raise NotInitialised(f"{remote} has no shared workspace ({WORKSPACE_REF})",
                                     hint=f"run git storm init --remote {remote} in a clone that has the code")
            if mine is not None:
                store.repo.references.delete(name)
        elif mine != theirs:
            if name == WORKSPACE_REF and mine is not None and store.descends(mine, theirs):
                continue  # writes queued here on top of the server's head: they wait for their push
            _force(store, name, theirs)
    prefix = tracking_ref(remote, AGENTS_PREFIX)
    for tracked in store.refs_under(prefix):
        name = AGENTS_PREFIX + tracked[len(prefix):]
        theirs = store.ref_target(tracked)
        mine = store.ref_target(name)
        if mine == theirs:
            continue
        if mine is None or store.descends(theirs, mine):
            with flocked(store.commondir, agent_lock(name[len(AGENTS_PREFIX):])):
                _force(store, name, theirs)
                readsets.drop_cached(store, name[len(AGENTS_PREFIX):])


# -- sync, push-reads -------------------------------------------------------------
def tracked_head(store: Store, remote: str) -> pygit2.Oid | None:
    """The server's shared head as last fetched here."""
    return store.ref_target(tracking_ref(remote, WORKSPACE_REF))


@dataclass
class RemoteSyncResult:
    remote: str
    before: str
    head: str
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    branch: dict[str, Any] | None = None  # what following the server's branch did (branch_follow)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sync_remote(store: Store, remote: str) -> RemoteSyncResult:
    """``git storm sync``: fetch the storm refs and converge the working tree to the
    shared head (a local unmediated edit is kept, as everywhere in storm)."""
    from ..disk.sync import sync

    before = store.ref_target(WORKSPACE_REF)
    ws = RemoteWorkspace(store, remote)
    ws.flush()  # writes queued here by processes that stopped before pushing them
    with exchanging(store):
        ws.fetch_adopt()  # the working tree needs no agent's notes (status and log fetch them)
    res = sync(store, full=True)
    followed = follow(store, remote)
    return RemoteSyncResult(remote, str(before), str(res.head), res.outcomes, res.errors, followed.to_dict())


def push_reads(store: Store, remote: str, agent: str) -> dict[str, Any]:
    """Fold the agent's journal and push its notes ref alone (fast-forward only)."""
    readsets.fold(store, agent)
    with exchanging(store):
        transport.fetch(store, remote, [agent])
        with flocked(store.commondir, "workspace"):
            learn_writers(store, remote)
            adopt_tracking(store, remote)
        mine = store.ref_target(agent_ref(agent))
        theirs = store.ref_target(tracking_ref(remote, agent_ref(agent)))
        if mine is None or mine == theirs:
            return {"agent": agent, "pushed": False, "notes": str(mine) if mine else None}
        out = transport.push(store, remote, [(str(mine), agent_ref(agent), None)])
        if not out.ok:
            if out.unreachable:
                raise Unreachable(f"cannot push the reads of {agent} to {remote}: {transport.describe_failure(out)}",
                                  hint="check that the server is up, then retry; the reads stay recorded here")
            raise RepoStateError(f"{remote} did not take the notes of {agent}: {transport.describe_failure(out)}",
                                 hint="an agent id works from one clone at a time; use another --agent here")
        with flocked(store.commondir, "workspace"):
            _force(store, tracking_ref(remote, agent_ref(agent)), mine)
    return {"agent": agent, "pushed": True, "notes": str(mine)}
