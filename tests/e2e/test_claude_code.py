"""Claude Code itself (from npm) drives git storm through its hooks; a scripted model
on 127.0.0.1 plays the tool calls and records what Claude Code sent back, which
is what a model would have seen. Run with ``pytest -m harness tests/e2e``."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import harnesses as hx
from model_server import Script, serve

sys.path.insert(0, str(Path(__file__).parent.parent))
from helpers import git, make_repo, show, storm  # noqa: E402

pytestmark = pytest.mark.harness


@pytest.fixture
def world(tmp_path):
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    home.mkdir()
    return repo, home, tmp_path / "hooks.jsonl"


def install(repo: Path, home: Path, *args: str) -> None:
    r = storm(repo, "harness", "install", "claude", *args, env={"CLAUDE_CONFIG_DIR": str(home / ".claude")})
    assert r.returncode == 0, r.stderr


def play(bin_dir, repo, home, log, sessions, cwd=None, **kw):
    """Run one Claude Code per session (concurrently) on the script; return it."""
    script = Script(sessions)
    server, port = serve(script)
    try:
        runs = [hx.claude(bin_dir, cwd or repo, f"[[{name}]] do the task", port, home, log, **kw)
                for name in sessions if not name.endswith("-sub")]
        for r in [run.wait() for run in runs]:
            assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
    finally:
        server.shutdown()
    dump = os.environ.get("STORM_E2E_DUMP")  # what each session's model saw, for a person to read
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_CURRENT_TEST", "run").split(" ")[0].split("::")[-1]
        (Path(dump) / f"{name}.json").write_text(json.dumps(script.results, indent=1))
    return script


def agents_that_wrote(log: Path, path: str) -> list[str]:
    return [e["agent"] for e in hx.hook_log(log) if e.get("action") == "recorded-write" and path in e["paths"]]


def workspace(repo: Path, path: str) -> bytes:
    return show(repo, "refs/storm/workspace", path)


def test_two_sessions_one_file_the_stale_one_learns_what_changed_on_reading_again(harness_bin, world):
    repo, home, log = world
    install(repo, home)
    api = str(repo / "src/api.py")
    script = play(harness_bin, repo, home, log, {
        "A": [{"tool": "Read", "input": {"file_path": api}},
              {"tool": "Edit", "input": {"file_path": api, "old_string": "def fetch(url):",
                                         "new_string": "def fetch(url, timeout=10):  # A: callers hang"}}],
        "B": [{"tool": "Read", "input": {"file_path": api}},
              {"after": ["A", 2], "tool": "Edit",
               "input": {"file_path": api, "old_string": "return http_get(url)", "new_string": "return http_get(url, 5)"}},
              {"tool": "Read", "input": {"file_path": api}},
              {"tool": "Edit", "input": {"file_path": api, "old_string": "return http_get(url)",
                                         "new_string": "return http_get(url, 5)"}}],
    })
    [a] = agents_that_wrote(log, "src/api.py")[:1]
    out = script.outputs("B")
    # Claude Code's own check refuses the stale edit before any hook runs ...
    assert "modified since read" in out[1], out[1]
    # ... so storm tells B on its next read: the diff and who made it
    assert "src/api.py changed since your previous read" in out[2] and f"by {a}" in out[2], out[2]
    assert "+def fetch(url, timeout=10):  # A: callers hang" in out[2]
    content = workspace(repo, "src/api.py").decode()
    assert "timeout=10" in content and "http_get(url, 5)" in content  # no lost update
    writers = agents_that_wrote(log, "src/api.py")
    assert len(set(writers)) == 2 and a in writers
    assert (repo / "src/api.py").read_bytes() == workspace(repo, "src/api.py")
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["unmediated"] == [] and st["reservations"] == []
