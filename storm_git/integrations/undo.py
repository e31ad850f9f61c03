"""Which version ``undo_edit`` restores: the agent's edit history of a path.

Storm mode derives it from the shared ref's history, not from server memory:
every accepted write is a commit with ``Storm-Agent`` / ``Storm-Op`` /
``Storm-Path`` trailers, so "this agent's last edit of P" is the newest such
commit, and the version before it is P in that commit's first parent. That
survives a restarted or killed server and sees edits made through the CLI too.
Undos are themselves commits (op ``undo_edit``); walking back, each one cancels
the next older edit, so repeated undos step back through the history like
file_editor's per-file stack.

Worktree mode has no commit per write (only ``write`` events without content),
so the server keeps a per-process stack of previous contents there: a restarted
server can no longer undo earlier edits; the agent's branch and ``git diff`` in
its worktree still show them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pygit2

from ..core import trailers
from ..core.store import Store, hex_
from ..storm.validated_writer import UNDO_OP

__all__ = ["UNDO_OP", "LastEdit", "MemoryHistory", "last_edit"]
WALK_LIMIT = 5000  # commits looked at, newest first


@dataclass
class LastEdit:
    """The commit to undo, the version it produced and the one before it (None: absent)."""

    commit: str
    produced: str | None
    previous: str | None


def _blob(store: Store, tree: pygit2.Tree, path: str) -> str | None:
    try:
        e = store.entry(tree, path)
    except Exception:  # noqa: BLE001 - a directory or a path through a file: not a version of the file
        return None
    return hex_(e.oid) if e else None


def last_edit(store: Store, head: pygit2.Oid, agent: str, path: str) -> LastEdit | None:
    """The agent's newest edit of ``path`` not yet undone, or None."""
    c = store.commit(head)
    cancelled = 0
    for _ in range(WALK_LIMIT):
        t = trailers.parse(c.message)
        if "Storm-Agent" not in t:
            return None  # below the first write: storm's history starts here
        if t["Storm-Agent"][0] == agent and path in t.get("Storm-Path", []) and c.parent_ids:
            if t.get("Storm-Op", [""])[0] == UNDO_OP:
                cancelled += 1
            elif cancelled:
                cancelled -= 1
            else:
                parent = store.commit(c.parent_ids[0])
                return LastEdit(str(c.id), _blob(store, c.tree, path), _blob(store, parent.tree, path))
        if not c.parent_ids:
            return None
        c = store.commit(c.parent_ids[0])
    return None


@dataclass
class MemoryHistory:
    """Worktree mode: previous contents per path, for this server process only."""

    stacks: dict[str, list[bytes | None]] = field(default_factory=dict)

    def push(self, path: str, previous: bytes | None) -> None:
        self.stacks.setdefault(path, []).append(previous)

    def pop(self, path: str) -> tuple[bool, bytes | None]:
        stack = self.stacks.get(path)
        if not stack:
            return False, None
        return True, stack.pop()
