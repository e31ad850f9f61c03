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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.agents import ENV_VAR, validate_agent
from ..core.errors import BadPath, NotARepository, NotInitialised, UsageError
from ..core.paths import normalize
from ..core.payloads import Rejection, WriteResult
from ..core.store import Store
from ..storm import commands, edits
from . import shell_reads

if TYPE_CHECKING:  # pragma: no cover
    from ..storm.workspace import SharedWorkspace

HARNESSES = ("claude", "codex")
EDIT_TOOLS = ("Edit", "MultiEdit", "Write", "NotebookEdit")  # NotebookEdit: a .ipynb cell, written whole
PATCH_TOOLS = ("apply_patch",)
READ_TOOLS = ("Read",)
SHELL_TOOLS = ("Bash",)

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
    raw_cwd = data.get("cwd")
    cwd = raw_cwd if isinstance(raw_cwd, str) else os.getcwd()
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
    environ = os.environ if env is None else env
    base = explicit or environ.get(ENV_VAR) or ""
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


def _repo_dir(store: Store, cwd: str) -> str:
    """The command's directory as a repository path ('' at the top or outside)."""
    top = os.path.realpath(store.main_workdir)
    real = os.path.realpath(cwd)
    if not real.startswith(top + os.sep):
        return ""
    return os.path.relpath(real, top).replace(os.sep, "/")


def shell_command(event: HookEvent) -> str:
    cmd = event.tool_input.get("command")
    if isinstance(cmd, list):
        return " ".join(str(c) for c in cmd)
    return cmd if isinstance(cmd, str) else ""


# -- the step a pre hook opens and its post hook closes (two processes) --------------------
def step_key(event: HookEvent, paths: list[str]) -> str:
    """The open step of one tool call: its tool_use_id, else its tool and paths."""
    return event.tool_use_id or "\0".join([event.tool, *paths])


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
        edits.abandon_edit(ws, who, paths, key=step_key(event, paths))
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
    """Record what the agent saw on disk (storm_git.storm.edits.note_disk_read) and
    tell it what changed since its previous read."""
    seen = edits.note_disk_read(ws, agent, paths)
    notes = list(seen.news)
    if seen.behind:
        notes.append(f"storm: you read an older version of {', '.join(seen.behind)}; the file on disk is now the "
                     "shared head's: read it again before editing it")
    if seen.edited:
        notes.append(f"storm: {', '.join(seen.edited)} on disk holds an edit made outside storm; an edit of yours "
                     "records it as part of your write (git storm status shows it; git storm checkout PATH "
                     "discards it)")
    return HookResult(NOTE if notes else PASS, event, "recorded-read", agent, paths, message="\n".join(notes))


def pre_write(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    """Validate the agent's read set for ``paths`` and lease them (storm's begin_edit), or deny."""
    content = event.tool_input.get("content")
    if event.tool == "Write" and isinstance(content, str):  # refused before it lands, not after
        ws.check_size(paths[0], content.encode("utf-8", "surrogateescape"))
    if event.harness == "codex":
        # Codex reads through the shell, which the hook cannot see: the patch's own
        # context lines are its read of each target it has not read otherwise.
        edits.note_patch_context(ws, agent, paths)
    began = edits.begin_edit(ws, agent, paths, key=step_key(event, paths),
                             change=lambda base: intended_content(event, base))
    if began.rejection is None:
        return HookResult(PASS, event, "validated-and-leased", agent, paths)
    return HookResult(DENY, event, "denied", agent, paths, rejection=began.rejection)


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


def post_write(ws: "SharedWorkspace", agent: str, event: HookEvent, paths: list[str]) -> HookResult:
    """Record the files the tool left on disk as the agent's write (storm's finish_edit)."""
    res = edits.finish_edit(ws, agent, paths, key=step_key(event, paths), intent=_intent(agent, event, paths))
    if res is None:
        return HookResult(PASS, event, "nothing-changed", agent, paths)
    if res.accepted:
        note = f"storm: recorded, flagged {', '.join(res.flags)}" if res.flags else ""
        return HookResult(NOTE if note else PASS, event, "recorded-write", agent, res.paths, write=res,
                          message=note)
    return HookResult(BLOCK, event, "write-rejected", agent, res.paths, rejection=res.rejection, write=res)


def _intent(agent: str, event: HookEvent, paths: list[str]) -> str:
    what = {"Write": "writes", "apply_patch": "patches"}.get(event.tool, "edits")
    return f"{agent} {what} {', '.join(paths[:3])}" + (" …" if len(paths) > 3 else "") + f" ({event.tool})"


# -- Bash ---------------------------------------------------------------------------------
def pre_shell(ws: "SharedWorkspace", agent: str, event: HookEvent) -> HookResult:
    """Before a shell command: the files it shows are recorded as read, as they are now
    (before it runs: the safe side), then storm's begin_exec, its start kept for the
    post hook."""
    reads = shell_reads.read_paths(event.tool_input.get("command"), event.cwd,
                                   lambda raw, cwd: repo_path(ws.store, raw, cwd))
    if reads:
        post_read(ws, agent, event, reads)
    commands.begin_exec(ws, agent, command=shell_command(event), cwd=_repo_dir(ws.store, event.cwd),
                        key=step_key(event, []))
    return HookResult(PASS, event, "snapshot-taken", agent)


def post_shell(ws: "SharedWorkspace", agent: str, event: HookEvent) -> HookResult:
    """After a shell command: storm's finish_exec, the files it changed recorded as one
    write; paths leased by another agent (its edit between its own pre and post hooks)
    are that agent's and left to it."""
    started = commands.open_exec(ws, agent, step_key(event, []))
    if started is None:
        return HookResult(NOTE, event, "no-snapshot", agent,
                          message="storm: no snapshot was taken before this command, so its changes were not "
                                  "recorded; git storm status lists them, git storm adopt PATH records them")
    command = shell_command(event)
    command = command if len(command) <= 100 else command[:97] + "..."
    res = commands.finish_exec(ws, agent, started, [command], intent=f"{agent} {event.tool}: {command}",
                               leave_leased=True,
                               refuse_mixed=False)
    notes = []
    if res.uncredited:
        notes.append(f"storm: {', '.join(res.uncredited[:10])} changed while this command ran, but the command "
                     "does not name it: not recorded as yours (a person may have saved it). If your command made "
                     f"it: git storm adopt PATH --agent {agent}")
    if res.left:
        notes.append(f"storm: {', '.join(res.left)} changed while another agent held it; not recorded as yours")
    if res.mixed:
        notes.append(
            f"storm: {', '.join(res.mixed)} held an edit made outside storm before this command, and the command "
            "changed it too; not recorded as yours (git storm status shows it: record the earlier edit as its "
            "author's with git storm adopt PATH --agent NAME, or drop it with git storm checkout PATH, then run "
            "the command again)")
    w = res.write
    if w is None:
        note = "\n".join(notes)
        return HookResult(NOTE if note else PASS, event, "no-file-changed", agent, message=note)
    if w.accepted:
        if w.flags:
            notes.append(f"storm: recorded, flagged {', '.join(w.flags)}")
        note = "; ".join(notes)
        return HookResult(NOTE if note else PASS, event, "recorded-write", agent, res.paths, write=w, message=note)
    if res.reverted:
        from .. import render

        notes.append("storm: " + render.reverted_by_command(res.reverted))
    return HookResult(BLOCK, event, "write-rejected", agent, res.paths, rejection=w.rejection, write=w,
                      message="\n".join(notes))


def hook(stdin: str | bytes, *, harness: str = "claude", agent: str | None = None,
         env: dict[str, str] | None = None) -> HookResult:
    """Parse and handle one event (what ``git storm harness hook`` runs)."""
    from ..testwatch.notices import note_hook_result

    return note_hook_result(handle(parse_event(stdin, harness), agent=agent, env=env), None)

