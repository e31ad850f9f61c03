"""A write's provenance: the read set it was validated against, from its trailers.

``Storm-Read-Set: <base> <n>`` (storm_git.core.trailers) names the agent's read-set
note ``<base>`` plus the first ``n`` reads of the journal that extended it
(storm_git.core.readsets keeps both). This module resolves that back into the
entries, from the folded journal's note or from the live journal file before the
fold; the server resolves pushed writes with it too, in its bare repository.
"""
from __future__ import annotations

import pygit2

from . import notes, trailers
from .errors import CorruptState
from .objects import blob_at
from .readsets import (
    JOURNAL_HEADER,
    NO_BASE,
    ReadEntry,
    agent_ref,
    journal_key,
    note_blob,
    parse_journal,
    read_journal,
    read_set_lines,
)
from .store import Store


class ProvenanceNotFound(CorruptState):
    """A write's provenance names a journal that cannot be found (the agent's notes
    ref was deleted or rewound, or its journal file lost before it was folded)."""

    kind = "provenance_not_found"


def read_set_at(repo: pygit2.Repository, tree: pygit2.Tree | None, agent: str, base: str, reads: int,
                live: bytes | None = None) -> dict[str, ReadEntry]:
    """The read set ``Storm-Read-Set: <base> <reads>`` names: the read-set note blob
    ``base`` plus the first ``reads`` reads of the journal that extended it — its note
    in the notes tree ``tree`` (the agent's ref), else ``live`` (the journal file, while
    ``base`` is not folded yet). Raises ProvenanceNotFound, CorruptReadSet, KeyError."""
    text = None if base == NO_BASE else blob_at(repo, pygit2.Oid(hex=base)).data.decode("utf-8", "surrogateescape")
    lines = read_set_lines(text, agent)
    if reads:
        jblob = note_blob(None, tree, journal_key(agent, base))  # type: ignore[arg-type]
        if jblob is not None:
            raw = blob_at(repo, jblob).data
        elif live is not None and live.startswith(f"{JOURNAL_HEADER}{base}\n".encode()):
            raw = live
        else:
            raise ProvenanceNotFound(f"the journal of {agent} extending {base[:12]} is not in "
                                     f"{agent_ref(agent)}", hint="was the agent's notes ref deleted or rewound?")
        j = parse_journal(raw, agent)
        if len(j.reads) < reads:
            raise ProvenanceNotFound(f"the journal of {agent} extending {base[:12]} holds {len(j.reads)} "
                                     f"reads, not the {reads} a write counted")
        for ln in j.reads[:reads]:
            lines[ln.split(" ", 2)[2]] = ln
    return {p: ReadEntry.parse(ln) for p, ln in lines.items()}


def entries(repo: pygit2.Repository, tree: pygit2.Tree | None, agent: str,
                       prov: trailers.Provenance, live: bytes | None = None) -> list[ReadEntry]:
    """The entries a write with provenance ``prov`` was validated against (its
    ``Storm-Dep`` paths of the read set, or all of it), sorted by path."""
    full = read_set_at(repo, tree, agent, prov.base, prov.reads, live)
    keep = sorted(full) if prov.deps is None else sorted(p for p in set(prov.deps) if p in full)
    return [full[p] for p in keep]


def load(store: Store, agent: str | None, commit: str) -> tuple[dict[str, str], list[ReadEntry]] | None:
    """(header, the read set the write ``commit`` was validated against), from its
    commit's trailers (header ``validated-at``, ``scope``, ``read-set``,
    ``journal-reads``). Resolves from the folded journal, or from the live journal
    before the fold. None when the commit carries none (not a storm write).
    ``agent`` None: the commit's ``Storm-Agent``."""
    c = store.commit(pygit2.Oid(hex=str(commit)))
    found = trailers.parse(c.message)
    agent = agent or (found.get("Storm-Agent") or [""])[0]
    try:
        prov = trailers.provenance(found)
    except ValueError as exc:
        raise CorruptState(f"the provenance trailers of {str(commit)[:12]} are unreadable ({exc})") from None
    if prov is None:
        return None
    header = {"agent": agent, "validated-at": prov.validated_at, "scope": prov.scope,
              "read-set": prov.base, "journal-reads": str(prov.reads)}
    try:
        return header, _entries_now(store, agent, prov)
    except ProvenanceNotFound:  # a fold between the two looks: its notes commit came first, look again
        return header, _entries_now(store, agent, prov)


def _entries_now(store: Store, agent: str, prov: trailers.Provenance) -> list[ReadEntry]:
    tree = notes.notes_tree(store, store.ref(agent_ref(agent)))
    return entries(store.repo, tree, agent, prov, read_journal(store, agent))
