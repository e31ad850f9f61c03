"""Storm mode: one shared workspace, validated compare-and-swap writes.

STORM's local state consistency on git: a write by agent ``a`` to ``f`` is valid
iff every ``(g, v)`` in ``S_a ∪ {(f, v_f observed)}`` still has version ``v`` at
the shared head. Versions are blob ids, so a file that went A → B → A is
consistent for an agent that read A (no false conflict, never a wrong accept).

The write path: blobs are written before any lock; then, under the workspace
flock, the reservation check, the validation against head ``H``, the commit on
``H`` and the CAS of ``refs/storm/workspace`` from ``H`` happen as one step. If
the CAS fails (a writer outside storm's lock moved the ref) the write is
re-validated against the new head. The commit carries its provenance (what
it was validated against: trailers, storm_git.core.trailers). The agent's read
set and the working tree are updated afterwards under their own locks, so
writers by different agents only serialise on the short critical section.
"""
from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pygit2

from ..core import casefold, events, history, intents, maintenance, readsets, reservations, trailers
from ..core.agents import validate_agent
from ..core.convert import Conversions
from ..core.diffs import is_binary, unified
from ..disk.safe_fs import parent_fd as disk_parent
from ..core.tree_diff import changed_paths
from ..disk.record import check_record
from ..disk.sync import materialize
from ..core.errors import BadPath, NotFound, NotInitialised, StormError, UsageError
from ..core.files import reason
from ..core.locks import flocked
from ..core.paths import check_on_disk, normalize
from ..core.payloads import (
    DIRECT_CONFLICT,
    RESERVED,
    STALE_DEPENDENCY,
    UNREAD_TARGET,
    AgentStatus,
    CommitResult,
    ExecResult,
    FileChange,
    ReadResult,
    Rejection,
    ReservationWait,
    Status,
    WriteResult,
)
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..deps import impact as depimpact, scope as depscope
from ..core.assignments import OUTSIDE_ASSIGNMENT, flag_storm_write
from ..core.store import MODE_BLOB, MODE_EXEC, MODE_LINK, WORKSPACE_REF, Entry, Store, hex_
from ..core.workspace import BaseWorkspace
from . import branch, rebased
from .writer import AS_WRITTEN, UNDO_OP, OnWait

DEFAULT_RESERVATION_SECONDS = 30
# Rejections the agent must re-plan around: these reserve the target, and so does
# an unread_target rejection that also lists stale dependencies (the agent built on
# files that changed). A plain unread_target only hands over the content; reserving
# then would make an agent that did read the file wait for one that merely had not.
RESERVING_REASONS = (DIRECT_CONFLICT, STALE_DEPENDENCY)
HISTORY_LIMIT = 256
PRE_VALIDATE_AT = 64  # read-set size from which validation starts before the lock
# ``deps=AUTO_DEPS`` (or ``storm.deps=auto``): validate against the read files the write
# depends on, computed (storm_git.deps.scope), instead of the whole read set.
AUTO_DEPS = depscope.AUTO
DEPS_KEY = "storm.deps"


def deps_argument(words: Iterable[str] | None) -> list[str] | str | None:
    """The ``deps`` of a write from what a user or an agent typed (CLI ``--deps``, the MCP
    tools' ``deps`` list): paths, or the one word ``auto`` (computed scope) or ``all``
    (the whole read set, over ``storm.deps=auto``); a file really named so is ``./auto``."""
    if not words:
        return None
    words = list(words)
    special = [d for d in words if d in (AUTO_DEPS, depscope.ALL)]
    if special and len(words) > 1:
        raise UsageError(f"--deps {special[0]} cannot be combined with other --deps",
                         hint="give either --deps auto, --deps all, or the paths (a file named auto: ./auto)")
    return special[0] if special else words


class _MustReject:
    """Content of an edit that cannot be computed: validation must refuse it."""


MUST_REJECT = _MustReject()


@dataclass
class _Verdict:
    reason: str | None
    current: dict[str, Entry | None]
    conflicts: list[str]
    stale: list[str]


class SharedWorkspace(BaseWorkspace):
    """The verbs of storm mode."""

    mode = "storm"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        # agent -> (read-set parse, re-read paths then, head): the agent's whole read
        # set was valid at that head (see apply; per process, never persisted)
        self._valid: dict[str, tuple[int, int, pygit2.Oid]] = {}

    # -- settings --------------------------------------------------------------
    @property
    def reservation_seconds(self) -> float:
        return self.store.config_float("storm.reservationSeconds", DEFAULT_RESERVATION_SECONDS)

    # -- helpers ---------------------------------------------------------------
    def path(self, raw: str, *, for_write: bool = False, seen: dict[str, str] | None = None) -> str:
        """Validate a user path (relative to the caller's directory); ``seen`` is shared by
        the paths of one call (see check_on_disk)."""
        p = normalize(raw, self.store.prefix, self.store.top)
        check_on_disk(p, self.store.main_workdir, for_write=for_write, seen=seen)
        return p

    def _head_ref(self) -> pygit2.Reference:
        ref = self.store.ref(WORKSPACE_REF)
        if ref is None:
            raise NotInitialised("storm is not initialised in this repository",
                                 hint="run git storm init")
        return ref

    def head(self) -> pygit2.Oid:
        return self._head_ref().target

    def catch_up(self, agent: str | None = None) -> None:
        """Bring the shared head to the truth before a decision made outside ``apply``
        (a harness pre-hook's lease). Locally the ref is the truth: nothing to do."""

    def publish_reservations(self) -> None:
        """Make reservations changed outside ``apply`` (a harness lease) reach the other
        machines. Locally they are already shared: nothing to do."""

    # -- where the compare-and-swap happens (storm_git.remote overrides these) ------
    # Locally the shared ref is the truth: the CAS under the workspace lock is the
    # write, and every verdict is final. On a remote (storm_git.remote.client) the
    # local CAS only queues the commit; it lands when the server takes a push.
    _lands_later = False

    def _publish(self, ref: pygit2.Reference, commit: pygit2.Oid, head: pygit2.Oid, agent: str, op: str) -> bool:
        """Move the shared ref from ``head`` to ``commit`` (workspace lock held); False
        when it moved meanwhile (the write is re-validated and retried)."""
        return self.store.cas(ref, WORKSPACE_REF, commit, f"storm: {agent} {op}")

    def _land(self, agent: str, commit: pygit2.Oid) -> pygit2.Oid | None:
        """With ``_lands_later``: called without the workspace lock once ``commit`` is
        on the local ref; the commit that is on the shared ref for good (``commit``,
        or the same write moved onto a newer head), or None when it was dropped (the
        write is validated again)."""
        return commit

    def _verdict_is_final(self) -> bool:
        """Whether a verdict that pushes nothing (a rejection, a write that changes
        nothing, a reservation to wait for) may be given as it is."""
        return True

    def _refresh_for_verdict(self, agent: str) -> None:
        """Make the next attempt's verdict final (called without the workspace lock)."""

    # -- read ------------------------------------------------------------------
    def read(self, paths: Iterable[str], *, agent: str | None) -> list[ReadResult]:
        """Content and version of each path at the shared head, recorded in the read set."""
        agent = validate_agent(agent)
        seen: dict[str, str] = {}
        norm = list(dict.fromkeys(self.path(p, seen=seen) for p in paths))
        if not norm:
            raise UsageError("no path given")
        head = self.head()
        tree = self.store.commit(head).tree
        results = []
        found = [(p, self.store.entry(tree, p)) for p in norm]
        if len(found) > 1:  # a partial clone fetches what it lacks in one go, not path by path
            self.store.prefetch([e.oid for _, e in found if e is not None])
        conv = Conversions(self.store)
        for p, e in found:
            results.append(ReadResult(p, hex_(e.oid) if e else None, str(head),
                                      self.agent_content(p, e.oid, e.mode, conv) if e else None,
                                      e.mode if e else None))
        readsets.record(self.store, agent,
                        [ReadEntry(r.path, r.version, str(head)) for r in results], why="read")
        return results

    def agent_content(self, path: str, oid: pygit2.Oid, mode: int | None = None,
                      conv: Conversions | None = None) -> bytes:
        """Blob ``oid`` of ``path`` as agents are given it: what ``write`` takes back
        (storm_git.core.convert.Conversions.for_agent; a link's target as stored)."""
        data = self.store.blob_bytes(oid)
        if mode == MODE_LINK:
            return data
        return (conv or Conversions(self.store)).for_agent(path, data, oid)

    # -- writes ----------------------------------------------------------------
    def write(self, path: str, content: bytes, *, agent: str | None, intent: str | None = None,
              deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Validated write of one file (see module docstring)."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        self._check_size(p, content)
        return self.apply(agent, {p: content}, intent=intent, deps=deps, wait=wait, op="write", on_wait=on_wait)

    def edit(self, path: str, old: str, new: str, *, agent: str | None, intent: str | None = None,
             deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Replace exactly one occurrence of ``old`` in the version the agent last read,
        then write it with validation: a concurrent change is a rejection, not "not found"."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        if old == "":
            raise UsageError("--old is empty", hint="give the exact text to replace")
        seen = readsets.load(self.store, agent).get(p)
        if seen is None or seen.blob is None:
            if self.store.entry(self.store.commit(self.head()).tree, p) is None:
                raise NotFound(f"{p} does not exist in the shared workspace",
                               hint="use git storm write to create it")
            # Never read (or read while absent): the validation refuses it and the
            # rejection gives the agent the content to edit.
            return self.apply(agent, {p: MUST_REJECT}, intent=intent, deps=deps, wait=wait, op="edit",
                              on_wait=on_wait)
        base = self.agent_content(p, pygit2.Oid(hex=seen.blob))
        old_b, new_b = old.encode("utf-8"), new.encode("utf-8")
        n = base.count(old_b)
        if n != 1:
            where = f"the version of {p} that {agent} last read ({seen.blob[:12]})"
            if n == 0:
                raise UsageError(f"--old text not found in {where}",
                                 hint="read the file again and copy the text exactly")
            raise UsageError(f"--old text occurs {n} times in {where}",
                             hint="include more surrounding text so it matches once")
        content = base.replace(old_b, new_b, 1)
        self._check_size(p, content)
        return self.apply(agent, {p: content}, intent=intent, deps=deps, wait=wait, op="edit", on_wait=on_wait)

    def rm(self, path: str, *, agent: str | None, intent: str | None = None,
           deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Validated delete."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        if self.store.entry(self.store.commit(self.head()).tree, p) is None:
            raise NotFound(f"{p} does not exist in the shared workspace")
        return self.apply(agent, {p: None}, intent=intent, deps=deps, wait=wait, op="rm", on_wait=on_wait)

    def release(self, path: str, *, agent: str | None) -> Reservation | None:
        """End the agent's own reservation on ``path``; returns it (None if there was none)."""
        agent = validate_agent(agent)
        p = normalize(path, self.store.prefix, self.store.top)
        with flocked(self.store.commondir, "workspace"):
            self._head_ref()
            r = reservations.get(self.store, p)
            if r is None:
                return None
            if r.holder != agent:
                raise UsageError(f"{p} is reserved by {r.holder}, not {agent}",
                                 hint=f"only {r.holder} can release it; it expires in {r.remaining():.0f}s")
            reservations.update(self.store, {p: None}, agent=agent, message=f"storm: {agent} released {p}")
            events.append(self.store, "release", agent, f"{agent} released {p}", {"path": p})
        return r

    def apply(self, agent: str, changes: dict[str, Any], *, intent: str | None, deps: Iterable[str] | None,
              wait: bool, op: str, expected: dict[str, str | None] | None = None,
              on_wait: OnWait | None = None) -> WriteResult:
        """The validated atomic write of ``changes`` ({path: bytes, or None to delete}).

        ``expected`` overrides the observed version of targets (``exec`` compares
        with the tree the command started from instead of the read set).
        ``on_wait`` is called (outside the lock) each time the write starts waiting
        for another agent's reservation, so a caller can say so; the library never prints.
        """
        store = self.store
        paths = list(changes)
        blobs: dict[str, Any] = {}
        modes: dict[str, int] = {}
        contents: dict[pygit2.Oid, bytes] = {}
        conv = Conversions(store)
        for p, c in changes.items():
            from_disk = isinstance(c, tuple)
            if from_disk:  # (content, mode) read from disk: exec and adopt record the exec bit and links
                c, modes[p] = c
            if isinstance(c, bytes):
                if modes.get(p) != MODE_LINK:  # what `git add` would store (.gitattributes: eol, filters)
                    c = conv.to_odb(p, c, from_disk=from_disk)
                blobs[p] = store.write_blob(c)
                contents[blobs[p]] = c
            else:
                blobs[p] = c
        view = readsets.load_view(store, agent)
        reads = view.entries
        dep_list: list[str] | None = None
        auto: depscope.Scope | None = None
        if deps is None and expected is None:
            deps = self._configured_deps()
        if isinstance(deps, str):  # "all" overrides storm.deps=auto; any other string is one path
            deps = None if deps == depscope.ALL else deps if deps == AUTO_DEPS else [deps]
        if isinstance(deps, str) and deps == AUTO_DEPS:
            auto = depscope.compute(store, agent, changes, reads, self.head())
            scope, scope_name, dep_list = self._auto_scope(auto, reads, paths)
        elif deps is not None:
            dep_paths = [normalize(d, store.prefix, store.top) for d in deps]
            missing = [d for d in dep_paths if d not in reads and d not in changes]
            if missing:
                raise UsageError(f"--deps {missing[0]} was never read by {agent}",
                                 hint="read it first (git storm read), or leave it out of --deps")
            scope = {d: reads[d] for d in dep_paths if d in reads}
            scope.update({p: reads[p] for p in paths if p in reads})
            scope_name, dep_list = "deps", sorted(scope)
        else:
            scope, scope_name = dict(reads), "all"

        # Validation looks at the whole read set once per process: after that, at the
        # paths re-recorded since and those that moved on the shared ref since the
        # head it was last found valid at (write cost independent of the read set).
        # Else a large read set is validated before the lock, and under it only the
        # paths that changed since, so one agent's big read set does not stall others.
        whole = scope_name in ("all", depscope.FALLBACK) and expected is None
        known = self._valid.get(agent) if whole else None
        if len(scope) <= PRE_VALIDATE_AT:
            # a small scope is checked whole under the lock: a lookup per path costs less
            # than diffing the head against the one it was last valid at, a diff that
            # grows with every write queued for the lock ahead of this one
            pre = None
        elif known is not None and known[0] == view.gen:
            pre = self._advance(known[2], view.changed[known[1]:view.changed_at], paths, reads, scope,
                                expected, changes)
        elif len(scope) > PRE_VALIDATE_AT:
            h0 = self.head()
            pre = (h0, self._validate(store.commit(h0).tree, paths, reads, scope, expected, changes), [])
        else:
            pre = None
        check_record(store)  # an unreadable disk record refuses the write before it lands, not after
        started = time.monotonic()
        hold = self.reservation_seconds  # read config once per write
        wait_budget = hold + 1.0
        retries = 0
        warnings: list[str] = []  # steps after the landing that failed (see _after_landing)
        announced: Reservation | None = None  # the reservation being waited for (on_wait told)
        blocked_at = blocked_end = 0.0  # time spent on reservations only, not on the lock
        landing: pygit2.Oid | None = None  # a commit made under the lock, landed outside it (remote)
        refresh = False  # the verdict pushes nothing: confirm it on a fresh head first (remote)
        while True:
            if landing is not None:
                landed = self._land(agent, landing)
                if landed is not None:
                    if landed != commit:  # moved onto a newer head on its way (storm_git.remote)
                        commit, head = landed, store.commit(landed).parent_ids[0]
                    if held:  # the reservation ends once the write is on the shared ref
                        with flocked(store.commondir, "workspace"):
                            _after_landing(warnings, "ending the writer's reservation", None,
                                           _end_reservations, store, agent, held)
                    break
                landing, retries, pre = None, retries + 1, None  # dropped: validate again
            if refresh:
                self._refresh_for_verdict(agent)
                refresh, pre = False, None
            blocked: Reservation | None = None
            granted: Reservation | None = None
            commit: pygit2.Oid | None = None
            with flocked(store.commondir, "workspace"):
                ref = self._head_ref()
                head = ref.target
                tree = store.commit(head).tree
                now = reservations.clock()
                held = []
                live = reservations.live_on(store, paths, now)  # one ref lookup for the batch
                for p in paths:
                    r = live.get(p)
                    if r is not None:
                        if r.holder != agent:
                            blocked = r
                            break
                        held.append(p)
                if blocked is None:
                    if auto is not None and depscope.widen(auto, store, agent, changes, reads, head):
                        scope, scope_name, dep_list = self._auto_scope(auto, reads, paths)
                        pre = None  # files that moved since brought new dependencies: check them all
                    # checked again at the moment of writing, under the lock (a deletion writes nothing)
                    _check_disk_parents(store.main_workdir, [p for p in paths if blobs[p] is not None])
                    verdict = self._validate_at(head, tree, pre, paths, reads, scope, expected, changes)
                    if verdict.reason == STALE_DEPENDENCY and auto is not None and auto.paths is not None:
                        # moved files whose change touches nothing the write uses leave the
                        # computed scope (storm_git.deps.impact); the rest still reject
                        try:
                            impact = depimpact.judge(store, agent, changes, reads, tree, verdict.stale)
                        except (RecursionError, MemoryError, ValueError, KeyError, TypeError) as exc:
                            # an optimisation: if it fails, the files simply stay in the scope
                            impact = depimpact.Impact(kept={p: f"not looked inside ({type(exc).__name__})"
                                                            for p in verdict.stale})
                        auto.kept = impact.kept
                        if impact.spared:
                            auto.paths -= impact.spared.keys()
                            auto.unaffected.update(impact.spared)
                            scope, scope_name, dep_list = self._auto_scope(auto, reads, paths)
                            verdict = self._validate(tree, paths, reads, scope, expected, changes)
                    if verdict.reason is None:
                        if any(b is MUST_REJECT for b in blobs.values()):
                            raise NotFound(f"{paths[0]} does not exist in the shared workspace")
                        _refuse_case_twins(store, tree, [p for p, b in blobs.items()
                                                         if b is not None and verdict.current[p] is None],
                                           {p for p, b in blobs.items() if b is None})
                        placed = {p: None if b is None else (b, modes.get(p) or _mode(verdict.current[p]))
                                  for p, b in blobs.items()}
                        new_tree = store.tree_with(tree, placed)
                        commit = None
                        if new_tree != tree.id:
                            # the provenance travels in the commit: what it was validated
                            # against, the read set by reference (storm_git.core.trailers)
                            prov = trailers.Provenance(str(head), scope_name, view.base, view.counted, dep_list)
                            message = trailers.format_message(intent, agent, op, paths, prov)
                            commit = store.make_commit(new_tree, [head], agent, message)
                        # journaled before the CAS: a kill after it cannot lose the agent's view
                        # of its own write (readsets module docstring)
                        if whole:
                            # valid at head, and at this commit too: it changes only the paths
                            # written, whose new entries are journaled now and so re-checked
                            self._valid[agent] = (view.gen, view.changed_at, commit or head)
                        journal_size = readsets.record_write(
                            store, agent, [ReadEntry(p, hex_(b), str(commit or head)) for p, b in blobs.items()])
                        if commit is not None and not self._publish(ref, commit, head, agent, op):
                            retries += 1
                            continue
                        if commit is not None and self._lands_later:
                            landing = commit  # pushed at the top of the loop, the lock released
                            continue
                        if commit is None and not self._verdict_is_final():
                            refresh = True
                            continue
                        if held:
                            _after_landing(warnings, "ending the writer's reservation", None,
                                           _end_reservations, store, agent, held)
                        break
                    if not self._verdict_is_final():
                        refresh = True
                        continue
                    granted = self._reject_locked(agent, op, paths, verdict, head, now, hold)
                    break
                if not self._verdict_is_final():
                    refresh = True
                    continue
                if not wait or time.monotonic() - started >= wait_budget:
                    verdict = _Verdict(RESERVED, {p: store.entry(tree, p) for p in paths}, [], [])
                    events.append(store, "rejection", agent, f"{agent} {op} {blocked.path}: reserved",
                                  {"reason": RESERVED, "path": blocked.path, "paths": paths, "op": op,
                                   "holder": blocked.holder, "head": str(head)})
                    break
            if blocked != announced:
                blocked_at = blocked_at or time.monotonic()
                announced = blocked
                if on_wait is not None:
                    on_wait(blocked)
            time.sleep(min(0.05, max(0.001, blocked.remaining())))
            blocked_end = time.monotonic()

        waited = time.monotonic() - started
        held_by = blocked or announced  # blocked: refused as reserved (perhaps at once, --no-wait)
        res_wait = ReservationWait(held_by.holder, held_by.path, blocked_end - blocked_at) if held_by else None
        if verdict.reason is None:
            # after the lock (they read only the immutable parent tree and commit):
            # outside the agent's assignment, allowed but flagged and logged (storm_git.core.assignments);
            # a line another agent annotated, deleted or rewritten: flagged and logged (storm_git.core.intents)
            # The write is on the shared ref: from here on nothing may turn it into an
            # error (a full disk, a bad setting). What fails is said in the answer.
            landed = commit is not None
            outside = _after_landing(warnings, "the assignment check", [], flag_storm_write,
                                     store, agent, paths, commit) if landed else []
            overwritten = _after_landing(warnings, "the intent check", [], intents.flag_write,
                                         store, agent, tree, blobs, commit) if landed else []
            new_head = commit or head
            versions = {p: hex_(b) if b is not None else None for p, b in blobs.items()}
            synced = materialize(store, paths, contents, step=(head, commit),
                                 entries={p: v and Entry(*v) for p, v in placed.items()}, conv=conv) if landed else None
            if synced is not None and synced.record_error:
                warnings.append(f"recording the disk write failed: {synced.record_error} (it stays recorded "
                                "as pending; the next storm command records it)")
            # outside the lock: the next write need not read them back
            _after_landing(warnings, "the intent cache", None, intents.remember, store, contents)
            if journal_size >= readsets.FOLD_BYTES:
                _after_landing(warnings, "folding the read-set journal", None, readsets.fold, store, agent)
            if landed:
                maintenance.after_write(store, commit)  # one write in 16 looks; never waits, never raises
            return WriteResult(True, agent, paths, str(new_head), hex_(commit), versions,
                               disk=synced.outcomes if synced else {},
                               disk_errors=synced.errors if synced else {}, warnings=warnings,
                               cas_retries=retries, waited=waited,
                               flags=[OUTSIDE_ASSIGNMENT] * bool(outside) + [intents.INTENT_OVERWRITTEN] * bool(overwritten),
                               reservation_wait=res_wait,
                               unaffected=dict(sorted(auto.unaffected.items())) if auto else {})
        seen = dict(reads)
        for p, v in (expected or {}).items():  # exec/adopt: the base the edit was made on
            if v != AS_WRITTEN:
                seen[p] = ReadEntry(p, v, "")
        rejection = self._payload(agent, verdict, head, seen, granted if verdict.reason != RESERVED else blocked,
                                  op=op)
        rejection.scope = {"name": scope_name, "paths": dep_list, "why": auto.why if auto else None}
        if auto is not None and (auto.kept or auto.unaffected):
            # --deps auto looked inside the moved files: why each still counts, and which did not
            rejection.scope["moved"] = {p: auto.kept[p] for p in sorted(auto.kept)}
            rejection.scope["unaffected"] = dict(sorted(auto.unaffected.items()))
        if scope_name != "all" and verdict.reason == STALE_DEPENDENCY:
            rejection.message += f" (validated against scope {scope_name}: {len(scope)} read file(s))"
        rejection.intents_in_diff = intents.in_rejection(store, rejection)
        if verdict.reason == DIRECT_CONFLICT:
            rejection.rebased = self.offer_rebased(agent, rejection, seen.get(rejection.path),
                                                    changes.get(rejection.path))
        if verdict.reason != RESERVED:
            # What counts as read is what reached the agent in full: the target's current
            # content. Stale dependencies are shown as diffs, and stay stale until read.
            e = self._entry_or_none(tree, rejection.path)
            readsets.record(store, agent, [ReadEntry(rejection.path, hex_(e.oid) if e else None, str(head))],
                            why="was shown")
        return WriteResult(False, agent, paths, str(head), rejection=rejection, cas_retries=retries, waited=waited,
                           reservation_wait=res_wait)

    def offer_rebased(self, agent: str, rejection: Rejection, seen: ReadEntry | None,
                       change: Any) -> rebased.Rebased | None:
        """The agent's change of the target re-applied on its current version (kept for
        ``write --rebased``), when it read a version of it and wrote text."""
        mine = change[0] if isinstance(change, tuple) else change
        if seen is None or not seen.blob or not isinstance(mine, bytes) or rejection.current_content is None:
            return None
        base = self.agent_content(rejection.path, pygit2.Oid(hex=seen.blob), None)
        offer = rebased.merge(rejection.path, base, mine, rejection.current_content,
                              read_version=seen.blob, current_version=rejection.current_version)
        if offer is not None:
            rebased.keep(self.store, agent, offer)
        return offer

    def write_rebased(self, path: str, *, agent: str | None, intent: str | None = None,
                      wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Accept the rebased change the agent's last rejection of ``path`` offered: a
        validated write of it (rejected again if anything moved since)."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        content, made_on = rebased.take(self.store, agent, p)
        now = self._entry_or_none(self.store.commit(self.head()).tree, p)
        if hex_(now.oid if now else None) != made_on:
            rebased.drop(self.store, agent, p)
            raise UsageError(f"{p} changed since the rebased change was offered to {agent}",
                             hint="write it again: the rejection then offers a new one")
        res = self.write(p, content, agent=agent, intent=intent, wait=wait, on_wait=on_wait)
        if res.accepted:
            rebased.drop(self.store, agent, p)
        return res

    def _configured_deps(self) -> str | None:
        """``storm.deps``: ``auto`` makes every write/edit/rm use the computed scope."""
        value = (self.store.config_get(DEPS_KEY) or "all").strip().lower()
        if value not in ("all", AUTO_DEPS):
            raise UsageError(f"{DEPS_KEY} is {value!r}, not 'all' or 'auto'",
                             hint=f"fix it with git config {DEPS_KEY} auto (or unset it)")
        return AUTO_DEPS if value == AUTO_DEPS else None

    @staticmethod
    def _auto_scope(auto: depscope.Scope, reads: dict[str, ReadEntry],
                    paths: list[str]) -> tuple[dict[str, ReadEntry], str, list[str] | None]:
        """(scope, its name, the deps listed in provenance) of a computed scope."""
        if auto.paths is None:
            return dict(reads), auto.name, None
        scope = {p: reads[p] for p in auto.paths if p in reads}
        scope.update({p: reads[p] for p in paths if p in reads})
        return scope, auto.name, sorted(scope)

    # -- validation and payloads ------------------------------------------------
    def _target_entry(self, tree: pygit2.Tree, path: str, changes: dict[str, Any]) -> Entry | None:
        """The target's current entry; a path under a file is refused unless the
        same write deletes that file (a command that turned a file into a directory)."""
        try:
            return self.store.entry(tree, path)
        except BadPath:
            parts = path.split("/")
            if any(changes.get("/".join(parts[:i]), b"") is None for i in range(1, len(parts))):
                return None
            # a directory replaced by a file: only if the same write deletes all of it
            obj = tree[path] if path in tree else None
            if isinstance(obj, pygit2.Tree) and all(changes.get(f"{path}/{f}", b"") is None
                                                    for f in _files(obj)):
                return None
            raise

    def _entry_or_none(self, tree: pygit2.Tree, path: str) -> Entry | None:
        try:
            return self.store.entry(tree, path)
        except BadPath:
            return None

    def _advance(self, h0: pygit2.Oid, reread: list[str], paths: list[str], reads: dict[str, ReadEntry],
                 scope: dict[str, ReadEntry], expected: dict[str, str | None] | None,
                 changes: dict[str, Any]) -> tuple[pygit2.Oid, None, list[str]]:
        """Before the lock: the whole scope was valid at ``h0``; check the paths that
        moved since against the current head, so that under the lock only the writes
        made meanwhile are diffed. With 8 writers the diff from ``h0`` had grown to
        several directories, diffed while every other writer waited for the lock."""
        h1 = self.head()
        if h1 == h0:
            return h0, None, reread
        tree = self.store.commit(h1).tree
        moved = changed_paths(self.store, self.store.commit(h0).tree, tree)
        narrow = {p: scope[p] for p in (*moved, *reread) if p in scope}
        try:
            valid = self._validate(tree, paths, reads, narrow, expected, changes).reason is None
        except BadPath:
            valid = False
        # not valid: the lock's full check writes the rejection with every stale file
        return (h1, None, []) if valid else (h0, None, reread)

    def _validate_at(self, head: pygit2.Oid, tree: pygit2.Tree,
                     pre: tuple[pygit2.Oid, _Verdict | None, list[str]] | None,
                     paths: list[str], reads: dict[str, ReadEntry], scope: dict[str, ReadEntry],
                     expected: dict[str, str | None] | None, changes: dict[str, Any]) -> _Verdict:
        """The verdict at ``head``. ``pre`` is (h0, verdict at h0, paths re-read since):
        with a verdict computed before the lock, it stands when no path it depends on
        changed since (a verdict is a function of those paths' entries); with None,
        the whole scope was valid at h0, so only the paths re-read since and those
        that moved since h0 can have become stale."""
        if pre is not None:
            h0, verdict, reread = pre
            if verdict is not None and h0 == head:
                return verdict
            moved = changed_paths(self.store, self.store.commit(h0).tree, tree) if h0 != head else []
            if verdict is not None:
                if set(moved).isdisjoint(paths) and set(moved).isdisjoint(scope):
                    return verdict
            else:
                narrow = {p: scope[p] for p in (*moved, *reread) if p in scope}
                verdict = self._validate(tree, paths, reads, narrow, expected, changes)
                if verdict.reason is None:
                    return verdict
                # a rejection: its payload lists every stale file, so look at them all
        return self._validate(tree, paths, reads, scope, expected, changes)

    def _validate(self, tree: pygit2.Tree, paths: list[str], reads: dict[str, ReadEntry],
                  scope: dict[str, ReadEntry], expected: dict[str, str | None] | None,
                  changes: dict[str, Any] | None = None) -> _Verdict:
        current = {p: self._target_entry(tree, p, changes or {}) for p in paths}
        conflicts, unread = [], []
        for p in paths:
            cur = hex_(current[p].oid) if current[p] else None
            exp = expected.get(p, AS_WRITTEN) if expected is not None else AS_WRITTEN
            if exp != AS_WRITTEN:
                if exp != cur:
                    conflicts.append(p)
            elif p in reads:
                if reads[p].blob != cur:
                    conflicts.append(p)
            elif current[p] is not None or (expected is not None and p in expected):
                unread.append(p)  # the last: a revert re-creating a file deleted since
        stale = []
        for g, e in scope.items():
            if g in current:
                continue
            c = self._entry_or_none(tree, g)
            if (hex_(c.oid) if c else None) != e.blob:
                stale.append(g)
        reason = (DIRECT_CONFLICT if conflicts else UNREAD_TARGET if unread
                  else STALE_DEPENDENCY if stale else None)
        return _Verdict(reason, current, conflicts + unread, stale)

    def _reject_locked(self, agent: str, op: str, paths: list[str], verdict: _Verdict,
                       head: pygit2.Oid, now: float, secs: float) -> Reservation | None:
        """Log the rejection and, for a conflict to re-plan around (RESERVING_REASONS), grant
        the rejected agent its reservation (workspace lock held)."""
        target = verdict.conflicts[0] if verdict.conflicts else paths[0]
        replan = verdict.reason in RESERVING_REASONS or bool(verdict.stale)
        granted = Reservation(target, agent, now + secs, now) if replan else None
        if granted is not None and secs > 0:
            reservations.update(self.store, {target: granted}, agent=agent,
                                message=f"storm: {agent} reserves {target} after a rejection")
        events.append(self.store, "rejection", agent, f"{agent} {op} {target}: {verdict.reason}",
                      {"reason": verdict.reason, "path": target, "paths": paths, "op": op,
                       "stale": verdict.stale, "head": str(head)})
        return granted

    def _file_history(self, path: str, head: pygit2.Oid, since: str | None,
                      base: str | None = None) -> tuple[list[str], int | None]:
        """Agents that changed ``path`` between ``since`` and ``head`` (newest first), and
        how many times. Without ``since`` (an edit on disk has no head, only the
        version ``base`` it was made on) the walk stops where the path was ``base``."""
        c = self.store.commit(head)
        by: list[str] = []
        behind = 0
        for _ in range(HISTORY_LIMIT):
            if since and str(c.id) == since:
                return list(dict.fromkeys(by)), behind
            if not since and hex_(getattr(self._entry_or_none(c.tree, path), "oid", None)) == base:
                return list(dict.fromkeys(by)), behind
            if not c.parent_ids:
                break
            parent = self.store.commit(c.parent_ids[0])
            if self._entry_or_none(c.tree, path) != self._entry_or_none(parent.tree, path):
                behind += 1
                by.append(trailers.parse(c.message).get("Storm-Agent", [c.author.name])[0])
            c = parent
        return list(dict.fromkeys(by)), behind

    def _change(self, path: str, seen: ReadEntry | None, current: Entry | None, head: pygit2.Oid,
                new: bytes | None = None) -> FileChange:
        """``new``: the current content as agents see it, when the caller has it already."""
        conv = Conversions(self.store)
        old = self.agent_content(path, pygit2.Oid(hex=seen.blob), None, conv) if seen and seen.blob else None
        if new is None and current is not None:
            new = self.agent_content(path, current.oid, current.mode, conv)
        by, behind = self._file_history(path, head, seen.head if seen else None, seen.blob if seen else None)
        if seen is None:  # never read: no base to diff from or count versions since
            return FileChange(path, None, hex_(current.oid) if current else None, by, None, "",
                              is_binary(new), never_read=True)
        return FileChange(path, seen.blob, hex_(current.oid) if current else None,
                          by, behind, unified(path, old, new), is_binary(old) or is_binary(new))

    def _payload(self, agent: str, verdict: _Verdict, head: pygit2.Oid, reads: dict[str, ReadEntry],
                 reservation: Reservation | None, *, op: str = "write") -> Rejection:
        tree = self.store.commit(head).tree
        target = verdict.conflicts[0] if verdict.conflicts else next(iter(verdict.current))
        cur = verdict.current.get(target)
        content = self.agent_content(target, cur.oid, cur.mode) if cur else None  # once: a smudge may be a process
        change = self._change(target, reads.get(target), cur, head, content)
        stale = [self._change(g, reads[g], self._entry_or_none(tree, g), head) for g in verdict.stale]
        reason = verdict.reason or RESERVED
        text = {
            DIRECT_CONFLICT: (f"{target} changed since {agent} read it" if target in reads and reads[target].head
                              else _changed_meanwhile(target, agent, op, change.changed_by)
                              if target in reads and not change.never_read else
                              f"{target} was changed by another agent meanwhile; {agent} never read it: "
                              "its current content is attached and now counts as read"),
            UNREAD_TARGET: f"{agent} never read {target}; its current content is attached and now counts as read",
            STALE_DEPENDENCY: f"{len(stale)} file(s) {agent} read changed since: {', '.join(s.path for s in stale)}",
            RESERVED: (f"{target} is reserved by {reservation.holder} for {reservation.remaining():.1f}s more"
                       if reservation else f"{target} is reserved"),
        }[reason]
        if reason != RESERVED and reservation is not None:
            text += f"; {agent} holds {target} for {reservation.remaining():.0f}s to retry"
        return Rejection(reason, agent, target, str(head), hex_(cur.oid) if cur else None,
                         content, change, stale, reservation, text)

    # -- status and log ----------------------------------------------------------
    def status(self, *, diffs: bool = False, untracked_content: bool = False) -> Status:
        readsets.fold_all(self.store)  # status is where journals reach the notes at the latest
        head = self.head()
        tree = self.store.commit(head).tree
        agents, corrupt = [], []
        for a in readsets.agents(self.store):
            try:
                reads = readsets.peek(self.store, a)
            except readsets.CorruptReadSet as exc:  # that agent's problem: status still reports the rest
                corrupt.append(str(exc))
                continue
            stale = sorted(p for p, e in reads.items()
                           if hex_(getattr(self._entry_or_none(tree, p), "oid", None)) != e.blob)
            agents.append(AgentStatus(a, len(reads), stale))
        nested: list[str] = []
        edits = self.unmediated(diffs=diffs, untracked_content=untracked_content, nested=nested)
        news = self._branch_news(head)
        return Status(self.mode, str(head), agents, reservations.active(self.store),
                      extra={"unmediated": edits, **({"nested_repositories": nested} if nested else {}),
                             **({"branch_news": news.to_dict()} if news else {}),
                             **({"corrupt_read_sets": corrupt} if corrupt else {})})

    def _branch_news(self, head: pygit2.Oid) -> branch.BranchNews | None:
        """Commits the checked-out branch gained outside storm (the manager's commit merges them in)."""
        repo = self.store.repo
        if repo.head_is_unborn or repo.head_is_detached:
            return None
        try:
            return branch.news(self.store, repo.lookup_reference("HEAD").resolve(), head)
        except (pygit2.GitError, KeyError):
            return None

    # -- the shared working tree (storm_git.storm.tracking, storm_git.storm.manager) ----------
    def exec(self, argv: list[str], *, agent: str | None, intent: str | None = None,
             timeout: float | None = None, wait: bool = True, on_wait: OnWait | None = None) -> ExecResult:
        """Run a command in the shared working tree; record what it changed as one write."""
        from .tracking import exec_

        return exec_(self, argv, agent=agent, intent=intent, timeout=timeout, wait=wait, on_wait=on_wait)

    def adopt(self, paths: list[str], *, agent: str | None, intent: str | None = None,
              wait: bool = True, allow_revert: bool = False, on_wait: OnWait | None = None) -> WriteResult:
        """Record files edited outside storm as the agent's write, validated against
        the version each edit was made on."""
        from .tracking import adopt

        if any(self._directory(p) is not None for p in paths):  # a directory: its edits, as git add DIR
            paths = self._under_directories(paths, skip=("not-a-file",) if allow_revert else ("not-a-file", "reverted"))
            if not paths:
                raise UsageError("nothing to adopt under that directory: the disk holds the shared state there",
                                 hint="git storm status lists the edits on disk")
            return adopt(self, paths, agent=agent, intent=intent, wait=wait, allow_revert=allow_revert,
                         on_wait=on_wait, repo_relative=True)
        return adopt(self, paths, agent=agent, intent=intent, wait=wait, allow_revert=allow_revert,
                     on_wait=on_wait)

    def unmediated(self, *, diffs: bool = True, untracked_content: bool = False,
                   nested: list[str] | None = None) -> list[dict[str, Any]]:
        """Paths whose disk differs from what storm last put there (with diffs on request);
        ``nested`` receives the git repositories of their own that storm does not record."""
        from .tracking import unmediated

        return unmediated(self, diffs=diffs, untracked_content=untracked_content, nested=nested)

    def checkout(self, paths: list[str]) -> dict[str, str]:
        """Restore ``paths`` on disk from the shared head, discarding edits made there.
        A directory (``.`` for all) means every edited or deleted file of the shared
        state under it, as ``git checkout -- DIR`` restores tracked files: files the
        shared state does not have (``added``) are left, as git leaves untracked ones."""
        from ..disk.sync import restore

        if not paths:
            raise UsageError("no path given", hint="git storm checkout PATH... (git storm status lists them)")
        norm = self._under_directories(paths, skip=("added", "not-a-file"), check=True)
        return restore(self.store, norm) if norm else {}

    def _under_directories(self, paths: list[str], *, skip: tuple[str, ...], check: bool = False) -> list[str]:
        """``paths`` as repository paths, each directory among them replaced by the
        files under it that differ on disk (unmediated edits), but those in ``skip``
        states. ``check``: a file is checked on disk as ``path`` does."""
        out: list[str] = []
        edits: list[dict[str, Any]] | None = None
        for raw in paths:
            d = self._directory(raw)
            if d is None:
                out.append(self.path(raw) if check else normalize(raw, self.store.prefix, self.store.top))
                continue
            if edits is None:
                edits = self.unmediated(diffs=False)
            out.extend(u["path"] for u in edits if u["state"] not in skip and (not d or u["path"].startswith(d + "/")))
        return list(dict.fromkeys(out))

    def _directory(self, raw: str) -> str | None:
        """The repository path of the directory ``raw`` names ('' for the top), or None
        when it names something else (then ``path`` judges it)."""
        store = self.store
        if isinstance(raw, str) and raw and not os.path.isabs(raw):
            joined = posixpath.normpath(posixpath.join(store.prefix, raw)) if store.prefix else posixpath.normpath(raw)
            if joined in (".", ""):
                return ""
        elif isinstance(raw, str) and os.path.isabs(raw) and os.path.realpath(raw) == os.path.realpath(store.top):
            return ""
        try:
            p = normalize(raw.rstrip("/") if isinstance(raw, str) and len(raw) > 1 else raw, store.prefix, store.top)
        except BadPath:
            return None
        full = os.path.join(store.main_workdir, p)
        if os.path.isdir(full) and not os.path.islink(full):
            return p
        try:
            return p if isinstance(self.store.commit(self.head()).tree[p], pygit2.Tree) else None
        except KeyError:
            return None

    def commit(self, message: str, *, agent: str | None = None, adopt: bool = False,
               strict: bool = False, sign: bool | None = None, verify: bool = True,
               keep_shared: bool = False) -> CommitResult:
        """The manager commits the shared head's tree to the current branch (after
        merging in the commits the branch gained outside storm)."""
        from .manager import commit

        return commit(self, message, agent=agent, adopt=adopt, strict=strict, sign=sign, verify=verify,
                      keep_shared=keep_shared)

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """Accepted writes (the shared ref's history) and recorded events, newest first."""
        return history.log(self.store, self.head(), limit)


def _changed_meanwhile(target: str, agent: str, op: str, by: list[str]) -> str:
    """A conflict with a write checked against the version its edit started from (not a
    read), said in the terms of what ``agent`` did: an undo, a command, an edit on disk."""
    who = ", ".join(by) or "another agent"
    if op == UNDO_OP:
        return (f"{target} was changed by {who} after {agent}'s last edit of it; undoing that edit would "
                f"discard their change; the diff is from the version {agent}'s edit left")
    if op == "exec":
        return (f"{target} was changed by {who} while {agent}'s command ran; the diff is from the version "
                "the command started from")
    return (f"{target} was changed by {who} while {agent}'s edit of it on disk was made; the diff is from "
            "the version that edit started from")


def _files(tree: pygit2.Tree, prefix: str = "") -> Iterable[str]:
    for e in tree:
        if isinstance(e, pygit2.Tree):
            yield from _files(e, f"{prefix}{e.name}/")
        else:
            yield prefix + e.name


def _check_disk_parents(top: str, paths: list[str]) -> None:
    """Refuse (exit 2, nothing written) a path whose directory on disk became a
    symlink or a file while the writer waited; the disk write re-checks it."""
    for p in paths:
        if "/" not in p:
            continue
        try:
            with disk_parent(top, p, create=False):
                pass
        except FileNotFoundError:
            pass


def _refuse_case_twins(store: Store, tree: pygit2.Tree, created: list[str], deleted: set[str]) -> None:
    """Where the file system ignores case, refuse (exit 2, nothing written) a new path
    that names an existing file in another case (storm_git.core.casefold)."""
    if not created or not casefold.ignores_case(store):
        return
    for p in created:
        twin = casefold.case_twin(tree, p, deleted)
        if twin is not None:
            meant = twin + p[len(twin):]  # the path as the file system already spells it
            raise BadPath(f"{p!r} is {meant!r} on this case-insensitive file system (core.ignoreCase=true): "
                          f"{twin!r} is already there",
                          hint=f"write {meant!r} instead" + ("" if meant != twin else ", or delete it in the same change"))


def _mode(current: Entry | None) -> int:
    return current.mode if current is not None and current.mode in (MODE_BLOB, MODE_EXEC) else MODE_BLOB


def _after_landing(warnings: list[str], what: str, fallback: Any, fn: Any, *args: Any) -> Any:
    """Run a step that follows a landed write; a failure of the machine (a full disk,
    an unwritable file, a bad setting) becomes a warning on the answer, not an error."""
    try:
        return fn(*args)
    except (OSError, pygit2.GitError, StormError) as exc:
        warnings.append(f"{what} failed: {reason(exc)}")
        return fallback


def _end_reservations(store: Store, agent: str, held: Iterable[str]) -> None:
    """The agent's reservations on ``held`` end: its write is on the shared ref
    (workspace lock held)."""
    reservations.update(store, {p: None for p in held}, agent=agent,
                        message=f"storm: {agent} wrote; reservation ends")
