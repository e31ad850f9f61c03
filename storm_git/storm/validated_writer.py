"""What the layers above the validated write need of it.

:mod:`storm_git.storm.commands` (exec), :mod:`storm_git.storm.adopt` and :mod:`storm_git.storm.commit`
(commit) record their changes through :meth:`SharedWorkspace.apply`; typing them
against this protocol instead of the class keeps the dependency one-way:
``SharedWorkspace`` offers them as methods, and they do not import it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pygit2

from ..core.payloads import WriteResult
from ..core.reservations import Reservation
from ..core.store import Store

OnWait = Callable[[Reservation], None]  # called once when a writer starts waiting on a reservation
# An ``expected`` value for a target validated as a write's are (against the read
# set), not against the version on disk when the edit started: a command that put
# back an older shared version (storm_git.storm.reverts.revert_targets).
AS_WRITTEN = "<read set>"
# The op of a write that puts back the version before the agent's last edit (the MCP
# undo_edit tool): its ``expected`` is the version that edit produced.
UNDO_OP = "undo_edit"


class ValidatedWriter(Protocol):
    store: Store

    @property
    def max_file_bytes(self) -> int: ...

    def head(self) -> pygit2.Oid: ...

    def check_size(self, path: str, content: bytes) -> None: ...

    def apply(self, agent: str, changes: dict[str, Any], *, intent: str | None, deps: Iterable[str] | None,
              wait: bool, op: str, expected: dict[str, str | None] | None = None,
              on_wait: OnWait | None = None) -> WriteResult: ...

    def take_in_shell_edits(self, paths: list[str] | None = None, *, only_adopting: bool = False,
                            made_on: dict[str, str | None] | None = None) -> Any: ...

    def reservation(self, path: str) -> Reservation | None: ...


class WriteHost(Protocol):
    """What the validated write (storm_git.storm.write, validate, rejection) needs of
    its workspace: typed against this, they do not import the workspace that calls them."""

    store: Store
    publication: Any  # storm_git.storm.publication.Publication
    valid_cache: dict[str, tuple[int, int, pygit2.Oid]]

    @property
    def reservation_seconds(self) -> float: ...

    def head(self) -> pygit2.Oid: ...

    def head_ref(self) -> pygit2.Reference: ...

    def agent_content(self, path: str, oid: pygit2.Oid, mode: int | None = None, conv: Any = None) -> bytes: ...

    def offer_rebased(self, agent: str, rejection: Any, seen: Any, change: Any) -> Any: ...
