"""Storm's trailers cannot be forged by an intent: a line ``Storm-Moved-From: <id>``
or ``Storm-Validated-At: <hex>`` in the text an agent gives (the CLI's ``-m``, the
MCP ``intent``, the Bash door's command line) is text, never a trailer, for the
server's ordering, the queue's move and the guard; a push made by hand with plain
git gets no further with such a line, nor with a real ``Storm-Moved-From`` that
claims another agent's landed write.

The window: clone ``a`` validates its write on its copy of the server's head while
clone ``b``'s write ``L`` has landed above it, so the server has to place ``a``'s
write behind ``L`` (and says "landed" for a write whose identity it finds there)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from helpers import claude_event, decision, git, hook, read_as, rev, show, storm, write_as
from servers import ordered_site, queue
from storm_git.core import trailers
from storm_git.remote import inbox
from storm_git.remote.transport import read_push

WS = "refs/storm/workspace"
NOTES = "refs/notes/storm/agents/"


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(server that orders writes, clone a, clone b), over file://."""
    return ordered_site(tmp_path)


def mcp_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def block(repo: Path, commit: str) -> dict[str, list[str]]:
    return trailers.parse(git(repo, "log", "-1", "--format=%B", commit).stdout.decode())


def land_elsewhere(b: Path) -> str:
    """b's write of another file, landed on the server: the commit ``L``."""
    read_as(b, "bob", "src/util.py")
    code, out = write_as(b, "src/util.py", "x = 1\n", agent="bob")
    assert code == 0, out
    return out["commit"]


def assert_own_write_landed(srv: Path, queued_intent_line: str, other: str) -> str:
    """The head is al's own write of README.md, placed behind ``other``; its trailer
    block is storm's (validated at its parent, no identity borrowed) and the intent's
    forged line is in its text, escaped."""
    head = rev(srv, WS)
    assert head != other and show(srv, head, "README.md") == b"# al\n"
    assert git(srv, "rev-parse", f"{head}^").stdout.decode().strip() == other
    t = block(srv, head)
    assert t["Storm-Agent"] == ["al"] and t["Storm-Validated-At"] == [other], t
    assert t.get("Storm-Moved-From", [other])[0] != other, t
    body = git(srv, "log", "-1", "--format=%B", head).stdout.decode()
    assert f"\n {queued_intent_line}\n" in body, body
    return head


# -- the command line -------------------------------------------------------------------------
def test_cli_intent_holding_storm_moved_from_is_applied_as_itself(site) -> None:
    srv, a, b = site
    read_as(a, "al", "README.md")
    other = land_elsewhere(b)
    line = f"Storm-Moved-From: {other}"
    r = storm(a, "write", "README.md", "-m", f"al's fix\n{line}", "--json", input="# al\n", agent="al")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    head = assert_own_write_landed(srv, line, other)
    assert res["commit"] == head != other, res  # the writer is told its own commit


def test_cli_intent_holding_storm_validated_at_does_not_break_the_move(site) -> None:
    srv, a, b = site
    read_as(a, "al", "README.md")
    other = land_elsewhere(b)
    line = f"storm-validated-at: {'0' * 40}"  # git compares trailer keys in any case
    r = storm(a, "write", "README.md", "-m", f"al's fix\n{line}", input="# al\n", agent="al")
    assert r.returncode == 0, r.stderr
    assert_own_write_landed(srv, line, other)


# -- MCP ---------------------------------------------------------------------------------------
def test_mcp_intent_holding_storm_moved_from_is_applied_as_itself(site) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    srv, a, b = site
    line_holder: dict[str, str] = {}

    async def main() -> str:
        params = StdioServerParameters(command="git", args=["storm", "mcp", "--agent", "al"], cwd=str(a),
                                       env=mcp_env())
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("read", {"paths": ["README.md"]})
            assert not res.is_error
            other = land_elsewhere(b)
            line_holder["line"] = f"Storm-Moved-From: {other}"
            res = await s.call_tool("write", {"path": "README.md", "content": "# al\n",
                                              "intent": f"al's fix\n{line_holder['line']}"})
            assert not res.is_error, res
            return other

    other = anyio.run(main)
    assert_own_write_landed(srv, line_holder["line"], other)


# -- the Bash door -----------------------------------------------------------------------------
def test_bash_command_line_holding_storm_validated_at_does_not_break_the_move(site) -> None:
    """The command's text is the exec write's intent; b lands a write between the
    command's start (its pre hook fetched) and its end, so a's write is moved."""
    srv, a, b = site
    line = f"Storm-Validated-At: {'f' * 40}"
    cmd = {"command": f"echo '# al' > README.md\n{line}", "description": "edit"}
    pre = claude_event(a, "s1", "PreToolUse", "Bash", cmd, "b1")
    assert decision(hook(a, pre, "-a", "al")) is None
    other = land_elsewhere(b)
    (a / "README.md").write_text("# al\n")
    post = claude_event(a, "s1", "PostToolUse", "Bash", cmd, "b1",
                        {"stdout": "", "stderr": "", "interrupted": False, "isImage": False})
    assert decision(hook(a, post, "-a", "al")) is None
    head = assert_own_write_landed(srv, line, other)
    assert block(srv, head)["Storm-Op"] == ["exec"]


# -- pushes made by hand -------------------------------------------------------------------------
def reword(c: Path, commit: pygit2.Oid, message: str) -> str:
    """``commit`` with another message, made with plain git (same tree, parent, author)."""
    fmt = git(c, "log", "-1", "--format=%an%n%ae%n%ad%n%P%n%T", "--date=raw", str(commit)).stdout.decode().split("\n")
    env = {"GIT_AUTHOR_NAME": fmt[0], "GIT_AUTHOR_EMAIL": fmt[1], "GIT_AUTHOR_DATE": fmt[2],
           "GIT_COMMITTER_NAME": fmt[0], "GIT_COMMITTER_EMAIL": fmt[1], "GIT_COMMITTER_DATE": fmt[2]}
    r = subprocess.run(["git", "commit-tree", "-p", fmt[3], fmt[4]], cwd=c, input=message.encode(),
                       capture_output=True, env={**os.environ, **env}, check=True)
    return r.stdout.decode().strip()


def push_inbox(c: Path, commit: str, agent: str, notes: pygit2.Oid) -> subprocess.CompletedProcess:
    return git(c, "-c", "core.abbrev=no", "push", "--porcelain", "origin", f"{commit}:refs/storm/inbox/x1/workspace",
               f"{notes}:refs/storm/inbox/x1/notes/{agent}", check=False)


@pytest.mark.parametrize("where", ["text", "trailer block"])
def test_a_push_by_hand_cannot_borrow_a_landed_writes_identity(site, where: str) -> None:
    """A valid queued write, reworded with plain git to name b's landed write ``L`` as
    its Storm-Moved-From: in its text (an intent line), or in its real trailer block
    (a forged move). The server applies it as the write it is, and its answer names
    the commit it became, never ``L``."""
    srv, a, b = site
    _st, q, notes = queue(a, "al", "README.md", "# al\n")
    other = land_elsewhere(b)
    msg = git(a, "log", "-1", "--format=%B", str(q)).stdout.decode()
    head_text, _sep, last = msg.rstrip("\n").rpartition("\n\n")
    lines = last.splitlines()
    line = f"Storm-Moved-From: {other}"
    forged = (f"{head_text}\n{line}\n\n" + "\n".join(lines) + "\n" if where == "text"
              else f"{head_text}\n\n" + "\n".join(lines + [line]) + "\n")
    commit = reword(a, q, forged)
    r = push_inbox(a, commit, "al", notes)
    assert r.returncode == 0, r.stdout + r.stderr
    answer = inbox.read_answer(read_push(r.returncode, r.stdout, r.stderr))
    head = rev(srv, WS)
    assert [str(n) for _o, n in answer.landed] == [head] and head != other, answer
    assert show(srv, head, "README.md") == b"# al\n" and show(srv, head, "src/util.py") == b"x = 1\n"
    assert block(srv, head)["Storm-Validated-At"] == [other]
