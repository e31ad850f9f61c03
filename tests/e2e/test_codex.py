"""Codex itself (from npm) drives git storm through its hooks; a scripted model on
127.0.0.1 plays the tool calls and records what Codex sent back. Run with
``pytest -m harness tests/e2e``."""
from __future__ import annotations

import sys
from pathlib import Path

import harnesses as hx
import pytest
from model_server import Script, serve

sys.path.insert(0, str(Path(__file__).parent.parent))
from helpers import git, storm  # noqa: E402

workspace = hx.workspace

pytestmark = pytest.mark.harness


def patch(path: str, *hunks: tuple[str, str]) -> str:
    body = "".join(f"@@\n-{old}\n+{new}\n" for old, new in hunks)
    return f"*** Begin Patch\n*** Update File: {path}\n{body}*** End Patch\n"



def play(bin_dir, repo, home, log, sessions, cwd=None, trust=True, extra_toml=""):
    script = Script(sessions)
    server, port = serve(script)
    hx.codex_home(home, port, extra_toml)
    env = {"CODEX_HOME": str(home / ".codex")}
    r = storm(repo, "harness", "install", "codex", *(["--trust"] if trust else []), env=env)
    assert r.returncode == (0 if trust else 3), r.stderr
    if hx.use_other_build(repo / ".codex/hooks.json") and trust:
        hx.trust_codex_hooks(repo, home / ".codex")
    runs = [hx.codex(bin_dir, cwd or repo, f"[[{name}]] do the task", home, log) for name in sessions]
    hx.finish(runs, server, script)
    return script




def test_untrusted_hooks_never_run_and_install_says_so(harness_bin, world):
    repo, home, log = world
    steps = {"A": [{"tool": "apply_patch", "patch": patch("src/util.py", ("def clamp(x, lo, hi):",
                                                                          "def clamp(x, lo=0, hi=1):"))}]}
    script = play(harness_bin, repo, home, log, steps, trust=False)
    assert "Success" in script.outputs("A")[0]  # the patch landed on disk ...
    assert hx.hook_log(log) == []  # ... with no hook at all: codex exec said nothing
    r = storm(repo, "harness", "status", env={"CODEX_HOME": str(home / ".codex")})
    assert r.returncode == 3 and "codex: NOT active" in r.stdout and "not trusted" in r.stdout
    storm(repo, "checkout", "src/util.py")
    play(harness_bin, repo, home, log, steps, trust=True)
    assert hx.writers(log, "src/util.py") and b"lo=0" in workspace(repo, "src/util.py")


def test_a_failed_patch_leaves_no_lease_that_holds_another_session(harness_bin, world):
    """Codex sends no post hook when apply_patch fails: the lease its pre hook took
    must not hold the other session for the lease's 30 s (the wait is capped at 5 s
    here, so a held lease would be a 'reserved' denial). B reads the file after A's
    write (its shell read is recorded), so its patch passes storm's check and fails
    only in Codex, on context B got wrong: a lease, not a rejection's reservation."""
    repo, home, log = world
    git(repo, "config", "storm.leaseSeconds", "30")
    git(repo, "config", "storm.harnessWaitSeconds", "5")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "exec_command", "input": {"cmd": "cat src/api.py"}},
              {"tool": "apply_patch", "patch": patch("src/api.py", ("def fetch(url):", "def fetch(url, timeout=10):"))},
              {"after": ["B", 2], "tool": "apply_patch",
               "patch": patch("src/api.py", ("    return http_get(url)", "    return http_get(url, timeout)"))}],
        "B": [{"after": ["A", 2], "tool": "exec_command", "input": {"cmd": "cat src/api.py"}},
              {"tool": "apply_patch",  # context B got wrong: fails to apply
               "patch": patch("src/api.py", ("def fetch(url):", "def fetch(url, retries=3):"))}],
    })
    a, b = script.outputs("A"), script.outputs("B")
    assert "def fetch(url):" in a[0] and "def fetch(url, timeout=10):" in b[0]  # the shell reads
    assert "Success" not in b[1], b[1]  # B's patch failed
    assert "Success" in a[2], a[2]  # A's next patch was not held by B's lease
    content = workspace(repo, "src/api.py").decode()
    assert "timeout=10" in content and "http_get(url, timeout)" in content and "retries" not in content
    assert len(set(hx.writers(log, "src/api.py"))) == 1
    agents = {e["agent"] for e in hx.hook_log(log)}
    assert len(agents) == 2 and all(x.startswith("codex-") for x in agents)  # two sessions, two agents


def test_a_command_keeps_its_output_when_storm_refuses_what_it_wrote(harness_bin, world):
    repo, home, log = world
    git(repo, "config", "storm.maxFileBytes", "100")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "exec_command", "input": {"cmd": "head -c 500 /dev/zero | tr '\\\\0' x > src/big.txt; "
                                                        "echo the-command-output"}},
              {"tool": "exec_command", "input": {"cmd": "sed -i 's/lo, hi/low, high/' src/util.py"}},
              {"tool": "exec_command", "input": {"cmd": "echo half > src/half.txt; echo failing; exit 3"}}],
    })
    out = script.outputs("A")
    assert "the-command-output" in out[0], out[0]  # never replaced
    assert "storm.maxFileBytes" in out[0] and out[0].count("could not record this Bash") == 1, out[0]  # told once
    assert b"low, high" in workspace(repo, "src/util.py")  # a shell edit is recorded
    assert "failing" in out[2] and workspace(repo, "src/half.txt") == b"half\n"  # a failing one's too


def test_a_session_started_in_a_subdirectory_is_guarded(harness_bin, world):
    repo, home, log = world
    play(harness_bin, repo, home, log, {
        "A": [{"tool": "apply_patch", "patch": patch("util.py", ("def clamp(x, lo, hi):", "def clamp(x, lo, hi=9):"))}],
    }, cwd=repo / "src")
    assert hx.writers(log, "src/util.py") and b"hi=9" in workspace(repo, "src/util.py")


def test_a_stale_dependency_is_denied_with_the_diff_and_the_command_that_reads_it_again(harness_bin, world):
    """Codex reads through the shell, which storm cannot see: after a stale_dependency
    denial, "read it again" must name the command that records the read, or the
    agent can never write again in this task."""
    repo, home, log = world
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "apply_patch",
               "patch": patch("src/util.py", ("def clamp(x, lo, hi):", "def clamp(x, lo, hi=9):"))},
              {"after": ["B", 1], "tool": "apply_patch",
               "patch": patch("src/api.py", ("    return http_get(url)", "    return http_get(url)  # A"))},
              {"tool": "exec_command", "input_from": ["cmd", r"command (\S+ read \S+ --agent \S+)"], "input": {}},
              {"tool": "apply_patch",
               "patch": patch("src/api.py", ("    return http_get(url)", "    return http_get(url)  # A"))}],
        "B": [{"after": ["A", 1], "tool": "apply_patch",
               "patch": patch("src/util.py", ("    return max(lo, min(x, hi))", "    return min(max(x, lo), hi)"))}],
    })
    a = script.outputs("A")
    assert "Success" in a[0], a[0]
    assert "stale_dependency" in a[1] and "+    return min(max(x, lo), hi)" in a[1], a[1]  # the diff
    assert "git-storm read src/util.py --agent codex-" in a[1], a[1]  # the command that clears it
    assert "return min(max(x, lo), hi)" in a[2], a[2]  # the read printed the file
    assert "Success" in a[3], a[3]
    assert b"# A" in workspace(repo, "src/api.py") and b"min(max(x, lo), hi)" in workspace(repo, "src/util.py")


def test_a_patch_made_after_a_shell_read_is_refused_when_the_read_file_changed(harness_bin, world):
    """Codex reads src/util.py through its shell (`sed -n`, `cat`), session B changes
    that file, and A's later patch of src/api.py is a stale dependency: the shell read
    is in A's read set. Without shell reads the patch was accepted on a file A never
    saw in its current form."""
    repo, home, log = world
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "exec_command", "input": {"cmd": "sed -n '1,80p' src/util.py && cat src/api.py"}},
              {"after": ["B", 1], "tool": "apply_patch",
               "patch": patch("src/api.py", ("    return http_get(url)", "    return http_get(url)  # A"))}],
        "B": [{"after": ["A", 1], "tool": "apply_patch",
               "patch": patch("src/util.py", ("    return max(lo, min(x, hi))", "    return min(max(x, lo), hi)"))}],
    })
    a, b = script.outputs("A"), script.outputs("B")
    assert "def clamp(x, lo, hi):" in a[0], a[0]  # the shell showed it
    assert "Success" in b[0], b[0]
    assert "stale_dependency" in a[1] and "+    return min(max(x, lo), hi)" in a[1], a[1]
    assert b"# A" not in workspace(repo, "src/api.py")
    assert b"min(max(x, lo), hi)" in workspace(repo, "src/util.py")


# the read commands Codex sends (its own habits: sed -n ranges, nl -ba, rg with and without files)
READ_SESSION = [
    ("cat README.md", ["README.md"]),
    ("sed -n '1,200p' src/api.py", ["src/api.py"]),
    ("nl -ba src/util.py | sed -n '1,40p'", ["src/util.py"]),
    ("rg -n 'fetch' src/client.py src/api.py", ["src/client.py", "src/api.py"]),
    ("rg -n 'clamp'", []),  # a search of the tree: not a read
    ("ls -la src && head -n 20 src/client.py", ["src/client.py"]),
    ("cd src && tail -n 5 util.py", ["src/util.py"]),
]


def test_how_many_of_codex_shell_reads_storm_records(harness_bin, world):
    """The reads a Codex session makes through its shell, and how many of them are in
    its read set afterwards (the figure in docs/agents.md and docs/performance.md)."""
    from figures import record
    from storm_git.core import readsets
    from storm_git.core.store import Store

    repo, home, log = world
    play(harness_bin, repo, home, log, {"A": [{"tool": "exec_command", "input": {"cmd": c}} for c, _ in READ_SESSION]})
    agents = {e["agent"] for e in hx.hook_log(log)}
    assert len(agents) == 1, agents
    shown = {p for _, ps in READ_SESSION for p in ps}
    recorded = set(readsets.load(Store.discover(str(repo)), agents.pop()))
    record("codex_shell_reads", commands=len(READ_SESSION), files_shown=len(shown),
           recorded=len(shown & recorded), extra=sorted(recorded - shown))
    assert recorded == shown, (sorted(shown), sorted(recorded))
