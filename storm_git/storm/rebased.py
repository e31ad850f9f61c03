"""The rejected agent's own change, re-applied on today's version: a re-plan it may accept.

A ``direct_conflict`` means the target changed since the agent read it. Most such
changes do not touch the lines the agent changed; re-reading, re-planning and
regenerating the edit then costs an LLM agent a round trip for nothing. The
rejection therefore carries the agent's edit (from the version it read to what it
tried to write) three-way merged onto the current version, clean or with conflict
markers, with the hunks of the other agents' change that it crosses. Nothing is
merged without the agent's word: accepting it (``git storm write --rebased``, the
MCP tools' ``rebased`` argument) is an ordinary validated write, rejected again if
anything moved since.

The offer is kept per agent in ``<git dir>/storm/rebased/<agent>.json`` (path ->
content) until it is used or replaced by a newer rejection of that path.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..core.diffs import unified
from ..core.errors import UsageError
from ..core.files import read_own, replace_file
from ..core.locks import flocked
from ..core.readsets import agent_lock
from ..core.store import Store, git_env

MARKERS = (b"<<<<<<< ", b"=======", b">>>>>>> ")


class Edited(bytes):
    """An ``edit``'s new content that remembers the replacement it made: its rebased
    offer is the replacement made again on the current version, when ``old`` still
    occurs there exactly once (a line-based merge would see a neighbour's change as
    crossing it)."""

    old: bytes
    new: bytes

    def __new__(cls, content: bytes, old: bytes, new: bytes) -> Edited:
        obj = super().__new__(cls, content)
        obj.old, obj.new = old, new
        return obj


@dataclass
class Rebased:
    """The agent's change merged onto the current version of ``path``."""

    path: str
    clean: bool
    content: bytes
    conflicts: int  # conflict regions (0 when clean)
    read_version: str | None
    current_version: str | None
    crossed: list[str] = field(default_factory=list)  # the others' hunks the agent's change overlaps

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "clean": self.clean, "content": self.content.decode("utf-8"),
                "conflicts": self.conflicts, "crossed": self.crossed,
                "read_version": self.read_version, "current_version": self.current_version}


def _text(data: bytes | None) -> bool:
    if data is None or b"\x00" in data[:8000]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def merge(path: str, base: bytes, mine: bytes, current: bytes, *, read_version: str | None,
          current_version: str | None) -> Rebased | None:
    """``current`` plus the change ``base`` -> ``mine`` (an edit's replacement made
    again, else git merge-file); None for binary or non-UTF-8 content, or when the
    agent changed nothing."""
    if not (_text(base) and _text(mine) and _text(current)) or base == mine:
        return None
    if isinstance(mine, Edited) and current.count(mine.old) == 1:
        again = current.replace(mine.old, mine.new, 1)
        return Rebased(path, True, again, 0, read_version, current_version,
                       crossed(path, base, mine, current))
    with tempfile.TemporaryDirectory(prefix="storm-rebase-") as d:
        files = []
        for name, data in (("current", current), ("read", base), ("yours", mine)):
            full = os.path.join(d, name)
            with open(full, "wb") as fh:
                fh.write(data)
            files.append(full)
        r = subprocess.run(["git", "merge-file", "-p", "-L", f"current ({(current_version or 'absent')[:10]})",
                            "-L", f"read ({(read_version or 'absent')[:10]})", "-L", "yours", *files],
                           capture_output=True, env=git_env())
    if r.returncode < 0 or r.returncode > 127:
        return None  # git could not merge (an error, not conflicts): no offer
    return Rebased(path, r.returncode == 0, r.stdout, r.returncode, read_version, current_version,
                   crossed(path, base, mine, current))


def crossed(path: str, base: bytes, mine: bytes, current: bytes) -> list[str]:
    """The hunks of ``base`` -> ``current`` (the others' change) whose lines overlap or
    touch lines the agent changed (``base`` -> ``mine``), as unified-diff hunks."""
    from unidiff import PatchSet  # only a direct_conflict pays for it, not every write's start-up

    def hunks(new: bytes) -> list[Any]:
        text = unified(path, base, new, context=0)
        return list(PatchSet(text)[0]) if text.strip() else []

    ours = [(h.source_start, h.source_start + max(h.source_length, 1)) for h in hunks(mine)]
    out = []
    for h in hunks(current):
        lo, hi = h.source_start, h.source_start + max(h.source_length, 1)
        if any(lo <= b_hi and a_lo <= hi for a_lo, b_hi in ours):
            out.append(str(h).rstrip("\n"))
    return out


# -- the offer, kept until the agent takes it ------------------------------------------
def _file(store: Store, agent: str) -> str:
    return os.path.join(store.commondir, "storm", "rebased", f"{agent}.json")


def _load(path: str) -> dict[str, Any]:
    try:
        raw = read_own(path)
        data = json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def keep(store: Store, agent: str, offer: Rebased) -> None:
    """Remember ``offer`` as the agent's rebased change of its path (replacing an older one)."""
    path = _file(store, agent)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with flocked(store.commondir, agent_lock(agent)):
        data = _load(path)
        data[offer.path] = {"clean": offer.clean, "content": base64.b64encode(offer.content).decode("ascii"),
                            "current_version": offer.current_version}
        replace_file(path, json.dumps(data, sort_keys=True).encode(), tmp=f"{path}.{os.getpid()}")


def take(store: Store, agent: str, path: str) -> tuple[bytes, str | None]:
    """The content of the agent's rebased change of ``path`` and the version of the file
    it was made on (exit 2 when there is none, or when it holds conflict markers:
    those need the agent's own resolution)."""
    with flocked(store.commondir, agent_lock(agent)):
        entry = _load(_file(store, agent)).get(path)
    if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
        raise UsageError(f"{agent} has no rebased change of {path} to accept",
                         hint="a direct_conflict rejection of a text file offers one; write the file yourself "
                              "otherwise")
    try:
        content = base64.b64decode(entry["content"], validate=True)
    except ValueError:
        raise UsageError(f"the rebased change of {path} kept for {agent} is unreadable",
                         hint="write the file yourself (its current content counts as read)") from None
    if not entry.get("clean"):
        raise UsageError(f"the rebased change of {path} has conflict markers: the two changes cross",
                         hint="resolve them in the content the rejection showed and write the result "
                              "(the current version counts as read)")
    current = entry.get("current_version")
    return content, current if isinstance(current, str) else None


def drop(store: Store, agent: str, path: str) -> None:
    """Forget the offer for ``path`` (taken, or the agent wrote the file itself)."""
    file = _file(store, agent)
    if not os.path.exists(file):
        return
    with flocked(store.commondir, agent_lock(agent)):
        data = _load(file)
        if data.pop(path, None) is not None:
            replace_file(file, json.dumps(data, sort_keys=True).encode(), tmp=f"{file}.{os.getpid()}")
