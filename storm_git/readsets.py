"""Agents' read sets, kept as git notes in one notes ref per agent.

STORM's read set ``S_a = {(path, version observed)}`` is stored under
``refs/notes/storm/reads/<agent>``: one note per path, attached to a small blob
whose content is the path itself (so the note's object exists and ``git notes
prune`` keeps it). One ref per agent means reads by different agents never
contend on a ref (GIT-FACTS: a shared notes ref lost 60–75 % of notes).

A note is one line ``<blob-hex|absent> <head-hex> <path>``: the version seen and
the shared head it was read at.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import pygit2

from . import notes
from .errors import CorruptState
from .locks import flocked
from .store import PROVENANCE_PREFIX, READS_PREFIX, Store

ABSENT = "absent"


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
        try:
            blob, head, path = text.rstrip("\n").split(" ", 2)
        except ValueError:
            raise CorruptState(f"unreadable read-set note {text[:60]!r}",
                               hint="run git storm doctor") from None
        return cls(path, None if blob == ABSENT else blob, head)

    def to_dict(self) -> dict:
        return asdict(self)


def path_key(path: str) -> str:
    """The object a path's note hangs on: the blob whose content is the path."""
    return str(pygit2.hash(path.encode("utf-8")))


def reads_ref(agent: str) -> str:
    return READS_PREFIX + agent


def provenance_ref(agent: str) -> str:
    return PROVENANCE_PREFIX + agent


def agent_lock(agent: str) -> str:
    return f"agent-{agent}"


def load(store: Store, agent: str) -> dict[str, ReadEntry]:
    """Agent's read set as {path: entry}."""
    tree = notes.notes_tree(store, store.ref(reads_ref(agent)))
    out: dict[str, ReadEntry] = {}
    for _target, blob in notes.iter_notes(store, tree):
        entry = ReadEntry.parse(store.blob_bytes(blob).decode("utf-8", "surrogateescape"))
        out[entry.path] = entry
    return out


def record(store: Store, agent: str, entries: Iterable[ReadEntry], *, why: str = "read",
           provenance: tuple[pygit2.Oid, str] | None = None) -> None:
    """Record ``entries`` in the agent's read set (and a provenance note), under the agent lock."""
    entries = list(entries)
    with flocked(store.commondir, agent_lock(agent)):
        if provenance is not None:
            commit, text = provenance
            notes.update_notes(store, provenance_ref(agent), {str(commit): text.encode("utf-8")},
                               agent=agent, message=f"storm: provenance of {str(commit)[:12]}")
        if entries:
            changes: dict[str, bytes | None] = {}
            for e in entries:
                key = store.write_blob(e.path.encode("utf-8"))
                changes[str(key)] = e.line().encode("utf-8")
            names = ", ".join(e.path for e in entries[:3]) + (" …" if len(entries) > 3 else "")
            notes.update_notes(store, reads_ref(agent), changes, agent=agent,
                               message=f"storm: {agent} {why} {names}")


def forget(store: Store, agent: str, paths: Iterable[str] | None) -> list[str]:
    """Drop ``paths`` (all when None) from the read set; returns what was dropped."""
    with flocked(store.commondir, agent_lock(agent)):
        current = load(store, agent)
        drop = list(current) if paths is None else [p for p in paths if p in current]
        if drop:
            notes.update_notes(store, reads_ref(agent), {path_key(p): None for p in drop},
                               agent=agent, message=f"storm: {agent} forgot {len(drop)} path(s)")
    return drop


def agents(store: Store) -> list[str]:
    """Every agent that has a read set."""
    return sorted(r[len(READS_PREFIX):] for r in store.refs_under(READS_PREFIX))


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
