"""Edits on disk made outside storm: a person's (kept) or the shell's (taken in as writes).

Whatever changes the shared working tree outside storm's own writes is, to storm,
one of three things:

* the change of an agent's command that storm ran or watched (``exec``, MCP
  ``exec``, the drop-in's ``run_command``, a harness's Bash between its pre and
  post hooks): recorded as that agent's write when the command ends
  (storm_git.storm.commands), and left alone here while the command may still be
  running (a path dated after a running command's start, :mod:`.steps`);
* with ``storm.shellEdits=adopt``: a *shell edit*, taken in at the next storm
  operation that looks at the path (a read, a write, ``status``, the commit) as a
  write by the declared identity ``storm.shellAgent`` (default ``shell``),
  validated against the version it was made on (the disk record), logged like any
  write. So every door sees what is on disk: a file the shell made exists, one it
  removed is gone, and an agent's write over a shell edit it did not read is a
  conflict for that agent, rejected with the diff;
* with ``storm.shellEdits=keep`` (the default): a *person's edit* (an editor, a
  formatter run by hand): never overwritten, listed by ``status``, recorded with
  ``adopt``. An agent's write to such a path is refused before it lands, saying
  why: the disk must never disagree with what an agent was told.

A path another agent holds (a lease: its file tool is writing it) and a new file
that looks like a secret (``.env``, a key) are never taken in.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..core.agents import validate_agent
from ..core.convert import Conversions
from ..core.errors import BadPath, TooLarge, UnmediatedEdit, UsageError
from ..core.locks import flocked
from ..core.paths import quoted
from ..core.payloads import WriteResult
from ..core.secret_files import likely_secret
from ..core.store import Store, hex_
from ..disk import safe_fs, sync as disk_sync
from ..disk.record import entry_or_none, load as load_record
from . import steps
from .snapshot import check_recordable, read_disk_content, snapshot, with_mode
from .validated_writer import ValidatedWriter

SHELL_EDITS = "storm.shellEdits"
SHELL_AGENT = "storm.shellAgent"
KEEP = "keep"
ADOPT = "adopt"
DEFAULT_SHELL_AGENT = "shell"
OP = "shell"


def policy(store: Store, override: str | None = None) -> str:
    """``adopt`` or ``keep``: what an edit outside storm is (``override``: a door's own
    default, used when the setting is unset)."""
    raw = store.config_get(SHELL_EDITS)
    value = (str(raw).strip().lower() if raw is not None else override) or KEEP
    if value not in (KEEP, ADOPT):
        raise UsageError(f"{SHELL_EDITS} is {value!r}, not 'keep' or 'adopt'",
                         hint=f"git config {SHELL_EDITS} adopt (shell edits become writes) or keep (a person's)")
    return value


def shell_agent(store: Store) -> str:
    """The identity shell edits are recorded under."""
    return validate_agent(str(store.config_get(SHELL_AGENT) or DEFAULT_SHELL_AGENT))


@dataclass
class TakeIn:
    """What ``take_in`` did: the shell's write, and the edits it left on disk with why."""

    write: WriteResult | None = None
    paths: list[str] = field(default_factory=list)  # taken in
    left: dict[str, str] = field(default_factory=dict)  # path -> why it stays an edit on disk


def looks_edited(store: Store, paths: list[str]) -> bool:
    """A look without the worktree lock (a writer must not wait for it before its CAS):
    whether any of ``paths`` may hold an edit made outside storm. A state storm put
    there, recorded or pending, is not one; anything unclear (the record read while
    a writer appends to it) is."""
    try:
        rec = load_record(store)
        conv = Conversions(store)
        for p in paths:
            have = safe_fs.disk_state(store.main_workdir, p, conv=conv)
            if have is not False and not rec.is_storms(store, p, have) and not (
                    have is None and disk_sync.outside_sparse_checkout(store, p)):
                return True
    except Exception:  # noqa: BLE001 - the locked look decides
        return True
    return False


def take_in(ws: ValidatedWriter, paths: list[str] | None = None, *, override: str | None = None,
            made_on: dict[str, str | None] | None = None) -> TakeIn:
    """Under ``storm.shellEdits=adopt``: the edits on disk outside storm among ``paths``
    (None: the whole tree, one snapshot) become one write by ``storm.shellAgent``.
    Under ``keep`` the edits are listed in ``left``, nothing is written. ``made_on``:
    the version an edit was made on where the disk record cannot know it (an edit
    saved while a write's disk step ran: the disk never held that write)."""
    store = ws.store
    adopting = policy(store, override) == ADOPT
    out = TakeIn()
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with flocked(store.commondir, "worktree"):
        ws.head()
        edited = _edited(store, paths)
        if not edited:
            return out
        if not adopting:
            out.left = {p: "a person's edit (storm.shellEdits=keep)" for p in edited}
            return out
        running = steps.running_commands(store)
        rtree, _ = disk_sync.record_tree(store)
        for p, have in sorted(edited.items()):
            why = _left_why(ws, store, p, have, rtree, running)
            if why is None:
                try:
                    check_recordable(store, p, have, ws)
                    content = read_disk_content(store, p) if have is not None else None
                    if content is not None:
                        ws.check_size(p, content)
                except (BadPath, TooLarge) as exc:
                    why = exc.message
            if why is not None:
                out.left[p] = why
                continue
            base = entry_or_none(store, rtree, p)
            changes[p] = with_mode(content, have, base)
            expected[p] = made_on[p] if made_on and p in made_on else hex_(base.oid if base else None)
    if not changes:
        return out
    who = shell_agent(store)
    names = ", ".join(sorted(changes)[:3]) + (" …" if len(changes) > 3 else "")
    out.write = ws.apply(who, changes, intent=f"{who}: edits made outside storm, taken in: {names}", deps=None,
                         wait=True, op=OP, expected=expected)
    if out.write.accepted:
        out.paths = sorted(changes)
    else:
        why = "made on an older version than the shared one (a conflict: git storm status shows it)"
        out.left.update({p: why for p in changes})
    return out


def _edited(store: Store, paths: list[str] | None) -> dict[str, Any]:
    """Path -> DiskState of every path that differs on disk from storm's record, after
    behind paths were brought forward (caller holds the worktree lock)."""
    if paths is None:
        return dict(snapshot(store).dirty)
    if not paths:
        return {}
    disk_sync.sync_locked(store, list(paths))
    rtree, rec = disk_sync.record_tree(store)
    conv = Conversions(store)
    out: dict[str, Any] = {}
    with safe_fs.DirFds(store.main_workdir) as dirs:
        for p in paths:
            have = safe_fs.disk_state(store.main_workdir, p, dirs, conv)
            if have is False:
                continue  # a directory, or a path through a link: nothing storm records there
            if not rec.is_storms(store, p, have) and not (have is None and disk_sync.outside_sparse_checkout(store, p)):
                out[p] = have
    return out


def _left_why(ws: ValidatedWriter, store: Store, path: str, have: Any, rtree: Any,
              running: list[dict[str, Any]]) -> str | None:
    """Why the edit of ``path`` is not the shell's to take in now (None: it is)."""
    if have is False:
        return "not a regular file"
    if have is not None and entry_or_none(store, rtree, path) is None and likely_secret(path):
        return "a new file that looks like a secret (never shared without an explicit adopt)"
    held = ws.reservation(path)
    if held is not None:
        return f"held by {held.holder} (its file tool is writing it)"
    for cmd in running:
        if _maybe_of(store, path, have, cmd):
            return f"{cmd.get('agent')}'s command is running; it is recorded when the command ends"
    return None


def _maybe_of(store: Store, path: str, have: Any, cmd: dict[str, Any]) -> bool:
    """Could the running command ``cmd`` have made this edit (it is dated after its start)?"""
    mark = cmd.get("mark")
    if mark is None:
        return True  # no clock: any edit may be the command's
    full = os.path.join(store.main_workdir, path)
    try:
        st = os.lstat(full if have is not None else os.path.dirname(full) or store.main_workdir)
    except OSError:
        return True
    return max(st.st_ctime_ns, st.st_mtime_ns) > int(mark)


def refuse_edited(store: Store, left: dict[str, str], op: str) -> None:
    """An agent's write to paths that hold an edit on disk storm could not take in: refused
    before it lands (it could not be put on disk), naming each and why."""
    named = "; ".join(f"{quoted(p)}: {why}" for p, why in sorted(left.items())[:5])
    more = f" and {len(left) - 5} more" if len(left) > 5 else ""
    raise UnmediatedEdit(
        f"{op} refused: the disk holds an edit made outside storm that is not in the shared workspace, and "
        f"storm never writes over it ({named}{more}); nothing was written",
        hint="record it (git storm adopt PATH --agent NAME), drop it (git storm checkout PATH), or wait for the "
             f"command to end; with git config {SHELL_EDITS} adopt, edits outside storm become "
             f"{DEFAULT_SHELL_AGENT}'s writes")
