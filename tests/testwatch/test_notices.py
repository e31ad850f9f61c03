"""The runner's notices reach each implicated agent once, through whichever door it
uses next: the command line's stderr, the harness hook's additionalContext, an MCP
tool result (the real SDK client over stdio)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import claude_event, hook, make_repo, storm

FILES = {"app.py": "x = 1\n", "lib.py": "y = 2\n"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", FILES)


def leave_notice(repo: Path, *agents: str) -> str:
    from storm_git.testwatch import notices

    writes = [notices.BlamedWrite(f"{i:040x}", a, f"{a}'s change", ["app.py"]) for i, a in enumerate(agents, 1)]
    n = notices.add(str(repo / ".git"), "tests/test_app.py::test_x", "semantic", "f" * 40,
                    "E   TypeError: f() got an unexpected keyword argument 'loud'", writes)
    return n.id


def test_the_command_line_tells_on_stderr_once(repo):
    leave_notice(repo, "alice", "bob")
    r = storm(repo, "read", "app.py", agent="bob")
    assert r.returncode == 0 and r.stdout == "x = 1\n"  # the command's own output is untouched
    assert "semantic conflict" in r.stderr and "unexpected keyword argument 'loud'" in r.stderr
    assert "semantic conflict" not in storm(repo, "read", "app.py", agent="bob").stderr
    assert "semantic conflict" not in storm(repo, "read", "app.py", agent="carol").stderr
    assert "semantic conflict" in storm(repo, "status", "--agent", "alice").stderr  # --agent as well as $STORM_AGENT
    # a rejected write still exits 1, with the notice beside its own message
    leave_notice(repo, "dave")
    storm(repo, "read", "app.py", agent="eve")
    storm(repo, "write", "app.py", input="x = 3\n", agent="eve")
    r = storm(repo, "write", "app.py", input="x = 4\n", agent="dave")
    assert r.returncode == 1 and "semantic conflict" in r.stderr


def test_the_hook_tells_in_additional_context_once_and_never_before_a_tool(repo):
    leave_notice(repo, "carol")
    path = str(repo / "app.py")
    pre = hook(repo, claude_event(repo, "s1", "PreToolUse", "Edit",
                                  {"file_path": path, "old_string": "x = 1", "new_string": "x = 2"}, "u0"),
               "--agent", "carol")
    assert "semantic conflict" not in pre.stdout  # before a tool: only its own decision
    post = hook(repo, claude_event(repo, "s1", "PostToolUse", "Read", {"file_path": path}, "u1",
                                   response={"type": "text", "file": {"filePath": path, "content": "x = 1\n"}}),
                "--agent", "carol")
    assert post.returncode == 0, post.stderr
    ctx = json.loads(post.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "semantic conflict" in ctx and "tests/test_app.py::test_x" in ctx
    again = hook(repo, claude_event(repo, "s1", "PostToolUse", "Read", {"file_path": path}, "u2",
                                    response={"type": "text", "file": {"filePath": path, "content": "x = 1\n"}}),
                 "--agent", "carol")
    assert "semantic conflict" not in again.stdout
    # told by the hook, the command line does not tell it again
    assert "semantic conflict" not in storm(repo, "status", agent="carol").stderr


def test_an_mcp_result_carries_the_notice_once(repo):
    mcp = pytest.importorskip("mcp")
    anyio = pytest.importorskip("anyio")
    import os
    import sys

    leave_notice(repo, "dave")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("STORM_AGENT", None)
    params = mcp.StdioServerParameters(command="git", args=["storm", "mcp", "--agent", "dave"], cwd=str(repo), env=env)
    got: list[str] = []

    async def main() -> None:
        async with mcp.stdio_client(params) as (r, w), mcp.ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(2):
                res = await s.call_tool("read", {"paths": ["app.py"]})
                assert not res.is_error
                got.append("\n".join(c.text for c in res.content if c.type == "text"))

    anyio.run(main)
    assert "semantic conflict" in got[0] and "x = 1" in got[0]
    assert "semantic conflict" not in got[1]
    assert "semantic conflict" not in storm(repo, "status", agent="dave").stderr


def test_a_notice_file_that_cannot_be_read_tells_nobody_and_breaks_no_command(repo):
    d = repo / ".git" / "storm" / "tests" / "notices"
    d.mkdir(parents=True)
    (d / "0000.json").write_text("{not json")
    r = storm(repo, "read", "app.py", agent="bob")
    assert r.returncode == 0 and "git storm watch" not in r.stderr
    leave_notice(repo, "bob")
    assert "semantic conflict" in storm(repo, "read", "app.py", agent="bob").stderr
