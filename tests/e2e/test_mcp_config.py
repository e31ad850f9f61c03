"""The MCP configuration docs/agents.md gives, used by the real Claude Code: the
server entry ``claude mcp add --scope project`` writes (the absolute path of
``git-storm``), started by Claude Code itself, its tools called by the scripted
model. Run with ``pytest -m harness tests/e2e``."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import harnesses as hx
import pytest
from model_server import Script, serve

sys.path.insert(0, str(Path(__file__).parent.parent))
from helpers import storm  # noqa: E402

pytestmark = pytest.mark.harness

pytest.importorskip("mcp", reason="the MCP server needs the mcp extra (pip install '.[mcp]')")


def test_claude_code_starts_storms_mcp_server_from_the_documented_entry(harness_bin, world):
    repo, home, log = world
    git_storm = shutil.which("git-storm")
    assert git_storm and Path(git_storm).is_absolute()
    env = hx.base_env(home, log)
    env.update(CLAUDE_CONFIG_DIR=str(home / ".claude"))
    # the documented command, run by the real claude binary
    r = subprocess.run([str(harness_bin / "claude"), "mcp", "add", "--scope", "project", "storm-engineer_1", "--",
                        git_storm, "mcp", "--agent", "engineer_1"], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    entry = json.loads((repo / ".mcp.json").read_text())["mcpServers"]["storm-engineer_1"]
    assert entry["command"] == git_storm and entry["args"] == ["mcp", "--agent", "engineer_1"]
    api = str(repo / "src/api.py")
    tool = "mcp__storm-engineer_1__"
    other = "git storm read src/api.py --agent engineer_2 >/dev/null && printf 'def fetch(url):\\n    return http_get(url, 2)\\n' | git storm write src/api.py --agent engineer_2"
    script = Script({"A": [
        # Claude Code does not wait for MCP servers before the first turn; its tool for it:
        {"tool": "WaitForMcpServers", "input": {}},
        {"tool": tool + "view", "input": {"path": api}},
        {"tool": "Bash", "input": {"command": other}},  # another agent writes meanwhile
        {"tool": tool + "str_replace", "input": {"path": api, "old_str": "def fetch(url):",
                                                 "new_str": "def fetch(url, timeout=10):"}},
        {"tool": tool + "str_replace", "input": {"path": api, "old_str": "def fetch(url):",
                                                 "new_str": "def fetch(url, timeout=10):"}},
    ]})
    server, port = serve(script)
    run = hx.claude(harness_bin, repo, "[[A]] do the task", port, home, log)
    hx.finish([run], server, script)
    out = script.outputs("A")[1:]
    assert "accepted" in out[1], out[1]
    # what the model saw: the file, then the rejection with the diff and its author
    assert "def fetch(url):" in out[0] and "return http_get(url)" in out[0], out[0]
    assert "changed since engineer_1 read it" in out[2] and "engineer_2" in out[2], out[2]
    assert "+    return http_get(url, 2)" in out[2], out[2]
    assert "has been edited" in out[3], out[3]
    assert hx.workspace(repo, "src/api.py") == b"def fetch(url, timeout=10):\n    return http_get(url, 2)\n"
    writes = [e for e in json.loads(storm(repo, "log", "--json").stdout) if e.get("type") == "write"]
    assert [e.get("agent") for e in writes[:2]] == ["engineer_1", "engineer_2"], writes[:2]

