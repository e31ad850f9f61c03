"""Claude Code itself (from npm) drives git storm through its hooks; a scripted model
on 127.0.0.1 plays the tool calls and records what Claude Code sent back, which
is what a model would have seen. Run with ``pytest -m harness tests/e2e``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import harnesses as hx
import pytest
from model_server import Script, serve

sys.path.insert(0, str(Path(__file__).parent.parent))
from helpers import git, storm  # noqa: E402

workspace = hx.workspace

pytestmark = pytest.mark.harness



def install(repo: Path, home: Path, *args: str) -> None:
    r = storm(repo, "harness", "install", "claude", *args, env={"CLAUDE_CONFIG_DIR": str(home / ".claude")})
    assert r.returncode == 0, r.stderr
    hx.use_other_build(home / ".claude/settings.json" if "--user" in args else repo / ".claude/settings.json")


def play(bin_dir, repo, home, log, sessions, cwd=None, **kw):
    """Run one Claude Code per session (concurrently) on the script; return it."""
    script = Script(sessions)
    server, port = serve(script)
    runs = [hx.claude(bin_dir, cwd or repo, f"[[{name}]] do the task", port, home, log, **kw)
            for name in sessions if not name.endswith("-sub")]
    hx.finish(runs, server, script)
    return script




def test_two_sessions_one_file_the_stale_one_learns_what_changed_on_reading_again(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    api = str(repo / "src/api.py")
    script = play(harness_bin, repo, home, log, {
        # A edits only once B has read (B's read is of the old version), and B edits after A
        "A": [{"tool": "Read", "input": {"file_path": api}},
              {"after": ["B", 1], "tool": "Edit",
               "input": {"file_path": api, "old_string": "def fetch(url):",
                         "new_string": "def fetch(url, timeout=10):  # A: callers hang"}}],
        "B": [{"tool": "Read", "input": {"file_path": api}},
              {"after": ["A", 2], "tool": "Edit",
               "input": {"file_path": api, "old_string": "return http_get(url)",
                         "new_string": "return http_get(url, 5)"}},
              {"tool": "Read", "input": {"file_path": api}},
              {"tool": "Edit", "input": {"file_path": api, "old_string": "return http_get(url)",
                                         "new_string": "return http_get(url, 5)"}}],
    })
    [a] = hx.writers(log, "src/api.py")[:1]
    out = script.outputs("B")
    if hx.hooks_before_read_checks(harness_bin):
        # storm's hook sees the stale edit first: refused with the diff and who made it
        assert "rejected (direct_conflict)" in out[1] and f"changed by {a}" in out[1], out[1]
        assert "+def fetch(url, timeout=10):  # A: callers hang" in out[1]
    else:
        # Claude Code's own check refuses the stale edit before any hook runs ...
        assert "modified since read" in out[1], out[1]
        # ... so storm tells B on its next read: the diff and who made it
        assert "src/api.py changed since your previous read" in out[2] and f"by {a}" in out[2], out[2]
        assert "+def fetch(url, timeout=10):  # A: callers hang" in out[2]
    content = workspace(repo, "src/api.py").decode()
    assert "timeout=10" in content and "http_get(url, 5)" in content  # no lost update
    writers = hx.writers(log, "src/api.py")
    assert len(set(writers)) == 2 and a in writers
    assert (repo / "src/api.py").read_bytes() == workspace(repo, "src/api.py")
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["unmediated"] == [] and st["reservations"] == []


def test_a_stale_dependency_is_denied_with_the_diff_and_the_retry_lands(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    api, util = str(repo / "src/api.py"), str(repo / "src/util.py")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "Read", "input": {"file_path": util}},
              {"tool": "Read", "input": {"file_path": api}},
              {"after": ["B", 2], "tool": "Edit",
               "input": {"file_path": api, "old_string": "return http_get(url)",
                         "new_string": "return clamp(http_get(url), 0, 9)"}},
              {"tool": "Read", "input": {"file_path": util}},
              {"tool": "Edit", "input": {"file_path": api, "old_string": "return http_get(url)",
                                         "new_string": "return clamp(http_get(url), 0, 9)"}}],
        "B": [{"tool": "Read", "input": {"file_path": util}},
              {"after": ["A", 2], "tool": "Edit",  # after A's reads: A's view of util.py is the old one
               "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                         "new_string": "def clamp(x, lo=0, hi=1):  # B: defaults"}}],
    })
    out = script.outputs("A")
    denied = out[2]
    assert "git storm refused this Edit of src/api.py" in denied and "stale_dependency" in denied, denied
    assert "+def clamp(x, lo=0, hi=1):  # B: defaults" in denied  # the diff of what it relied on
    assert "updated successfully" in out[4]
    assert b"clamp(http_get" in workspace(repo, "src/api.py")
    assert b"lo=0" in workspace(repo, "src/util.py")


def test_new_file_shell_edit_failing_edit_and_an_unread_file_in_one_session(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    client, new = str(repo / "src/client.py"), str(repo / "src/new.py")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "Write", "input": {"file_path": new, "content": "X = 1\n"}},
              {"tool": "Bash", "input": {"command": "sed -i 's/lo, hi/low, high/' src/util.py && echo edited",
                                         "description": "rename"}},
              {"tool": "Read", "input": {"file_path": client}},
              {"tool": "Edit", "input": {"file_path": client, "old_string": "no such text", "new_string": "x"}},
              {"tool": "Edit", "input": {"file_path": str(repo / "README.md"), "old_string": "# service",
                                         "new_string": "# svc"}},
              {"tool": "Bash", "input": {"command": "echo half > src/half.txt; echo failing; exit 3",
                                         "description": "fail"}}],
        # B edits the file A read only once A's session is over: A's failing command must not
        # meet a stale read of it (that rejection would be right, and the order a race)
        "B": [{"after": ["A", 6], "tool": "Read", "input": {"file_path": client}},
              {"tool": "Edit", "input": {"file_path": client, "old_string": "def load(url):",
                                         "new_string": "def load(url, retries=1):"}}],
    })
    out = script.outputs("A")
    assert workspace(repo, "src/new.py") == b"X = 1\n"  # Write of a new file, recorded
    assert "edited" in out[1] and b"low, high" in workspace(repo, "src/util.py")  # Bash sed -i, recorded
    # Claude Code checks an Edit's input before any hook: a failing one takes no lease ...
    assert "String to replace not found" in out[3]
    assert "updated successfully" in script.outputs("B")[1]  # ... so B's edit of the file goes on
    if hx.hooks_before_read_checks(harness_bin):  # storm's hook refuses the unread file first
        assert "rejected (unread_target)" in out[4] and "never read README.md" in out[4], out[4]
        assert hx.writers(log, "README.md") == []
    else:
        assert "has not been read yet" in out[4]  # its own check: an unread file is not edited
        assert [e for e in hx.hook_log(log) if "README.md" in e["paths"]] == []
    assert (repo / "README.md").read_text() == "# service\n"
    # a failing command: what it wrote is still recorded, and the model saw its output
    assert "failing" in out[5] and "Exit code 3" in out[5], out[5]
    assert workspace(repo, "src/half.txt") == b"half\n"
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["unmediated"] == [] and st["reservations"] == []


def test_an_edit_refused_by_permissions_leaves_no_lease_that_holds_another_session(harness_bin, world):
    """Claude Code runs the pre hook, then refuses the edit (default permission mode:
    ``-p`` cannot ask), and sends no post hook. The lease the pre hook took must not
    hold the other session's edit for the lease's 30 s: the wait is capped at 5 s
    here, so a held lease would be a 'reserved' denial."""
    repo, home, log = world
    install(repo, home)
    git(repo, "config", "storm.leaseSeconds", "30")
    git(repo, "config", "storm.harnessWaitSeconds", "5")
    api = str(repo / "src/api.py")
    script = Script({
        "A": [{"tool": "Read", "input": {"file_path": api}},
              {"tool": "Edit", "input": {"file_path": api, "old_string": "def fetch(url):",
                                         "new_string": "def fetch(url, timeout=10):"}}],
        "B": [{"tool": "Read", "input": {"file_path": api}},
              {"after": ["A", 2], "tool": "Edit",
               "input": {"file_path": api, "old_string": "return http_get(url)",
                         "new_string": "return http_get(url, 5)"}}],
    })
    server, port = serve(script)
    runs = [hx.claude(harness_bin, repo, "[[A]] do the task", port, home, log, skip_permissions=False),
            hx.claude(harness_bin, repo, "[[B]] do the task", port, home, log)]
    hx.finish(runs, server, script)
    a, b = script.outputs("A"), script.outputs("B")
    assert "updated successfully" not in a[1] and "permission" in a[1].lower(), a[1]  # refused by Claude Code
    assert any(e["action"] == "validated-and-leased" and "src/api.py" in e["paths"]
               for e in hx.hook_log(log) if e.get("event") == "PreToolUse"), "A's pre hook never leased"
    assert "updated successfully" in b[1], b[1]  # not held by A's lease
    content = workspace(repo, "src/api.py").decode()
    assert "http_get(url, 5)" in content and "timeout=10" not in content
    assert (repo / "src/api.py").read_bytes() == workspace(repo, "src/api.py")


def test_a_subagent_is_an_agent_of_its_own(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    util = str(repo / "src/util.py")
    play(harness_bin, repo, home, log, {
        "A": [{"tool": "Agent", "input": {"description": "edit util", "subagent_type": "general-purpose",
                                          "prompt": "[[A-sub]] edit util"}}],
        "A-sub": [{"tool": "Read", "input": {"file_path": util}},
                  {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                                             "new_string": "def clamp(x, lo, hi):  # sub: checked"}}],
    })
    [writer] = hx.writers(log, "src/util.py")
    assert writer.startswith("claude-") and "-sub-" in writer
    assert b"# sub: checked" in workspace(repo, "src/util.py")


def test_a_session_started_in_a_subdirectory(harness_bin, world):
    """Claude Code reads .claude/settings.json where it starts: with the project's
    settings only, a session started in src/ runs no hook and its edit stays an
    unmediated edit (install said so); with --user it is guarded like any other."""
    repo, home, log = world
    install(repo, home)
    util = str(repo / "src/util.py")
    steps = lambda tag: [{"tool": "Read", "input": {"file_path": util}},  # noqa: E731
                         {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp(",
                                                    "new_string": f"def clamp_{tag}("}}]
    play(harness_bin, repo, home, log, {"A": steps("a")}, cwd=repo / "src")
    assert hx.hook_log(log) == []  # no hook ran at all
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert [u["path"] for u in st["unmediated"]] == ["src/util.py"]
    r = storm(repo, "harness", "status", env={"CLAUDE_CONFIG_DIR": str(home / ".claude")})
    assert "a session started in a subdirectory runs without storm's hooks" in r.stdout
    storm(repo, "checkout", "src/util.py")
    install(repo, home, "--user")
    play(harness_bin, repo, home, log, {"B": steps("b")}, cwd=repo / "src")
    assert hx.writers(log, "src/util.py")
    assert b"def clamp_b(" in workspace(repo, "src/util.py")
    # at the top, with both settings installed, each hook runs once (the same command)
    n = len(hx.hook_log(log))
    play(harness_bin, repo, home, log, {"C": [{"tool": "Read", "input": {"file_path": util}}]})
    assert len(hx.hook_log(log)) == n + 1


def test_without_storm_hooks_nothing_is_recorded_and_status_says_so(harness_bin, world):
    repo, home, log = world
    util = str(repo / "src/util.py")
    r = storm(repo, "harness", "status", env={"CLAUDE_CONFIG_DIR": str(home / ".claude")})
    assert "claude: NOT active (not installed)" in r.stdout
    play(harness_bin, repo, home, log, {"A": [{"tool": "Read", "input": {"file_path": util}},
                                              {"tool": "Edit", "input": {"file_path": util, "old_string": "lo, hi",
                                                                         "new_string": "a, b"}}]})
    assert hx.hook_log(log) == []
    head = git(repo, "rev-parse", "refs/storm/workspace").stdout
    assert b"lo, hi" in workspace(repo, "src/util.py") and head
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert [u["path"] for u in st["unmediated"]] == ["src/util.py"]


def test_over_the_size_limit_a_write_is_denied_and_an_edit_blocked_once(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    git(repo, "config", "storm.maxFileBytes", "200")
    util, big = str(repo / "src/util.py"), str(repo / "src/big.txt")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "Write", "input": {"file_path": big, "content": "x" * 500}},
              {"tool": "Read", "input": {"file_path": util}},
              {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp", "new_string": "y" * 300}}],
    })
    out = script.outputs("A")
    assert "storm.maxFileBytes" in out[0] and "nothing was written" in out[0].lower(), out[0]
    assert not (repo / "src/big.txt").exists()  # denied before it landed
    assert out[2].count("NOT part of the shared state") == 1, out[2]  # the block, read once
    assert b"yyy" not in workspace(repo, "src/util.py")
