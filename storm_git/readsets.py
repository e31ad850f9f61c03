"""Agents' read sets and the provenance of their writes, as git notes.

Each agent has one notes ref, ``refs/notes/storm/agents/<agent>`` (one ref per
agent, so agents never contend on a ref: GIT-FACTS measured a shared notes ref
losing 60–75 % of notes). It holds:

* the agent's read set ``S_a``, as one note on a small per-agent key blob: one
  line ``<blob-hex|absent> <head-hex> <path>`` per path (the version seen and
  the shared head it was read at);
* one provenance note on each commit the agent wrote: the read set that write
  was validated against, so ``git log --notes='storm/agents/*'`` shows it.

Keeping both in one ref means an accepted write costs one notes commit, and
loading a read set reads one blob whatever the number of writes.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import pygit2

from . import notes
from .errors import CorruptState
from .locks import flocked
from .store import AGENTS_PREFIX, Store

ABSENT = "absent"
READ_SET_HEADER = "storm read set"
# One read-set line: <blob|absent> <head, empty in worktree mode before a commit> <path>.
_LINE_RE = re.compile(r"(absent|[0-9a-f]{40}|[0-9a-f]{64}) ([0-9a-f]{40}|[0-9a-f]{64}|) ([^\n]+)")


class CorruptReadSet(CorruptState):
    """An agent's read-set note that cannot be parsed. Only that agent is affected,
    and ``forget --agent A`` (or ``doctor --fix``) resets it."""

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
        if m is None:
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


# Both live in the agent's one notes ref (names kept for callers).
reads_ref = agent_ref
provenance_ref = agent_ref


def agent_lock(agent: str) -> str:
    return f"agent-{agent}"


def _key(agent: str) -> bytes:
    return f"{READ_SET_HEADER}: {agent}\n".encode("utf-8")


def _parse_set(text: str) -> dict[str, ReadEntry]:
    out: dict[str, ReadEntry] = {}
    for line in text.splitlines()[1:]:
        if line:
            e = ReadEntry.parse(line)
            out[e.path] = e
    return out


def _note_text(store: Store, tree: pygit2.Tree | None, agent: str) -> str | None:
    raw = notes.read_note(store, tree, str(pygit2.hash(_key(agent))))
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


def _load_from(store: Store, tree: pygit2.Tree | None, agent: str) -> dict[str, ReadEntry]:
    text = _note_text(store, tree, agent)
    try:
        return {} if text is None else _parse_set(text)
    except CorruptState as exc:
        raise CorruptReadSet(agent, exc.message) from None


def load(store: Store, agent: str) -> dict[str, ReadEntry]:
    """Agent's read set as {path: entry}."""
    return _load_from(store, notes.notes_tree(store, store.ref(agent_ref(agent))), agent)


def _lines(text: str | None, agent: str) -> dict[str, str]:
    """{path: note line} without building entries: recording a read into a large
    read set must not cost a full parse and re-format of every entry."""
    out: dict[str, str] = {}
    match = _LINE_RE.fullmatch
    for ln in (text or "").split("\n")[1:]:
        if ln:
            m = match(ln)
            if m is None:
                raise CorruptReadSet(agent, f"unreadable line {ln[:60]!r}")
            out[m.group(3)] = ln
    return out


def _store_set(store: Store, agent: str, lines: dict[str, str], extra: dict[str, bytes],
               message: str) -> None:
    key = store.write_blob(_key(agent))  # the note's object must exist (git notes prune)
    changes: dict[str, bytes | None] = dict(extra)
    body = "".join(lines[p] + "\n" for p in sorted(lines))
    header = f"{READ_SET_HEADER} of {agent}: <version|absent> <head> <path>\n"
    changes[str(key)] = (header + body).encode("utf-8") if lines else None
    notes.update_notes(store, agent_ref(agent), changes, agent=agent, message=message)


def record(store: Store, agent: str, entries: Iterable[ReadEntry], *, why: str = "read",
           provenance: tuple[pygit2.Oid, str] | None = None) -> None:
    """Record ``entries`` in the agent's read set, and a write's provenance note,
    in one notes commit under the agent lock."""
    entries = list(entries)
    with flocked(store.commondir, agent_lock(agent)):
        tree = notes.notes_tree(store, store.ref(agent_ref(agent)))
        lines = _lines(_note_text(store, tree, agent), agent)
        lines.update((e.path, e.line().rstrip("\n")) for e in entries)
        extra = {}
        if provenance is not None:
            commit, text = provenance
            extra[str(commit)] = text.encode("utf-8")
        names = ", ".join(e.path for e in entries[:3]) + (" …" if len(entries) > 3 else "")
        _store_set(store, agent, lines, extra, f"storm: {agent} {why} {names}")


def forget(store: Store, agent: str, paths: Iterable[str] | None) -> list[str]:
    """Drop ``paths`` (all when None) from the read set; returns what was dropped.
    Provenance notes stay: they are the audit trail of past writes."""
    with flocked(store.commondir, agent_lock(agent)):
        text = _note_text(store, notes.notes_tree(store, store.ref(agent_ref(agent))), agent)
        try:
            lines = _lines(text, agent)
        except CorruptReadSet:
            if paths is not None:
                raise
            return _reset_unreadable(store, agent, text or "")
        drop = list(lines) if paths is None else [p for p in paths if p in lines]
        if drop:
            for p in drop:
                del lines[p]
            _store_set(store, agent, lines, {}, f"storm: {agent} forgot {len(drop)} path(s)")
    return drop


def _reset_unreadable(store: Store, agent: str, text: str) -> list[str]:
    """Empty an unparsable read set (the way out its error offers); returns the
    paths still recognisable in it, or a marker when none is."""
    _store_set(store, agent, {}, {}, f"storm: {agent} reset an unreadable read set")
    found = [ln.split(" ", 2)[2] for ln in text.split("\n")[1:] if ln.count(" ") >= 2]
    return found or ["(unreadable read set)"]


def agents(store: Store) -> list[str]:
    """Every agent that has a notes ref (a read set or provenance)."""
    return sorted(r[len(AGENTS_PREFIX):] for r in store.refs_under(AGENTS_PREFIX))


def provenance_text(agent: str, head: pygit2.Oid, scope: str, entries: Iterable[ReadEntry]) -> str:
    lines = [
        "storm provenance: the read set this write was validated against",
        f"agent: {agent}",
        f"validated-at: {head}",
        f"scope: {scope}",
    ]
    body = "".join(e.line() for e in sorted(entries, key=lambda e: e.path))
    return "\n".join(lines) + "\n" + body


def parse_provenance(text: str) -> tuple[dict[str, str], list[ReadEntry]]:
    """(header fields, entries) of a provenance note."""
    header: dict[str, str] = {}
    entries: list[ReadEntry] = []
    for line in text.splitlines()[1:]:
        if ": " in line and len(entries) == 0 and line.split(": ", 1)[0] in ("agent", "validated-at", "scope"):
            k, v = line.split(": ", 1)
            header[k] = v
        elif line:
            entries.append(ReadEntry.parse(line))
    return header, entries


def load_provenance(store: Store, agent: str, commit: str) -> tuple[dict[str, str], list[ReadEntry]] | None:
    tree = notes.notes_tree(store, store.ref(provenance_ref(agent)))
    raw = notes.read_note(store, tree, commit)
    return None if raw is None else parse_provenance(raw.decode("utf-8", "surrogateescape"))
