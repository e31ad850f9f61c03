"""`git storm mcp` through the real MCP SDK client.

Sessions are real: ``ClientSession`` over ``stdio_client`` spawning ``git storm mcp
--agent X`` in a temporary repository initialised with ``git storm init``; the many
small argument checks use the SDK's in-memory transport (``mcp.Client`` on the server
object) against the same repository. No mocks of git or the file system.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

mcp = pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

from helpers import ROOT, git, rev, show, snapshot_refs, storm  # noqa: E402

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
EXPECTED_TOOLS = {"view", "create", "str_replace", "insert", "undo_edit", "read", "write", "rm", "exec",
                  "status", "log", "release", "forget", "commit", "assign", "merge"}


def _env(agent_env: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("STORM_AGENT", None)
    if agent_env:
        env["STORM_AGENT"] = agent_env
    return env


@asynccontextmanager
async def session(repo: Path, agent: str) -> AsyncIterator[ClientSession]:
    """A real stdio session with `git storm mcp --agent AGENT` run in ``repo``."""
    params = StdioServerParameters(command="git", args=["storm", "mcp", "--agent", agent], cwd=str(repo),
                                   env=_env())
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            yield s


def text(res: Any) -> str:
    return "\n".join(c.text for c in res.content if getattr(c, "type", "") == "text")


def head(repo: Path) -> str:
    return rev(repo, "refs/storm/workspace")


def _ancestor(repo: Path, commit: str) -> bool:
    return git(repo, "merge-base", "--is-ancestor", commit, "refs/storm/workspace", check=False).returncode == 0


# -- tool list ----------------------------------------------------------------------------
def test_tool_names_match_the_strict_pattern(repo):
    async def main() -> list[Any]:
        async with session(repo, "engineer_1") as s:
            return (await s.list_tools()).tools

    tools = anyio.run(main)
    names = {t.name for t in tools}
    assert names == EXPECTED_TOOLS
    assert all(TOOL_NAME.fullmatch(n) for n in names), names
    view = next(t for t in tools if t.name == "view")
    assert set(view.input_schema["properties"]) == {"path", "view_range"}
    assert all(t.description for t in tools)


# -- the full session ---------------------------------------------------------------------
def test_session_view_edit_rejection_view_retry(repo):
    """view -> str_replace -> another agent's change -> str_replace rejected (isError,
    diff in text and structuredContent) -> view -> the retry is accepted."""
    api = repo / "src" / "api.py"

    async def main() -> None:
        async with session(repo, "engineer_1") as e1, session(repo, "engineer_2") as e2:
            r = await e1.call_tool("view", {"path": str(api)})  # absolute path, as file_editor passes
            assert not r.is_error and "     1\tdef fetch(url):" in text(r)
            r = await e1.call_tool("str_replace", {"path": "src/api.py", "old_str": "def fetch(url):",
                                                   "new_str": "def fetch(url, timeout=10):"})
            assert not r.is_error, text(r)
            assert "has been edited" in text(r) and r.structured_content["accepted"] is True
            first = r.structured_content["commit"]

            # engineer_2 reads the new version and changes the body
            assert not (await e2.call_tool("view", {"path": "src/api.py"})).is_error
            r = await e2.call_tool("str_replace", {"path": "src/api.py", "old_str": "    return http_get(url)",
                                                   "new_str": "    return http_get(url, retries=3)"})
            assert not r.is_error, text(r)
            second = r.structured_content["commit"]

            # engineer_1 edits again from what it last saw: rejected with the diff
            before = head(repo)
            r = await e1.call_tool("str_replace", {"path": "src/api.py", "old_str": "    return http_get(url)",
                                                   "new_str": "    return http_get(url, timeout)"})
            assert r.is_error
            t = text(r)
            assert "REJECTED (direct_conflict)" in t and "engineer_2" in t
            assert "-    return http_get(url)" in t and "+    return http_get(url, retries=3)" in t
            assert "What to do next" in t
            rej = r.structured_content["rejection"]
            assert rej["reason"] == "direct_conflict" and rej["changed_by"] == ["engineer_2"]
            assert "+    return http_get(url, retries=3)" in rej["diff"]
            assert rej["current_content"] == show(repo, "refs/storm/workspace", "src/api.py").decode()
            assert rej["reservation"]["holder"] == "engineer_1"
            assert head(repo) == before  # nothing written

            r = await e1.call_tool("view", {"path": "src/api.py"})
            assert "retries=3" in text(r)
            r = await e1.call_tool("str_replace", {"path": "src/api.py",
                                                   "old_str": "    return http_get(url, retries=3)",
                                                   "new_str": "    return http_get(url, retries=3, timeout=timeout)"})
            assert not r.is_error, text(r)
            third = r.structured_content["commit"]
            assert all(_ancestor(repo, c) for c in (first, second, third))

    anyio.run(main)
    final = show(repo, "refs/storm/workspace", "src/api.py").decode()
    assert final == "def fetch(url, timeout=10):\n    return http_get(url, retries=3, timeout=timeout)\n"
    assert (repo / "src" / "api.py").read_text() == final  # the disk converged to the head
    log = storm(repo, "log", "--json").stdout
    assert '"reason": "direct_conflict"' in log or "direct_conflict" in log


# -- racing clients ---------------------------------------------------------------------
async def _agent_loop(repo: Path, agent: str, path: str, rounds: int, outcomes: list[dict]) -> None:
    async with session(repo, agent) as s:
        for j in range(rounds):
            line = f"{agent} round {j}\n"
            await s.call_tool("view", {"path": path})
            for _attempt in range(40):
                r = await s.call_tool("str_replace", {"path": path, "old_str": "# end\n",
                                                      "new_str": line + "# end\n"})
                d = r.structured_content or {}
                outcomes.append({"agent": agent, "line": line, "error": r.is_error, "data": d, "text": text(r)})
                if not r.is_error:
                    break
                assert "rejection" in d, text(r)  # a rejection, never a plain error
                await anyio.sleep(random.random() * 0.05)
            else:
                raise AssertionError(f"{agent} never got its write in")


@pytest.mark.parametrize("clients,same_file", [(2, True), pytest.param(4, True, marks=pytest.mark.slow), (4, False)],
                         ids=["2-same", "4-same", "4-different"])
def test_racing_clients_lose_no_update(repo, clients, same_file):
    git(repo, "config", "storm.reservationSeconds", "5")
    files = ["shared.txt"] if same_file else [f"own_{i}.txt" for i in range(clients)]
    for f in files:
        assert storm(repo, "write", f, "-m", "setup", input="# start\n# end\n", agent="setup").returncode == 0
    rounds = 3
    outcomes: list[dict] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(_agent_loop, repo, f"agent_{i}", files[0 if same_file else i], rounds, outcomes)

    anyio.run(main)
    accepted = [o for o in outcomes if not o["error"]]
    rejected = [o for o in outcomes if o["error"]]
    assert len(accepted) == clients * rounds
    for o in accepted:  # every accepted write is in the shared ref's history
        assert _ancestor(repo, o["data"]["commit"])
    for o in rejected:  # every rejection is justified: the file had moved since the agent read it
        rej = o["data"]["rejection"]
        assert rej["reason"] in ("direct_conflict", "reserved"), rej
        if rej["reason"] == "direct_conflict":
            assert rej["read_version"] != rej["current_version"] and rej["diff"]
    if not same_file:
        assert not rejected, [o["text"] for o in rejected]
    for f in files:
        final = show(repo, "refs/storm/workspace", f).decode()
        for o in accepted:  # no lost update: every accepted line is in the final file
            if same_file or o["line"].startswith(f"agent_{files.index(f)} "):
                assert o["line"] in final, (o["line"], final)
        assert final.count("round") == (clients * rounds if same_file else rounds)
        assert (repo / f).read_text() == final  # the disk converged to the head
    assert storm(repo, "doctor").returncode == 0


# -- bad arguments (in-memory transport) ---------------------------------------------------
def _server(repo: Path, agent: str = "engineer_1"):
    from storm_git.integrations.mcp_server import build_server

    return build_server(str(repo), agent)


BAD_CALLS = [
    ("view", {"path": "../outside.txt"}, "leads outside the repository"),
    ("view", {"path": "/etc/passwd"}, "outside the repository"),
    ("view", {"path": ".git/config"}, "inside .git"),
    ("view", {"path": "src/api.py", "view_range": [0, 1]}, "Invalid `view_range`"),
    ("view", {"path": "src/api.py", "view_range": [2, 1]}, "larger or equal"),
    ("view", {"path": "src/api.py", "view_range": [1, 99]}, "smaller than the number of lines"),
    ("view", {"path": "src/api.py", "view_range": [1]}, "two integers"),
    ("view", {"path": "src", "view_range": [1, 2]}, "not allowed when `path` points to a directory"),
    ("view", {}, "path"),
    ("view", {"path": 7}, "path"),
    ("create", {"path": "src/api.py", "file_text": "x"}, "already exists"),
    ("create", {"path": "a\nb.py", "file_text": "x"}, "newline"),
    ("str_replace", {"path": "src/api.py", "old_str": "nowhere", "new_str": "x"}, "did not appear verbatim"),
    ("str_replace", {"path": "src/api.py", "old_str": "url", "new_str": "u"}, "Multiple occurrences"),
    ("str_replace", {"path": "src/api.py", "old_str": "", "new_str": "x"}, "must not be empty"),
    ("str_replace", {"path": "src/nope.py", "old_str": "a", "new_str": "b"}, "does not exist"),
    ("insert", {"path": "src/api.py", "insert_line": 9, "new_str": "x"}, "[0, 2]"),
    ("insert", {"path": "src/api.py", "insert_line": -1, "new_str": "x"}, "insert_line"),
    ("undo_edit", {"path": "src/api.py"}, "No edit history found"),
    ("read", {"paths": []}, "no path given"),
    ("write", {"path": "src", "content": "x"}, "directory"),
    ("exec", {"command": ""}, "no command given"),
    ("exec", {"command": []}, "non-empty list"),
    ("exec", {"command": ["definitely-not-a-command-xyz"]}, "not found"),
    ("log", {"limit": 0}, "at least 1"),
    ("release", {"path": "src/api.py"}, "nothing to release"),
    ("merge", {}, "storm mode"),
    ("assign", {"assignee": "engineer_2"}, "no files given"),
    ("no_such_tool", {}, "Unknown tool"),
]


def test_bad_arguments_are_clear_tool_errors_and_change_nothing(repo):
    async def main() -> list[tuple[str, Any]]:
        out = []
        async with mcp.Client(_server(repo)) as c:
            # engineer_1 has read src/api.py, so the edits below reach their own checks
            assert not (await c.call_tool("view", {"path": "src/api.py"})).is_error
            refs = snapshot_refs(repo)
            for name, args, _ in BAD_CALLS:
                out.append((name, await c.call_tool(name, args)))
            assert snapshot_refs(repo) == refs, "a refused call changed a ref"
        return out

    results = anyio.run(main)
    for (name, args, expected), (_, res) in zip(BAD_CALLS, results, strict=True):
        t = text(res)
        if name == "release":  # not an error: there is simply nothing to release
            assert not res.is_error and expected in t
            continue
        assert res.is_error, (name, args, t)
        assert expected in t, (name, args, t)
        assert "Traceback" not in t and 'File "' not in t, t
        if res.structured_content is not None:  # storm's own errors carry their kind and exit code
            assert res.structured_content["error"]["exit_code"] in (2, 3, 127), res.structured_content
    multi = next(text(res) for (name, args, _), (_, res) in zip(BAD_CALLS, results, strict=True)
                 if "Multiple occurrences" in text(res))
    assert "[1, 2]" in multi  # the lines of each occurrence


def test_small_tools_in_memory(repo):
    """create / insert / undo_edit / read / write / rm / exec / status / log / forget / assign."""
    async def main() -> None:
        async with mcp.Client(_server(repo)) as c:
            r = await c.call_tool("create", {"path": str(repo / "pkg" / "new.py"), "file_text": "x = 1\n"})
            assert not r.is_error and "File created successfully" in text(r)
            r = await c.call_tool("insert", {"path": "pkg/new.py", "insert_line": 0, "new_str": "# header"})
            assert not r.is_error and "     1\t# header" in text(r)
            r = await c.call_tool("insert", {"path": "pkg/new.py", "insert_line": 2, "new_str": "y = 2\n"})
            assert not r.is_error
            assert (repo / "pkg" / "new.py").read_text() == "# header\nx = 1\ny = 2\n"
            r = await c.call_tool("undo_edit", {"path": "pkg/new.py"})
            assert not r.is_error and (repo / "pkg" / "new.py").read_text() == "# header\nx = 1\n"
            r = await c.call_tool("undo_edit", {"path": "pkg/new.py"})
            assert not r.is_error and (repo / "pkg" / "new.py").read_text() == "x = 1\n"
            r = await c.call_tool("undo_edit", {"path": "pkg/new.py"})  # undoes the create
            assert not r.is_error and "removed" in text(r) and not (repo / "pkg" / "new.py").exists()
            r = await c.call_tool("undo_edit", {"path": "pkg/new.py"})
            assert r.is_error and "No edit history" in text(r)

            r = await c.call_tool("view", {"path": "."})
            assert not r.is_error and "src/api.py" in text(r) and ".git" not in text(r)
            r = await c.call_tool("read", {"paths": ["src/util.py", "missing.txt"]})
            assert not r.is_error and "def clamp" in text(r) and "not found" in text(r)
            assert [f["exists"] for f in r.structured_content["files"]] == [True, False]
            r = await c.call_tool("write", {"path": "src/util.py", "content": "def clamp(x):\n    return x\n",
                                            "intent": "engineer_1: simpler"})
            assert not r.is_error and r.structured_content["accepted"]
            r = await c.call_tool("exec", {"command": "echo out; echo err >&2; printf 'z\\n' > gen.txt"})
            assert not r.is_error and "out" in text(r) and "err" in text(r)
            assert r.structured_content["paths"] == ["gen.txt"] and r.structured_content["write"]["accepted"]
            r = await c.call_tool("exec", {"command": ["sh", "-c", "exit 3"]})
            assert not r.is_error and "exit code 3" in text(r)
            r = await c.call_tool("rm", {"path": "gen.txt"})
            assert not r.is_error and not (repo / "gen.txt").exists()
            r = await c.call_tool("status", {})
            assert not r.is_error and r.structured_content["mode"] == "storm"
            r = await c.call_tool("log", {"limit": 3})
            assert not r.is_error and len(r.structured_content["entries"]) == 3
            r = await c.call_tool("forget", {})
            assert not r.is_error and r.structured_content["forgotten"]
            r = await c.call_tool("assign", {"assignee": "engineer_2", "files": ["src/client.py"]})
            assert not r.is_error and "engineer_2: src/client.py" in text(r)
            r = await c.call_tool("commit", {"message": "integrate"})
            assert r.is_error and "manager" in text(r)  # engineers do not commit in storm mode
        async with mcp.Client(_server(repo, "manager")) as m:
            r = await m.call_tool("commit", {"message": "integrate"})
            assert not r.is_error and "committed" in text(r), text(r)

    anyio.run(main)
    assert git(repo, "log", "-1", "--format=%s", "main").stdout.decode().strip() == "integrate"
    assert storm(repo, "doctor").returncode == 0


def test_write_deps_auto_skips_an_unrelated_stale_read_and_deps_all_does_not(repo):
    """The tools' ``deps`` take the CLI's words: ["auto"] validates only what the new
    content depends on (not a file named "auto"), ["all"] the whole read set."""
    async def main() -> None:
        async with mcp.Client(_server(repo)) as c:
            r = await c.call_tool("read", {"paths": ["src/util.py", "README.md"]})
            assert not r.is_error
            other = storm(repo, "write", "README.md", "-m", "e2: title", input="# renamed\n", agent="engineer_2")
            assert other.returncode == 1  # engineer_2 never read it: unread_target, counts as its read
            assert storm(repo, "write", "README.md", "-m", "e2: title", input="# renamed\n",
                         agent="engineer_2").returncode == 0
            new = "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n"
            r = await c.call_tool("write", {"path": "src/util.py", "content": new, "deps": ["all"]})
            assert r.is_error and r.structured_content["rejection"]["reason"] == "stale_dependency"
            r = await c.call_tool("read", {"paths": ["src/util.py"]})
            r = await c.call_tool("write", {"path": "src/util.py", "content": new, "deps": ["auto"]})
            assert not r.is_error and r.structured_content["accepted"], text(r)
            r = await c.call_tool("write", {"path": "src/util.py", "content": new, "deps": ["auto", "README.md"]})
            assert r.is_error and "cannot be combined" in text(r)

    anyio.run(main)
    landed = show(repo, "refs/storm/workspace", "src/util.py").decode()
    assert landed.startswith("def clamp(x, lo, hi):\n    return min")


def test_undo_is_refused_when_another_agent_changed_the_file_since(repo):
    async def main() -> None:
        async with mcp.Client(_server(repo, "engineer_1")) as a, mcp.Client(_server(repo, "engineer_2")) as b:
            await a.call_tool("view", {"path": "src/util.py"})
            r = await a.call_tool("str_replace", {"path": "src/util.py", "old_str": "lo, hi", "new_str": "lo=0, hi=1"})
            assert not r.is_error
            await b.call_tool("view", {"path": "src/util.py"})
            r = await b.call_tool("insert", {"path": "src/util.py", "insert_line": 0, "new_str": "# engineer_2"})
            assert not r.is_error
            before = head(repo)
            r = await a.call_tool("undo_edit", {"path": "src/util.py"})
            assert r.is_error and "undoing it would also discard" in text(r)
            # what happened, in the terms of what engineer_1 did: an edit and an undo (no exec,
            # nothing on disk), and who changed the file since
            message = r.structured_content["rejection"]["message"]
            assert "exec" not in text(r) and "on disk" not in text(r), text(r)
            assert message.startswith("src/util.py was changed by engineer_2 after engineer_1's last edit of it"), \
                message
            assert r.structured_content["rejection"]["reason"] == "direct_conflict"
            assert head(repo) == before

    anyio.run(main)


def test_undo_history_survives_a_new_server(repo):
    """undo_edit derives the agent's last edit from the shared ref, not from server memory."""
    async def edit() -> None:
        async with mcp.Client(_server(repo)) as c:
            await c.call_tool("view", {"path": "README.md"})
            assert not (await c.call_tool("str_replace", {"path": "README.md", "old_str": "# service",
                                                          "new_str": "# service v2"})).is_error

    async def undo() -> None:
        async with mcp.Client(_server(repo)) as c:
            r = await c.call_tool("undo_edit", {"path": "README.md"})
            assert not r.is_error, text(r)

    anyio.run(edit)
    anyio.run(undo)
    assert show(repo, "refs/storm/workspace", "README.md") == b"# service\n"


# -- a server killed mid-session --------------------------------------------------------------
def test_server_killed_mid_write_leaves_a_valid_state(repo):
    big = "".join(f"line {i}\n" for i in range(20000))
    killed = 0

    async def one(delay: float) -> None:
        nonlocal killed
        try:
            async with session(repo, "engineer_1") as s:
                r = await s.call_tool("exec", {"command": "echo $PPID"})
                pid = int(text(r).splitlines()[1])
                await s.call_tool("view", {"path": "big.txt"})
                async with anyio.create_task_group() as tg:
                    async def write() -> None:
                        try:
                            await s.call_tool("write", {"path": "big.txt", "content": big + f"{delay}\n"})
                        except Exception:  # noqa: BLE001 - the connection dies with the server
                            pass

                    tg.start_soon(write)
                    await anyio.sleep(delay)
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        except Exception:  # noqa: BLE001 - the SDK reports the closed connection as it can
            pass

    for delay in (0.0, 0.02, 0.06):  # before, around and after the write reaches the server
        anyio.run(one, delay)
    assert killed == 3
    r = storm(repo, "doctor")
    if r.returncode != 0:
        # a SIGKILL while the file was being written (or swapped in) can leave only the
        # writer's temporary file, which nothing can clean up at the moment of the kill;
        # doctor names it and --fix removes it. Anything else is a failure.
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("storm doctor:")]
        assert lines and all(ln.startswith("stale_temp_file: ") for ln in lines), r.stdout + r.stderr
        assert storm(repo, "doctor", "--fix").returncode == 0
        r = storm(repo, "doctor")
    assert r.returncode == 0, r.stdout + r.stderr

    async def after() -> None:  # a new server works
        async with session(repo, "engineer_1") as s:
            r = await s.call_tool("view", {"path": "README.md"})
            assert not r.is_error
            edit = {"path": "README.md", "old_str": "# service", "new_str": "# service after the crash"}
            r = await s.call_tool("str_replace", edit)
            if r.is_error and show_absent(repo, "big.txt"):
                # a write killed between its journal entry and its CAS leaves the version it
                # would have made in the agent's read set (storm_git.core.readsets.record_write):
                # the next write is refused once as stale on big.txt, never accepted wrongly,
                # and reading big.txt again clears it
                assert "stale_dependency" in text(r) and "big.txt" in text(r), text(r)
                await s.call_tool("view", {"path": "big.txt"})
                r = await s.call_tool("str_replace", edit)
            assert not r.is_error, text(r)

    anyio.run(after)
    assert (repo / "README.md").read_text() == show(repo, "refs/storm/workspace", "README.md").decode()


def show_absent(repo, path: str) -> bool:
    return git(repo, "cat-file", "-e", f"refs/storm/workspace:{path}", check=False).returncode != 0


# -- worktree mode ----------------------------------------------------------------------------
def test_worktree_mode_session(repo, tmp_path):
    assert storm(repo, "mode", "worktree").returncode == 0
    r = storm(repo, "spawn", "engineer_1", "--json")
    assert r.returncode == 0, r.stderr
    import json

    wt = Path(json.loads(r.stdout)["path"])

    async def main() -> None:
        async with session(repo, "engineer_1") as s:
            r = await s.call_tool("view", {"path": str(wt / "src" / "api.py")})
            assert not r.is_error and "def fetch" in text(r)
            r = await s.call_tool("str_replace", {"path": str(wt / "src" / "api.py"), "old_str": "http_get(url)",
                                                  "new_str": "http_get(url, retries=3)"})
            assert not r.is_error, text(r)
            assert "worktree" in text(r)
            r = await s.call_tool("insert", {"path": "src/api.py", "insert_line": 0, "new_str": "# engineer_1"})
            assert not r.is_error
            r = await s.call_tool("undo_edit", {"path": "src/api.py"})
            assert not r.is_error
            r = await s.call_tool("release", {"path": "src/api.py"})
            assert r.is_error and "no reservations" in text(r)
            r = await s.call_tool("commit", {"message": "engineer_1: retries"})
            assert not r.is_error, text(r)
        async with session(repo, "manager") as m:
            r = await m.call_tool("merge", {})
            assert not r.is_error, text(r)
            assert "engineer_1: merged" in text(r)

    anyio.run(main)
    assert (wt / "src" / "api.py").read_text() == "def fetch(url):\n    return http_get(url, retries=3)\n"
    assert show(repo, "main", "src/api.py") == b"def fetch(url):\n    return http_get(url, retries=3)\n"
    assert show(repo, "main", "src/client.py") == (repo / "src" / "client.py").read_bytes()


# -- the command line ------------------------------------------------------------------------
def test_cli_refuses_a_missing_or_bad_agent_before_serving(repo):
    for args, env in ((["mcp"], None), (["mcp", "--agent", "bad agent"], None), (["mcp"], {"STORM_AGENT": "a/b"})):
        r = subprocess.run(["git", "storm", *args], cwd=repo, capture_output=True, text=True, input="",
                           env=dict(_env(), **(env or {})), timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "agent" in r.stderr and r.stdout == ""


def test_cli_without_the_sdk_says_how_to_install_it(repo, tmp_path):
    """The SDK is an optional extra: its absence is one line and exit 2, not a traceback."""
    fake = tmp_path / "no_sdk" / "mcp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('mcp is not installed here')\n")
    env = dict(_env(), PYTHONPATH=str(fake.parent))
    r = subprocess.run(["git", "storm", "mcp", "--agent", "engineer_1"], cwd=repo, capture_output=True,
                       text=True, input="", env=env, timeout=30)
    assert r.returncode == 2
    # the hint installs the extra the way this copy was installed: editable, from the clone
    root = str(ROOT)
    assert r.stderr.count("\n") == 1, r.stderr
    # with this environment's interpreter (the git-storm script's: python or python3)
    assert f"(/{os.path.dirname(sys.executable).strip('/')}/python" in r.stderr, r.stderr
    assert f" -m pip install -e '{root}[mcp]';" in r.stderr, r.stderr
    assert storm(repo, "status").returncode == 0  # the rest of git storm does not need it


def test_help_shows_each_harness_configuration():
    r = subprocess.run(["git", "storm", "mcp", "-h"], capture_output=True, text=True, env=_env(), timeout=30)
    assert r.returncode == 0
    for needle in ("claude mcp add", "codex mcp add", ".cursor/mcp.json", "stdio_servers", "Example:"):
        assert needle in r.stdout, needle


def test_exec_rejected_when_another_agent_wrote_the_file_meanwhile_and_timeouts(repo):
    """exec is one validated write: another agent's write landing while the command runs is
    a rejection (isError, the diff, what to do); a command past its timeout records nothing."""
    async def main() -> tuple[Any, Any, Any]:
        async with mcp.Client(_server(repo, "engineer_1")) as a, mcp.Client(_server(repo, "engineer_2")) as b:
            await b.call_tool("view", {"path": "src/util.py"})
            results: dict[str, Any] = {}

            async def run_exec() -> None:
                results["exec"] = await a.call_tool("exec", {
                    "command": "sleep 1; printf 'def clamp(x):\\n    return x\\n' > src/util.py"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(run_exec)
                await anyio.sleep(0.4)
                results["edit"] = await b.call_tool("str_replace", {"path": "src/util.py", "old_str": "lo, hi",
                                                                    "new_str": "lo=0, hi=1"})
            slow = await a.call_tool("exec", {"command": "sleep 5; echo late > late.txt", "timeout": 0.3})
            return results["exec"], results["edit"], slow

    ex, edit, slow = anyio.run(main)
    assert not edit.is_error, text(edit)
    assert ex.is_error and "REJECTED (direct_conflict)" in text(ex) and "engineer_2" in text(ex)
    assert "command's changes were not recorded" in text(ex)
    assert ex.structured_content["write"]["rejection"]["reason"] == "direct_conflict"
    assert "lo=0, hi=1" in show(repo, "refs/storm/workspace", "src/util.py").decode()
    assert slow.is_error and "timed out" in text(slow) and slow.structured_content["timed_out"]
    assert b"late.txt" not in git(repo, "ls-tree", "-r", "--name-only", "refs/storm/workspace").stdout


def test_paths_are_relative_to_the_top_and_binary_files_are_not_edited_as_text(repo):
    assert storm(repo, "write", "blob.bin", "-m", "setup", input=b"\x00\x01\x02", agent="setup").returncode == 0

    async def main() -> None:
        async with mcp.Client(_server(repo / "src")) as c:  # a server started in a subdirectory
            r = await c.call_tool("view", {"path": "src/api.py"})
            assert not r.is_error and "def fetch" in text(r)
            r = await c.call_tool("view", {"path": "blob.bin"})
            assert not r.is_error and "binary file (3 bytes)" in text(r)
            r = await c.call_tool("str_replace", {"path": "blob.bin", "old_str": "a", "new_str": "b"})
            assert r.is_error and "binary" in text(r)
            r = await c.call_tool("view", {"path": "missing.py"})
            assert r.is_error and "does not exist" in text(r)
            r = await c.call_tool("create", {"path": "missing.py", "file_text": "ok = True\n"})
            assert not r.is_error, text(r)  # validated against the read of its absence

    anyio.run(main)
    assert (repo / "missing.py").read_text() == "ok = True\n"


def test_exec_that_undoes_unread_work_says_how_to_go_on(repo):
    """An agent's `git checkout -- .` over another agent's write it never read: the
    exec tool's error names the revert and both ways on, as the command line does."""
    assert storm(repo, "read", "src/api.py", agent="engineer_2").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, t=1):\n    pass\n",
                 agent="engineer_2").returncode == 0

    async def main() -> Any:
        async with mcp.Client(_server(repo, "engineer_1")) as a:
            return await a.call_tool("exec", {"command": "git checkout -- ."})

    ex = anyio.run(main)
    assert ex.is_error and ("unread_target" in text(ex).lower() or "never read" in text(ex)), text(ex)
    assert "put back an older shared version of src/api.py" in text(ex)
    assert ex.structured_content["reverted"] == ["src/api.py"]
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"def fetch(url, t=1):\n    pass\n"


def test_a_file_name_that_is_not_utf8_does_not_stop_the_server(repo):
    """Any process may leave ``bad\\xffname.txt`` in the working tree: ``status`` lists
    it (quoted as git does; escaped in structuredContent) and the server goes on
    answering. The server used to die on it, the client waiting for ever."""
    (repo / os.fsdecode(b"bad\xffname.txt")).write_bytes(b"x\n")

    async def main() -> tuple[Any, Any]:
        async with session(repo, "engineer_1") as s:
            with anyio.fail_after(30):
                st = await s.call_tool("status", {})
                rd = await s.call_tool("read", {"paths": ["src/util.py"]})
            return st, rd

    st, rd = anyio.run(main)
    assert not st.is_error and '"bad\\377name.txt"' in text(st), text(st)
    assert [u["path"] for u in st.structured_content["unmediated"]] == ["bad\\xffname.txt"], st.structured_content
    assert not rd.is_error and "def clamp" in text(rd)
