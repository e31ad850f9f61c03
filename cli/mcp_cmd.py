"""``git storm mcp``: serve storm's tools to one agent over MCP (stdio)."""
from __future__ import annotations

import os

from storm_git.cli.app import CONTEXT, agent_option, cli, json_option


@cli.command("mcp", context_settings=CONTEXT)
@agent_option
@json_option
def mcp(agent: str | None, as_json: bool) -> None:
    """Serve storm's file tools to one agent over the Model Context Protocol (stdio).

    One server per agent: the agent's harness starts it and talks to it on
    stdin/stdout. Tools: view, create, str_replace, insert, undo_edit (OpenHands
    file_editor's semantics; every view is a recorded read, every edit a
    validated write), read, write, rm, exec, status, log, release, forget, and
    for the manager commit, assign, merge. A rejected write is a tool result
    with isError and the diff. A missing or invalid agent is refused (exit 2)
    before serving; the SDK is the optional extra 'mcp' (without it, this
    command prints the pip command that adds it).
    Run it in the repository (or use git -C REPO); see docs/agents.md.
    --json only shapes an error before serving (the session is JSON-RPC).

    \b
    Claude Code (project scope writes .mcp.json):
      claude mcp add --scope project storm-engineer_1 -- git storm mcp --agent engineer_1
    \b
    Codex (~/.codex/config.toml, or: codex mcp add storm -- git storm mcp --agent engineer_1):
      [mcp_servers.storm]
      command = "git"
      args = ["-C", "/path/to/repo", "storm", "mcp"]
      env = { STORM_AGENT = "engineer_1" }
    \b
    Cursor (.cursor/mcp.json in the project):
      {"mcpServers": {"storm": {"command": "git",
        "args": ["storm", "mcp", "--agent", "engineer_1"]}}}
    \b
    OpenHands (config.toml):
      [mcp]
      stdio_servers = [{name = "storm", command = "git",
        args = ["-C", "/workspace", "storm", "mcp", "--agent", "engineer_1"]}]

    \b
    Example:
      git storm mcp --agent engineer_1
      STORM_AGENT=manager git storm mcp
    """
    from storm_git.api import open_workspace
    from storm_git.core.agents import validate_agent

    agent = validate_agent(agent or os.environ.get("STORM_AGENT"))
    open_workspace()  # not a repository / not initialised: exit 3 before serving
    from storm_git.integrations.mcp_server import run_stdio

    run_stdio(None, agent)
