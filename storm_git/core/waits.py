"""Who is waiting, right now, for another agent's reservation.

A write blocked on a reservation waits inside storm (``storm.write.apply``) until the
reservation ends or its budget runs out; nothing on the refs shows that wait while it
lasts. The writer marks it with a small file, ``.git/storm/waits/AGENT.PID`` (the
holder, the path, since when, the process), made when the wait starts and removed
when the write ends, whatever its outcome. A board reads them (:func:`current`): an
agent is blocked on a reservation exactly while its file exists and its process is
alive. Waiting for one of storm's locks is not such a wait and is not marked.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

from .files import replace_file
from .locks import pid_alive
from .store import Store


@dataclass
class Wait:
    agent: str
    holder: str
    path: str
    since: float
    pid: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def waits_dir(store: Store) -> str:
    return os.path.join(store.commondir, "storm", "waits")


def _file(store: Store, agent: str, pid: int) -> str:
    return os.path.join(waits_dir(store), f"{agent}.{pid}")


def begin(store: Store, agent: str, holder: str, path: str) -> None:
    """Mark ``agent``'s write as waiting for ``holder``'s reservation of ``path``
    (again with the new holder or path when the reservation it waits for changes)."""
    pid = os.getpid()
    data = json.dumps(Wait(agent, holder, path, time.time(), pid).to_dict()).encode("utf-8")
    try:
        os.makedirs(waits_dir(store), exist_ok=True)
        replace_file(_file(store, agent, pid), data)
    except OSError:
        pass  # a sign for the board only: the write goes on waiting without it


def end(store: Store, agent: str) -> None:
    """The write stopped waiting (it went on, landed, was refused or failed)."""
    try:
        os.unlink(_file(store, agent, os.getpid()))
    except OSError:
        pass


def stamp(store: Store) -> int:
    """Changes whenever a wait begins or ends (the folder's mtime): a cache key."""
    try:
        return os.stat(waits_dir(store)).st_mtime_ns
    except OSError:
        return 0


def current(store: Store, agents: list[str] | None = None) -> dict[str, Wait]:
    """The waits going on now, by agent (its latest when several); a file whose process
    is gone (killed mid-wait) is left out, and removed."""
    out: dict[str, Wait] = {}
    try:
        names = os.listdir(waits_dir(store))
    except OSError:
        return out
    for name in names:
        agent, dot, pid = name.rpartition(".")
        if not dot or not pid.isdigit() or (agents is not None and agent not in agents):
            continue
        full = os.path.join(waits_dir(store), name)
        try:
            with open(full, "rb") as fh:
                d = json.loads(fh.read())
            w = Wait(str(d["agent"]), str(d["holder"]), str(d["path"]), float(d["since"]), int(d["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not ours
        if not pid_alive(w.pid):
            try:
                os.unlink(full)
            except OSError:
                pass
            continue
        if agent not in out or w.since > out[agent].since:
            out[agent] = w
    return out
