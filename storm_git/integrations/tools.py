"""What each MCP tool does, for one agent in one repository (no MCP import here).

The MCP server (:mod:`.mcp_server`) only maps these methods to tools; keeping
the behaviour apart lets it be read, and changed, without the SDK. Every
method returns a :class:`ToolOutcome`: the text a model reads, the JSON payload
(``structuredContent``) and whether it is an error. A rejected write is an
error outcome whose text says what changed, by whom, the diff, the stale files,
the reservation and what to do next; its payload is the library's ``to_dict()``.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..api import open_workspace
from ..core.agents import validate_agent
from ..core.errors import BadPath, NotFound, RepoStateError, StormError, UsageError, classify
from ..core.files import read_regular
from ..core.paths import normalize
from ..core.payloads import DIRECT_CONFLICT, RESERVED, STALE_DEPENDENCY, UNREAD_TARGET, WriteResult
from ..core.store import Store
from ..storm.workspace import SharedWorkspace
from ..storm.write import deps_argument
from . import editor
from .undo import UNDO_OP, MemoryHistory, last_edit

MAX_OUTPUT_CHARS = 16_000  # exec output returned to the model (the tail)
DEFAULT_EXEC_TIMEOUT = 600.0


@dataclass
class ToolOutcome:
    """A tool's result: ``text`` for the model, ``data`` as structuredContent."""

    text: str
    data: dict[str, Any] | None = None
    is_error: bool = False


def error_outcome(exc: BaseException) -> ToolOutcome:
    """A library error as a tool error: its one-line message and hint, never a traceback."""
    known = classify(exc)
    if known is not None:
        code, kind, message, hint = known
    else:
        code, kind = 4, "internal"
        message, hint = f"internal error {type(exc).__name__}: {exc}", "a bug in git storm: please report it"
    text = f"Error: {message}" + (f" ({hint})" if hint else "") + "\nNothing was changed."
    return ToolOutcome(text, {"error": {"kind": kind, "message": message, "hint": hint, "exit_code": code}}, True)


NEXT_STEP = {
    DIRECT_CONFLICT: ("Another agent changed {path} after you read it, so your edit was not applied. Its current "
                      "content (above) now counts as read, and you hold {path} for a short while. Re-apply your "
                      "change to the current content (str_replace with old_str copied from it) and retry."),
    STALE_DEPENDENCY: ("Files you read changed after you read them (diffs above); your edit may rely on what they "
                       "said. Read them again (view), check that your edit still holds, then retry it. If you no "
                       "longer depend on a file, call forget with its path."),
    UNREAD_TARGET: ("You had not viewed {path} before editing it. Its current content (above) now counts as read: "
                    "make your edit against it and retry."),
    RESERVED: ("{path} is held by another agent re-planning after a conflict; nothing was written. Retry in a "
               "few seconds, or work on another file meanwhile."),
}
REBASED_STEP = ("Your change also re-applies cleanly on the current version (the last diff above shows what it would "
                "change). If that is still what you want, call write with path {path} and rebased true to accept "
                "it; otherwise re-apply your change yourself.")


def rejection_outcome(res: WriteResult, data: dict[str, Any] | None = None, *, op: str = "") -> ToolOutcome:
    """A rejected write: the CLI's human rendering of the payload plus what to do next."""
    from .. import render  # plain text rendering, no click: shared with `git storm` output

    r = res.rejection
    assert r is not None
    body = editor.clip(render.rejection(r))
    nxt = NEXT_STEP[r.reason].format(path=r.path)
    if r.rebased is not None and r.rebased.clean and op not in (UNDO_OP, "exec"):
        nxt = REBASED_STEP.format(path=r.path)
    if op == UNDO_OP and r.reason == DIRECT_CONFLICT:
        nxt = (f"{r.path} changed after your last edit, so undoing it would also discard that change. "
               "Make the change you want with str_replace on the current content instead.")
    if op == "exec" and r.reason == DIRECT_CONFLICT:
        nxt = (f"Another agent's write to {r.path} landed while the command ran, so the command's changes were "
               "not recorded. Its version of the file stays on disk as an edit outside storm (status lists it). "
               "Redo the change on the current version (above) with str_replace or write, or re-run the command "
               f"after git storm checkout {r.path} restores the disk.")
    text = f"REJECTED ({r.reason}): nothing was written.\n{body}\n\nWhat to do next: {nxt}"
    return ToolOutcome(text, data if data is not None else res.to_dict(), True)


def _accepted_line(res: WriteResult) -> str:
    from .. import render

    return "[storm] " + render.write_result(res)


@contextmanager
def captured_output() -> Iterator[Any]:
    """Point file descriptors 1 and 2 at a temporary file while a command runs.

    ``exec`` lets the command inherit the process's stdio. In the MCP server the
    protocol does not use fd 1 (the SDK moves it to a private descriptor), but the
    model should see the command's output, so it is collected here (outside the
    working tree, where it would count as a change)."""
    sys.stdout.flush()
    sys.stderr.flush()
    tmp = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        yield tmp
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@dataclass
class StormTools:
    """The tools of one agent; the repository is opened once and kept open."""

    store: Store
    agent: str
    history: MemoryHistory = field(default_factory=MemoryHistory)
    capture_output: bool = True

    def __post_init__(self) -> None:
        self.agent = validate_agent(self.agent)
        self.workspace()  # not initialised or a bad mode: refuse before serving

    @classmethod
    def open(cls, repo: str | None, agent: str | None) -> "StormTools":
        """Paths are relative to the top of the working tree, whatever the directory."""
        agent = validate_agent(agent)
        store = Store.discover(repo)
        if store.prefix:
            store = Store(store.repo, cwd=store.top)
        return cls(store, agent)

    # -- helpers ------------------------------------------------------------------------
    def workspace(self) -> Any:
        """The workspace in the mode the config names now (a mode switch needs no restart)."""
        return open_workspace(store=self.store)

    def _top(self, ws: Any) -> str:
        return ws.store.top if isinstance(ws, SharedWorkspace) else ws.worktree(self.agent).path

    def _is_top(self, raw: str, top: str) -> bool:
        if os.path.isabs(raw):
            return os.path.normpath(raw) in (os.path.normpath(top), os.path.realpath(top))
        return raw.rstrip("/") in ("", ".")

    def _norm(self, raw: str, top: str) -> str:
        if not isinstance(raw, str):
            raise BadPath("path must be a string")
        return normalize(raw.rstrip("/") if len(raw) > 1 else raw, "", top)

    def _head_tree(self, ws: SharedWorkspace) -> pygit2.Tree:
        return self.store.commit(ws.head()).tree

    def _base(self, ws: Any, p: str) -> tuple[bytes | None, bool]:
        """(content an edit of ``p`` applies to, whether the agent read it).

        Storm mode: the version the agent last read (as ``edit`` does), so a change
        made since surfaces as a rejection; never read: the head's content, and the
        validated write is refused as unread_target (which then counts as the read).
        Worktree mode: the file in the agent's worktree."""
        if isinstance(ws, SharedWorkspace):
            seen = ws.read_set(self.agent).get(p)
            if seen is not None and seen.blob is not None:
                return ws.agent_content(p, pygit2.Oid(hex=seen.blob)), True
            e = self.store.entry(self._head_tree(ws), p)
            return (ws.agent_content(p, e.oid, e.mode) if e else None), False
        full = os.path.join(ws.worktree(self.agent).path, p)
        if os.path.isdir(full):
            raise BadPath(f"{p} is a directory, not a file")
        try:
            return read_regular(full), True  # a FIFO is refused (files.NotRegularFile), never waited on
        except FileNotFoundError:
            return None, True

    def _written(self, res: WriteResult, ok_text: str) -> ToolOutcome:
        if not res.accepted:
            return rejection_outcome(res)
        return ToolOutcome(f"{ok_text}\n{_accepted_line(res)}", res.to_dict())

    # -- file_editor tools --------------------------------------------------------------
    def view(self, path: str, view_range: list[int] | None = None) -> ToolOutcome:
        ws = self.workspace()
        top = self._top(ws)
        if self._is_top(path, top):
            return self._listing(ws, path, "", view_range)
        p = self._norm(path, top)
        if isinstance(ws, SharedWorkspace):
            tree = self._head_tree(ws)
            if p in tree and isinstance(tree[p], pygit2.Tree):
                return self._listing(ws, path, p, view_range)
        elif os.path.isdir(os.path.join(top, p)) and not os.path.islink(os.path.join(top, p)):
            return self._listing(ws, path, p, view_range)
        if view_range is not None:  # a bad range is refused before anything is recorded
            base = self._current(ws, p)
            if base is not None and not editor.is_binary(base):
                editor.view_lines(path, base.decode("utf-8", "replace"), view_range)
        r = ws.read([p], agent=self.agent)[0]
        data = {k: v for k, v in r.to_dict().items() if k not in ("content", "content_base64")}
        if r.content is None:
            return ToolOutcome(f"Error: The path {path} does not exist. Please provide a valid path.\n"
                               f"[storm] recorded as read while absent: create it with create.", data, True)
        footer = f"[storm] {p} version {r.version[:12] if r.version else '?'} (recorded as read)" + \
            (f"\n[storm] {r.offline}" if r.offline else "")
        if editor.is_binary(r.content):
            return ToolOutcome(f"{path} is a binary file ({len(r.content)} bytes).\n{footer}", data)
        text = r.content.decode("utf-8", "replace")
        numbered, first, last = editor.view_lines(path, text, view_range)
        data.update({"lines": len(editor.Lines.of(text).lines), "shown": [first, last]})
        return ToolOutcome(f"Here's the result of running `cat -n` on {path}:\n{editor.clip(numbered)}\n{footer}",
                           data)

    def _current(self, ws: Any, p: str) -> bytes | None:
        """The content ``p`` has now (shared head, or the agent's worktree), not recorded."""
        if isinstance(ws, SharedWorkspace):
            e = self.store.entry(self._head_tree(ws), p)
            return ws.agent_content(p, e.oid, e.mode) if e else None
        return self._base(ws, p)[0]

    def _listing(self, ws: Any, shown: str, p: str, view_range: list[int] | None = None) -> ToolOutcome:
        if view_range is not None:
            raise editor.EditorError("The `view_range` parameter is not allowed when `path` points to a directory.")
        entries: list[tuple[str, bool]] = []
        if isinstance(ws, SharedWorkspace):
            tree = self._head_tree(ws)
            root = tree[p] if p else tree
            assert isinstance(root, pygit2.Tree), "a listing is asked of a directory"
            for e in root:
                name = str(e.name)
                if name.startswith("."):
                    continue
                is_dir = isinstance(e, pygit2.Tree)
                entries.append((name, is_dir))
                if isinstance(e, pygit2.Tree):
                    entries.extend((f"{name}/{s.name}", isinstance(s, pygit2.Tree))
                                   for s in e if not str(s.name).startswith("."))
        else:
            base = os.path.join(self._top(ws), p)
            for name in os.listdir(base):
                if name.startswith("."):
                    continue
                full = os.path.join(base, name)
                is_dir = os.path.isdir(full) and not os.path.islink(full)
                entries.append((name, is_dir))
                if is_dir:
                    entries.extend((f"{name}/{s}", os.path.isdir(os.path.join(full, s)))
                                   for s in os.listdir(full) if not s.startswith("."))
        return ToolOutcome(editor.listing(shown, entries), {"path": p or ".", "entries": len(entries)})

    def create(self, path: str, file_text: str) -> ToolOutcome:
        ws = self.workspace()
        top = self._top(ws)
        p = self._norm(path, top)
        exists = (self._exists_shared(ws, p) if isinstance(ws, SharedWorkspace)
                  else os.path.lexists(os.path.join(top, p)))
        if exists:
            raise editor.EditorError(f"File already exists at: {path}. Cannot overwrite files using command "
                                     "`create`.", hint="view it, then change it with str_replace, insert or write")
        res = ws.write(p, file_text.encode("utf-8"), agent=self.agent, intent=None)
        if res.accepted and not isinstance(ws, SharedWorkspace):
            self.history.push(p, None)
        return self._written(res, f"File created successfully at: {path}")

    def _exists_shared(self, ws: SharedWorkspace, p: str) -> bool:
        tree = self._head_tree(ws)
        return p in tree

    def str_replace(self, path: str, old_str: str, new_str: str | None = None) -> ToolOutcome:
        ws = self.workspace()
        p = self._norm(path, self._top(ws))
        new = new_str or ""
        if old_str == "":
            raise editor.EditorError("Parameter `old_str` is required and must not be empty for command: "
                                     "str_replace")
        base, was_read = self._base(ws, p)
        if base is None:
            raise NotFound(f"The path {path} does not exist. Please provide a valid path.",
                           hint="create it with create")
        if not was_read:  # storm refuses it as unread_target and hands over the content
            return self._written(ws.edit(p, old_str, new, agent=self.agent), "")
        text = editor.decode(path, base)
        new_text, line = editor.replace_once(path, text, old_str, new)
        res = ws.edit(p, old_str, new, agent=self.agent)
        if res.accepted and not isinstance(ws, SharedWorkspace):
            self.history.push(p, base)
        snip = editor.snippet(new_text, line, new.count("\n") + 1)
        return self._written(res, f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                                  f"snippet of {path}:\n{snip}\nReview the changes and make sure they are as "
                                  "expected. Edit the file again if necessary.")

    def insert(self, path: str, insert_line: int, new_str: str) -> ToolOutcome:
        ws = self.workspace()
        p = self._norm(path, self._top(ws))
        base, _ = self._base(ws, p)
        if base is None:
            raise NotFound(f"The path {path} does not exist. Please provide a valid path.",
                           hint="create it with create")
        text = editor.decode(path, base)
        new_text = editor.insert_after(path, text, insert_line, new_str)
        res = ws.write(p, new_text.encode("utf-8"), agent=self.agent)
        if res.accepted and not isinstance(ws, SharedWorkspace):
            self.history.push(p, base)
        added = new_str.count("\n") + (0 if new_str.endswith("\n") else 1)
        snip = editor.snippet(new_text, insert_line + 1, added)
        return self._written(res, f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                                  f"snippet of the edited file:\n{snip}\nReview the changes and make sure they are "
                                  "as expected (correct indentation, no duplicate lines, etc). Edit the file again "
                                  "if necessary.")

    def undo_edit(self, path: str) -> ToolOutcome:
        ws = self.workspace()
        top = self._top(ws)
        p = self._norm(path, top)
        if isinstance(ws, SharedWorkspace):
            p = ws.path(p, for_write=True)
            last = last_edit(self.store, ws.head(), self.agent, p)
            if last is None:
                raise editor.EditorError(f"No edit history found for {path}.",
                                         hint=f"{self.agent} has no accepted edit of it to undo")
            content = ws.agent_content(p, pygit2.Oid(hex=last.previous)) if last.previous else None
            res = ws.apply(self.agent, {p: content}, intent=f"{self.agent}: undo its last edit of {p}",
                           deps=None, wait=True, op=UNDO_OP, expected={p: last.produced})
            if not res.accepted:
                return rejection_outcome(res, op=UNDO_OP)
        else:
            found, content = self.history.pop(p)
            if not found:
                raise editor.EditorError(f"No edit history found for {path}.",
                                         hint="in worktree mode undo knows this server's edits only")
            try:
                res = (ws.write(p, content, agent=self.agent, intent=f"{self.agent}: undo its last edit of {p}")
                       if content is not None else ws.rm(p, agent=self.agent))
            except BaseException:
                self.history.push(p, content)
                raise
        if content is None:
            return ToolOutcome(f"Last edit to {path} undone successfully: the file was removed (the edit had "
                               f"created it).\n{_accepted_line(res)}", res.to_dict())
        shown = editor.cat_n(editor.Lines.of(content.decode("utf-8", "replace")).lines)
        return ToolOutcome(f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on "
                           f"{path}:\n{editor.clip(shown)}\n{_accepted_line(res)}", res.to_dict())

    # -- storm's verbs ------------------------------------------------------------------
    def read(self, paths: list[str]) -> ToolOutcome:
        if not paths:
            raise UsageError("no path given", hint="paths: a list of files to read")
        ws = self.workspace()
        top = self._top(ws)
        results = ws.read([self._norm(p, top) for p in paths], agent=self.agent)
        parts = []
        for r in results:
            version = r.version[:12] if r.version else "absent"
            if r.content is None:
                body = "(not found: recorded as read while absent)"
            elif editor.is_binary(r.content):
                body = f"(binary, {len(r.content)} bytes)"
            else:
                body = r.content.decode("utf-8", "replace")
            parts.append(f"==> {r.path} @ {version} <==\n{body}")
        if results[0].offline:
            parts.append(f"[storm] {results[0].offline}")
        return ToolOutcome(editor.clip("\n".join(parts)),
                           {"head": results[0].head, "files": [r.to_dict() for r in results]})

    def write(self, path: str, content: str | None = None, intent: str | None = None, deps: list[str] | None = None,
              no_wait: bool = False, rebased: bool = False) -> ToolOutcome:
        ws = self.workspace()
        p = self._norm(path, self._top(ws))
        if rebased:
            if not isinstance(ws, SharedWorkspace):
                raise UsageError("rebased is for storm mode (a shared workspace)",
                                 hint="write the file's content instead")
            res = ws.write_rebased(p, agent=self.agent, intent=intent, wait=not no_wait)
            return self._written(res, f"Wrote the rebased change of {p}.")
        if content is None:
            raise UsageError("write needs content (or rebased true after a rejection that offered one)",
                             hint="give the file's new content")
        base = None if isinstance(ws, SharedWorkspace) else self._base(ws, p)[0]
        res = ws.write(p, content.encode("utf-8"), agent=self.agent, intent=intent, deps=deps_argument(deps),
                       wait=not no_wait)
        if res.accepted and not isinstance(ws, SharedWorkspace):
            self.history.push(p, base)
        return self._written(res, f"Wrote {p} ({len(content.encode('utf-8'))} bytes).")

    def rm(self, path: str, intent: str | None = None) -> ToolOutcome:
        ws = self.workspace()
        p = self._norm(path, self._top(ws))
        base = None if isinstance(ws, SharedWorkspace) else self._base(ws, p)[0]
        res = ws.rm(p, agent=self.agent, intent=intent)
        if res.accepted and not isinstance(ws, SharedWorkspace):
            self.history.push(p, base)
        return self._written(res, f"Removed {p}.")

    def exec(self, command: str | list[str], timeout: float | None = DEFAULT_EXEC_TIMEOUT,
             intent: str | None = None) -> ToolOutcome:
        if isinstance(command, str):
            if not command.strip():
                raise UsageError("no command given", hint='command: "pytest -q" or ["pytest", "-q"]')
            argv = ["sh", "-c", command]
        else:
            argv = list(command)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise UsageError("command must be a non-empty list of strings or a shell string")
        ws = self.workspace()
        shown = command if isinstance(command, str) else shlex.join(argv)
        intent = intent or f"{self.agent} exec: {shown[:100]}"
        if self.capture_output:
            with captured_output() as out:
                res = ws.exec(argv, agent=self.agent, intent=intent, timeout=timeout)
            out.seek(0)
            output = out.read().decode("utf-8", "replace")
        else:
            res = ws.exec(argv, agent=self.agent, intent=intent, timeout=timeout)
            output = ""
        if len(output) > MAX_OUTPUT_CHARS:
            output = "<output clipped: its last part follows>\n" + output[-MAX_OUTPUT_CHARS:]
        data = res.to_dict()
        data["output"] = output
        head = (f"$ {shown}\n{output.rstrip()}\n" if output.strip() else f"$ {shown}\n(no output)\n")
        status = ("timed out (killed); its changes were not recorded" if res.timed_out else
                  f"exit code {res.returncode}")
        if res.write is not None and not res.write.accepted:
            out = rejection_outcome(res.write, data, op="exec")
            from .. import render

            reverted = f"\n[storm] {render.reverted_by_command(res.reverted)}" if res.reverted else ""
            out.text = f"{head}[{status}]\n{out.text}{reverted}"
            return out
        if res.write is not None:
            recorded = _accepted_line(res.write)
        elif res.paths:
            recorded = f"[storm] changed {', '.join(res.paths[:10])}: not recorded (the command was killed)"
        else:
            recorded = "[storm] no file changed"
        if res.uncredited:
            recorded += (f"\n[storm] {', '.join(res.uncredited[:10])} changed while the command ran but it does "
                         "not name them: not recorded as yours "
                         f"(git storm adopt PATH --agent {self.agent} if it made them)")
        return ToolOutcome(f"{head}[{status}]\n{recorded}", data, res.timed_out)

    def status(self) -> ToolOutcome:
        from .. import render

        st = self.workspace().status(diffs=False)
        return ToolOutcome(render.status(st), st.to_dict())

    def log(self, limit: int = 20) -> ToolOutcome:
        from .. import render

        if limit < 1:
            raise UsageError(f"limit {limit} must be at least 1")
        entries = self.workspace().log(limit)
        text = "\n".join(render.log_entry(e) for e in entries) or "(no entries yet)"
        return ToolOutcome(text, {"entries": entries})

    def release(self, path: str) -> ToolOutcome:
        ws = self.workspace()
        r = ws.release(self._norm(path, self._top(ws)), agent=self.agent)
        text = f"released {r.path}" if r else f"no reservation on {path}: nothing to release"
        return ToolOutcome(text, {"released": r is not None, "reservation": r.to_dict() if r else None})

    def forget(self, paths: list[str] | None = None) -> ToolOutcome:
        ws = self.workspace()
        top = self._top(ws)
        dropped = ws.forget(None if not paths else [self._norm(p, top) for p in paths], agent=self.agent)
        text = f"forgot {len(dropped)} path(s)" + (f": {', '.join(dropped[:10])}" if dropped else "")
        return ToolOutcome(text, {"forgotten": dropped})

    # -- the manager's verbs --------------------------------------------------------------
    def commit(self, message: str, adopt: bool = False) -> ToolOutcome:
        res = self.workspace().commit(message, agent=self.agent, adopt=adopt)
        text = (f"committed {res.commit[:10]} on {res.branch}: {res.summary()}" if res.commit
                else f"nothing to commit on {res.branch}")
        if res.unmediated:
            text += f"\nleft on disk, not committed: {', '.join(u.get('path', '?') for u in res.unmediated[:10])}"
        return ToolOutcome(text, res.to_dict())

    def assign(self, assignee: str | None = None, files: list[str] | None = None, task: str | None = None,
               allow_overlap: bool = False, clear: bool = False) -> ToolOutcome:
        from ..coordination import assignments as scope

        if assignee is None:
            if files or task or clear:
                raise UsageError("name the agent to assign", hint="assignee: the agent, files: its globs")
            allv = scope.load_all(self.store)
            lines = [f"{a}: {', '.join(s.files)}" + (f"  -- {s.task}" if s.task else "") for a, s in allv.items()]
            restricted = scope.restricted_globs(self.store)
            lines.append(f"restricted: {', '.join(restricted) if restricted else 'none'}")
            return ToolOutcome("\n".join(lines), {"assignments": {a: s.to_dict() for a, s in allv.items()},
                                                  "restricted": restricted})
        if clear and files:
            raise UsageError("clear and files do not go together")
        if not clear and not files:
            raise UsageError("no files given", hint="files: paths or globs of the agent's primary set")
        res = scope.assign(self.store, assignee, None if clear else list(files or []), task=task,
                           allow_overlap=allow_overlap, by=self.agent, integrated_tree=self._integrated_tree())
        if res.assignment is None:
            text = f"{assignee}: assignment cleared" if res.previous else f"{assignee} had no assignment"
        else:
            text = f"{assignee}: {', '.join(res.assignment.files)}" + (f" -- {task}" if task else "")
            for other, paths in res.overlaps.items():
                text += f"\n  overlaps {other} on {', '.join(paths[:5])} (allowed)"
            if res.reads_reset:
                text += f"\n  new task: the read set of {assignee} was reset"
        return ToolOutcome(text, res.to_dict())

    def _integrated_tree(self) -> pygit2.Oid | None:
        """The tree overlaps are checked against: the shared head (storm) or the target branch."""
        from ..core.store import WORKSPACE_REF
        from ..worktree.worktrees import target_branch

        if self.store.config_get("storm.mode") == "storm":
            head = self.store.ref_target(WORKSPACE_REF)
            if head is not None:
                return self.store.commit(head).tree_id
        try:
            tip = self.store.ref_target("refs/heads/" + target_branch(self.store))
            return None if tip is None else self.store.commit(tip).tree_id
        except StormError:
            return None

    def merge(self, agents: list[str] | None = None, into: str | None = None, strategy: str = "abort",
              dry_run: bool = False) -> ToolOutcome:
        from ..worktree.merge import merge as do_merge

        mode = self.store.config_get("storm.mode")
        if mode != "worktree":
            raise RepoStateError(f"this repository is in {mode} mode: there are no branches to merge "
                                 "(writes land in the shared workspace; the manager uses commit)",
                                 hint="switch with git storm mode worktree")
        rep = do_merge(self.store, agents or None, into=into, strategy=strategy, by=self.agent, dry_run=dry_run)
        return ToolOutcome(_merge_text(rep), rep.to_dict(), not rep.ok)


def _merge_text(rep: Any) -> str:
    """One line per agent; the conflicting paths and what resolves them."""
    what = "dry run: nothing moved" if rep.dry_run else f"{rep.before[:10]} -> {rep.after[:10]}"
    out = [f"merge into {rep.target} ({rep.strategy}; {what})"]
    for r in rep.results:
        line = f"  {r.agent}: {r.status}, {len(r.files_changed)} file(s)"
        if r.conflicts:
            line += f"; conflicts in {', '.join(c.path for c in r.conflicts[:10])}"
            line += f" (resolve: git storm sync {r.agent} --onto {rep.target}, then merge again)"
        out.append(line)
    return "\n".join(out)
