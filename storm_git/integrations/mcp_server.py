"""``git storm mcp``: storm's tools for one agent over the Model Context Protocol.

One server process per agent, on stdio, with the repository opened once
(:class:`.tools.StormTools`). The file tools keep OpenHands ``file_editor``'s
names and semantics so an agent needs no new habits; storm's own verbs are
tools too. A rejected write is a tool result with ``isError: true``, a text the
model can act on and the JSON payload (led by that text) as ``structuredContent``; a library error
is a tool error with its message and hint, never a traceback.

Built on the official ``mcp`` SDK v2 (``mcp.server.mcpserver.MCPServer``,
formerly FastMCP). The SDK is the optional extra ``mcp``; importing this
module without it raises :class:`MissingSDK`, which the CLI prints as one line
with the pip command that adds it to this installation.
"""
import re
import threading
from collections.abc import Callable
from typing import Annotated, Any

from ..core.errors import UsageError
from ..core.install_hint import pip_install, pip_install_requirement
from ..core.paths import printable
from .tools import DEFAULT_EXEC_TIMEOUT, StormTools, ToolOutcome, error_outcome


class MissingSDK(UsageError):
    """The ``mcp`` package is not installed (exit 2, like any unusable command line)."""

    kind = "missing_dependency"


try:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field
except ImportError:  # pragma: no cover - exercised by the CLI test without the extra
    raise MissingSDK("git storm mcp needs the MCP Python SDK, which is not installed",
                     hint=f"{pip_install('mcp')}; or the SDK alone: {pip_install_requirement('mcp>=2')}") from None

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what strict clients accept (no dots or slashes)

INSTRUCTIONS = """\
Files of this repository are shared with other agents through git storm. Use these tools for every
file you read or change: view records what you read; create, str_replace, insert, undo_edit and write
are accepted only if nothing you read has changed since. When a write is rejected (isError), the
result says what changed, by whom, with the diff; the target's current version then counts as read, so
re-apply your change to it and retry (other files it names as stale you must view again). When it says
your change re-applies cleanly, write with rebased true accepts that after you have looked at it. Paths may be absolute inside the working tree or relative to its top.
Start a new task with forget (an empty read set)."""

ReadOnly = ToolAnnotations(read_only_hint=True)
PathArg = Annotated[str, Field(description="File or directory: absolute inside the working tree, or relative "
                                           "to its top, e.g. /repo/src/app.py or src/app.py.")]
IntentArg = Annotated[str | None, Field(description="Why: becomes the commit message of the write.")]


def _sendable(value: Any) -> Any:
    """``value`` with every string UTF-8 encodable (storm_git.core.paths.printable): a
    file name that is not UTF-8 reaches a result as surrogate escapes, which the SDK
    cannot encode: the server would die on it and leave the client waiting."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_sendable(k): _sendable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sendable(v) for v in value]
    return value


def _result(out: ToolOutcome) -> CallToolResult:
    """The text for the model, and the payload as ``structuredContent`` led by the same
    text: Claude Code (and VS Code) give the model only ``structuredContent`` when a
    result has it, so a ``view`` would reach the model without the file."""
    text = printable(out.text)
    data = None if out.data is None else {"text": text, **_sendable(out.data)}
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data,
                          is_error=out.is_error)


def server_for(tools: StormTools) -> MCPServer:
    """An MCP server whose tools act for ``tools.agent`` (one repository, kept open)."""
    lock = threading.Lock()  # the SDK runs sync tools on worker threads; a repository is not thread-safe

    def run(fn: Callable[..., ToolOutcome], *args: Any, **kwargs: Any) -> CallToolResult:
        with lock:
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a tool error, never a traceback
                out = error_outcome(exc)
        return _result(out)

    server = MCPServer(name="git-storm", title=f"git storm ({tools.agent})", instructions=INSTRUCTIONS,
                       log_level="WARNING")
    tool = server.tool

    # -- file_editor's tools ---------------------------------------------------------------
    @tool(annotations=ReadOnly)
    def view(path: PathArg,
             view_range: Annotated[list[int] | None, Field(
                 description="Optional [start, end] lines to show (1-based, inclusive; end -1: to the end "
                             "of the file). Only for files.")] = None) -> CallToolResult:
        """View a file with line numbers (`cat -n`) or a directory (non-hidden entries, two levels deep).
        Viewing a file records the version you saw: your later edits are validated against it."""
        return run(tools.view, path, view_range)

    @tool()
    def create(path: PathArg, file_text: Annotated[str, Field(description="The content of the new file.")]
               ) -> CallToolResult:
        """Create a new file with file_text. Refused if the path already exists (use str_replace,
        insert or write to change an existing file)."""
        return run(tools.create, path, file_text)

    @tool()
    def str_replace(path: PathArg,
                    old_str: Annotated[str, Field(description="Exact text to replace; must occur exactly once "
                                                              "in the version you last viewed.")],
                    new_str: Annotated[str | None, Field(description="Replacement text (omitted: delete "
                                                                     "old_str).")] = None) -> CallToolResult:
        """Replace the one occurrence of old_str in the file, as you last viewed it, with new_str. If
        another agent changed the file since, nothing is written and the result (isError) shows the diff
        and the current content, which then counts as viewed: re-apply your change to it."""
        return run(tools.str_replace, path, old_str, new_str)

    @tool()
    def insert(path: PathArg,
               insert_line: Annotated[int, Field(description="Insert after this line (0: at the top).")],
               new_str: Annotated[str, Field(description="The text to insert.")]) -> CallToolResult:
        """Insert new_str after line insert_line of the file as you last viewed it (validated like
        str_replace)."""
        return run(tools.insert, path, insert_line, new_str)

    @tool()
    def undo_edit(path: PathArg) -> CallToolResult:
        """Revert your last edit of the file (repeat to go further back). Itself a validated write: refused,
        with the diff, if another agent changed the file after your edit."""
        return run(tools.undo_edit, path)

    # -- storm's verbs ----------------------------------------------------------------------
    @tool(annotations=ReadOnly)
    def read(paths: Annotated[list[str], Field(description="Files to read.")]) -> CallToolResult:
        """Read files without line numbers (each with its version); recorded as read like view."""
        return run(tools.read, paths)

    @tool()
    def write(path: PathArg, content: Annotated[str | None, Field(
                  description="The whole new content (leave it out with rebased).")] = None,
              intent: IntentArg = None,
              deps: Annotated[list[str] | None, Field(
                  description="Validate only these read files (plus the target) instead of everything you "
                              "read; [\"auto\"]: the read files the new content depends on (imports, "
                              "definitions).")] = None,
              no_wait: Annotated[bool, Field(description="Be rejected at once instead of waiting for "
                                                         "another agent's reservation.")] = False,
              rebased: Annotated[bool, Field(description="Accept the rebased change your last rejection of this "
                                                         "path offered (your change re-applied on the current "
                                                         "version), instead of giving content.")] = False
              ) -> CallToolResult:
        """Write a whole file (create or replace), validated against everything you read."""
        return run(tools.write, path, content, intent, deps, no_wait, rebased)

    @tool()
    def rm(path: PathArg, intent: IntentArg = None) -> CallToolResult:
        """Delete a file, validated like a write."""
        return run(tools.rm, path, intent)

    @tool()
    def exec(command: Annotated[str | list[str], Field(
                 description='A shell command string (run with sh -c), or an argv list such as '
                             '["pytest", "-q"].')],
             timeout: Annotated[float | None, Field(description="Seconds before the command is killed.")]
             = DEFAULT_EXEC_TIMEOUT,
             intent: IntentArg = None) -> CallToolResult:
        """Run a command in the working tree (tests, formatters, code generators) and record the files
        it changed as one validated write of yours. Returns its exit code and output."""
        return run(tools.exec, command, timeout, intent)

    @tool(annotations=ReadOnly)
    def status() -> CallToolResult:
        """Mode, shared head, agents with their stale reads, reservations, edits made outside storm."""
        return run(tools.status)

    @tool(annotations=ReadOnly)
    def log(limit: Annotated[int, Field(description="How many entries, newest first.")] = 20
            ) -> CallToolResult:
        """Accepted writes, rejections and other events, newest first."""
        return run(tools.log, limit)

    @tool()
    def release(path: PathArg) -> CallToolResult:
        """Give up your reservation on a file (taken after a rejection) before it expires."""
        return run(tools.release, path)

    @tool()
    def forget(paths: Annotated[list[str] | None, Field(
            description="Paths to drop from your read set; omitted: all of it (a new task).")] = None
               ) -> CallToolResult:
        """Drop files from your read set so changes to them no longer reject your writes."""
        return run(tools.forget, paths)

    # -- the manager's verbs -----------------------------------------------------------------
    @tool()
    def commit(message: Annotated[str, Field(description="The commit message.")],
               adopt: Annotated[bool, Field(description="Storm mode: first record edits made on disk "
                                                        "outside storm.")] = False) -> CallToolResult:
        """Storm mode (the manager): commit the shared workspace to the current branch. Worktree mode:
        commit your worktree to your branch."""
        return run(tools.commit, message, adopt)

    @tool()
    def assign(assignee: Annotated[str | None, Field(description="The agent; omitted: list assignments.")]
               = None,
               files: Annotated[list[str] | None, Field(description="Paths or globs of its primary files.")]
               = None,
               task: Annotated[str | None, Field(description="Its task (a new task resets its read set).")]
               = None,
               allow_overlap: bool = False, clear: bool = False) -> CallToolResult:
        """The manager: record an agent's primary files (disjoint between agents) and task."""
        return run(tools.assign, assignee, files, task, allow_overlap, clear)

    @tool()
    def merge(agents: Annotated[list[str] | None, Field(description="Agents to merge; omitted: all with "
                                                                    "new commits.")] = None,
              into: Annotated[str | None, Field(description="Target branch.")] = None,
              strategy: Annotated[str, Field(description="abort (skip a conflicting agent), ours or "
                                                         "theirs.")] = "abort",
              dry_run: bool = False) -> CallToolResult:
        """Worktree mode (the manager): merge agent branches into the target branch, reporting conflicts."""
        return run(tools.merge, agents, into, strategy, dry_run)

    return server


def build_server(repo: str | None, agent: str | None) -> MCPServer:
    """The server for ``agent`` in the repository containing ``repo`` (default: cwd).

    Refuses a bad agent or an uninitialised repository (typed errors) before serving."""
    return server_for(StormTools.open(repo, agent))


def run_stdio(repo: str | None, agent: str | None) -> None:
    """Serve on stdin/stdout until the client closes the connection."""
    build_server(repo, agent).run("stdio")
