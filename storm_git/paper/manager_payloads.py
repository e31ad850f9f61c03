"""The payloads of the STORM paper's manager that are not about one read or write:
the state of a file (``Manager.files``), a command's record in the command log and
the answer to ``execute_command``. Field for field the reference manager's, so a
harness that reads them runs unchanged on git storm's drop-in."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class FileState:
    """A file of the shared head: its version, the md5 of its content (the reference's
    ``content_hash``) and who made that version (an agent, or a commit's author)."""

    path: str
    version: int = 0
    content_hash: str = ""
    last_modified_by: str = ""


@dataclass
class CommandRecord:
    """One command in the manager's command log (``seq`` counts from 1)."""

    seq: int
    agent_id: str
    command: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    timestamp: float = field(default_factory=time.time)
    affected_files: list[str] = field(default_factory=list)


@dataclass
class CommandResponse:
    """What ``execute_command`` answers: the command's output and status, the commands
    of other agents run since this agent's last one (``missed_commands``), and the
    files this command changed. ``rejected``, beyond the reference: why storm did not
    record the command's changes as the agent's write (None: recorded, or none)."""

    stdout: str
    stderr: str
    exit_code: int
    missed_commands: list[CommandRecord] = field(default_factory=list)
    affected_files: list[str] = field(default_factory=list)
    rejected: object | None = None
