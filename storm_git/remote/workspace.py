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
queue moved onto it (``rebase_queue``): a queued write whose scope and targets the
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

from ..core import readsets
from ..core.agents import record_seen, seen_agents, validate_agent
from ..core.errors import Busy, NotInitialised, RepoStateError
from ..core.files import read_own, replace_file

# REMOTE_LOCK: taken around every exchange with the server (fetch, push) and before the
# workspace lock, never inside it: the tracking refs only move under it, and a network
# round trip never holds up this clone's local validation.
from ..core.locks import LANDING_LOCK, REMOTE_LOCK, flocked, try_flocked
from ..core.readsets import agent_lock, agent_ref, journal_path
from ..core.store import AGENTS_PREFIX, RESERVATIONS_REF, WORKSPACE_REF, Store
from ..storm.publication import Publication
from ..storm.workspace import SharedWorkspace
from . import backoff, inbox, transport
from .branch_follow import follow
from .queue import (
    DROPPED,
    LANDED,
    QUEUED,
    RETRY_SECONDS,
    force,
    hops,
    notes_refused,
    push_updates,
    put_queue_record,
    queued_writes,
    rebase_queue,
    record_for,
    record_landing,
    to_fold,
    tracked_head,
    write_state,
)
from .transport import SHARED_REFS, RemoteRefused, Unreachable, tracking_ref

_AGENT_TRAILER = re.compile(r"^Storm-Agent: (\S+)$", re.MULTILINE)


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
            self.rebased += rebase_queue(store, self.remote)
            adopt_tracking(store, self.remote)
            put_queue_record(store, tracked_head(store, self.remote), store.ref_target(WORKSPACE_REF), None)

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
                queued = queued_writes(self.store, self.remote)[0] is not None
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
        before = record_for(store, tracked, head)
        queued = None if before is None or store.commit(commit).parent_ids != [head] else [*before.order, commit]
        put_queue_record(store, tracked, commit, queued)
        return True

    def land(self, agent: str, commit: pygit2.Oid) -> pygit2.Oid | None:
        """Group commit: the first queued writer to take the remote lock pushes every
        write queued on the local ref (its own and those other processes of this
        clone queued before or behind it) in one atomic push with a lease on the
        server's head; the others sleep on the landing lock until that attempt is
        over, then find theirs landed. After a stale lease the queue is moved onto
        the server's new head (``rebase_queue``); a write whose scope the new head
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
                self._moves += hops(store, commit, now)
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
                force(self.store, tracking_ref(self.remote, dst), pygit2.Oid(hex=src))
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
            return write_state(self.store, self.remote, commit)

    def _push_queue(self, agent: str | None) -> None:
        """Push what is queued on the local ref (remote lock held); on failure the queue
        is dropped, or the server's answer is learnt by a fetch. Raises when the
        server cannot be reached or refuses: nothing of the queue then lands."""
        store = self.store
        with flocked(store.commondir, "workspace"):
            tip, base, agents, count = queued_writes(store, self.remote)
        if tip is None:  # the server's head was never fetched here: learn it (the queue is judged again)
            self.fetch_adopt()
            self._fresh = True
            return
        for a in to_fold(store, tip, base):
            readsets.fold(store, a)  # the journal reads each queued write names travel with it
        updates = push_updates(store, self.remote, tip, base, agents)
        if inbox.server_orders(store, self.remote) and self._push_to_inbox(agent, updates, count):
            return
        out = transport.push(store, self.remote, updates)
        self.pushes += 1
        if out.ok:
            with flocked(store.commondir, "workspace"):
                self._after_landing(updates)
                record_landing(store, base, tip)
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
        if not out.unreachable and not out.remote_rejected() and not notes_refused(out, updates):
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
        notes_ref = notes_refused(out, updates)
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

    def _push_to_inbox(self, agent: str | None, updates: list[tuple[str, str, str | None]], count: int) -> bool:
        """Push the queue to this clone's inbox on a server that orders writes
        (:mod:`.inbox`); the server applies them in arrival order and answers per
        write. False when it does not order writes after all: push with the lease."""
        store = self.store
        (tip, _ws, base), notes_updates = updates[0], updates[1:]
        notes = {dst[len(AGENTS_PREFIX):]: pygit2.Oid(hex=src) for src, dst, _lease in notes_updates}
        ans = inbox.push(store, self.remote, pygit2.Oid(hex=tip), notes)
        self.pushes += 1
        if ans.unordered:
            inbox.remove_stray(store, self.remote, ans.stray)
            return False
        if ans.unreachable or ans.refused or ans.notes_refused:
            self._drop_queue(pygit2.Oid(hex=base) if base else None)
            if agent is not None:
                self._queued = None
                self._put_back(agent)
            if ans.notes_refused:
                raise RepoStateError(
                    f"{ans.notes_refused} on {self.remote} was written from another clone: agent "
                    f"{ans.notes_refused[len(AGENTS_PREFIX):]} has notes there that this clone does not have",
                    hint="an agent id works from one clone at a time; use another --agent here")
            if ans.refused:
                raise RemoteRefused(f"{self.remote} refused the write: {ans.refused}",
                                    hint="nothing was changed; see docs/remote.md (the server's guard)")
            raise Unreachable(f"cannot push the write to {self.remote}: {ans.unreachable}",
                              hint=self._unreachable_hint())
        if ans.busy or ans.unclear:
            # the server is busy, or the answer was lost (the server may have applied the
            # writes): the same queue is pushed again, and a write already there is
            # answered landed, never applied twice
            self._unclear += 1 if ans.unclear else 0
            backoff.write(store, backoff.after_push(backoff.read(store), stale=True))
            backoff.wait(store)
            return True
        backoff.write(store, backoff.after_push(backoff.read(store), stale=False))
        with flocked(store.commondir, "workspace"):
            for ref, oid in ans.notes.items():
                force(store, tracking_ref(self.remote, ref), oid)
        if ans.head == pygit2.Oid(hex=tip):  # every write landed as it was: nothing to fetch
            with flocked(store.commondir, "workspace"):
                self._after_landing(updates)
                record_landing(store, pygit2.Oid(hex=base), pygit2.Oid(hex=tip))
            self.batched += count - 1
        else:  # moved by the server, or not applied: the new head tells which (queue_move.landed_since)
            self.fetch_adopt()
        self._fresh = True
        return True

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
                force(store, WORKSPACE_REF, tracked)

    def _unqueue(self, commit: pygit2.Oid) -> bool:
        """A write given up while still queued (its writer is told it failed) must not
        land later: the local ref goes back to the server's head as last known (the
        other queued writes are validated again by their writers). False when it was
        no longer queued (landed or dropped meanwhile: its state says which)."""
        with flocked(self.store.commondir, "workspace"):
            tracked = tracked_head(self.store, self.remote)
            queued = tracked is not None and write_state(self.store, self.remote, commit)[0] == QUEUED
            if queued:
                force(self.store, WORKSPACE_REF, tracked)
        if queued:
            self._queued = None
        return queued

    def _drop_queue(self, base: pygit2.Oid | None) -> None:
        """Take the local ref back to the server's head as last known: no queued write
        may land after its writer was told it failed."""
        with flocked(self.store.commondir, "workspace"):
            if base is not None and self.store.ref_target(WORKSPACE_REF) != base:
                force(self.store, WORKSPACE_REF, base)

    def flush(self) -> int:
        """Push writes queued on the local ref by processes that stopped before pushing
        them (``sync``, ``status``); returns how many landed."""
        with exchanging(self.store):
            with flocked(self.store.commondir, "workspace"):
                tip, _base, _agents, count = queued_writes(self.store, self.remote)
                behind = tip is None and self.store.ref_target(WORKSPACE_REF) != tracked_head(self.store, self.remote)
            if behind:  # a queue on an older server head (a fetch stopped halfway): move it first
                self.fetch_adopt()
                with flocked(self.store.commondir, "workspace"):
                    tip, _base, _agents, count = queued_writes(self.store, self.remote)
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
                force(store, agent_ref(agent), snap.notes)
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
                    force(store, tracking_ref(self.remote, RESERVATIONS_REF), local)

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
            force(store, name, theirs)
    prefix = tracking_ref(remote, AGENTS_PREFIX)
    for tracked in store.refs_under(prefix):
        name = AGENTS_PREFIX + tracked[len(prefix):]
        theirs = store.ref_target(tracked)
        mine = store.ref_target(name)
        if mine == theirs:
            continue
        if mine is None or store.descends(theirs, mine):
            with flocked(store.commondir, agent_lock(name[len(AGENTS_PREFIX):])):
                force(store, name, theirs)
                readsets.drop_cached(store, name[len(AGENTS_PREFIX):])


# -- sync, push-reads -------------------------------------------------------------
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
            force(store, tracking_ref(remote, agent_ref(agent)), mine)
    return {"agent": agent, "pushed": True, "notes": str(mine)}
