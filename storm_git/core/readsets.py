"""Agents' read sets, and the journals a write's provenance points into: a journal folded into git notes.

Each agent has one notes ref, ``refs/notes/storm/agents/<agent>`` (one ref per
agent, so agents never contend on a ref: a shared notes ref under concurrent
writers loses notes). It holds:

* the agent's read set ``S_a``, as one note on a small per-agent key blob
  (``storm read set: <agent>``): a header naming the fold, then one line
  ``<blob-hex|absent> <head-hex> <path>`` per path (the version seen and the
  shared head it was read at). Every fold writes a new, unique note blob, even
  for an empty read set, so a note blob names one state of the read set for good;
* every journal ever folded, as a note on the key blob ``storm journal: <agent>
  <base>``, where ``<base>`` is the read-set note blob (or ``none``) the journal
  extended. Those keys are never reused, so these notes are never replaced.

What happens between two folds goes to the agent's **journal**,
``<commondir>/storm/journal/<agent>``: one ``write()`` of whole lines per read
(``r <blob|absent> <head> <path>``) and per accepted write (its new versions, as
``r`` lines too). The journal's first line names the read-set note blob it
extends. A notes commit per read or write would make a read ~24x a blob lookup and
a write grow with the read set; the journal costs one append.

**Provenance** — the read set a write was validated against — travels in the
write's commit (``storm_git.core.trailers``): ``Storm-Read-Set: <base> <n>``
says the read set was the note ``<base>`` plus the first ``n`` reads of the
journal that extends it. :func:`storm_git.core.provenance.load` resolves it from the folded
journal note, or from the live journal file while ``<base>`` is not folded yet.
Nothing per write goes into the notes, so a fold costs a few objects however many
writes it covers.

Every fold writes a unique note (its header holds a fresh fold id), so a journal
left behind by a fold killed after its notes commit no longer matches and is
ignored — it was folded, and its note keeps it for the provenance that points
into it. A fold writes, in one notes commit, the new read set and the journal. It
runs at an agent's write once the journal holds FOLD_BYTES, and at
``status``/``doctor``/``maintenance``/``forget``; never on a read's path.
"""
from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import pygit2

from . import notes
from .errors import CorruptState
from .files import append_all, read_own, replace_file
from .locks import flocked, try_flocked
from .store import AGENTS_PREFIX, Store, ref_oid

ABSENT = "absent"
READ_SET_HEADER = "storm read set"
JOURNAL_HEADER = "storm journal 1 base "
JOURNAL_KEY_HEADER = "storm journal"
FOLD_BYTES = 32 << 10  # journal size from which a write folds it into the notes (~256 lines)
NO_BASE = "none"
# One read-set line: <blob|absent> <head, empty in worktree mode before a commit> <path>.
_LINE_RE = re.compile(r"(absent|[0-9a-f]{40}|[0-9a-f]{64}) ([0-9a-f]{40}|[0-9a-f]{64}|) ([^\n]+)")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _path_ok(path: str) -> bool:
    """A read set only ever holds normalised repository paths: a line naming
    ``../x``, ``/x``, ``a//b`` or ``a/./b`` was not written by storm (four substring
    checks, not a second regex: a read set of 2,000 paths is parsed on a first read)."""
    s = f"/{path}/"
    return "//" not in s and "/./" not in s and "/../" not in s and "\0" not in path


class CorruptReadSet(CorruptState):
    """An agent's read-set note (or journal) that cannot be parsed. Only that agent
    is affected, and ``forget --agent A`` (or ``doctor --fix``) resets it."""

    kind = "corrupt_read_set"

    def __init__(self, agent: str, detail: str) -> None:
        super().__init__(f"the read set of {agent} is unreadable ({detail})",
                         hint=f"reset it with git storm forget --agent {agent} (or git storm doctor --fix);"
                              f" {agent} then reads again what it needs")
        self.agent = agent


@dataclass(frozen=True)
class ReadEntry:
    """One element of a read set: ``blob`` None means the path was absent."""

    path: str
    blob: str | None
    head: str

    def line(self) -> str:
        return f"{self.blob or ABSENT} {self.head} {self.path}\n"

    @classmethod
    def parse(cls, text: str) -> "ReadEntry":
        m = _LINE_RE.fullmatch(text.rstrip("\n"))
        if m is None or not _path_ok(m.group(3)):
            raise CorruptState(f"unreadable read-set line {text[:60]!r}",
                               hint="run git storm doctor") from None
        blob, head, path = m.groups()
        return cls(path, None if blob == ABSENT else blob, head)

    def to_dict(self) -> dict:
        return asdict(self)


def path_key(path: str) -> str:
    """A stable object id for a path (reservations are keyed by it)."""
    return str(pygit2.hash(path.encode("utf-8")))


def agent_ref(agent: str) -> str:
    return AGENTS_PREFIX + agent




def agent_lock(agent: str) -> str:
    return f"agent-{agent}"


def journal_dir(store: Store) -> str:
    return os.path.join(store.commondir, "storm", "journal")


def journal_path(store: Store, agent: str) -> str:
    return os.path.join(journal_dir(store), agent)


def _key(agent: str) -> bytes:
    return f"{READ_SET_HEADER}: {agent}\n".encode("utf-8")


def journal_key(agent: str, base: str) -> bytes:
    """The key blob whose note is the journal that extended read-set note ``base``."""
    return f"{JOURNAL_KEY_HEADER}: {agent} {base}\n".encode("utf-8")


# -- the folded read set (the note) ---------------------------------------------------------------

def note_blob(store: Store, tree: pygit2.Tree | None, key: bytes) -> pygit2.Oid | None:
    if tree is None:
        return None
    target = str(pygit2.hash(key))
    for path in (f"{target[:2]}/{target[2:]}", target):
        try:
            return tree[path].id
        except KeyError:
            continue
    return None


def read_set_lines(text: str | None, agent: str, out: dict[str, str] | None = None) -> dict[str, str]:
    """{path: line} of a read-set note, without building entries."""
    out = {} if out is None else out
    match = _LINE_RE.fullmatch
    for ln in (text or "").split("\n")[1:]:
        if ln:
            m = match(ln)
            if m is None or not _path_ok(m.group(3)):
                raise CorruptReadSet(agent, f"unreadable line {ln[:60]!r}")
            out[m.group(3)] = ln
    return out


def _note_text(agent: str, lines: dict[str, str]) -> bytes:
    """The note of a read set; a fresh fold id makes every fold's blob unique (an
    empty read set too: a journal's key names its base, so no base may come back)."""
    header = f"{READ_SET_HEADER} of {agent}: <version|absent> <head> <path> (fold {uuid.uuid4().hex})\n"
    return (header + "".join(lines[p] + "\n" for p in sorted(lines))).encode("utf-8")


# -- the journal ----------------------------------------------------------------------------------

@dataclass
class _Journal:
    """A parsed journal: the base it extends and what it adds."""

    base: str
    reads: list[str] = field(default_factory=list)  # read-set lines, in order
    size: int = 0  # bytes of complete lines parsed

    @property
    def lines(self) -> int:
        return len(self.reads)


def _parse_rows(text: str, agent: str, j: _Journal) -> None:
    match = _LINE_RE.fullmatch
    for ln in text.split("\n"):
        if not ln:
            continue
        kind, rest = ln[:2], ln[2:]
        if kind == "r ":
            m = match(rest)
            if m is None or not _path_ok(m.group(3)):
                raise CorruptReadSet(agent, f"unreadable journal line {ln[:60]!r}")
            j.reads.append(rest)
        else:
            raise CorruptReadSet(agent, f"unreadable journal line {ln[:60]!r}")


def parse_journal(data: bytes, agent: str, start: int = 0) -> _Journal:
    """The journal's complete lines from byte ``start`` (0: check the header). A
    line torn by a killed writer is ignored (and cut at the next append)."""
    end = data.rfind(b"\n") + 1
    if start == 0:
        nl = data.find(b"\n")
        header = data[:nl].decode("utf-8", "surrogateescape") if nl >= 0 else ""
        if not header.startswith(JOURNAL_HEADER):
            raise CorruptReadSet(agent, "journal header unreadable")
        start = nl + 1
        j = _Journal(header[len(JOURNAL_HEADER):], size=end)
    else:
        j = _Journal("", size=max(end, start))
    _parse_rows(data[start:end].decode("utf-8", "surrogateescape"), agent, j)
    return j


def read_journal(store: Store, agent: str) -> bytes | None:
    return read_own(journal_path(store, agent))


def _start_journal(store: Store, agent: str, base: str) -> None:
    """Replace the journal by an empty one extending ``base`` (atomic rename)."""
    d = journal_dir(store)
    os.makedirs(d, exist_ok=True)
    replace_file(journal_path(store, agent), f"{JOURNAL_HEADER}{base}\n".encode(),
                 tmp=os.path.join(d, f".{agent}.tmp"))


def _append(store: Store, agent: str, base: str, data: str, known: "_Cached | None" = None,
            *, copy: bool = False) -> int:
    """One ``write()`` of whole lines (agent lock held); a stale or torn journal is
    restarted or cut first. Returns the journal's size after the append.

    ``known``: the agent's cached parse, just checked against the file under the
    lock. When it covers the whole file (right header, no torn tail) the journal
    is not read again, and the parse absorbs the appended lines, so the next load
    in this process finds it current (a write reads the journal once)."""
    path = journal_path(store, agent)
    raw = data.encode("utf-8", "surrogateescape")
    current = known is not None and known.size > 0 and known.mtime != 0 and known.base == base
    if not current:
        old = read_journal(store, agent)
        if old is None or not old.startswith(f"{JOURNAL_HEADER}{base}\n".encode()):
            _start_journal(store, agent, base)
        elif not old.endswith(b"\n"):
            os.truncate(path, old.rfind(b"\n") + 1)
    st = append_all(path, raw)  # all of it or nothing: a full disk leaves no torn line
    if current and known is not None and st.st_size == known.size + len(raw) and st.st_ino == known.inode:
        _absorb(known, data, agent, copy=copy)
        known.size, known.mtime = st.st_size, st.st_mtime_ns
    return st.st_size


def _absorb(c: "_Cached", data: str, agent: str, *, copy: bool) -> None:
    """Apply lines this process appended to its cached parse, as a load would.
    ``copy``: into new dicts, leaving those a live ReadSetView holds as they were (a
    write whose CAS fails is validated again against the read set it started with,
    not one that already names its own new versions)."""
    j = _Journal("")
    _parse_rows(data, agent, j)
    if copy:
        c.lines, c.entries = dict(c.lines), dict(c.entries)
    _take(c, j.reads)


def _take(c: "_Cached", reads: list[str]) -> None:
    """Add journal lines to a cached read set: the latest line for a path wins, and
    the path is marked re-recorded (a validator re-checks it)."""
    for ln in reads:
        e = ReadEntry.parse(ln)
        c.lines[e.path] = ln
        c.entries[e.path] = e
        c.changed.append(e.path)
    c.counted += len(reads)


# -- loading --------------------------------------------------------------------------------------

@dataclass
class ReadSetView:
    """An agent's read set and where it stands: the note it extends and how many
    journal reads it includes (a write's provenance points at exactly that).
    ``gen`` names one parse of the read set in this process and ``changed`` the
    paths re-recorded since (first ``changed_at`` of them were there when this view
    was taken): a validator that checked the whole set at some head re-checks only
    those and the paths that moved (storm_git.storm.write). ``entries`` is read-only."""

    entries: dict[str, ReadEntry]
    base: str
    counted: int
    gen: int = 0
    changed: list[str] = field(default_factory=list)
    changed_at: int = 0


@dataclass
class _Cached:
    notes_head: pygit2.Oid | None
    base: str
    inode: int
    size: int
    counted: int
    lines: dict[str, str]
    mtime: int = 0
    entries: dict[str, ReadEntry] = field(default_factory=dict)
    gen: int = 0
    changed: list[str] = field(default_factory=list)


_GEN = iter(range(1, 1 << 62))


def _cache(store: Store) -> dict[str, _Cached]:
    return store.caches.setdefault("readsets", {})


def drop_cached(store: Store, agent: str) -> None:
    """Forget this process's parse of ``agent``'s read set: its notes ref was moved
    from outside this module (a remote clone adopting the server's copy)."""
    _cache(store).pop(agent, None)


def _base_of(store: Store, agent: str) -> tuple[pygit2.Oid | None, str, pygit2.Tree | None]:
    ref = store.ref(agent_ref(agent))
    tree = notes.notes_tree(store, ref)
    blob = note_blob(store, tree, _key(agent))
    return (ref_oid(ref) if ref is not None else None), (str(blob) if blob else NO_BASE), tree


def _load_locked(store: Store, agent: str) -> _Cached:
    """The read set (agent lock held), parsing only the journal bytes appended
    since the last load in this process."""
    notes_head, base, tree = _base_of(store, agent)
    try:
        st = os.stat(journal_path(store, agent))
        inode, size, mtime = st.st_ino, st.st_size, st.st_mtime_ns
    except FileNotFoundError:
        inode, size, mtime = 0, 0, 0
    c = _cache(store).get(agent)
    if c is not None and (c.notes_head, c.base, c.inode, c.size, c.mtime) == (notes_head, base, inode, size, mtime):
        return c
    if c is None or c.notes_head != notes_head or c.base != base or c.inode != inode or size < c.size:
        blob = note_blob(store, tree, _key(agent))
        text = None if blob is None else store.blob_bytes(blob).decode("utf-8", "surrogateescape")
        lines = read_set_lines(text, agent)
        c = _Cached(notes_head, base, inode, 0, 0, lines, entries={p: ReadEntry.parse(ln) for p, ln in lines.items()},
                    gen=next(_GEN))
    raw = read_journal(store, agent) if inode else None
    if raw is not None and (c.size or raw.startswith(f"{JOURNAL_HEADER}{base}\n".encode())):
        j = parse_journal(raw, agent, c.size)
        _take(c, j.reads)
        c.size = j.size
    c.mtime = mtime if c.size == size else 0  # a torn tail is re-read next time
    _cache(store)[agent] = c
    return c


def load_view(store: Store, agent: str) -> ReadSetView:
    with flocked(store.commondir, agent_lock(agent)):
        c = _load_locked(store, agent)
        return ReadSetView(c.entries, c.base, c.counted, c.gen, c.changed, len(c.changed))


def load(store: Store, agent: str) -> dict[str, ReadEntry]:
    """Agent's read set as {path: entry} (the note plus its journal)."""
    return dict(load_view(store, agent).entries)


def peek(store: Store, agent: str) -> dict[str, ReadEntry]:
    """Another agent's read set for display (status, doctor), without waiting for its
    lock: an agent stopped while holding it must not hang everyone's ``status``.
    Unlocked, a fold may be caught halfway; the journal is then ignored, which only
    shows fewer reads until the next look."""
    with try_flocked(store.commondir, agent_lock(agent)):  # taken or not: never wait
        c = _load_locked(store, agent)
        return dict(c.entries)


def _line_map(store: Store, agent: str) -> dict[str, str]:
    return _load_locked(store, agent).lines


# -- recording ------------------------------------------------------------------------------------

def record(store: Store, agent: str, entries: Iterable[ReadEntry], *, why: str = "read") -> int:
    """Record ``entries`` in the agent's read set: one journal append, nothing when
    every entry is already there as given (a re-read at an unchanged head).
    Returns the number of entries appended."""
    with flocked(store.commondir, agent_lock(agent)):
        c = _load_locked(store, agent)
        new = [e.line() for e in entries if c.entries.get(e.path) != e]
        if new:
            _append(store, agent, c.base, "".join("r " + ln for ln in new), c)
        return len(new)


def record_write(store: Store, agent: str, entries: Iterable[ReadEntry]) -> int:
    """Journal an accepted write's new versions before its CAS. Its provenance is in
    its commit (``Storm-Read-Set``: the view it was validated against), which points
    at reads already in the journal, so nothing else is written. A write whose CAS
    then fails or never happens leaves entries naming versions the agent itself
    produced: they can only make a later write of it be refused. Returns the
    journal's size in bytes (the caller folds past FOLD_BYTES)."""
    with flocked(store.commondir, agent_lock(agent)):
        c = _load_locked(store, agent)
        data = "".join("r " + e.line() for e in entries)
        return _append(store, agent, c.base, data, c, copy=True)


# -- folding --------------------------------------------------------------------------------------

def unfolded(store: Store, agent: str, base: str) -> bool:
    """Whether the journal extending read-set note ``base`` is still the agent's live
    one (not yet kept as a note): a write whose Storm-Read-Set names ``base`` with
    reads from it can be resolved elsewhere only after a fold."""
    return _base_of(store, agent)[1] == base


def fold(store: Store, agent: str) -> bool:
    """Fold the agent's journal into its notes ref (one notes commit); returns
    whether there was anything to fold."""
    with flocked(store.commondir, agent_lock(agent)):
        return _fold_locked(store, agent)


def _fold_locked(store: Store, agent: str, drop: Iterable[str] | None = None, reset: bool = False) -> bool:
    _notes_head, base, tree = _base_of(store, agent)
    raw = read_journal(store, agent)
    journal = None
    if raw is not None and raw.startswith(f"{JOURNAL_HEADER}{base}\n".encode()):
        journal = parse_journal(raw, agent)
    if (journal is None or journal.lines == 0) and drop is None and not reset:
        if raw is not None and journal is None:
            _start_journal(store, agent, base)  # left by a fold killed after its notes commit
        return False
    blob = note_blob(store, tree, _key(agent))
    base_text = None if blob is None else store.blob_bytes(blob).decode("utf-8", "surrogateescape")
    lines = {} if reset else read_set_lines(base_text, agent)
    changes: dict[str, bytes | None] = {}
    if raw is not None and journal is not None and journal.lines:
        # kept for good under a key naming its base: the provenance of this journal's
        # writes (Storm-Read-Set: <base> <n>) points into it
        jbytes = raw[:journal.size]
        jkey = journal_key(agent, base)
        store.write_blob(jkey)  # note targets must exist (git notes prune)
        changes[str(pygit2.hash(jkey))] = jbytes
        if not reset:
            for ln in journal.reads:
                lines[ln.split(" ", 2)[2]] = ln
    for p in drop or ():
        lines.pop(p, None)
    text = _note_text(agent, lines)
    store.write_blob(_key(agent))
    changes[str(pygit2.hash(_key(agent)))] = text
    notes.update_notes(store, agent_ref(agent), changes, agent=agent,
                       message=f"storm: {agent} folds {journal.lines if journal else 0} journal line(s)")
    _start_journal(store, agent, str(pygit2.hash(text)))
    _cache(store).pop(agent, None)
    return True


def fold_all(store: Store) -> list[str]:
    """Fold every agent's journal (status, doctor, maintenance); returns who had one.
    An unreadable journal is left for doctor to report."""
    done = []
    for agent in agents(store):
        with try_flocked(store.commondir, agent_lock(agent)) as taken:
            if not taken:
                continue  # busy (or stopped) right now: its own next write or a later status folds it
            try:
                if _fold_locked(store, agent):
                    done.append(agent)
            except CorruptReadSet:
                continue
    return done


def forget(store: Store, agent: str, paths: Iterable[str] | None) -> list[str]:
    """Drop ``paths`` (all when None) from the read set; returns what was dropped.
    The folded journals stay: past writes' provenance points into them, the audit trail.
    An agent storm has never seen has nothing to drop, and nothing is created for it."""
    if not known(store, agent):
        return []
    with flocked(store.commondir, agent_lock(agent)):
        try:
            current = dict(_line_map(store, agent))
        except CorruptReadSet:
            if paths is not None:
                raise
            return _reset_unreadable(store, agent)
        drop = list(current) if paths is None else [p for p in paths if p in current]
        if drop:
            _fold_locked(store, agent, drop=drop)
        else:
            _fold_locked(store, agent)
    return drop


def _reset_unreadable(store: Store, agent: str) -> list[str]:
    """Empty an unparsable read set (the way out its error offers); returns the
    paths still recognisable in it, or a marker when none is. The journal is kept
    as it was, under its base's key, like any folded journal."""
    _n, base, tree = _base_of(store, agent)
    blob = note_blob(store, tree, _key(agent))
    text = "" if blob is None else store.blob_bytes(blob).decode("utf-8", "surrogateescape")
    raw = read_journal(store, agent) or b""
    text += raw.decode("utf-8", "surrogateescape")
    found = [ln.split(" ", 2)[2] for ln in text.split("\n")[1:] if ln.count(" ") >= 2]
    changes: dict[str, bytes | None] = {}
    kept = raw[:raw.rfind(b"\n") + 1]
    if kept.startswith(f"{JOURNAL_HEADER}{base}\n".encode()) and kept.count(b"\n") > 1:
        store.write_blob(journal_key(agent, base))
        changes[str(pygit2.hash(journal_key(agent, base)))] = kept
    empty = _note_text(agent, {})
    store.write_blob(_key(agent))
    changes[str(pygit2.hash(_key(agent)))] = empty
    notes.update_notes(store, agent_ref(agent), changes, agent=agent,
                       message=f"storm: {agent} reset an unreadable read set")
    _start_journal(store, agent, str(pygit2.hash(empty)))
    _cache(store).pop(agent, None)
    return [f.removeprefix("r ").split(" ", 2)[-1] for f in found] or ["(unreadable read set)"]


def _task_file(store: Store, agent: str) -> str:
    return os.path.join(store.commondir, "storm", "tasks", agent)


def begin_task(store: Store, agent: str, task: str) -> list[str]:
    """A read set belongs to one task (STORM keeps one per task): when ``agent`` starts
    a task other than the one it last worked on (a new harness session, a new team
    subtask), its read set is emptied first. Returns what was dropped; the same task
    again drops nothing and costs one small file read."""
    file = _task_file(store, agent)
    try:
        if read_own(file) == task.encode("utf-8", "surrogateescape"):
            return []
    except OSError:
        pass
    dropped = forget(store, agent, None)
    os.makedirs(os.path.dirname(file), exist_ok=True)
    replace_file(file, task.encode("utf-8", "surrogateescape"), tmp=f"{file}.{os.getpid()}")
    return dropped


def known(store: Store, agent: str) -> bool:
    """Whether storm has seen ``agent``: a notes ref or a journal of its own."""
    return store.ref_target(AGENTS_PREFIX + agent) is not None or os.path.exists(journal_path(store, agent))


def agents(store: Store) -> list[str]:
    """Every agent with a notes ref (a read set or provenance) or a journal."""
    names = {r[len(AGENTS_PREFIX):] for r in store.refs_under(AGENTS_PREFIX)}
    try:
        names.update(n for n in os.listdir(journal_dir(store)) if not n.startswith("."))
    except FileNotFoundError:
        pass
    return sorted(names)
