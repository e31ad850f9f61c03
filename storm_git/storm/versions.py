"""Integer versions of the shared workspace's files, kept in git.

Storm's versions are blob ids. A harness built for integer versions (the STORM
paper's manager: the agent sees ``v3`` and sends ``expected_version=3``) gets its
numbers here. Every change of a path on ``refs/storm/workspace`` -- each commit
whose tree differs from its first parent's at that path -- takes the path's next
number, in the order of the shared history. So the numbers are the same for every
process, survive restarts, and count changes the way an in-memory manager counts
writes: a file that went A -> B -> A is at version 3, not back at 1.

A number names exactly one state (number -> blob is a function), and callers
validate with the state, not the number: an agent holding version 1 of that file
read A, which is what the file holds again, so its write is not a false conflict.

Version 0 means absent (the harness's "create"). A file that was there when the
table began and has not changed since is version 1. A deletion takes a number too
(a file created again never reuses an old one), but absent is always reported as 0.

Storage: the notes ref ``refs/notes/storm/versions``, one note per path (on the
path's key, as reservations key paths): a header line with the path, then its last
KEEP states as ``<number> <blob|absent> <commit>``; and one state note naming the
table's origin and the shared head it has been written up to. The commits after
that head are numbered by walking them (the same walk, so the same numbers, in every
process); every PERSIST_EVERY commits the table is written up to the shared head,
under the ``versions`` flock, by CAS. Lookups read it without a lock.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pygit2

from ..core import notes
from ..core.errors import BadPath, CorruptState, NotInitialised
from ..core.locks import flocked
from ..core.readsets import path_key
from ..core.store import WORKSPACE_REF, Store, hex_
from ..core.tree_diff import tree_changes

VERSIONS_REF = "refs/notes/storm/versions"
LOCK = "versions"
KEEP = 256  # states kept per path: an agent holds a version this many changes old at most
MAX_WALK = 100_000  # commits walked back to the last synced head before diffing trees instead
PERSIST_EVERY = 16  # commits the written table may lag the shared head (numbered by the walk meanwhile)
STATE_KEY = str(pygit2.hash(b"storm versions: state\n"))
_HEADER = "storm versions 1 "
_STATE_HEADER = "storm versions state 1\n"
_AGENT = "storm"  # author of the table's commits (it records history, no agent's act)
_FIX = f"delete it to number afresh: git update-ref -d {VERSIONS_REF}"
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_ROW = re.compile(r"([1-9][0-9]{0,17}) (absent|[0-9a-f]{40}|[0-9a-f]{64}) ([0-9a-f]{40}|[0-9a-f]{64}|)")


@dataclass(frozen=True)
class Version:
    """One numbered state of a path: ``blob`` None is absent; ``commit`` is the
    shared commit that made it ('' when unknown)."""

    number: int
    blob: str | None
    commit: str


ABSENT = Version(0, None, "")


class _Table:
    """One state of the versions ref, parsed on demand."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ref = store.ref(VERSIONS_REF)
        self.tree = notes.notes_tree(store, self.ref)
        self.origin = self.synced = ""
        self.floor = 0
        raw = notes.read_note(store, self.tree, STATE_KEY)
        if raw is not None:
            fields = dict(line.split(" ", 1) for line in raw.decode("ascii", "replace").splitlines()[1:]
                          if " " in line)
            self.origin, self.synced = fields.get("origin", ""), fields.get("synced", "")
            if not raw.startswith(_STATE_HEADER.encode()) or not all(_HEX.fullmatch(x) for x in
                                                                      (self.origin, self.synced)):
                raise CorruptState(f"{VERSIONS_REF} holds an unreadable state note", hint=_FIX)
            try:
                self.floor = int(fields.get("floor", "0"))
            except ValueError:
                raise CorruptState(f"{VERSIONS_REF} holds an unreadable state note", hint=_FIX) from None
        self._states: dict[str, list[Version]] = {}

    def states(self, path: str) -> list[Version]:
        """The numbered states of ``path``, oldest first (empty: unchanged since the origin)."""
        if path not in self._states:
            raw = notes.read_note(self.store, self.tree, path_key(path))
            self._states[path] = [] if raw is None else _parse(path, raw)
        return self._states[path]

    def origin_state(self, path: str) -> Version | None:
        """Version 1 of a path that has had no change since the table began."""
        try:
            e = self.store.entry(self.store.commit(pygit2.Oid(hex=self.origin)).tree, path)
        except (BadPath, CorruptState, KeyError, ValueError, pygit2.GitError):  # BadPath: not a file there
            return None
        return Version(1, hex_(e.oid), self.origin) if e is not None else None


def _parse(path: str, raw: bytes) -> list[Version]:
    """A path's note; anything storm did not write (its ids end up in read sets) is corrupt state."""
    lines = raw.decode("utf-8", "surrogateescape").splitlines()
    if not lines or lines[0] != _HEADER + path:
        raise CorruptState(f"{VERSIONS_REF}: the note of {path} is not storm's", hint=_FIX)
    out = []
    for line in lines[1:]:
        m = _ROW.fullmatch(line)
        if m is None:
            raise CorruptState(f"{VERSIONS_REF}: the note of {path} has an unreadable line", hint=_FIX)
        out.append(Version(int(m[1]), None if m[2] == "absent" else m[2], m[3]))
    return out


def _format(path: str, states: list[Version]) -> bytes:
    rows = "".join(f"{v.number} {v.blob or 'absent'} {v.commit}\n" for v in states[-KEEP:])
    return f"{_HEADER}{path}\n{rows}".encode("utf-8", "surrogateescape")


def _state_note(origin: str, synced: str, floor: int) -> bytes:
    return f"{_STATE_HEADER}origin {origin}\nsynced {synced}\nfloor {floor}\n".encode("ascii")


def _highest(store: Store, t: _Table) -> int:
    """The highest number the table holds for any path (1: none but the implicit ones)."""
    top = 1
    for key, blob in notes.iter_notes(store, t.tree):
        if key != STATE_KEY:
            first = store.blob_bytes(blob).decode("utf-8", "surrogateescape").partition("\n")[0]
            states = _parse(first[len(_HEADER):], store.blob_bytes(blob))
            if states:
                top = max(top, states[-1].number)
    return top


def _commit_or_none(store: Store, hexid: str) -> pygit2.Commit | None:
    try:
        return store.commit(pygit2.Oid(hex=hexid))
    except (KeyError, ValueError, pygit2.GitError, CorruptState):
        return None


def _steps(store: Store, synced: str, head: pygit2.Oid) -> list[tuple[str, pygit2.Tree | None, pygit2.Tree]] | None:
    """(commit, tree before, tree after) for each commit from ``synced`` (excluded) to
    ``head``, oldest first; None when ``head`` does not descend from ``synced``."""
    return _linear(store, synced, head, MAX_WALK)


def _advance(store: Store, t: _Table, head: pygit2.Oid) -> dict[str, bytes | None]:
    """The notes that bring ``t`` from its synced head to ``head`` (versions lock held)."""
    if t.ref is None or not t.synced:
        return {STATE_KEY: _state_note(str(head), str(head), 0)}
    origin, floor = t.origin, t.floor
    steps = _steps(store, t.synced, head)
    if steps is None:
        # The shared ref was reset off the history the table followed. Numbers this or
        # another process computed for commits after the table's head, never written,
        # are lost with them; no number up to the most they can be is given out again.
        floor = max(floor, _highest(store, t)) + PERSIST_EVERY
        old = _commit_or_none(store, t.synced)
        if old is None:  # and its commits are gone: every file of head is numbered anew
            origin = str(head)
        steps = [(str(head), old.tree if old is not None else store.repo[store.empty_tree()],
                  store.commit(head).tree)]
    pending = _numbered_steps(store, t, {}, steps, floor, keep_origin=origin == t.origin)
    out: dict[str, bytes | None] = {path_key(p): _format(p, s) for p, s in pending.items()}
    out[STATE_KEY] = _state_note(origin, str(head), floor)
    return out


def _numbered_steps(store: Store, t: _Table, pending: dict[str, list[Version]],
                    steps: list[tuple[str, pygit2.Tree | None, pygit2.Tree]], floor: int, *,
                    keep_origin: bool = True) -> dict[str, list[Version]]:
    """``pending`` (path -> states, on top of ``t``) with each change of ``steps`` numbered;
    a new dict, the lists given are not changed."""
    out = dict(pending)
    for commit, old, new in steps:
        for path, state in tree_changes(store, old, new):
            states = out.get(path)
            if states is None:
                states = list(t.states(path))
                if not states:
                    first = t.origin_state(path) if keep_origin else None
                    states = [first] if first is not None else []
            last = max(states[-1].number if states else 0, floor)
            out[path] = (states + [Version(last + 1, hex_(state[0]) if state else None, commit)])[-KEEP:]
    return out


@dataclass
class _View:
    """The table and the numbers of the commits since its synced head, computed (the
    walk is the same in every process) and written down every PERSIST_EVERY commits."""

    table: _Table
    head: str
    pending: dict[str, list[Version]]
    lag: int  # commits since the table's synced head

    def states(self, path: str) -> list[Version]:
        found = self.pending.get(path)
        return found if found is not None else self.table.states(path)


def _linear(store: Store, since: str, head: pygit2.Oid,
            limit: int) -> list[tuple[str, pygit2.Tree | None, pygit2.Tree]] | None:
    """The steps from ``since`` to ``head`` when ``head`` is at most ``limit`` commits on
    from it along first parents; None otherwise."""
    chain: list[pygit2.Commit] = []
    c = store.commit(head)
    for _ in range(limit + 1):
        if str(c.id) == since:
            chain.reverse()
            return [(str(x.id), store.commit(x.parent_ids[0]).tree, x.tree) for x in chain]
        if not c.parent_ids:
            return None
        chain.append(c)
        c = store.commit(c.parent_ids[0])
    return None


def _current(store: Store) -> _View:
    """The numbers up to the shared head as it is now."""
    head = store.ref_target(WORKSPACE_REF)
    if head is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    t = _Table(store)
    if t.synced == str(head):
        return _View(t, str(head), {}, 0)
    cache = store.caches.setdefault("versions", {})
    known: _View | None = cache.get("view")
    steps = None
    if t.ref is not None and t.synced:
        if known is not None and known.table.ref is not None and known.table.ref.target == t.ref.target:
            steps = _linear(store, known.head, head, PERSIST_EVERY - known.lag)
            t, base, lag = known.table, known.pending, known.lag
        if steps is None:
            steps = _linear(store, t.synced, head, PERSIST_EVERY)
            base, lag = {}, 0
    if steps is None or lag + len(steps) >= PERSIST_EVERY:
        with flocked(store.commondir, LOCK):
            t = _persist_locked(store)
        view = _View(t, t.synced, {}, 0)
    else:
        view = _View(t, str(head), _numbered_steps(store, t, base, steps, t.floor), lag + len(steps))
    cache["view"] = view
    return view


def _persist_locked(store: Store) -> _Table:
    """Write the table up to the shared head (versions lock held)."""
    t = _Table(store)
    head = store.ref_target(WORKSPACE_REF)
    if head is None:
        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    if t.synced != str(head):
        notes.update_notes(store, VERSIONS_REF, _advance(store, t, head), agent=_AGENT,
                           message=f"storm: versions up to {str(head)[:12]}")
        t = _Table(store)
    return t


def _at_or_before(store: Store, commit: str, head: str) -> bool:
    if commit == head:
        return True
    try:
        return store.descends(pygit2.Oid(hex=head), pygit2.Oid(hex=commit))
    except (KeyError, ValueError, pygit2.GitError):
        return False


def number(store: Store, path: str, head: str | pygit2.Oid, blob: str | None) -> int:
    """The number of ``path`` in the state ``blob`` it has at shared commit ``head``
    (0: absent). A state the table has not numbered yet is numbered now."""
    if blob is None:
        return 0
    head = str(head)
    view = _current(store)
    states = view.states(path)
    if not states:
        first = view.table.origin_state(path)
        if first is not None and first.blob == blob:
            _keep_first(store, path, first)
            return 1
    elif head == view.head and states[-1].blob == blob:
        return states[-1].number
    for v in reversed(states):
        if v.blob == blob and _at_or_before(store, v.commit, head):
            return v.number
    for v in reversed(states):  # a head off the shared history (it was reset): the newest such
        if v.blob == blob:
            return v.number
    return _number_new(store, path, blob, head)


def _keep_first(store: Store, path: str, first: Version) -> None:
    """Write version 1 of a path down once it has been handed out, so that every
    process lists it (:func:`numbered`). The walk numbers a path's first change 2
    whether or not this is written, so the table may lag the shared head here."""
    with flocked(store.commondir, LOCK):
        if not _Table(store).states(path):
            notes.update_notes(store, VERSIONS_REF, {path_key(path): _format(path, [first])}, agent=_AGENT,
                               message=f"storm: versions: {path} is at version 1")


def _number_new(store: Store, path: str, blob: str, head: str) -> int:
    """Number a state the history walk never met (seen at a head the shared ref has
    since been reset away from), on the table brought up to the shared head."""
    with flocked(store.commondir, LOCK):
        t = _persist_locked(store)
        states = list(t.states(path))
        for v in reversed(states):
            if v.blob == blob:
                return v.number
        v = Version(max(states[-1].number if states else 0, t.floor) + 1, blob, head)
        notes.update_notes(store, VERSIONS_REF, {path_key(path): _format(path, states + [v])}, agent=_AGENT,
                           message=f"storm: versions: {path} at version {v.number}")
        return v.number


def lookup(store: Store, path: str, n: int) -> Version | None:
    """The state version ``n`` of ``path`` names (None: no such number was handed
    out, or it is older than the KEEP states kept)."""
    if n == 0:
        return ABSENT
    view = _current(store)
    states = view.states(path)
    for v in states:
        if v.number == n:
            return v
    return view.table.origin_state(path) if n == 1 and not states else None


def numbered(store: Store) -> dict[str, int]:
    """{path: current number} of every file present that has been given a number."""
    view = _current(store)
    out: dict[str, int] = {}
    paths = set(view.pending)
    for key, blob in notes.iter_notes(store, view.table.tree):
        if key == STATE_KEY:
            continue
        raw = store.blob_bytes(blob).decode("utf-8", "surrogateescape")
        first, _, _rest = raw.partition("\n")
        if not first.startswith(_HEADER):
            raise CorruptState(f"{VERSIONS_REF} holds a note that is not storm's ({key})", hint=_FIX)
        paths.add(first[len(_HEADER):])
    for path in paths:
        states = view.states(path)
        if states and states[-1].blob is not None:
            out[path] = states[-1].number
    return out
