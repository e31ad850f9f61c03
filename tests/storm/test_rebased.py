"""Cheap re-plans: a direct_conflict rejection offers the agent's own change re-applied
on the current version, accepted only on the agent's word (``write --rebased``, the MCP
``write`` tool's ``rebased``, the exact call in a harness hook's deny text); and what
counts as read after a rejection is exactly what it showed in full: the target's
current content, never the stale files it lists."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from helpers import git, make_repo, rev, show as _show, storm, storm_json

WS = "refs/storm/workspace"


def show(repo: Path, ref: str, path: str) -> str:
    return _show(repo, ref, path).decode()
LINES = "".join(f"line {i}\n" for i in range(1, 13))


def _repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "r", {"a.py": "x=1\n", "b.py": "y=1\n", "long.py": LINES})
    git(repo, "config", "storm.reservationSeconds", "0")  # several rejected agents in a row
    return repo


def test_the_stale_files_a_rejection_names_do_not_count_as_read(tmp_path):
    """The sequence that lost A's x=2: B's rejection on b.py named a.py as stale (shown as
    a diff only); B's later write of a.py from its old view must be refused."""
    repo = _repo(tmp_path)
    assert storm(repo, "read", "a.py", "b.py", agent="B").returncode == 0
    assert storm(repo, "read", "a.py", "b.py", agent="A").returncode == 0
    assert storm(repo, "write", "a.py", input="x=2\n", agent="A").returncode == 0
    assert storm(repo, "write", "b.py", input="y=2\n", agent="A").returncode == 0
    code, res = storm_json(repo, "write", "b.py", "--no-wait", input="y=3\n", agent="B")
    assert code == 1 and [s["path"] for s in res["rejection"]["stale"]] == ["a.py"], res
    code, res = storm_json(repo, "write", "a.py", "--no-wait", input="x=3\n", agent="B")
    assert code == 1 and res["rejection"]["reason"] == "direct_conflict", res
    assert show(repo, WS, "a.py") == "x=2\n"
    # the target's content was shown in full: it counts as read (B can write b.py now, having re-planned)
    code, res = storm_json(repo, "write", "b.py", "--deps", "b.py", "--no-wait", input="y=2\ny=3\n", agent="B")
    assert code == 0 and res["accepted"], res


def _conflict(repo: Path, theirs: str, mine: str, *, also: str | None = None) -> dict:
    """A's ``theirs`` lands after B (and ``also``) read long.py; B's ``mine`` is rejected
    (JSON); ``also``'s same write is rejected too, in text, returned under "text"."""
    for agent in ("A", "B", *([also] if also else [])):
        assert storm(repo, "read", "long.py", agent=agent).returncode == 0
    assert storm(repo, "write", "long.py", input=theirs, agent="A").returncode == 0
    code, res = storm_json(repo, "write", "long.py", "--no-wait", input=mine, agent="B")
    assert code == 1 and res["rejection"]["reason"] == "direct_conflict", res
    if also:
        r = storm(repo, "write", "long.py", "--no-wait", input=mine, agent=also)
        assert r.returncode == 1, r.stdout
        res["rejection"]["text"] = r.stdout
    return res["rejection"]


def test_a_change_on_other_lines_is_offered_rebased_and_accepted_on_the_agents_word(tmp_path):
    repo = _repo(tmp_path)
    theirs = LINES.replace("line 2\n", "line 2 (A)\n")
    mine = LINES.replace("line 11\n", "line 11 (B)\n")
    rej = _conflict(repo, theirs, mine, also="C")
    offer = rej["rebased"]
    assert offer["clean"] and offer["conflicts"] == 0 and offer["crossed"] == [], offer
    assert offer["content"] == theirs.replace("line 11\n", "line 11 (B)\n")
    assert show(repo, WS, "long.py") == theirs  # nothing merged without the agent's word
    text = rej["text"]
    assert "git storm write long.py --rebased" in text and "+line 11 (B)" in text, text
    code, res = storm_json(repo, "write", "long.py", "--rebased", agent="B")
    assert code == 0 and res["accepted"], res
    assert show(repo, WS, "long.py") == offer["content"]
    code, res = storm_json(repo, "write", "long.py", "--rebased", agent="B")  # used: gone
    assert code == 2 and res["error"]["kind"] == "usage" and "no rebased change" in res["error"]["message"]


def test_crossing_changes_are_offered_with_markers_and_never_written_by_rebased(tmp_path):
    repo = _repo(tmp_path)
    rej = _conflict(repo, LINES.replace("line 5\n", "line 5 (A)\n"), LINES.replace("line 5\n", "line 5 (B)\n"))
    offer = rej["rebased"]
    assert not offer["clean"] and offer["conflicts"] == 1 and len(offer["crossed"]) == 1, offer
    assert "<<<<<<< current" in offer["content"] and ">>>>>>> yours" in offer["content"]
    assert "+line 5 (A)" in offer["crossed"][0]
    before = rev(repo, WS)
    r = storm(repo, "write", "long.py", "--rebased", agent="B")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "conflict markers" in r.stderr, r.stderr
    assert rev(repo, WS) == before


def test_an_offer_is_refused_once_the_file_moved_again_and_its_write_is_validated(tmp_path):
    repo = _repo(tmp_path)
    _conflict(repo, LINES.replace("line 2\n", "line 2 (A)\n"), LINES.replace("line 11\n", "line 11 (B)\n"))
    assert storm(repo, "read", "long.py", agent="A").returncode == 0
    assert storm(repo, "write", "long.py", input=LINES, agent="A").returncode == 0  # moved again
    before = rev(repo, WS)
    r = storm(repo, "write", "long.py", "--rebased", agent="B")
    assert r.returncode == 2 and "changed since the rebased change was offered" in r.stderr, r.stderr
    assert rev(repo, WS) == before
    # a stale dependency that moved after the offer: the accepted-looking offer is rejected like any write
    _conflict(repo, LINES.replace("line 3\n", "line 3 (A)\n"), LINES.replace("line 12\n", "line 12 (B)\n"))
    assert storm(repo, "read", "a.py", agent="B").returncode == 0
    assert storm(repo, "read", "a.py", agent="A").returncode == 0
    assert storm(repo, "write", "a.py", input="x=9\n", agent="A").returncode == 0
    code, res = storm_json(repo, "write", "long.py", "--rebased", "--no-wait", agent="B")
    assert code == 1 and res["rejection"]["reason"] == "stale_dependency", res


def test_rebased_refuses_content_and_binary_files_get_no_offer(tmp_path):
    repo = make_repo(tmp_path / "r", {"bin.dat": b"\x00\x01\x02\n", "long.py": LINES})
    r = storm(repo, "write", "long.py", "--rebased", "--file", "x", agent="B")
    assert r.returncode == 2 and "--rebased takes no content" in r.stderr
    for agent in ("A", "B"):
        assert storm(repo, "read", "bin.dat", agent=agent).returncode == 0
    assert storm(repo, "write", "bin.dat", input=b"\x00A\n", agent="A").returncode == 0
    code, res = storm_json(repo, "write", "bin.dat", "--no-wait", input=b"\x00B\n", agent="B")
    assert code == 1 and res["rejection"]["rebased"] is None


def test_the_mcp_write_tool_accepts_the_offer(tmp_path):
    pytest.importorskip("mcp")
    from mcp import ClientSession, StdioServerParameters, stdio_client

    repo = _repo(tmp_path)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("STORM_AGENT", None)

    async def main() -> None:
        params = StdioServerParameters(command="git", args=["storm", "mcp", "--agent", "B"], cwd=str(repo), env=env)
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                assert not (await s.call_tool("view", {"path": "long.py"})).is_error
                assert storm(repo, "read", "long.py", agent="A").returncode == 0
                theirs = LINES.replace("line 1\n", "line 1 (A)\n")
                assert storm(repo, "write", "long.py", input=theirs, agent="A").returncode == 0
                res = await s.call_tool("str_replace", {"path": "long.py", "old_str": "line 12",
                                                        "new_str": "line 12 (B)"})
                body = "\n".join(c.text for c in res.content if c.type == "text")
                assert res.is_error and "rebased true" in body, body
                assert res.structured_content["rejection"]["rebased"]["clean"] is True
                res = await s.call_tool("write", {"path": "long.py", "rebased": True})
                assert not res.is_error and res.structured_content["accepted"], res.content
                assert show(repo, WS, "long.py") == theirs.replace("line 12\n", "line 12 (B)\n")

    asyncio.run(main())


def test_a_harness_deny_tells_the_model_the_exact_call(tmp_path):
    repo = _repo(tmp_path)
    path = str(repo / "long.py")

    def hook(event: str, tool: str, tool_input: dict, use_id: str):
        e = {"session_id": "sess-1", "transcript_path": "/tmp/sess-1.jsonl", "cwd": str(repo),
             "permission_mode": "default", "hook_event_name": event, "tool_name": tool, "tool_input": tool_input,
             "tool_use_id": use_id}
        if event == "PostToolUse":
            e["tool_response"] = {"filePath": path, "success": True}
        r = storm(repo, "harness", "hook", input=json.dumps(e), env={"STORM_AGENT": ""})
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout) if r.stdout.strip() else None

    assert hook("PostToolUse", "Read", {"file_path": path}, "r1") is None
    assert storm(repo, "read", "long.py", agent="A").returncode == 0
    theirs = LINES.replace("line 1\n", "line 1 (A)\n")
    assert storm(repo, "write", "long.py", input=theirs, agent="A").returncode == 0
    out = hook("PreToolUse", "Edit", {"file_path": path, "old_string": "line 12", "new_string": "line 12 (B)"}, "e1")
    spec = out["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny", out
    reason = spec["permissionDecisionReason"]
    call = next(line for line in reason.splitlines() if "--rebased --agent" in line)
    agent = call.split("--agent ", 1)[1].split(";")[0].split()[0]
    assert storm(repo, "write", "long.py", "--rebased", "--agent", agent).returncode == 0
    assert show(repo, WS, "long.py") == theirs.replace("line 12\n", "line 12 (B)\n")
