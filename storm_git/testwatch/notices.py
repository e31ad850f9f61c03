"""The notices the test runner leaves for agents, and the bookkeeping that tells each
implicated agent once.

A notice is one JSON file, ``<common git dir>/storm/tests/notices/<id>.json``, its
id a digest of the test and the writes blamed, so the same finding (a round
repeated after the runner was killed) is one notice. "Told" is a file
``told/<id>.<agent>`` created with ``O_EXCL``: whichever door (the harness hook,
an MCP result, the command line) creates it first tells the agent, and no other
door ever tells it again. The doors call one function each and only translate:
:func:`take_text` (MCP, the command line), :func:`note_hook_result` (the hook).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.agents import is_valid
from .state import now, tests_dir

KINDS = ("semantic", "break")
TAIL_LINES = 12


@dataclass
class BlamedWrite:
    commit: str
    agent: str
    subject: str
    paths: list[str] = field(default_factory=list)


@dataclass
class Notice:
    """A test that passed and fails since ``writes`` landed: ``semantic`` (it passes
    with each write alone, fails with both) or ``break`` (it fails with the write alone)."""

    id: str
    test: str
    kind: str
    head: str
    tail: str
    writes: list[BlamedWrite]
    time: float = 0.0

    @property
    def agents(self) -> list[str]:
        return list(dict.fromkeys(w.agent for w in self.writes))

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), agents=self.agents)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Notice:
        return cls(id=str(d["id"]), test=str(d["test"]), kind=str(d["kind"]), head=str(d["head"]),
                   tail=str(d.get("tail", "")), writes=[BlamedWrite(**w) for w in d["writes"]],
                   time=float(d.get("time", 0.0)))

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "test": self.test, "kind": self.kind, "head": self.head,
                "writes": [w.commit[:10] for w in self.writes], "agents": self.agents}

    def text(self) -> str:
        """What an agent reads: the test, what the writes did, the failure's last lines."""
        who = "; ".join(f"{w.commit[:10]} by {w.agent} ({w.subject})" for w in self.writes)
        if self.kind == "semantic":
            head = (f"git storm watch: test {self.test} fails on the shared head {self.head[:10]}: a semantic "
                    f"conflict between {who}. It passes with each write alone and fails with both: the "
                    "agents involved should agree on a fix (one of you changes the code to fit the other's).")
        else:
            head = (f"git storm watch: test {self.test} fails on the shared head {self.head[:10]} since {who}; "
                    "it fails with that write alone: fix it or revert it.")
        tail = "\n".join(self.tail.strip().splitlines()[-TAIL_LINES:])
        return head + ("\n" + tail if tail else "")


def _dir(commondir: str, sub: str) -> str:
    return os.path.join(tests_dir(commondir), sub)


def notice_id(test: str, commits: list[str]) -> str:
    return hashlib.sha256(("\0".join([test, *commits])).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def add(commondir: str, test: str, kind: str, head: str, tail: str, writes: list[BlamedWrite]) -> Notice:
    """Leave a notice (the same finding twice is one notice, the first kept)."""
    if kind not in KINDS:
        raise ValueError(f"unknown notice kind {kind!r}")
    n = Notice(notice_id(test, [w.commit for w in writes]), test, kind, head, tail, writes, now())
    d = _dir(commondir, "notices")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, n.id + ".json")
    if os.path.exists(path):
        return load_notice(path) or n
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(n.to_dict(), fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return n


def load_notice(path: str) -> Notice | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return Notice.from_dict(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a notice that cannot be read tells nobody; `status` still lists the rest


def all_notices(commondir: str) -> list[Notice]:
    d = _dir(commondir, "notices")
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    found = [n for n in (load_notice(os.path.join(d, name)) for name in names) if n is not None]
    return sorted(found, key=lambda n: n.time)


def told(commondir: str, notice: Notice, agent: str) -> bool:
    return os.path.exists(os.path.join(_dir(commondir, "told"), f"{notice.id}.{agent}"))


def pending(commondir: str, agent: str) -> list[Notice]:
    """The notices naming ``agent`` that no door has told it yet."""
    return [n for n in all_notices(commondir) if agent in n.agents and not told(commondir, n, agent)]


def take(commondir: str, agent: str) -> list[Notice]:
    """The notices for ``agent`` not told yet, each marked told by this call alone."""
    if not os.path.isdir(_dir(commondir, "notices")):
        return []  # the common case, one stat: no runner ever found anything
    d = _dir(commondir, "told")
    out = []
    for n in pending(commondir, agent):
        os.makedirs(d, exist_ok=True)
        try:
            fd = os.open(os.path.join(d, f"{n.id}.{agent}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another door told it a moment ago
        os.close(fd)
        out.append(n)
    return out


def take_text(commondir: str | None, agent: str | None) -> str:
    """The text of the notices ``agent`` has not heard yet ("" when none), marking them
    told. Never raises: a door must not fail its call over a notice."""
    if not commondir or not agent or not is_valid(agent):
        return ""
    try:
        return "\n\n".join(n.text() for n in take(commondir, agent))
    except OSError:
        return ""


def commondir_of(cwd: str | None = None) -> str | None:
    """The common git dir of the repository at ``cwd`` (None outside one)."""
    import pygit2

    try:
        gitdir = pygit2.discover_repository(cwd or os.getcwd())
    except (KeyError, ValueError, OSError, pygit2.GitError):
        return None
    if not gitdir:
        return None
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as fh:
            rel = fh.read().strip()
        return os.path.normpath(os.path.join(gitdir, rel))
    except OSError:
        return os.path.normpath(gitdir)


def cli_text(args: list[str], cwd: str | None = None) -> str:
    """The notices for the agent a command line names (``--agent``/``-a`` or
    $STORM_AGENT), for the CLI to print on stderr after the command. The hook and the
    MCP server are doors of their own: their stderr reaches no model."""
    if args[:2] == ["harness", "hook"] or args[:1] == ["mcp"]:
        return ""
    agent = os.environ.get("STORM_AGENT")
    for i, a in enumerate(args):
        if a in ("--agent", "-a") and i + 1 < len(args):
            agent = args[i + 1]
        elif a.startswith("--agent="):
            agent = a.split("=", 1)[1]
    if not agent:
        return ""
    try:
        return take_text(commondir_of(cwd), agent)
    except Exception:  # noqa: BLE001 - the command already ran; a notice must never change its outcome
        return ""


def note_hook_result(res: Any, cwd: str | None) -> Any:
    """``res`` (a harness hook's result) with the agent's untold notices added to what
    the model reads after a tool ran (``additionalContext``, or the reason of a block)."""
    event = getattr(res, "event", None)
    if event is None or event.pre or not res.agent:
        return res
    try:
        text = take_text(commondir_of(cwd or event.cwd), res.agent)
    except Exception:  # noqa: BLE001 - the hook's own decision stands whatever happens here
        return res
    if text:
        res.message = "\n\n".join(x for x in (res.message, text) if x)
        if res.decision == "pass":
            res.decision = "note"
    return res
