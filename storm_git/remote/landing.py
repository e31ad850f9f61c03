"""Landing a remote write: the queue pushed to the server, which does the compare-and-swap.

The landing half of :class:`~.workspace.RemoteWorkspace` (its module docstring has
the write's steps and the lock order). A validated write is queued on the local
copy of the shared ref (``queue_write``) and lands (``land``) when the first queued
writer to take the clone's remote lock pushes everything queued in one
``git push --atomic`` leased on the server's head, or to the clone's inbox on a
server that orders writes (:mod:`.inbox`). A stale lease moves the queue onto the
server's new head (:mod:`.write_queue`); a write it drops validates again.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pygit2

from ..core import readsets
from ..core.errors import Busy, RepoStateError
from ..core.locks import LANDING_LOCK, REMOTE_LOCK, flocked
from ..core.store import AGENTS_PREFIX, WORKSPACE_REF, Store
from . import backoff, inbox, transport
from .exchange import exchanging
from .transport import RemoteRefused, Unreachable, tracking_ref
from .write_queue import (
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
    record_for,
    record_landing,
    to_fold,
    tracked_head,
    write_state,
)


class Landing:
    """The landing half of a remote workspace: its state is set by
    ``RemoteWorkspace.__init__`` and reset at the start of each write."""

    store: Store
    remote: str
    stale_leases: int  # over the life of the object: retries caused by other machines
    pushes: int
    batched: int  # writes of other processes that landed in this object's pushes
    _snap: dict[str, Any]  # each writing agent's read-set state before its attempt
    _stale_now: int  # stale leases of the write in progress
    _unclear: int  # pushes of the write in progress whose answer was lost
    _moves: int  # times the write in progress was moved onto a newer server head
    _started: float  # when it started (bounded by storm.remoteRetrySeconds)
    _fresh: bool  # the write in progress has fetched: its verdicts are the server's
    _queued: pygit2.Oid | None  # its commit, on the local ref, not yet landed
    _busy: str | None  # the server's last "busy" answer to the write in progress, why

    if TYPE_CHECKING:  # the other half's, RemoteWorkspace's
        def fetch_adopt(self, agents: Iterable[str] | None = ()) -> None: ...

        def _put_back(self, agent: str) -> None: ...

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
            if self._busy and not self._stale_now:  # the server said why it could not take the write
                raise Busy(f"{self.remote} could not take the write: {self._busy}",
                           hint="retry the write; git storm server-hook check on the server says what stays wrong")
            lost = (f"moved {self._stale_now} times during one write" if self._stale_now else
                    f"kept moving: this clone's pushes lost {backoff.read(self.store).streak} leases in a row "
                    "while the write waited")
            raise Busy(f"{WORKSPACE_REF} on {self.remote} {lost}",
                       hint="other machines kept writing first; retry the write (or raise storm.remoteRetrySeconds)")

    def _after_landing(self, pushed: list[tuple[str, str, str | None]]) -> None:
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
        assert base is not None, "a queued tip is leased on the server's head"
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
        assert base is not None, "the shared ref's update is leased on the server's head"
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
        self._busy = ans.busy
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
            if tracked is not None and queued:
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
