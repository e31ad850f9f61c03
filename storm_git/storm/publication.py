"""Where a validated write's commit goes: the one step that differs between a local
shared workspace and one whose shared ref lives on a git server.

Locally the shared ref is the truth: the compare-and-swap under the workspace lock
is the write, and every verdict is final. ``storm_git.remote`` gives its workspace
another publication, whose CAS only queues the commit on the local copy of the ref;
it lands when the server takes a push (``land``), and a verdict that pushes nothing
is given only once it was reached on the server's head.
"""
from __future__ import annotations

import pygit2

from ..core.store import WORKSPACE_REF, Store


class Publication:
    """Local publication: the CAS of ``refs/storm/workspace``."""

    lands_later = False  # True: ``publish`` queues, ``land`` (without the lock) lands

    def __init__(self, store: Store) -> None:
        self.store = store

    def publish(self, ref: pygit2.Reference, commit: pygit2.Oid, head: pygit2.Oid, agent: str, op: str) -> bool:
        """Move the shared ref from ``head`` to ``commit`` (workspace lock held); False
        when it moved meanwhile (the write is validated again and retried)."""
        return self.store.cas(ref, WORKSPACE_REF, commit, f"storm: {agent} {op}")

    def land(self, agent: str, commit: pygit2.Oid) -> pygit2.Oid | None:
        """With ``lands_later``: the commit that is on the shared ref for good (``commit``,
        or the same write moved onto a newer head), or None when it was dropped."""
        return commit

    def verdict_is_final(self) -> bool:
        """Whether a verdict that pushes nothing (a rejection, a write that changes
        nothing, a reservation to wait for) may be given as it is."""
        return True

    def refresh_for_verdict(self, agent: str) -> None:
        """Make the next attempt's verdict final (called without the workspace lock)."""
