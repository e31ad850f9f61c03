"""The validated write of storm mode, as named steps.

1. ``stage``: blobs written and the validation scope settled (``--deps auto`` parses
   Python here), before any lock;
2. ``pre_validate``: a large scope checked against the current head, before the lock;
3. ``attempt``, under the workspace lock: ``validate.check`` (reservations, then the
   verdict at the locked head), then either the commit on that head and its
   publication (``publication.Publication``: locally the compare-and-swap of the
   shared ref; on a remote, the queue a push lands), or ``validate.refuse``;
   an attempt whose dependency analysis is out of date leaves the lock to redo it;
4. ``land``: a publication that lands later (a remote) is awaited without the lock;
5. ``finish``: flags, the disk write and the answer for an accepted write
   (nothing after the landing may turn it into an error), or ``validate.reject``.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..coordination import intents
from ..coordination.assignments import OUTSIDE_ASSIGNMENT, flag_storm_write
from ..core import maintenance, readsets, reservations, trailers, tree_rules, waits
from ..core.convert import Conversions
from ..core.errors import BadPath, NotFound, StormError, UsageError
from ..core.files import reason
from ..core.locks import flocked
from ..core.paths import normalize
from ..core.payloads import RESERVED, STALE_DEPENDENCY, ReservationWait, WriteResult
from ..core.readsets import ReadEntry, ReadSetView
from ..core.reservations import Reservation
from ..core.store import MODE_BLOB, MODE_EXEC, MODE_LINK, Entry, Store, hex_, ref_oid
from ..deps import impact as depimpact, scope as depscope
from ..disk.record import check_record
from ..disk.safe_fs import parent_fd
from ..disk.sync import materialize
from . import validate
from .validated_writer import AS_WRITTEN, OnWait, WriteHost
from .verdict import MUST_REJECT, Verdict

PRE_VALIDATE_AT = 64  # read-set size from which validation starts before the lock
ANALYSE_OUTSIDE = 3  # rounds of dependency analysis a write may take outside the lock, then inside
# ``deps=AUTO_DEPS`` (or ``storm.deps=auto``): validate against the read files the write
# depends on, computed (storm_git.deps.scope), instead of the whole read set.
AUTO_DEPS = depscope.AUTO
DEPS_KEY = "storm.deps"

# What one locked attempt came to
PUBLISHED = "published"  # the commit is on the shared ref (or queued to land: publication.lands_later)
UNCHANGED = "unchanged"  # valid, but the tree is the same: nothing to publish
REJECTED = "rejected"
BLOCKED = "blocked"  # another agent's reservation: wait and try again
GAVE_UP = "gave-up"  # ... and the wait is over
RETRY = "retry"  # the shared ref moved under the publication: validate again
REFRESH = "refresh"  # a verdict that pushes nothing, not final yet (a remote): confirm it first
ANALYSE = "analyse"  # the dependency analysis is behind the head: redo it outside the lock


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


def configured_deps(store: Store) -> str | None:
    """``storm.deps``: ``auto`` makes every write/edit/rm use the computed scope."""
    value = (store.config_get(DEPS_KEY) or "all").strip().lower()
    if value not in ("all", AUTO_DEPS):
        raise UsageError(f"{DEPS_KEY} is {value!r}, not 'all' or 'auto'",
                         hint=f"fix it with git config {DEPS_KEY} auto (or unset it)")
    return AUTO_DEPS if value == AUTO_DEPS else None


@dataclass
class Write:
    """One write in the making: what it changes and what it is validated against."""

    agent: str
    op: str
    intent: str | None
    changes: dict[str, Any]  # {path: bytes, (bytes, mode) read from disk, None to delete, MUST_REJECT}
    expected: dict[str, str | None] | None
    view: ReadSetView
    conv: Conversions
    blobs: dict[str, Any] = field(default_factory=dict)  # path -> blob id, None, MUST_REJECT
    modes: dict[str, int] = field(default_factory=dict)
    contents: dict[pygit2.Oid, bytes] = field(default_factory=dict)
    scope: dict[str, ReadEntry] = field(default_factory=dict)
    scope_name: str = "all"
    dep_list: list[str] | None = None
    auto: depscope.Scope | None = None
    judged: tuple[pygit2.Oid | None, frozenset[str]] = (None, frozenset())  # depimpact done at head, for paths
    analysed_outside: int = 0

    @property
    def paths(self) -> list[str]:
        return list(self.changes)

    @property
    def reads(self) -> dict[str, ReadEntry]:
        return self.view.entries

    @property
    def whole(self) -> bool:
        """Validated against the whole read set: the per-process validity cache applies."""
        return self.scope_name in ("all", depscope.FALLBACK) and self.expected is None

    def set_auto_scope(self) -> None:
        """The scope, its name and the deps listed in provenance, from the computed scope."""
        auto, reads = self.auto, self.reads
        assert auto is not None, "only --deps auto computes a scope"
        if auto.paths is None:
            self.scope, self.scope_name, self.dep_list = dict(reads), auto.name, None
            return
        scope = {p: reads[p] for p in auto.paths if p in reads}
        scope.update({p: reads[p] for p in self.paths if p in reads})
        self.scope, self.scope_name, self.dep_list = scope, auto.name, sorted(scope)


@dataclass
class Attempt:
    """One pass under the workspace lock."""

    outcome: str
    head: pygit2.Oid
    tree: pygit2.Tree
    verdict: Verdict | None = None
    commit: pygit2.Oid | None = None
    held: list[str] = field(default_factory=list)
    blocked: Reservation | None = None
    granted: Reservation | None = None
    placed: dict[str, Any] = field(default_factory=dict)
    journal_size: int = 0
    stale: list[str] = field(default_factory=list)  # ANALYSE: the moved files to look inside


# -- 1. stage ---------------------------------------------------------------------------
def stage(ws: WriteHost, agent: str, changes: dict[str, Any], *, intent: str | None,
          deps: Iterable[str] | str | None, op: str, expected: dict[str, str | None] | None) -> Write:
    """Blobs into the object store and the validation scope, before any lock."""
    store = ws.store
    w = Write(agent, op, intent, changes, expected, readsets.load_view(store, agent), Conversions(store))
    for p, c in changes.items():
        from_disk = isinstance(c, tuple)
        if from_disk:  # (content, mode) read from disk: exec and adopt record the exec bit and links
            c, w.modes[p] = c
        if isinstance(c, bytes):
            if w.modes.get(p) != MODE_LINK:  # what `git add` would store (.gitattributes: eol, filters)
                c = w.conv.to_odb(p, c, from_disk=from_disk)
            w.blobs[p] = store.write_blob(c)
            w.contents[w.blobs[p]] = c
        else:
            w.blobs[p] = c
    reads = w.reads
    if deps is None and expected is None:
        deps = configured_deps(store)
    if isinstance(deps, str):  # "all" overrides storm.deps=auto; any other string is one path
        deps = None if deps == depscope.ALL else deps if deps == AUTO_DEPS else [deps]
    if isinstance(deps, str) and deps == AUTO_DEPS:
        w.auto = depscope.compute(store, agent, changes, reads, ws.head())
        w.set_auto_scope()
    elif deps is not None:
        dep_paths = [normalize(d, store.prefix, store.top) for d in deps]
        missing = [d for d in dep_paths if d not in reads and d not in changes]
        if missing:
            raise UsageError(f"--deps {missing[0]} was never read by {agent}",
                             hint="read it first (git storm read), or leave it out of --deps")
        w.scope = {d: reads[d] for d in dep_paths if d in reads}
        w.scope.update({p: reads[p] for p in w.paths if p in reads})
        w.scope_name, w.dep_list = "deps", sorted(w.scope)
    else:
        w.scope, w.scope_name = dict(reads), "all"
    return w


def analyse(ws: WriteHost, w: Write, head: pygit2.Oid, stale: list[str]) -> None:
    """``--deps auto`` brought to ``head``: what the files that moved since bring in
    (depscope.widen), and whether the ``stale`` read files' changes touch anything the
    write uses (depimpact: those that do not leave the scope). Runs without the lock
    except after ANALYSE_OUTSIDE rounds lost to other writers."""
    auto, store = w.auto, ws.store
    assert auto is not None, "only --deps auto analyses"
    if depscope.widen(auto, store, w.agent, w.changes, w.reads, head):
        w.set_auto_scope()
    if not stale or auto.paths is None:
        return
    tree = store.commit(head).tree
    try:
        impact = depimpact.judge(store, w.agent, w.changes, w.reads, tree, stale)
    except (RecursionError, MemoryError, ValueError, KeyError, TypeError) as exc:
        # an optimisation: if it fails, the files simply stay in the scope
        impact = depimpact.Impact(kept={p: f"not looked inside ({type(exc).__name__})" for p in stale})
    auto.kept = impact.kept
    if impact.spared:
        auto.paths -= impact.spared.keys()
        auto.unaffected.update(impact.spared)
        w.set_auto_scope()
    w.judged = (head, frozenset(stale))


def _behind(w: Write, head: pygit2.Oid) -> bool:
    """The computed scope was found at another head: it may lack what moved since."""
    return w.auto is not None and w.auto.paths is not None and w.auto.head != head


def _unjudged(w: Write, head: pygit2.Oid, found: Verdict) -> bool:
    """A stale dependency under a computed scope that nobody looked inside at ``head``."""
    return (found.reason == STALE_DEPENDENCY and w.auto is not None and w.auto.paths is not None
            and not (w.judged[0] == head and set(found.stale) <= w.judged[1]))


# -- 2. pre_validate ----------------------------------------------------------------------
def pre_validate(ws: WriteHost, w: Write) -> validate.Pre | None:
    """Validation looks at the whole read set once per process: after that, at the paths
    re-recorded since and those that moved on the shared ref since the head it was
    last found valid at (write cost independent of the read set). Else a large scope
    is validated before the lock, and under it only the paths that changed since, so
    one agent's big read set does not stall others."""
    if len(w.scope) <= PRE_VALIDATE_AT:
        # a small scope is checked whole under the lock: a lookup per path costs less
        # than diffing the head against the one it was last valid at, a diff that
        # grows with every write queued for the lock ahead of this one
        return None
    store, view = ws.store, w.view
    known = ws.valid_cache.get(w.agent) if w.whole else None
    if known is not None and known[0] == view.gen:
        return validate.advance(store, ws.head(), known[2], view.changed[known[1]:view.changed_at], w.paths,
                                w.reads, w.scope, w.expected, w.changes)
    h0 = ws.head()
    return h0, validate.verdict(store, store.commit(h0).tree, w.paths, w.reads, w.scope, w.expected,
                                w.changes), []


# -- 3. attempt (under the workspace lock) ----------------------------------------------
def attempt(ws: WriteHost, w: Write, pre: validate.Pre | None, *, hold: float, give_up: bool,
            warnings: list[str]) -> Attempt:
    """One pass under the workspace lock: check, then commit and publish, or refuse."""
    store, pub, agent, paths = ws.store, ws.publication, w.agent, w.paths
    with flocked(store.commondir, "workspace"):
        ref = ws.head_ref()
        head = ref_oid(ref)
        tree = store.commit(head).tree
        if _behind(w, head) and w.analysed_outside < ANALYSE_OUTSIDE:
            return Attempt(ANALYSE, head, tree)
        now = reservations.clock()

        def judge() -> Verdict:
            known = pre
            if _behind(w, head):  # the last resort: analysed under the lock
                analyse(ws, w, head, [])
                known = None
            # checked again at the moment of writing, under the lock (a deletion writes nothing)
            _check_disk_parents(store.main_workdir, [p for p in paths if w.blobs[p] is not None])
            return validate.verdict_at(store, head, tree, known, paths, w.reads, w.scope, w.expected, w.changes)

        chk = validate.check(store, agent, paths, now, judge)
        if chk.blocked is not None:
            if not pub.verdict_is_final():
                return Attempt(REFRESH, head, tree)
            if give_up:
                refused = validate.refuse_reserved(store, agent, w.op, paths, chk.blocked, head, tree)
                return Attempt(GAVE_UP, head, tree, verdict=refused, blocked=chk.blocked)
            return Attempt(BLOCKED, head, tree, blocked=chk.blocked)
        found = chk.verdict
        assert found is not None, "check judges whenever nothing blocks"
        if _unjudged(w, head, found):
            if w.analysed_outside < ANALYSE_OUTSIDE:
                return Attempt(ANALYSE, head, tree, stale=found.stale)
            analyse(ws, w, head, found.stale)
            found = validate.verdict(store, tree, paths, w.reads, w.scope, w.expected, w.changes)
        if found.reason is not None:
            if not pub.verdict_is_final():
                return Attempt(REFRESH, head, tree)
            granted = validate.refuse(store, agent, w.op, paths, found, head, now, hold)
            return Attempt(REJECTED, head, tree, verdict=found, granted=granted)
        return _commit_and_publish(ws, w, ref, head, tree, found, chk.held, warnings)


def _commit_and_publish(ws: WriteHost, w: Write, ref: pygit2.Reference, head: pygit2.Oid,
                        tree: pygit2.Tree, found: Verdict, held: list[str], warnings: list[str]) -> Attempt:
    """A valid write (workspace lock held): its commit on ``head``, the writer's own
    versions journaled, and the publication."""
    store, agent, pub = ws.store, w.agent, ws.publication
    if any(b is MUST_REJECT for b in w.blobs.values()):
        raise NotFound(f"{w.paths[0]} does not exist in the shared workspace")
    _refuse_case_twins(store, tree, [p for p, b in w.blobs.items() if b is not None and found.current[p] is None],
                       {p for p, b in w.blobs.items() if b is None})
    placed = {p: None if b is None else (b, w.modes.get(p) or _mode(found.current[p])) for p, b in w.blobs.items()}
    new_tree = store.tree_with(tree, placed)
    commit = None
    if new_tree != tree.id:
        # the provenance travels in the commit: what it was validated against, the
        # read set by reference (storm_git.core.trailers)
        prov = trailers.Provenance(str(head), w.scope_name, w.view.base, w.view.counted, w.dep_list)
        message = trailers.format_message(w.intent, agent, w.op, w.paths, prov)
        commit = store.make_commit(new_tree, [head], agent, message)
    # journaled before the publication: a kill after it cannot lose the agent's view of
    # its own write (readsets module docstring)
    if w.whole:
        # valid at head, and at this commit too: it changes only the paths written,
        # whose new entries are journaled now and so re-checked
        ws.valid_cache[agent] = (w.view.gen, w.view.changed_at, commit or head)
    journal_size = readsets.record_write(
        store, agent, [ReadEntry(p, hex_(b), str(commit or head)) for p, b in w.blobs.items()])
    done = Attempt(PUBLISHED if commit is not None else UNCHANGED, head, tree, verdict=found, commit=commit,
                   held=held, placed=placed, journal_size=journal_size)
    if commit is not None and not pub.publish(ref, commit, head, agent, w.op):
        done.outcome = RETRY
        return done
    if commit is None and not pub.verdict_is_final():
        done.outcome = REFRESH
        return done
    if held and not (commit is not None and pub.lands_later):  # it ends once the write is on the shared ref
        _after_landing(warnings, "ending the writer's reservation", None, end_reservations, store, agent, held)
    return done


# -- the loop ----------------------------------------------------------------------------
def apply(ws: WriteHost, agent: str, changes: dict[str, Any], *, intent: str | None,
          deps: Iterable[str] | str | None, wait: bool, op: str, expected: dict[str, str | None] | None = None,
          on_wait: OnWait | None = None) -> WriteResult:
    """The validated atomic write of ``changes`` ({path: bytes, or None to delete}).

    ``expected`` overrides the observed version of targets (``exec`` compares with the
    tree the command started from instead of the read set). ``on_wait`` is called
    (outside the lock) each time the write starts waiting for another agent's
    reservation, so a caller can say so; the library never prints."""
    store, pub = ws.store, ws.publication
    w = stage(ws, agent, changes, intent=intent, deps=deps, op=op, expected=expected)
    pre = pre_validate(ws, w)
    check_record(store)  # an unreadable disk record refuses the write before it lands, not after
    started = time.monotonic()
    hold = ws.reservation_seconds  # read config once per write
    wait_budget = hold + 1.0
    retries = 0
    warnings: list[str] = []  # steps after the landing that failed (see _after_landing)
    announced: Reservation | None = None  # the reservation being waited for (on_wait told)
    blocked_at = blocked_end = 0.0  # time spent on reservations only, not on the lock
    try:
        while True:
            at = attempt(ws, w, pre, hold=hold, give_up=not wait or time.monotonic() - started >= wait_budget,
                         warnings=warnings)
            if at.outcome == ANALYSE:
                w.analysed_outside += 1
                analyse(ws, w, at.head, at.stale)
                pre = None  # files that moved brought new dependencies, or left the scope: check them all
                continue
            if at.outcome == RETRY:
                retries += 1
                continue
            if at.outcome == REFRESH:
                pub.refresh_for_verdict(agent)
                pre = None
                continue
            if at.outcome == PUBLISHED and pub.lands_later:
                landed = pub.land(agent, at.commit)  # -- 4. land, without the lock
                if landed is None:  # dropped on its way: validate again
                    retries, pre = retries + 1, None
                    continue
                if landed != at.commit:  # moved onto a newer head on its way (storm_git.remote)
                    at.commit, at.head = landed, store.commit(landed).parent_ids[0]
                if at.held:  # the reservation ends once the write is on the shared ref
                    with flocked(store.commondir, "workspace"):
                        _after_landing(warnings, "ending the writer's reservation", None,
                                       end_reservations, store, agent, at.held)
            if at.outcome == BLOCKED:
                blocked = at.blocked
                assert blocked is not None, "a BLOCKED attempt names the reservation"
                if blocked != announced:
                    blocked_at = blocked_at or time.monotonic()
                    announced = blocked
                    waits.begin(store, agent, blocked.holder, blocked.path)
                    if on_wait is not None:
                        on_wait(blocked)
                time.sleep(min(0.05, max(0.001, blocked.remaining())))
                blocked_end = time.monotonic()
                continue
            break
    finally:
        if announced is not None:  # the board's sign of the wait (core.waits) goes with it
            waits.end(store, agent)
    # -- 5. finish
    waited = time.monotonic() - started
    held_by = at.blocked or announced  # blocked: refused as reserved (perhaps at once, --no-wait)
    res_wait = ReservationWait(held_by.holder, held_by.path, blocked_end - blocked_at) if held_by else None
    if at.outcome in (PUBLISHED, UNCHANGED):
        return _accepted(ws, w, at, warnings, retries, waited, res_wait)
    return _rejected(ws, w, at, retries, waited, res_wait)


def _accepted(ws: WriteHost, w: Write, at: Attempt, warnings: list[str], retries: int, waited: float,
              res_wait: ReservationWait | None) -> WriteResult:
    """The write is on the shared ref: from here on nothing may turn it into an error (a
    full disk, a bad setting); what fails is said in the answer. The flags read only
    the immutable parent tree and commit: outside the agent's assignment
    (storm_git.coordination.assignments), a line another agent annotated, deleted or rewritten
    (storm_git.coordination.intents), each allowed but flagged and logged."""
    store, agent, commit, paths = ws.store, w.agent, at.commit, w.paths
    landed = commit is not None
    outside = _after_landing(warnings, "the assignment check", [], flag_storm_write,
                             store, agent, paths, commit) if landed else []
    overwritten = _after_landing(warnings, "the intent check", [], intents.flag_write,
                                 store, agent, at.tree, w.blobs, commit) if landed else []
    versions = {p: hex_(b) if b is not None else None for p, b in w.blobs.items()}
    synced = materialize(store, paths, w.contents, step=(at.head, commit),
                         entries={p: v and Entry(*v) for p, v in at.placed.items()},
                         conv=w.conv) if commit is not None else None
    if synced is not None and synced.record_error:
        warnings.append(f"recording the disk write failed: {synced.record_error} (it stays recorded "
                        "as pending; the next storm command records it)")
    # outside the lock: the next write need not read them back
    _after_landing(warnings, "the intent cache", None, intents.remember, store, w.contents)
    if at.journal_size >= readsets.FOLD_BYTES:
        _after_landing(warnings, "folding the read-set journal", None, readsets.fold, store, agent)
    if landed:
        maintenance.after_write(store, commit)  # one write in 16 looks; never waits, never raises
    auto = w.auto
    return WriteResult(True, agent, paths, str(commit or at.head), hex_(commit), versions,
                       disk=synced.outcomes if synced else {},
                       disk_errors=synced.errors if synced else {}, warnings=warnings,
                       cas_retries=retries, waited=waited,
                       flags=[OUTSIDE_ASSIGNMENT] * bool(outside) + [intents.INTENT_OVERWRITTEN] * bool(overwritten),
                       reservation_wait=res_wait,
                       unaffected=dict(sorted(auto.unaffected.items())) if auto else {})


def _rejected(ws: WriteHost, w: Write, at: Attempt, retries: int, waited: float,
              res_wait: ReservationWait | None) -> WriteResult:
    """The rejection, with the scope it was validated against."""
    seen = dict(w.reads)
    for p, v in (w.expected or {}).items():  # exec/adopt: the base the edit was made on
        if v != AS_WRITTEN:
            seen[p] = ReadEntry(p, v, "")
    found, auto = at.verdict, w.auto
    assert found is not None, "a rejected attempt carries its verdict"
    reservation = at.granted if found.reason != RESERVED else at.blocked
    rejection = validate.reject(ws, w.agent, w.op, found, at.head, seen, reservation,
                                w.changes.get(found.conflicts[0]) if found.conflicts else None)
    rejection.scope = {"name": w.scope_name, "paths": w.dep_list, "why": auto.why if auto else None}
    if auto is not None and (auto.kept or auto.unaffected):
        # --deps auto looked inside the moved files: why each still counts, and which did not
        rejection.scope["moved"] = {p: auto.kept[p] for p in sorted(auto.kept)}
        rejection.scope["unaffected"] = dict(sorted(auto.unaffected.items()))
    if w.scope_name != "all" and found.reason == STALE_DEPENDENCY:
        rejection.message += f" (validated against scope {w.scope_name}: {len(w.scope)} read file(s))"
    return WriteResult(False, w.agent, w.paths, str(at.head), rejection=rejection, cas_retries=retries,
                       waited=waited, reservation_wait=res_wait)


def _check_disk_parents(top: str, paths: list[str]) -> None:
    """Refuse (exit 2, nothing written) a path whose directory on disk became a
    symlink or a file while the writer waited; the disk write re-checks it."""
    for p in paths:
        if "/" not in p:
            continue
        try:
            with parent_fd(top, p, create=False):
                pass
        except FileNotFoundError:
            pass


def _refuse_case_twins(store: Store, tree: pygit2.Tree, created: list[str], deleted: set[str]) -> None:
    """Where the file system ignores case, refuse (exit 2, nothing written) a new path
    that names an existing file in another case (storm_git.core.tree_rules)."""
    if not created or not tree_rules.ignores_case(store):
        return
    for p in created:
        twin = tree_rules.case_twin(tree, p, deleted)
        if twin is not None:
            meant = twin + p[len(twin):]  # the path as the file system already spells it
            raise BadPath(f"{p!r} is {meant!r} on this case-insensitive file system (core.ignoreCase=true): "
                          f"{twin!r} is already there",
                          hint=f"write {meant!r} instead"
                          + ("" if meant != twin else ", or delete it in the same change"))


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


def end_reservations(store: Store, agent: str, held: Iterable[str]) -> None:
    """The agent's reservations on ``held`` end: its write is on the shared ref
    (workspace lock held)."""
    reservations.update(store, {p: None for p in held}, agent=agent,
                        message=f"storm: {agent} wrote; reservation ends")
