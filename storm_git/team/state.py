"""A team run's state on disk: ``<common git dir>/storm/team/<run>/``.

``state.json`` (the run and each engineer: state, pid, attempts; replaced whole by
a rename under the run's flock, so a reader or a killed writer never sees half of
it), ``events.jsonl`` (one JSON line per event, appended with one ``write``),
``plan.json``, ``transcripts/`` (each session's stdout and stderr, kept), and
``briefs/`` (each engineer's prompt, the file ``STORM_TEAM_BRIEF`` names).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import CorruptState, UsageError
from ..core.files import replace_file

RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENGINEER_STATES = ("queued", "running", "waiting", "done", "failed", "stopped")


def team_dir(commondir: str) -> str:
    return os.path.join(commondir, "storm", "team")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def check_run_id(run: str) -> str:
    if not RUN_RE.match(run or ""):
        raise UsageError(f"{run!r} is not a run id", hint="git storm team status lists the runs")
    return run


@dataclass
class Engineer:
    agent: str
    subtask: str
    harness: str
    state: str = "queued"
    pid: int | None = None  # the session's wrapper, leader of its own process group
    pstart: int | None = None  # its start time in clock ticks (/proc), so a reused pid is not taken for it
    attempts: int = 0
    exit: int | None = None
    started: float | None = None
    ended: float | None = None
    first_tool: float | None = None
    cwd: str = ""
    why: str = ""  # why it failed or was not started
    fix_rounds: int = 0
    tokens: int | None = None
    cost: float | None = None


@dataclass
class RunState:
    run: str
    task: str
    mode: str
    harness: str
    harness_cmd: str | None
    test: str | None
    parallel: int
    fix_rounds: int
    phase: str = "starting"  # starting, running, landing, fixing, landed, failed, stopped
    runner_pid: int | None = None
    runner_pstart: int | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    branch: str = ""
    base_commit: str = ""
    base_workspace: str | None = None
    engineers: list[Engineer] = field(default_factory=list)
    tests: list[dict[str, Any]] = field(default_factory=list)
    merges: list[dict[str, Any]] = field(default_factory=list)
    landed: dict[str, Any] = field(default_factory=dict)
    land_branch: str = ""  # --branch: where it lands, when not where it started
    push: str | None = None  # --push: the remote
    pushed: dict[str, Any] = field(default_factory=dict)  # the push's outcome (publish.Pushed)
    problems: list[str] = field(default_factory=list)
    head_tests: dict[str, Any] = field(default_factory=dict)  # the shared head's runner: head_tests.py

    def engineer(self, agent: str) -> Engineer:
        return next(e for e in self.engineers if e.agent == agent)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        engs = [Engineer(**e) for e in d.get("engineers", [])]
        return cls(**{**d, "engineers": engs})


class RunDir:
    """The files of one run."""

    def __init__(self, commondir: str, run: str) -> None:
        self.run = check_run_id(run)
        self.path = os.path.join(team_dir(commondir), run)

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def create(self) -> None:
        os.makedirs(self.file("transcripts"), exist_ok=True)
        os.makedirs(self.file("briefs"), exist_ok=True)

    def exists(self) -> bool:
        return os.path.isfile(self.file("state.json"))

    @contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self.file("lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def load(self) -> RunState:
        try:
            with open(self.file("state.json"), encoding="utf-8") as fh:
                return RunState.from_dict(json.load(fh))
        except FileNotFoundError:
            raise UsageError(f"no team run {self.run}", hint="git storm team status lists the runs") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptState(f"the state of team run {self.run} is unreadable: {exc}",
                               hint=f"read {self.file('events.jsonl')}; start a new run") from None

    def save(self, st: RunState) -> None:
        data = json.dumps(st.to_dict(), indent=1, ensure_ascii=False).encode("utf-8")
        replace_file(self.file("state.json"), data, tmp=self.file(f"state.json.{os.getpid()}"))

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        ev = {"time": round(time.time(), 3), "run": self.run, "event": kind, **data}
        fd = os.open(self.file("events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(ev, ensure_ascii=False) + "\n").encode("utf-8"))  # one line, one write
        finally:
            os.close(fd)
        return ev

    def events(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Events from byte offset ``start`` (whole lines only), and the offset after them."""
        try:
            with open(self.file("events.jsonl"), "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except FileNotFoundError:
            return [], start
        end = data.rfind(b"\n") + 1
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out, start + end


def runs(commondir: str) -> list[str]:
    """Every run id, oldest first (ids start with their UTC time)."""
    d = team_dir(commondir)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if RUN_RE.match(n) and os.path.isfile(os.path.join(d, n, "state.json")))


def latest(commondir: str) -> str:
    found = runs(commondir)
    if not found:
        raise UsageError("no team run in this repository", hint="start one with git storm team run --plan FILE")
    return found[-1]
