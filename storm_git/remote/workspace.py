"""The remote validated write: storm mode whose shared ref lives on a git server.

:class:`RemoteWorkspace` is storm mode (:class:`SharedWorkspace`) whose shared ref
lives on a git server, which does the compare-and-swap. A write:

1. is validated, under the workspace lock, against the clone's local copy of the
   shared head, with the local code unchanged; the commit, its provenance in its
   trailers, is *queued*: the local ref moves to it (``queue_write``);
2. lands (``land``, :mod:`.landing`), the workspace lock released, under the clone's ``remote``
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
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pygit2

from ..core import readsets
from ..core.agents import seen_agents, validate_agent
from ..core.files import read_own, replace_file
from ..core.locks import flocked
from ..core.payloads import ExecResult, ReadResult, Status, WriteResult
from ..core.readsets import agent_lock, agent_ref, journal_path
from ..core.reservations import Reservation
from ..core.store import RESERVATIONS_REF, WORKSPACE_REF, Store
from ..storm.publication import Publication
from ..storm.validated_writer import OnWait
from ..storm.workspace import SharedWorkspace
from . import transport
from .exchange import adopt_tracking, exchanging, learn_writers, write_lock
from .landing import Landing
from .transport import Unreachable, tracking_ref
from .write_queue import force, put_queue_record, queued_writes, rebase_queue, tracked_head


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


class RemoteWorkspace(Landing, SharedWorkspace):
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
        self._busy: str | None = None

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
    def apply(self, agent: str, changes: dict[str, Any], *, intent: str | None, deps: Iterable[str] | None,
              wait: bool, op: str, expected: dict[str, str | None] | None = None,
              on_wait: OnWait | None = None) -> WriteResult:
        """The validated write, one per agent at a time on this clone. A write dropped
        after a stale lease puts the agent's journal and notes back to the snapshot it
        took before it wrote: with two writes of one agent in flight, that would take
        the other write's versions out of the read set, or (the other's snapshot put
        back last) bring the dropped write's versions back as read."""
        # patient: the write ahead is this agent's own, bounded by storm.remoteRetrySeconds
        with flocked(self.store.commondir, write_lock(agent), patient=True):
            return self._apply(agent, changes, intent=intent, deps=deps, wait=wait, op=op, expected=expected,
                               on_wait=on_wait)

    def _apply(self, agent: str, changes: dict[str, Any], *, intent: str | None, deps: Iterable[str] | None,
               wait: bool, op: str, expected: dict[str, str | None] | None,
               on_wait: OnWait | None) -> WriteResult:
        self._stale_now, self._started, self._fresh, self._queued = 0, time.monotonic(), False, None
        self._unclear = 0
        self._moves = 0
        self._busy = None  # the server's last "busy" answer to this write's push, why
        self._take_snapshot(agent)
        try:
            res = super().apply(agent, changes, intent=intent, deps=deps, wait=wait, op=op, expected=expected,
                                on_wait=on_wait)
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
    def edit(self, path: str, old: str, new: str, *, agent: str | None, intent: str | None = None,
             deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        self.refresh(disk=False, agent=agent)
        return super().edit(path, old, new, agent=agent, intent=intent, deps=deps, wait=wait, on_wait=on_wait)

    def rm(self, path: str, *, agent: str | None, intent: str | None = None,
           deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        self.refresh(disk=False, agent=agent)
        return super().rm(path, agent=agent, intent=intent, deps=deps, wait=wait, on_wait=on_wait)

    def exec(self, argv: list[str], *, agent: str | None, intent: str | None = None,
             timeout: float | None = None, wait: bool = True, on_wait: OnWait | None = None) -> ExecResult:
        self.refresh(agent=agent)
        return super().exec(argv, agent=agent, intent=intent, timeout=timeout, wait=wait, on_wait=on_wait)

    def adopt(self, paths: list[str], *, agent: str | None, intent: str | None = None,
              wait: bool = True, allow_revert: bool = False, on_wait: OnWait | None = None) -> WriteResult:
        self.refresh(agent=agent)
        return super().adopt(paths, agent=agent, intent=intent, wait=wait, allow_revert=allow_revert,
                             on_wait=on_wait)

    def release(self, path: str, *, agent: str | None) -> Reservation | None:
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
    def read(self, paths: Iterable[str], *, agent: str | None) -> list[ReadResult]:
        """The server's head; with the server out of reach, the last head this clone
        fetched, each result saying so and how old that head is (as git reads offline).
        A write made on such a read is validated by the server as usual."""
        try:
            self.refresh(agent=agent)
        except Unreachable as e:
            results = super().read(paths, agent=agent)
            note = offline_note(self.store, self.head(), e.message)
            for r in results:
                r.offline = note
            return results
        return super().read(paths, agent=agent)

    def status(self, *, diffs: bool = False, untracked_content: bool = False) -> Status:
        self.flush()
        self.refresh(notes=True)  # status reports every agent's read set
        st = super().status(diffs=diffs, untracked_content=untracked_content)
        st.extra["remote"] = self.remote
        return st

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        self.refresh(disk=False, notes=True)  # the provenance of every agent's writes
        return super().log(limit)


def offline_note(store: Store, head: pygit2.Oid, why: str) -> str:
    """What an offline read tells its reader: the head it read and its age."""
    age = max(0, int(time.time()) - store.commit(head).commit_time)
    when = f"{age // 86400} day(s)" if age >= 86400 else f"{age // 3600} h" if age >= 3600 else \
        f"{age // 60} min" if age >= 60 else f"{age} s"
    return f"offline ({why}): read at the last head fetched, {str(head)[:10]}, written {when} ago"
