"""What the test runner knows, kept in the repository so every door can read it:
``<common git dir>/storm/tests/state.json`` (the head last tested, each test's last
result, the last green head per test) and ``history.jsonl`` (one line per round).

The state file is replaced whole (write, fsync, rename), so a runner killed at any
point leaves either the previous round's state or this one's, never a mix: the
next runner repeats an unfinished round.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import CorruptState
from ..core.locks import pid_alive

STATE = "state.json"
HISTORY = "history.jsonl"
KEEP_HISTORY_IN_STATE = 20


def tests_dir(commondir: str) -> str:
    return os.path.join(commondir, "storm", "tests")


@dataclass
class TestResult:
    """One test's last known outcome: ``passed``, ``failed``, ``skipped`` or ``flaky``."""

    outcome: str
    head: str  # the head it was run on
    tail: str = ""  # the failure's last lines


@dataclass
class WatchState:
    head: str | None = None  # the last head a round finished on
    rounds: int = 0
    results: dict[str, TestResult] = field(default_factory=dict)
    last_green: dict[str, str] = field(default_factory=dict)  # test -> the last head it passed on
    known_failing: list[str] = field(default_factory=list)  # red before any agent wrote
    flaky: list[str] = field(default_factory=list)
    running: dict[str, Any] | None = None  # {"head", "pid", "started"} while a round runs
    recent: list[dict[str, Any]] = field(default_factory=list)  # the last rounds, newest last

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WatchState:
        return cls(head=d.get("head"), rounds=int(d.get("rounds", 0)),
                   results={k: TestResult(**v) for k, v in (d.get("results") or {}).items()},
                   last_green=dict(d.get("last_green") or {}), known_failing=list(d.get("known_failing") or []),
                   flaky=list(d.get("flaky") or []), running=d.get("running"), recent=list(d.get("recent") or []))

    def failing(self) -> list[str]:
        return sorted(t for t, r in self.results.items() if r.outcome == "failed")


def load(commondir: str) -> WatchState:
    """The state (empty when no runner ever finished a round); CorruptState when the
    file is not the runner's JSON (remove it: the next round starts afresh)."""
    path = os.path.join(tests_dir(commondir), STATE)
    hint = f"remove {path}: the next round of git storm watch starts afresh"
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return WatchState()
    except ValueError:
        raise CorruptState(f"{path} is not a test-runner state (not JSON)", hint=hint) from None
    if not isinstance(data, dict):
        raise CorruptState(f"{path} is not a test-runner state", hint=hint)
    try:
        return WatchState.from_dict(data)
    except (TypeError, AttributeError, ValueError) as exc:
        raise CorruptState(f"{path} is not a test-runner state ({exc})", hint=hint) from None


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save(commondir: str, st: WatchState) -> None:
    d = tests_dir(commondir)
    os.makedirs(d, exist_ok=True)
    _atomic_write(os.path.join(d, STATE), json.dumps(st.to_dict(), indent=1, sort_keys=True))


def append_history(commondir: str, entry: dict[str, Any]) -> None:
    """One line per finished round; a line cut by a kill is skipped by :func:`history`."""
    d = tests_dir(commondir)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, HISTORY), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def history(commondir: str, limit: int = 50) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(tests_dir(commondir), HISTORY), encoding="utf-8") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return []
    out = []
    for ln in lines[-limit:]:
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue
    return out


def alive(pid: int) -> bool:
    return pid > 0 and pid_alive(pid)


def now() -> float:
    return round(time.time(), 3)
