"""Steps a door opens before a tool runs and closes after it: a lease's edit, a command.

A harness runs its pre hook and its post hook in two processes, so what storm
knew when a step began (the versions an edit was checked at, a command's clock
mark) is kept in a small JSON file, one per open step, under
``<common git dir>/storm/open/<agent>/``. A step whose end never comes (a tool the
harness refused after its pre hook) is dropped after ``MAX_AGE``. The records also
tell storm which commands may be running now (:func:`running_commands`): an edit
on disk dated after one of them began may be that command's, and is left for its
end to attribute.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from ..core.files import replace_file
from ..core.store import Store

MAX_AGE = 3600.0  # a step open longer than this was abandoned (a harness's longest tool call is 10 min)
EDIT = "write"
COMMAND = "shell"


def _dir(store: Store, agent: str | None = None) -> str:
    d = os.path.join(store.commondir, "storm", "open")
    return os.path.join(d, agent) if agent else d


def record_path(store: Store, agent: str, key: str) -> str:
    d = _dir(store, agent)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest() + ".json")


def save(store: Store, agent: str, key: str, data: dict[str, Any]) -> None:
    """Keep what a step knew at its start (dropping this agent's abandoned steps)."""
    path = record_path(store, agent, key)
    d = os.path.dirname(path)
    now = time.time()
    for name in os.listdir(d):
        full = os.path.join(d, name)
        try:
            if now - os.stat(full).st_mtime > MAX_AGE:
                os.unlink(full)
        except OSError:
            pass
    replace_file(path, json.dumps({**data, "opened": now}).encode("utf-8"), tmp=f"{path}.{os.getpid()}")


def take(store: Store, agent: str, key: str) -> dict[str, Any] | None:
    """The step's record, removed (None when it was never opened or is unreadable)."""
    path = record_path(store, agent, key)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    try:
        os.unlink(path)
    except OSError:
        pass
    return data if isinstance(data, dict) else None


def of_agent(store: Store, agent: str) -> Iterator[dict[str, Any]]:
    """Every readable open step of ``agent``."""
    d = _dir(store, agent)
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        try:
            with open(os.path.join(d, name), encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            yield rec


def running_commands(store: Store) -> list[dict[str, Any]]:
    """The open command steps of every agent, not yet abandoned."""
    out: list[dict[str, Any]] = []
    now = time.time()
    try:
        agents = os.listdir(_dir(store))
    except OSError:
        return out
    for a in agents:
        for rec in of_agent(store, a):
            if rec.get("kind") == COMMAND and now - float(rec.get("opened") or 0) < MAX_AGE:
                out.append({**rec, "agent": a})
    return out
