"""Harness hooks: Claude Code's and Codex's own tools, recorded and validated by storm.

A harness (Claude Code, Codex CLI) runs a command before and after each tool
call with the event as JSON on stdin. ``git storm harness hook`` parses it
(:func:`parse_event`), decides (:func:`handle`) and the CLI prints what the
harness expects. The flow, per tool:

* after ``Read``: the version the agent saw is recorded in its read set (the
  shared head's blob when the disk holds it; otherwise the version the disk's
  content derives from, see :func:`post_read`), with what changed since the
  agent's previous read of the file and who changed it;
* before ``Edit``/``MultiEdit``/``Write``/``NotebookEdit`` (Codex: ``apply_patch``): the agent's
  read set is validated for those paths exactly as a write is, and a short
  *lease* (a reservation, ``storm.leaseSeconds``, default 10 s) is taken on
  them, so no other agent's write lands between the check and the tool's own
  write; or the call is denied with the rejection (diff, current content) as
  the reason, and, as with every storm rejection, what it showed now counts as
  read. A lease whose edit never ran (no post hook comes) is taken over by
  another agent after LEASE_GRACE (:func:`_never_ran`);
* after it: the file now on disk is recorded as the agent's write, validated
  against the version checked before (``expected``) and the agent's whole read
  set again (a file read may have changed while the tool ran), which also ends
  the lease;
* before and after ``Bash``: the pre-hook marks the file-system clock (or
  snapshots, as ``exec`` does), the post-hook finds the files the command
  changed and records them as one write (``Storm-Op: exec``).

The library never prints: it returns :class:`HookResult`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pygit2

from ..core import readsets, reservations
from ..core.agents import ENV_VAR, validate_agent
from ..core.convert import Conversions
from ..core.errors import BadPath, NotARepository, NotInitialised, UsageError
from ..core.files import replace_file
from ..core.locks import flocked
from ..core.paths import normalize
from ..core.payloads import DIRECT_CONFLICT, Rejection, WriteResult
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..core.store import Store, hex_
from ..disk import record, safe_fs, sync as disk_sync
from ..storm import rejection as rejection_payload, tracking, validate
from . import shell_reads

if TYPE_CHECKING:  # pragma: no cover
    from ..storm.workspace import SharedWorkspace

HARNESSES = ("claude", "codex")
EDIT_TOOLS = ("Edit", "MultiEdit", "Write", "NotebookEdit")  # NotebookEdit: a .ipynb cell, written whole
PATCH_TOOLS = ("apply_patch",)
READ_TOOLS = ("Read",)
SHELL_TOOLS = ("Bash",)
DEFAULT_LEASE_SECONDS = 10.0
LEASE_GRACE = 1.0  # after this, a lease whose edit left the disk untouched is taken to have never run
DEFAULT_WAIT_SECONDS = 20.0  # a hook's whole run must stay well under the harness's timeout (60 s)
PENDING_MAX_AGE = 3600.0
OP = "harness"

# decisions
PASS = "pass"  # nothing to say: the harness goes on as without storm
DENY = "deny"  # PreToolUse: the tool does not run; the reason goes to the model
BLOCK = "block"  # PostToolUse: the tool ran but storm refused to record it; tell the model
NOTE = "note"  # PostToolUse: recorded, with something the model should know


class BadEvent(UsageError):
    """The hook's stdin is not an event this hook understands."""

    kind = "bad_event"


@dataclass
class HookEvent:
    """One hook call, as Claude Code and Codex send it."""

    harness: str
    event: str  # PreToolUse, PostToolUse, PostToolUseFailure
    tool: str
    tool_input: dict[str, Any]
    session_id: str
    cwd: str
    tool_use_id: str | None = None
    subagent: str | None = None  # agent_id, when a subagent made the call
    tool_response: Any = None

    @property
    def pre(self) -> bool:
        return self.event == "PreToolUse"

    @property
    def failed(self) -> bool:
        return self.event == "PostToolUseFailure"


@dataclass
class HookResult:
    """What storm decided, for the CLI to print in the harness's format."""

    decision: str
    event: HookEvent | None
    action: str  # what storm did: recorded-read, leased, recorded-write, ...
    agent: str | None = None
    paths: list[str] = field(default_factory=list)
    rejection: Rejection | None = None
    write: WriteResult | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "action": self.action, "agent": self.agent, "paths": self.paths,
                "message": self.message,
                "rejection": self.rejection.to_dict() if self.rejection else None,
                "write": self.write.to_dict() if self.write else None}


# -- parsing ------------------------------------------------------------------------
def parse_event(text: str | bytes, harness: str = "claude") -> HookEvent:
    """The event on the hook's stdin; BadEvent (one line) when it is not one."""
    if harness not in HARNESSES:
        raise BadEvent(f"unknown harness {harness!r}", hint=f"one of {', '.join(HARNESSES)}")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadEvent(f"the hook event on stdin is not JSON ({exc})",
                       hint="the harness pipes one JSON object per call") from None
    if not isinstance(data, dict):
        raise BadEvent("the hook event on stdin is not a JSON object")
    name = data.get("hook_event_name")
    tool = data.get("tool_name")
    if not isinstance(name, str) or not isinstance(tool, str):
        raise BadEvent("the hook event has no hook_event_name or tool_name",
                       hint="install the hook on PreToolUse/PostToolUse only (git storm harness install)")
    tool_input = data.get("tool_input")
    if not isinstance(tool_input, dict):
        tool_input = {"command": tool_input} if isinstance(tool_input, str) else {}
    cwd = data.get("cwd") if isinstance(data.get("cwd"), str) else os.getcwd()
    sub = data.get("agent_id")
    return HookEvent(harness, name, tool, tool_input, str(data.get("session_id") or ""), cwd,
                     data.get("tool_use_id") if isinstance(data.get("tool_use_id"), str) else None,
                     sub if isinstance(sub, str) and sub else None, data.get("tool_response"))


_PATCH_LINE = re.compile(r"^\*\*\* (Update File|Add File|Delete File|Move to): (.+?)\s*$")


def patch_paths(patch: str) -> list[str]:
    """Every path an ``apply_patch`` text touches (updated, added, deleted, moved to),
    in order, without duplicates."""
    out: list[str] = []
    for line in patch.splitlines():
        m = _PATCH_LINE.match(line)
        if m:
            out.append(m.group(2))
    return list(dict.fromkeys(out))


def _slug(text: str, n: int) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", text)[:n]


SESSION_CHARS = 32  # a UUID's 32 hex digits: the whole id, whatever version


def session_slug(session_id: str) -> str:
    """The session's part of an agent id: all its letters and digits (a UUID's 32),
    or, for a longer id, 20 of them and 12 hex digits of a hash of the whole id.
    Never a prefix alone: Codex's session ids are UUIDv7, whose first 12 digits are
    the start time in milliseconds, shared by sessions started together."""
    slug = _slug(session_id, len(session_id))
    if len(slug) <= SESSION_CHARS:
        return slug
    return slug[:20] + hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def agent_for(event: HookEvent, explicit: str | None = None, env: dict[str, str] | None = None) -> str:
    """The storm agent of a hook call: ``--agent``, else ``$STORM_AGENT``, else
    ``<harness>-<session_slug(session_id)>``; a call made by a subagent (``agent_id``
    in the event) gets ``<that>-sub-<12 of agent_id>``, since a subagent works
    concurrently and needs a read set of its own."""
    env = os.environ if env is None else env
    base = explicit or env.get(ENV_VAR) or ""
    if not base:
        sid = session_slug(event.session_id)
        if not sid:
            raise BadEvent("no agent id: the event has no session_id and neither --agent nor "
                           f"{ENV_VAR} is set", hint="install with --agent ID or start the harness with "
                                                     f"{ENV_VAR}=ID")
        base = f"{event.harness}-{sid}"
    if event.subagent:
        base = f"{base[:44]}-sub-{_slug(event.subagent, 12) or 'x'}"
    return validate_agent(base)


# -- paths ----------------------------------------------------------------------------
def repo_path(store: Store, raw: Any, cwd: str, *, for_write: bool = False) -> str | None:
    """The repository path of the file a tool's argument names, or None when storm
    does not manage it (outside the shared working tree, or in git's own directory
    for a read). A write into git's own directory (its hooks, its config) is refused
    with BadPath, as storm's own writes refuse it.
    A name no file can have (a NUL, bytes that are not UTF-8) or one storm refuses
    inside the tree raises BadPath: the hook refuses the call rather than let the
    tool run unchecked. Symbolic links are followed, the last one too: the
    harnesses' file tools read and write the file a link names (CLAUDE.md ->
    AGENTS.md), so that file is what is validated and recorded."""
    if not isinstance(raw, str) or not raw:
        return None
    shown = raw.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace") \
        if not _encodable(raw) else raw
    if "\0" in raw or not _encodable(raw):
        raise BadPath(f"{shown!r} is not a usable file name (a NUL byte or bytes that are not UTF-8)",
                      hint="name the file in plain UTF-8 text")
    full = raw if os.path.isabs(raw) else os.path.join(cwd, raw)
    top = os.path.realpath(store.main_workdir)
    real = os.path.realpath(full)
    if real != top and not real.startswith(top + os.sep):
        return None
    rel = os.path.relpath(real, top).replace(os.sep, "/")
    if rel == ".git" or rel.startswith(".git/"):
        if for_write:
            raise BadPath(f"{rel} is inside git's own directory: an agent's edit there (a hook, the config) "
                          "is refused", hint="edit files of the working tree; git's directory is not shared state")
        return None  # git's own files: not storm's to version
    return normalize(rel)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raw_paths(event: HookEvent) -> list[str]:
    """The file names a file tool's input holds, as given."""
    inp = event.tool_input
    if event.tool in PATCH_TOOLS:
        text = next((v for k in ("command", "patch", "input") if isinstance(v := inp.get(k), str)), "")
        return patch_paths(text)
    raw = inp.get("file_path") or inp.get("notebook_path") or inp.get("path")
    return [raw] if isinstance(raw, str) and raw else []


def tool_paths(store: Store, event: HookEvent) -> list[str]:
    """The managed paths a file tool names."""
    raws = _raw_paths(event)
    write = event.tool not in READ_TOOLS
    return list(dict.fromkeys(p for p in (repo_path(store, r, event.cwd, for_write=write) for r in raws) if p))


def shell_command(event: HookEvent) -> str:
    cmd = event.tool_input.get("command")
    if isinstance(cmd, list):
        return " ".join(str(c) for c in cmd)
    return cmd if isinstance(cmd, str) else ""


# -- pending state between a pre and a post hook (two processes) -------------------------
def _pending_file(store: Store, agent: str, event: HookEvent, paths: list[str]) -> str:
    key = event.tool_use_id or "\0".join([event.tool, *paths])
    d = os.path.join(store.commondir, "storm", "harness", "pending", agent)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest() + ".json")


def _save_pending(path: str, data: dict[str, Any]) -> None:
    d = os.path.dirname(path)
    now = time.time()
    for name in os.listdir(d):  # a pre hook whose tool never ran leaves one behind
        full = os.path.join(d, name)
        try:
            if now - os.stat(full).st_mtime > PENDING_MAX_AGE:
                os.unlink(full)
        except OSError:
            pass
    replace_file(path, json.dumps(data).encode("utf-8"), tmp=f"{path}.{os.getpid()}")


def _take_pending(path: str) -> dict[str, Any] | None:
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


# -- the decisions ---------------------------------------------------------------------
def handle(event: HookEvent, *, agent: str | None = None, cwd: str | None = None,
           env: dict[str, str] | None = None) -> HookResult:
    """Decide what storm does with one hook call."""
    from ..api import open_workspace
    from ..storm.workspace import SharedWorkspace

    kind = ("read" if event.tool in READ_TOOLS else "write" if event.tool in EDIT_TOOLS + PATCH_TOOLS
            else "shell" if event.tool in SHELL_TOOLS else None)
    if kind is None:
        return HookResult(PASS, event, "not-a-storm-tool")
    if kind == "read" and event.pre:
        return HookResult(PASS, event, "nothing-before-a-read")
    try:
        ws = open_workspace(cwd or event.cwd)
    except (NotARepository, NotInitialised):
        return HookResult(PASS, event, "not-a-storm-repository")
    if not isinstance(ws, SharedWorkspace):
        # worktree mode: the agent works alone in its worktree; isolation is the protection,
        # and the radar tells it, once, of another branch's change to a file it just used
        return _radar_note(ws, event, kind, agent, env)
    who = agent_for(event, agent, env)
    if event.session_id and (agent or (env if env is not None else os.environ).get(ENV_VAR)):
        ws.begin_task(who, f"{event.harness} session {event.session_id}")  # a named agent's new session
    if kind == "shell":
        return pre_shell(ws, who, event) if event.pre else post_shell(ws, who, event)
    paths = tool_paths(ws.store, event)
    if not paths:
        return HookResult(PASS, event, "outside-the-shared-tree", who)
    if kind == "read":
        return post_read(ws, who, event, paths)
    if event.pre:
        return pre_write(ws, who, event, paths)
    if event.failed:
        if _release(ws.store, who, paths):
            ws.publish_reservations()
        _take_pending(_pending_file(ws.store, who, event, paths))
        return HookResult(PASS, event, "released-after-a-failed-tool", who, paths)
    return post_write(ws, who, event, paths)


def _radar_note(ws: Any, event: HookEvent, kind: str, agent: str | None, env: dict[str, str] | None) -> HookResult:
    """Worktree mode: after a read or an edit, the radar's news about those files."""
    from ..worktree import radar
    from ..worktree.worktrees import agent_of_worktree

    if event.pre or kind == "shell":
        return HookResult(PASS, event, "worktree-mode")
    store = ws.store
    who = agent_of_worktree(store) or (agent_for(event, agent, env) if (agent or (env or os.environ).get(ENV_VAR))
                                       else None)
    if not who:
        return HookResult(PASS, event, "worktree-mode")
    top = os.path.realpath(store.top)
    paths = []
    for raw in _raw_paths(event):
        full = os.path.realpath(os.path.join(event.cwd or top, raw))
        rel = os.path.relpath(full, top)
        if not rel.startswith(".."):
            paths.append(rel.replace(os.sep, "/"))
    note = radar.hook_note(store, who, paths) if paths else ""
    return HookResult(NOTE if note else PASS, event, "radar" if note else "worktree-mode", who, paths, message=note)


def post_read(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    """Record what the agent saw on disk.

    * the disk holds the shared head's version: a read at the head;
    * the disk holds the version storm last put there but the head moved on
      (*behind*): the agent saw that older shared version, which is recorded
      (its next write of the file is a direct conflict with the diff), and the
      disk is brought forward so that reading again shows the head;
    * the disk holds an edit made outside storm: the version that edit was made
      on is recorded, as ``adopt`` does; the agent built on the edit, so its
      write carries the edit along and is validated against that base (never
      undoing a newer accepted write).
    """
    store = ws.store
    top = store.main_workdir
    entries = []
    before = readsets.load(store, agent)
    news: list[str] = []
    with flocked(store.commondir, "worktree"):
        rtree, _ = disk_sync.record_tree(store)
        head = ws.head()
        tree = store.commit(head).tree
        behind, unmediated = [], []
        conv = Conversions(store)
        for p in paths:
            have = safe_fs.disk_state(top, p, conv=conv)
            if have is False:
                continue  # a directory (or a path through a link): nothing storm versions
            cur = record.entry_or_none(store, tree, p)
            base = record.entry_or_none(store, rtree, p)
            if safe_fs.same(have, cur):
                entries.append(ReadEntry(p, hex_(cur.oid) if cur else None, str(head)))
                seen = before.get(p)
                if seen is not None and seen.blob != (hex_(cur.oid) if cur else None):
                    news.append(_news(ws, p, seen, cur, head))
            else:
                entries.append(ReadEntry(p, hex_(base.oid) if base else None, ""))
                (behind if safe_fs.same(have, base) else unmediated).append(p)
        if behind:
            disk_sync.sync_locked(store, behind)
    if entries:
        readsets.record(store, agent, entries, why="harness read")
    notes = list(news)
    if behind:
        notes.append(f"storm: you read an older version of {', '.join(behind)}; the file on disk is now the "
                     "shared head's: read it again before editing it")
    edited = [p for p in unmediated if p not in behind]
    if edited:
        notes.append(f"storm: {', '.join(edited)} on disk holds an edit made outside storm; an edit of yours "
                     "records it as part of your write (git storm status shows it; git storm checkout PATH "
                     "discards it)")
    return HookResult(NOTE if notes else PASS, event, "recorded-read", agent, paths, message="\n".join(notes))


NEWS_MAX_CHARS = 6000


def _news(ws: "SharedWorkspace", path: str, seen: ReadEntry, cur: Any, head: Any) -> str:
    """What changed in ``path`` since the agent's previous read, and who changed it: the
    diff and the authors a rejection would have shown. The harness may have refused the
    agent's stale edit itself (Claude Code's "modified since read" check runs before any
    hook), so a re-read is where the agent learns what happened."""
    change = rejection_payload.file_change(ws, path, seen, cur, head)
    by = ", ".join(change.changed_by) or "another agent"
    versions = f"{change.versions_behind} version(s)" if change.versions_behind else "changed"
    diff = "(binary file)" if change.binary else change.diff
    if len(diff) > NEWS_MAX_CHARS:
        diff = diff[:NEWS_MAX_CHARS] + "\n… (diff cut; git storm log shows each write)"
    return (f"storm: {path} changed since your previous read ({versions}, by {by}); what they changed:\n"
            f"{diff}".rstrip())


def _lease_seconds(store: Store) -> float:
    return store.config_float("storm.leaseSeconds", DEFAULT_LEASE_SECONDS)


def pre_write(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    """Validate the agent's read set for ``paths`` and lease them, or deny."""
    store = ws.store
    ws.catch_up(agent)  # on a remote: validate and lease against the server's head
    content = event.tool_input.get("content")
    if event.tool == "Write" and isinstance(content, str):  # refused before it lands, not after
        ws.check_size(paths[0], content.encode("utf-8", "surrogateescape"))
    if event.harness == "codex":
        # Codex reads through the shell, which the hook cannot see: the patch's own
        # context lines are its read of each target it has not read otherwise.
        known = readsets.load(store, agent)
        head = ws.head()
        tree = store.commit(head).tree
        implicit = [ReadEntry(p, hex_(getattr(record.entry_or_none(store, tree, p), "oid", None)), str(head))
                    for p in paths if p not in known]
        if implicit:
            readsets.record(store, agent, implicit, why="harness patch context")
    reads = readsets.load(store, agent)
    lease = _lease_seconds(store)
    hold = ws.reservation_seconds
    deadline = time.monotonic() + store.config_float("storm.harnessWaitSeconds", DEFAULT_WAIT_SECONDS)
    granted: Reservation | None = None
    while True:
        with flocked(store.commondir, "workspace"):
            head = ws.head()
            tree = store.commit(head).tree
            now = reservations.clock()
            chk = validate.check(store, agent, paths, now,
                                 lambda tree=tree: validate.verdict(store, tree, paths, reads, dict(reads), None, {}),
                                 ignore=lambda r, now=now: _never_ran(store, r, now))
            verdict = chk.verdict
            if chk.blocked is None and verdict.reason is None:
                reservations.update(store, {p: Reservation(p, agent, now + lease, now) for p in paths},
                                    agent=agent, message=f"storm: {agent} leases {', '.join(paths[:3])}")
                expected = {p: hex_(verdict.current[p].oid) if verdict.current[p] else None for p in paths}
                _save_pending(_pending_file(store, agent, event, paths),
                              {"kind": "write", "paths": paths, "expected": expected, "head": str(head),
                               "time": time.time(), "since": now,
                               "tool_use_id": event.tool_use_id,
                               "disk": {p: _encode_state(safe_fs.disk_state(store.main_workdir, p))
                                        for p in paths}})
                break
            if chk.blocked is None:
                granted = validate.refuse(store, agent, OP, paths, verdict, head, now, hold)
                break
            if time.monotonic() >= deadline:
                verdict = validate.refuse_reserved(store, agent, OP, paths, chk.blocked, head, tree)
                granted = chk.blocked
                break
        time.sleep(min(0.1, max(0.01, chk.blocked.remaining())))
    ws.publish_reservations()  # the lease, or the rejected agent's reservation
    if verdict.reason is None:
        return HookResult(PASS, event, "validated-and-leased", agent, paths)
    change = None
    if verdict.reason == DIRECT_CONFLICT and len(paths) == 1:
        seen = reads.get(verdict.conflicts[0])
        base = ws.agent_content(seen.path, pygit2.Oid(hex=seen.blob), None) if seen and seen.blob else None
        change = intended_content(event, base)
    rejection = validate.reject(ws, agent, OP, verdict, head, reads, granted, change)
    return HookResult(DENY, event, "denied", agent, paths, rejection=rejection)


def intended_content(event: HookEvent, base: bytes | None) -> bytes | None:
    """What a Write or an Edit would make of the version the agent read (``base``), from
    the tool's input alone; None where that cannot be told (a patch, a missing text)."""
    inp = event.tool_input
    if event.tool == "Write" and isinstance(inp.get("content"), str):
        return inp["content"].encode("utf-8", "surrogatepass")
    old, new = inp.get("old_string"), inp.get("new_string")
    if event.tool != "Edit" or base is None or not isinstance(old, str) or not isinstance(new, str) or not old:
        return None
    try:
        text = base.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if old not in text:
        return None
    return text.replace(old, new, -1 if inp.get("replace_all") else 1).encode("utf-8")


def _never_ran(store: Store, lease: Reservation, now: float) -> bool:
    """A harness lease whose edit never ran: its pre hook's record is over LEASE_GRACE
    old and every file it leased is still as it was on disk then. The harness sends
    no post hook when that happens (Codex after a failed ``apply_patch``; Claude Code
    when it refuses an edit its pre hook allowed), and the lease would hold another
    session's edit for the whole lease. Taking it over is safe even if the edit does
    run later: that post hook validates against the version checked before, so it is
    refused (with the diff) rather than undo the newer write. A reservation from a
    rejection has no such record and is always kept."""
    if now - lease.since < LEASE_GRACE:
        return False
    d = os.path.join(store.commondir, "storm", "harness", "pending", lease.holder)
    try:
        names = os.listdir(d)
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(d, name), encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if (not isinstance(rec, dict) or rec.get("kind") != "write" or lease.path not in (rec.get("paths") or [])
                or rec.get("since") != lease.since or not isinstance(rec.get("disk"), dict)):
            continue
        return all(_encode_state(safe_fs.disk_state(store.main_workdir, p)) == rec["disk"].get(p, 0)
                   for p in rec["paths"])
    return False


def _release(store: Store, agent: str, paths: list[str]) -> bool:
    """End the agent's own leases on ``paths`` (never another agent's); whether any ended."""
    with flocked(store.commondir, "workspace"):
        mine = [p for p in paths if (r := reservations.get(store, p)) is not None and r.holder == agent]
        if mine:
            reservations.update(store, {p: None for p in mine}, agent=agent,
                                message=f"storm: {agent} lease ends on {', '.join(mine[:3])}")
    return bool(mine)


def post_write(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    """Record the files the tool left on disk as the agent's write, validated against
    the versions checked before it ran (without a pre hook: the disk record's, as adopt)
    and against the agent's whole read set again: a file it read may have changed
    while the tool ran (its lease covers only the files it edits), and a write built
    on a stale read must not land."""
    try:
        return _post_write(ws, agent, event, paths)
    except BaseException:
        if _release(ws.store, agent, paths):  # the refusal goes to the model; the lease must not outlive it
            ws.publish_reservations()
        raise


def _post_write(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    store = ws.store
    pending = _take_pending(_pending_file(store, agent, event, paths)) or {}
    expected_before = pending.get("expected") if isinstance(pending.get("expected"), dict) else {}
    top = store.main_workdir
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with flocked(store.commondir, "worktree"):
        rtree, _ = disk_sync.record_tree(store)
        tree = store.commit(ws.head()).tree
        conv = Conversions(store)
        for p in paths:
            have = safe_fs.disk_state(top, p, conv=conv)
            if safe_fs.same(have, record.entry_or_none(store, tree, p)) or have is False:
                continue  # nothing new (or a directory: not a file storm records)
            tracking.check_recordable(store, p, have, ws)
            content = tracking.read_disk_content(store, p) if have is not None else None
            if content is not None:
                ws.check_size(p, content)
            changes[p] = tracking.with_mode(content, have, record.entry_or_none(store, rtree, p))
            expected[p] = (expected_before[p] if p in expected_before
                           else hex_(getattr(record.entry_or_none(store, rtree, p), "oid", None)))
    if not changes:
        if _release(store, agent, paths):
            ws.publish_reservations()
        return HookResult(PASS, event, "nothing-changed", agent, paths)
    # deps=None: the whole read set, as the pre hook validated it (expected covers the targets)
    res = ws.apply(agent, changes, intent=_intent(agent, event, list(changes)), deps=None, wait=True, op=OP,
                   expected=expected)
    if _release(store, agent, [p for p in paths if p not in changes]):
        ws.publish_reservations()
    if res.accepted:
        flagged = [f for f in res.flags]
        note = f"storm: recorded, flagged {', '.join(flagged)}" if flagged else ""
        return HookResult(NOTE if flagged else PASS, event, "recorded-write", agent, list(changes), write=res,
                          message=note)
    if _release(store, agent, [p for p in paths if p in changes and p != getattr(res.rejection, "path", None)]):
        ws.publish_reservations()
    return HookResult(BLOCK, event, "write-rejected", agent, list(changes), rejection=res.rejection, write=res)


def _intent(agent: str, event: HookEvent, paths: list[str]) -> str:
    what = {"Write": "writes", "apply_patch": "patches"}.get(event.tool, "edits")
    return f"{agent} {what} {', '.join(paths[:3])}" + (" …" if len(paths) > 3 else "") + f" ({event.tool})"


# -- Bash ---------------------------------------------------------------------------------
def _encode_state(v: Any) -> Any:
    return [str(v[0]), v[1]] if isinstance(v, tuple) else v


def _decode_state(v: Any) -> Any:
    return (pygit2.Oid(hex=v[0]), v[1]) if isinstance(v, list) else v


def pre_shell(ws: "SharedWorkspace", agent: str, event: HookEvent) -> HookResult:
    """Before a shell command: what ``exec`` does before running it (clock mark, or a
    full snapshot without a usable clock), saved for the post hook."""
    store = ws.store
    dev = os.stat(store.main_workdir).st_dev
    with flocked(store.commondir, "worktree"):
        ws.head()
        disk_sync.sync_locked(store, full=True)  # behind paths forward: they are not the command's
        start, _ = disk_sync.record_tree(store)
        use_clock = str(store.config_get("storm.execClock", "true")).lower() not in ("false", "no", "off", "0")
        mark = tracking.clock_mark(store, dev) if use_clock else None
        before = tracking.snapshot(store) if mark is None else None
        missing = tracking.load_missing(store) if mark is not None else None
    data: dict[str, Any] = {"kind": "shell", "start": str(start.id), "mark": mark, "time": time.time(),
                            "missing": sorted(missing) if missing is not None else None}
    if before is not None:
        data["before"] = {"head": str(before.head), "record": str(before.record.id),
                          "dirty": {p: _encode_state(v) for p, v in before.dirty.items()}}
    # the edits already on disk (a person's): never credited to the agent whose command ran
    with flocked(store.commondir, "worktree"):
        edited = (before or tracking.snapshot(store)).dirty
    data["edited"] = {p: _encode_state(v) for p, v in edited.items()}
    _save_pending(_pending_file(store, agent, event, []), data)
    # the files the command shows are read, as they are now (before it runs): the safe side
    reads = shell_reads.read_paths(event.tool_input.get("command"), event.cwd,
                                   lambda raw, cwd: repo_path(store, raw, cwd))
    if reads:
        post_read(ws, agent, event, reads)
    return HookResult(PASS, event, "snapshot-taken", agent)


def post_shell(ws: "SharedWorkspace", agent: str, event: HookEvent) -> HookResult:
    """After a shell command: the files it changed, recorded as one write (exec's
    classification); paths leased by another agent (its edit between its own pre
    and post hooks) are that agent's and left to it."""
    store = ws.store
    pending = _take_pending(_pending_file(store, agent, event, []))
    if not pending or pending.get("kind") != "shell":
        return HookResult(NOTE, event, "no-snapshot", agent,
                          message="storm: no snapshot was taken before this command, so its changes were not "
                                  "recorded; git storm status lists them, git storm adopt PATH records them")
    left: list[str] = []
    with flocked(store.commondir, "worktree"):
        after = tracking.snapshot(store)
        start = store.repo[pygit2.Oid(hex=pending["start"])]
        if pending.get("mark") is not None:
            missing = set(pending["missing"]) if pending.get("missing") is not None else None
            changes, expected = tracking.classify_since(store, start, int(pending["mark"]), missing, after)
        else:
            b = pending["before"]
            before = tracking.Snapshot(pygit2.Oid(hex=b["head"]), after.tree, store.repo[pygit2.Oid(hex=b["record"])],
                                       {p: _decode_state(v) for p, v in b["dirty"].items()})
            changes, expected = tracking.classify(store, before, after)
        now = reservations.clock()
        for p in list(changes):
            r = reservations.get(store, p, now)
            if r is not None and r.holder != agent:
                left.append(p)
                del changes[p], expected[p]
        edited = pending.get("edited") if isinstance(pending.get("edited"), dict) else {}
        mixed = []
        for p in [p for p in changes if p in edited]:
            if after.dirty.get(p) != _decode_state(edited[p]):
                mixed.append(p)  # the command changed it too: its change cannot be told from that edit
            del changes[p]
            expected.pop(p, None)
        for p in changes:
            tracking.check_recordable(store, p, after.dirty.get(p), ws)
        reverted = tracking.revert_targets(store, after.head, start, after, expected)
    for p, change in changes.items():
        content = change[0] if isinstance(change, tuple) else None
        if content is not None:
            ws.check_size(p, content)
    note = (f"storm: {', '.join(left)} changed while another agent held it; not recorded as yours"
            if left else "")
    if mixed:
        note = "\n".join(x for x in (note, (
            f"storm: {', '.join(mixed)} held an edit made outside storm before this command, and the command "
            "changed it too; not recorded as yours (git storm status shows it: record the earlier edit as its "
            "author's with git storm adopt PATH --agent NAME, or drop it with git storm checkout PATH, then run "
            "the command again)")) if x)
    if not changes:
        return HookResult(NOTE if note else PASS, event, "no-file-changed", agent, message=note)
    command = shell_command(event)
    command = command if len(command) <= 100 else command[:97] + "..."
    res = ws.apply(agent, changes, intent=f"{agent} {event.tool}: {command}", deps=None, wait=True,
                   op="exec", expected=expected)
    if res.accepted:
        flagged = f"storm: recorded, flagged {', '.join(res.flags)}" if res.flags else ""
        note = "; ".join(x for x in (note, flagged) if x)
        return HookResult(NOTE if note else PASS, event, "recorded-write", agent, list(changes), write=res,
                          message=note)
    if reverted:
        from .. import render

        note = "\n".join(x for x in (note, "storm: " + render.reverted_by_command(reverted)) if x)
    return HookResult(BLOCK, event, "write-rejected", agent, list(changes), rejection=res.rejection, write=res,
                      message=note)


def hook(stdin: str | bytes, *, harness: str = "claude", agent: str | None = None,
         env: dict[str, str] | None = None) -> HookResult:
    """Parse and handle one event (what ``git storm harness hook`` runs)."""
    from ..testwatch.notices import note_hook_result

    return note_hook_result(handle(parse_event(stdin, harness), agent=agent, env=env), None)

