"""Data returned by the verbs: plain dataclasses with ``to_dict`` for ``--json``.

Content is bytes in the library; in JSON it is text when it is valid UTF-8 and
``content_base64`` otherwise, so binary files survive the round trip.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from .reservations import Reservation

DIRECT_CONFLICT = "direct_conflict"
STALE_DEPENDENCY = "stale_dependency"
UNREAD_TARGET = "unread_target"
RESERVED = "reserved"
REASONS = (DIRECT_CONFLICT, STALE_DEPENDENCY, UNREAD_TARGET, RESERVED)


def content_fields(data: bytes | None, key: str = "content") -> dict[str, Any]:
    if data is None:
        return {key: None}
    if b"\x00" not in data[:8000]:  # git's binary heuristic, as in diffs.is_binary
        try:
            return {key: data.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {f"{key}_base64": base64.b64encode(data).decode("ascii"), key: None}


@dataclass
class ReadResult:
    """A file and its version at the shared head (``version`` None: absent)."""

    path: str
    version: str | None
    head: str
    content: bytes | None
    mode: int | None = None
    offline: str | None = None  # remote mode, server unreachable: why, and how old the local head is

    @property
    def exists(self) -> bool:
        return self.version is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "version": self.version, "exists": self.exists, "head": self.head}
        if self.offline:
            d["offline"] = self.offline
        d.update(content_fields(self.content))
        return d


@dataclass
class FileChange:
    """How one file moved since an agent read it."""

    path: str
    read_version: str | None
    current_version: str | None
    changed_by: list[str]
    versions_behind: int | None
    diff: str
    binary: bool
    never_read: bool = False  # the agent had not read it: no diff, the content is the news

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Rejection:
    """Why a write was refused and everything needed to re-plan it."""

    reason: str
    agent: str
    path: str
    head: str
    current_version: str | None
    current_content: bytes | None
    target: FileChange | None
    stale: list[FileChange] = field(default_factory=list)
    reservation: Reservation | None = None
    message: str = ""
    # intent annotations (``# agent: why``) on the lines of the diffs (storm_git.coordination.intents)
    intents_in_diff: list[dict[str, Any]] = field(default_factory=list)
    # what the write was validated against: {"name": all|deps|auto|auto:all, "paths", "why"}
    scope: dict[str, Any] | None = None
    # direct_conflict: the agent's change re-applied on the current version (storm_git.storm.rebased)
    rebased: Any = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "reason": self.reason,
            "agent": self.agent,
            "path": self.path,
            "head": self.head,
            "message": self.message,
            "current_version": self.current_version,
        }
        d.update(content_fields(self.current_content, "current_content"))
        d["diff"] = self.target.diff if self.target else ""
        d["changed_by"] = self.target.changed_by if self.target else []
        d["versions_behind"] = self.target.versions_behind if self.target else None
        d["read_version"] = self.target.read_version if self.target else None
        d["never_read"] = self.target.never_read if self.target else False
        d["stale"] = [s.to_dict() for s in self.stale]
        d["reservation"] = self.reservation.to_dict() if self.reservation else None
        d["intents_in_diff"] = self.intents_in_diff
        d["scope"] = self.scope
        d["rebased"] = self.rebased.to_dict() if self.rebased is not None else None
        return d


@dataclass
class ReservationWait:
    """A writer waited for another agent's reservation: whose, on what, for how long."""

    holder: str
    path: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "path": self.path, "seconds": round(self.seconds, 3)}


@dataclass
class WriteResult:
    """The outcome of write/edit/rm/exec: accepted with a commit, or a rejection."""

    accepted: bool
    agent: str
    paths: list[str]
    head: str
    commit: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    rejection: Rejection | None = None
    disk: dict[str, str] = field(default_factory=dict)
    # path -> why, for each path whose disk outcome is "failed" (the write landed all the same)
    disk_errors: dict[str, str] = field(default_factory=dict)
    # steps after the landing that failed (the write stands; see storm_git.storm.write)
    warnings: list[str] = field(default_factory=list)
    displaced: list[str] = field(default_factory=list)  # replaced on disk by an edit outside storm, taken in
    cas_retries: int = 0
    waited: float = 0.0
    flags: list[str] = field(default_factory=list)
    reservation_wait: ReservationWait | None = None  # part of ``waited`` spent on a reservation
    # --deps auto: read files that moved since read, left out of the scope because their
    # change touches nothing the write uses (path -> why; storm_git.deps.impact)
    unaffected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "accepted": self.accepted,
            "agent": self.agent,
            "paths": self.paths,
            "head": self.head,
            "commit": self.commit,
            "versions": self.versions,
            "disk": self.disk,
            "disk_errors": self.disk_errors,
            "warnings": self.warnings,
            **({"displaced": self.displaced} if self.displaced else {}),
            "cas_retries": self.cas_retries,
            "waited": round(self.waited, 3),
            "reservation_wait": self.reservation_wait.to_dict() if self.reservation_wait else None,
            "flags": self.flags,
            "unaffected_deps": self.unaffected,
        }
        if self.rejection is not None:
            d["rejection"] = self.rejection.to_dict()
        return d


@dataclass
class ExecResult:
    """``exec``: the command's own outcome plus the write that recorded its changes.

    The command's stdout/stderr are not captured (they pass through to the
    caller); ``returncode`` follows subprocess (negative: killed by that signal).
    """

    argv: list[str]
    returncode: int
    timed_out: bool
    paths: list[str]
    write: WriteResult | None = None
    nested_repositories: list[str] = field(default_factory=list)  # made by the command, not recorded
    reverted: list[str] = field(default_factory=list)  # set back to an older shared version by the command
    left: list[str] = field(default_factory=list)  # leased by another agent's file tool meanwhile: not recorded
    mixed: list[str] = field(default_factory=list)  # held an edit made outside storm before: not recorded
    uncredited: list[str] = field(default_factory=list)  # changed while it ran, but not named by it: not recorded

    @property
    def accepted(self) -> bool:
        return self.write is None or self.write.accepted

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "paths": self.paths,
            "write": self.write.to_dict() if self.write else None,
            "nested_repositories": self.nested_repositories,
            "reverted": self.reverted,
            **({"left": self.left} if self.left else {}),
            **({"mixed": self.mixed} if self.mixed else {}),
            **({"uncredited": self.uncredited} if self.uncredited else {}),
        }


@dataclass
class CommitResult:
    """``commit``: the commit made on a branch and whose work it contains."""

    commit: str | None
    branch: str
    agents: list[str]
    writes: int
    paths: list[str]
    message: str = ""
    adopted: list[str] = field(default_factory=list)
    unmediated: list[dict[str, Any]] = field(default_factory=list)  # left on disk, not committed
    radar: list[dict[str, Any]] = field(default_factory=list)  # worktree mode: storm_git.worktree.radar hits
    # storm mode: commits the branch gained outside storm, merged into the shared workspace first
    branch_news: dict[str, Any] | None = None
    from_target: list[str] = field(default_factory=list)  # worktree mode: paths a sync's merge brought in

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        """What the commit holds, in words: storm writes when there were any, the paths,
        and those a sync brought from the target (not the agent's own work)."""
        who = ", ".join(self.agents) or "no agent"
        own = len(self.paths) - len(self.from_target)
        parts = [f"{self.writes} write(s) by {who}, {len(self.paths)} path(s)" if self.writes else
                 f"{len(self.paths)} path(s) by {who}" if own else f"{len(self.paths)} path(s)"]
        if self.from_target:
            parts.append(f"{len(self.from_target)} of them from the target branch (concluding a sync)")
        return "; ".join(parts)


@dataclass
class AgentStatus:
    agent: str
    reads: int
    stale: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "reads": self.reads, "stale": self.stale}


@dataclass
class Status:
    mode: str
    head: str
    agents: list[AgentStatus]
    reservations: list[Reservation]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "mode": self.mode,
            "head": self.head,
            "agents": [a.to_dict() for a in self.agents],
            "reservations": [r.to_dict() for r in self.reservations],
        }
        d.update(self.extra)
        return d
