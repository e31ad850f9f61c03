"""Harness hooks: the events Claude Code and Codex send, fed to
``git storm harness hook`` in real processes on real repositories.

The fixtures follow the harnesses' documentation: Claude Code's hooks reference
(common fields ``session_id``, ``transcript_path``, ``cwd``, ``permission_mode``,
``hook_event_name``; tool fields ``tool_name``, ``tool_input``, ``tool_use_id``;
PostToolUse adds ``tool_response``) and Codex's hooks page (the same envelope
plus ``model`` and ``turn_id``; ``apply_patch`` carries the patch text in
``tool_input.command``).
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from helpers import (
    claude_event,
    codex_event,
    decision,
    git,
    hold,
    hook,
    make_repo,
    release,
    rev,
    show,
    snapshot_refs,
    start_storm,
    storm,
)
from storm_git.integrations.harness import BadEvent, HookEvent, agent_for, parse_event, patch_paths


def test_two_sessions_race_on_one_file(repo):
    """Both sessions read src/api.py; A's edit lands; B's edit is denied with A's diff;
    after B reads again its edit is allowed and recorded as B's write."""
    api = repo / "src/api.py"
    path = str(api)
    for s, n in (("sess-A", "1"), ("sess-B", "2")):
        assert decision(hook(repo, claude_event(repo, s, "PostToolUse", "Read", {"file_path": path}, f"r{n}"),
                             env={"STORM_AGENT": ""})) is None
    edit_a = {"file_path": path, "old_string": "def fetch(url):", "new_string": "def fetch(url, timeout=10):",
              "replace_all": False}
    assert decision(hook(repo, claude_event(repo, "sess-A", "PreToolUse", "Edit", edit_a, "e1"))) is None
    # the tool itself writes the file, then the post hook records it
    api.write_text("def fetch(url, timeout=10):  # claude-sessA: callers hang\n    return http_get(url)\n")
    assert decision(hook(repo, claude_event(repo, "sess-A", "PostToolUse", "Edit", edit_a, "e1"))) is None
    assert show(repo, "refs/storm/workspace", "src/api.py") == api.read_bytes()
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert "Storm-Agent: claude-sessA" in msg and "Storm-Op: harness" in msg

    edit_b = {"file_path": path, "old_string": "return http_get(url)", "new_string": "return http_get(url, 5)",
              "replace_all": False}
    head = rev(repo, "refs/storm/workspace")
    out = decision(hook(repo, claude_event(repo, "sess-B", "PreToolUse", "Edit", edit_b, "e2")))
    spec = out["hookSpecificOutput"]
    assert spec["hookEventName"] == "PreToolUse" and spec["permissionDecision"] == "deny"
    reason = spec["permissionDecisionReason"]
    assert "direct_conflict" in reason and "changed by claude-sessA" in reason
    assert "+def fetch(url, timeout=10):  # claude-sessA: callers hang" in reason  # the diff
    assert "intent annotations in this diff" in reason and "Read it again" in reason
    assert rev(repo, "refs/storm/workspace") == head  # nothing written

    # B "re-reads" (a Read event), then its edit is allowed and recorded
    assert decision(hook(repo, claude_event(repo, "sess-B", "PostToolUse", "Read", {"file_path": path}, "r3"))) is None
    assert decision(hook(repo, claude_event(repo, "sess-B", "PreToolUse", "Edit", edit_b, "e3"))) is None
    api.write_text(api.read_text().replace("return http_get(url)", "return http_get(url, 5)"))
    assert decision(hook(repo, claude_event(repo, "sess-B", "PostToolUse", "Edit", edit_b, "e3"))) is None
    content = show(repo, "refs/storm/workspace", "src/api.py").decode()
    assert "timeout=10" in content and "http_get(url, 5)" in content  # no lost update
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["unmediated"] == [] and st["reservations"] == []  # lease ended with the write


def test_lease_blocks_other_writers_and_post_validates_expected(repo):
    """While A's lease holds, B's write waits; a post hook after the lease expired and
    another agent wrote is refused (the tool's result stays on disk, the model is told)."""
    git(repo, "config", "storm.leaseSeconds", "0.2")
    path = str(repo / "src/util.py")
    w = {"file_path": path, "content": "x = 1\n"}
    hook(repo, claude_event(repo, "A", "PostToolUse", "Read", {"file_path": path}, "r"))
    assert decision(hook(repo, claude_event(repo, "A", "PreToolUse", "Write", w, "w1"))) is None
    # the lease expires; another agent writes meanwhile through storm
    assert storm(repo, "read", "src/util.py", agent="engineer_2").returncode == 0
    assert storm(repo, "write", "src/util.py", input="y = 2\n", agent="engineer_2").returncode == 0
    (repo / "src/util.py").write_text("x = 1\n")  # A's Write tool
    out = decision(hook(repo, claude_event(repo, "A", "PostToolUse", "Write", w, "w1")))
    assert out["decision"] == "block" and "NOT part of the shared state" in out["reason"]
    assert "direct_conflict" in out["reason"]
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"y = 2\n"  # never overwritten


def test_bash_before_and_after_is_one_write(repo):
    """The pre hook marks, the post hook records every file the command changed as
    one exec write; an edit made before the command stays unmediated."""
    (repo / "README.md").write_text("# edited by hand before\n")
    cmd = {"command": "sed -i s/http_get/fetch_url/ src/api.py && rm src/util.py && echo n > new.txt",
           "description": "rename"}
    assert decision(hook(repo, claude_event(repo, "s1", "PreToolUse", "Bash", cmd, "b1"), "-a", "engineer_1")) is None
    api = repo / "src/api.py"
    api.write_text(api.read_text().replace("http_get", "fetch_url"))
    (repo / "src/util.py").unlink()
    (repo / "new.txt").write_text("n\n")
    post = claude_event(repo, "s1", "PostToolUse", "Bash", cmd, "b1",
                        {"stdout": "", "stderr": "", "interrupted": False, "isImage": False})
    assert decision(hook(repo, post, "-a", "engineer_1")) is None
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert "Storm-Op: exec" in msg and "Storm-Agent: engineer_1" in msg
    assert sorted(line.split(": ")[1] for line in msg.splitlines() if line.startswith("Storm-Path")) == \
        ["new.txt", "src/api.py", "src/util.py"]
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert [u["path"] for u in st["unmediated"]] == ["README.md"]


def test_codex_apply_patch_paths_and_write(repo):
    patch = ("*** Begin Patch\n"
             "*** Update File: src/api.py\n@@\n-    return http_get(url)\n+    return http_get(url, timeout=5)\n"
             "*** Add File: src/new.py\n+VALUE = 1\n"
             "*** Delete File: src/util.py\n"
             "*** Update File: src/client.py\n*** Move to: src/loader.py\n"
             "@@\n-from api import fetch\n+from api import fetch  # noqa\n"
             "*** End Patch\n")
    assert patch_paths(patch) == ["src/api.py", "src/new.py", "src/util.py", "src/client.py", "src/loader.py"]
    pre = codex_event(repo, "019a-codex", "PreToolUse", "apply_patch", patch, "call_1")
    assert decision(hook(repo, pre, "--harness", "codex")) is None
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert {r["path"] for r in st["reservations"]} == {"src/api.py", "src/new.py", "src/util.py", "src/client.py",
                                                       "src/loader.py"}  # leased
    (repo / "src/api.py").write_text("def fetch(url):\n    return http_get(url, timeout=5)\n")
    (repo / "src/new.py").write_text("VALUE = 1\n")
    (repo / "src/util.py").unlink()
    client = (repo / "src/client.py").read_text()
    (repo / "src/client.py").unlink()
    (repo / "src/loader.py").write_text(client.replace("from api import fetch", "from api import fetch  # noqa"))
    post = codex_event(repo, "019a-codex", "PostToolUse", "apply_patch", patch, "call_1")
    assert decision(hook(repo, post, "--harness", "codex")) is None
    tree = git(repo, "ls-tree", "-r", "--name-only", "refs/storm/workspace").stdout.decode().split()
    assert "src/loader.py" in tree and "src/new.py" in tree
    assert "src/util.py" not in tree and "src/client.py" not in tree
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert "Storm-Agent: codex-019acodex" in msg
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["reservations"] == [] and st["unmediated"] == []


def test_bad_events_change_nothing_and_outside_storm_say_nothing(repo, tmp_path):
    """Bad events fail closed (tests/integrations/test_harness_doors.py); outside storm's tree the hook is silent."""
    before = snapshot_refs(repo)
    for bad in ("not json", "[1, 2]", json.dumps({"session_id": "x", "cwd": str(repo)})):
        r = hook(repo, bad)
        assert r.returncode == 2, (bad, r.returncode)  # blocking in both harnesses, the reason on stderr
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert snapshot_refs(repo) == before
    # outside a storm repository, or a path outside the shared tree: nothing to say
    plain = tmp_path / "plain"
    plain.mkdir()
    git(plain, "init", "-q")
    e = claude_event(plain, "s", "PreToolUse", "Write", {"file_path": str(plain / "a"), "content": ""}, "x")
    r = hook(plain, e)
    assert r.returncode == 0 and r.stdout == ""
    e = claude_event(repo, "s", "PreToolUse", "Write", {"file_path": "/etc/hosts", "content": ""}, "x")
    assert decision(hook(repo, e)) is None and snapshot_refs(repo) == before


def test_install_merges_and_uninstall_restores(repo):
    settings = repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = json.dumps({
        "permissions": {"allow": ["Bash(npm test)"]},
        "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}]},
    }, indent=4) + "\n"
    settings.write_text(original)
    r = storm(repo, "harness", "install", "claude")
    assert r.returncode == 0 and "installed storm's hooks in .claude/settings.json" in r.stdout, r.stderr
    data = json.loads(settings.read_text())
    assert data["permissions"] == {"allow": ["Bash(npm test)"]}
    pre = data["hooks"]["PreToolUse"]
    assert pre[0]["hooks"][0]["command"] == "audit.sh"  # the user's hook first, kept
    assert pre[1]["matcher"] == "Edit|MultiEdit|Write|NotebookEdit|Bash" and "harness hook --harness claude" in \
        pre[1]["hooks"][0]["command"]
    assert "Read" in data["hooks"]["PostToolUse"][0]["matcher"]
    text = settings.read_text()
    r = storm(repo, "harness", "install", "claude")  # idempotent
    assert r.returncode == 0 and "already" in r.stdout and settings.read_text() == text
    r = storm(repo, "harness", "uninstall", "claude")
    assert r.returncode == 0 and "restored" in r.stdout
    assert settings.read_text() == original  # byte for byte


def test_install_creates_and_uninstall_deletes(repo):
    r = storm(repo, "harness", "install", "codex", "--json")
    res = json.loads(r.stdout)
    assert res["created"] and not res["tracked"] and res["action"] == "installed"
    hooks = json.loads((repo / ".codex/hooks.json").read_text())["hooks"]
    assert hooks["PreToolUse"][0]["matcher"] == "apply_patch|Bash"
    # a file storm created is excluded, so it is not an unmediated edit of the shared tree
    assert "/.codex/hooks.json" in (repo / ".git/info/exclude").read_text()
    assert json.loads(storm(repo, "status", "--json").stdout)["unmediated"] == []
    r = storm(repo, "harness", "uninstall", "codex")
    assert r.returncode == 0 and "deleted" in r.stdout
    assert not (repo / ".codex").exists()
    assert "/.codex/hooks.json" not in (repo / ".git/info/exclude").read_text()
    # bad JSON in an existing file: refused, nothing changed
    (repo / ".claude").mkdir()
    (repo / ".claude/settings.json").write_text("{oops")
    r = storm(repo, "harness", "install", "claude")
    assert r.returncode == 2 and "not valid JSON" in r.stderr
    assert (repo / ".claude/settings.json").read_text() == "{oops"


def test_worktree_mode_passes_through(tmp_path):
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "mode", "worktree").returncode == 0
    e = claude_event(repo, "s", "PreToolUse", "Write", {"file_path": str(repo / "src/api.py"), "content": ""}, "x")
    assert decision(hook(repo, e)) is None


def test_agent_id_mapping():
    def ev(session: str, sub: str | None = None, harness: str = "claude") -> HookEvent:
        return HookEvent(harness, "PreToolUse", "Edit", {}, session, "/", "t", sub)

    assert agent_for(ev("8f1c2a7e-55b1-4e0f-9d7a-0c3f"), env={}) == "claude-8f1c2a7e55b14e0f9d7a0c3f"
    assert agent_for(ev("8f1c2a7e", harness="codex"), env={}) == "codex-8f1c2a7e"
    assert agent_for(ev("x"), env={"STORM_AGENT": "engineer_3"}) == "engineer_3"
    assert agent_for(ev("x"), "engineer_4", env={"STORM_AGENT": "engineer_3"}) == "engineer_4"
    assert agent_for(ev("x", "agent/7:b"), "engineer_4", env={}) == "engineer_4-sub-agent7b"
    with pytest.raises(BadEvent):
        agent_for(ev("@@@"), env={})
    e = parse_event(json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Edit", "session_id": "s",
                                "cwd": "/", "tool_input": {"file_path": "/a"}, "agent_id": "sub1"}))
    assert e.subagent == "sub1" and e.pre and os.path.isabs(e.tool_input["file_path"])


def test_read_of_an_unmediated_edit_is_validated_against_its_base(repo):
    """The disk holds an edit made outside storm: the read records the version the
    edit was made on; the agent's edit carries it along; made on an older version,
    the edit is refused with the diff (never undoing a newer accepted write)."""
    util, path = repo / "src/util.py", str(repo / "src/util.py")
    util.write_text(util.read_text() + "# tweak made in an editor\n")
    out = decision(hook(repo, claude_event(repo, "s", "PostToolUse", "Read", {"file_path": path}, "r1"),
                        "-a", "engineer_1"))
    assert "edit made outside storm" in out["hookSpecificOutput"]["additionalContext"]
    w = {"file_path": path, "old_string": "lo, hi", "new_string": "low, high", "replace_all": False}
    assert decision(hook(repo, claude_event(repo, "s", "PreToolUse", "Edit", w, "e1"), "-a", "engineer_1")) is None
    util.write_text(util.read_text().replace("lo, hi", "low, high"))
    assert decision(hook(repo, claude_event(repo, "s", "PostToolUse", "Edit", w, "e1"), "-a", "engineer_1")) is None
    assert show(repo, "refs/storm/workspace", "src/util.py") == util.read_bytes()  # the tweak came along
    # an edit on disk made on a version that was replaced since
    api = repo / "src/api.py"
    assert storm(repo, "read", "src/api.py", agent="engineer_2").returncode == 0
    before = rev(repo, "refs/storm/workspace")
    holder = hold(repo, "worktree", seconds=60)  # engineer_2's write lands, then waits to write the disk...
    try:
        w = start_storm(repo, "write", "src/api.py", agent="engineer_2", input=b"def fetch(url):\n    return 2\n")
        while rev(repo, "refs/storm/workspace") == before:
            assert w.poll() is None
            time.sleep(0.01)
        api.write_text(api.read_text().replace("http_get", "get"))  # ...while the file is edited on disk
    finally:
        release(holder)
    assert w.wait(timeout=120) == 0
    assert "return get(url)" in api.read_text()  # storm kept it on disk (unmediated, made on v1)
    hook(repo, claude_event(repo, "s", "PostToolUse", "Read", {"file_path": str(api)}, "r2"), "-a", "engineer_1")
    w = {"file_path": str(api), "old_string": "get", "new_string": "get2", "replace_all": False}
    out = decision(hook(repo, claude_event(repo, "s", "PreToolUse", "Edit", w, "e2"), "-a", "engineer_1"))
    reason = out["hookSpecificOutput"]["permissionDecisionReason"]
    assert "direct_conflict" in reason and "+    return 2" in reason
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"def fetch(url):\n    return 2\n"


def test_lease_makes_others_wait_and_a_failed_tool_releases_it(repo):
    git(repo, "config", "storm.harnessWaitSeconds", "0.3")
    path = str(repo / "src/api.py")
    w = {"file_path": path, "old_string": "url", "new_string": "u", "replace_all": True}
    for s in ("A", "B"):
        hook(repo, claude_event(repo, s, "PostToolUse", "Read", {"file_path": path}, "r" + s))
    assert decision(hook(repo, claude_event(repo, "A", "PreToolUse", "Edit", w, "eA"))) is None
    out = decision(hook(repo, claude_event(repo, "B", "PreToolUse", "Edit", w, "eB")))
    reason = out["hookSpecificOutput"]["permissionDecisionReason"]
    assert "rejected (reserved)" in reason and "claude-A" in reason
    failed = claude_event(repo, "A", "PostToolUseFailure", "Edit", w, "eA")
    failed.update(error="String to replace not found in file.", is_interrupt=False)
    assert decision(hook(repo, failed)) is None
    assert json.loads(storm(repo, "status", "--json").stdout)["reservations"] == []  # released at once
    assert decision(hook(repo, claude_event(repo, "B", "PreToolUse", "Edit", w, "eB2"))) is None


def _notebook(*sources: str) -> str:
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
              "source": [s]} for i, s in enumerate(sources)]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


def test_notebook_edits_are_validated_and_recorded_like_edits(repo):
    """Claude Code's NotebookEdit writes a .ipynb itself: unmatched by storm's hooks, a
    stale cell edit would go through over another agent's write as an unmediated edit.
    It is checked before and recorded after, as Edit."""
    nb = repo / "analysis.ipynb"
    nb.write_text(_notebook("x = 1", "plot(x)"))
    assert storm(repo, "adopt", "analysis.ipynb", agent="engineer_1").returncode == 0
    installed = storm(repo, "harness", "install", "claude", "--json")
    assert installed.returncode == 0, installed.stderr
    groups = json.loads((repo / ".claude/settings.json").read_text())["hooks"]
    assert all("NotebookEdit" in groups[e][0]["matcher"].split("|")
               for e in ("PreToolUse", "PostToolUse", "PostToolUseFailure"))
    path = str(nb)
    for s in ("sess-A", "sess-B"):
        assert decision(hook(repo, claude_event(repo, s, "PostToolUse", "Read", {"file_path": path}, "r"),
                             env={"STORM_AGENT": ""})) is None
    edit_a = {"notebook_path": path, "cell_id": "c0", "new_source": "x = 2", "edit_mode": "replace"}
    assert decision(hook(repo, claude_event(repo, "sess-A", "PreToolUse", "NotebookEdit", edit_a, "n1"))) is None
    nb.write_text(_notebook("x = 2", "plot(x)"))  # the tool's own write
    assert decision(hook(repo, claude_event(repo, "sess-A", "PostToolUse", "NotebookEdit", edit_a, "n1"))) is None
    assert show(repo, "refs/storm/workspace", "analysis.ipynb") == nb.read_bytes()
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert "Storm-Agent: claude-sessA" in msg and "NotebookEdit" in msg
    head = rev(repo, "refs/storm/workspace")
    edit_b = {"notebook_path": path, "cell_id": "c1", "new_source": "plot(x, 'r')", "edit_mode": "replace"}
    out = decision(hook(repo, claude_event(repo, "sess-B", "PreToolUse", "NotebookEdit", edit_b, "n2")))
    spec = out["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "changed by claude-sessA" in spec["permissionDecisionReason"]
    assert rev(repo, "refs/storm/workspace") == head
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["unmediated"] == []


def test_a_bash_git_checkout_cannot_undo_work_the_agent_never_read(repo):
    """The agent's Bash tool runs ``git stash``: it takes engineer_1's accepted write off
    the disk. Recorded as the agent's write, engineer_1's work would be gone from the
    shared state; it is refused (the model is told what happened and how to go on) and
    the shared state keeps engineer_1's version."""
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, retries=3):\n    return http_get(url)\n",
                 agent="engineer_1").returncode == 0
    mine = show(repo, "refs/storm/workspace", "src/api.py")
    cmd = {"command": "git stash", "description": "shelve local changes"}
    assert decision(hook(repo, claude_event(repo, "s2", "PreToolUse", "Bash", cmd, "b1"), "-a", "engineer_2")) is None
    r = subprocess.run(["git", "stash"], cwd=repo, capture_output=True)
    assert r.returncode == 0 and show(repo, "HEAD", "src/api.py") == (repo / "src/api.py").read_bytes()
    post = claude_event(repo, "s2", "PostToolUse", "Bash", cmd, "b1",
                        {"stdout": "", "stderr": "", "interrupted": False, "isImage": False})
    out = decision(hook(repo, post, "-a", "engineer_2"))
    assert out["decision"] == "block" and "unread_target" in out["reason"]
    assert "put back an older shared version of src/api.py" in out["reason"]
    assert show(repo, "refs/storm/workspace", "src/api.py") == mine


def test_file_tools_on_a_symbolic_link_act_on_the_file_it_names(repo):
    """CLAUDE.md -> AGENTS.md, a common layout: Claude Code's Read, Edit and Write follow
    the link. Recording and validating the link itself would leave an edit through it
    unchecked against AGENTS.md's version and AGENTS.md an unmediated edit: the tools'
    path is the file the link names."""
    (repo / "AGENTS.md").write_text("# agents\n")
    os.symlink("AGENTS.md", repo / "CLAUDE.md")
    assert storm(repo, "adopt", "AGENTS.md", "CLAUDE.md", agent="engineer_1").returncode == 0
    link = str(repo / "CLAUDE.md")
    for s in ("sess-A", "sess-B"):
        assert decision(hook(repo, claude_event(repo, s, "PostToolUse", "Read", {"file_path": link}, "r"),
                             env={"STORM_AGENT": ""})) is None
    edit = {"file_path": link, "old_string": "# agents", "new_string": "# agents (A)", "replace_all": False}
    assert decision(hook(repo, claude_event(repo, "sess-A", "PreToolUse", "Edit", edit, "e1"))) is None
    with open(link, "w") as fh:  # the tool writes through the link
        fh.write("# agents (A)\n")
    assert os.path.islink(link)
    assert decision(hook(repo, claude_event(repo, "sess-A", "PostToolUse", "Edit", edit, "e1"))) is None
    assert show(repo, "refs/storm/workspace", "AGENTS.md") == b"# agents (A)\n"
    assert show(repo, "refs/storm/workspace", "CLAUDE.md") == b"AGENTS.md"  # the link is unchanged
    assert json.loads(storm(repo, "status", "--json").stdout)["unmediated"] == []
    edit_b = {"file_path": link, "old_string": "# agents", "new_string": "# agents (B)", "replace_all": False}
    out = decision(hook(repo, claude_event(repo, "sess-B", "PreToolUse", "Edit", edit_b, "e2")))
    spec = out["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "AGENTS.md" in spec["permissionDecisionReason"]
    assert "changed by claude-sessA" in spec["permissionDecisionReason"]


def test_a_named_agents_new_session_starts_a_new_read_set(repo):
    """A read set belongs to one task: engineer_1's old session read util.py, which has
    changed since; its new session (same STORM_AGENT, another session id) knows nothing
    of that read, and its edit is not refused as built on it. The same session keeps it."""
    env = {"STORM_AGENT": "engineer_1"}
    util, api = str(repo / "src/util.py"), str(repo / "src/api.py")
    assert decision(hook(repo, claude_event(repo, "old", "PostToolUse", "Read", {"file_path": util}, "r1"),
                         env=env)) is None
    assert storm(repo, "read", "src/util.py", agent="other").returncode == 0
    assert storm(repo, "write", "src/util.py", input="changed = 1\n", agent="other").returncode == 0
    edit = {"file_path": api, "old_string": "def fetch(url):", "new_string": "def fetch(url, t=1):",
            "replace_all": False}
    # the old session: its read of util.py is stale, the edit is refused
    assert decision(hook(repo, claude_event(repo, "old", "PostToolUse", "Read", {"file_path": api}, "r2"),
                         env=env)) is None
    out = decision(hook(repo, claude_event(repo, "old", "PreToolUse", "Edit", edit, "e1"), env=env))
    assert out and out["hookSpecificOutput"]["permissionDecision"] == "deny", out
    assert "stale" in out["hookSpecificOutput"]["permissionDecisionReason"]
    git(repo, "config", "storm.reservationSeconds", "0")
    assert storm(repo, "release", "src/api.py", agent="engineer_1").returncode == 0
    # a new session of engineer_1: a new task
    assert decision(hook(repo, claude_event(repo, "new", "PostToolUse", "Read", {"file_path": api}, "r3"),
                         env=env)) is None
    st = json.loads(storm(repo, "status", "--json").stdout)
    [me] = [a for a in st["agents"] if a["agent"] == "engineer_1"]
    assert me["reads"] == 1 and me["stale"] == [], me
    assert decision(hook(repo, claude_event(repo, "new", "PreToolUse", "Edit", edit, "e2"), env=env)) is None


def test_worktree_mode_tells_a_hooked_agent_once_of_another_branchs_change_to_its_file(tmp_path):
    """Worktree mode keeps agents apart until the merge; the radar knows earlier. Right
    after e1's tool reads or edits a file e2 changed on its branch, e1's context gets
    e2's hunk, once per e2 tip; nothing is refused."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "mode", "worktree").returncode == 0
    for a in ("e1", "e2"):
        assert storm(repo, "spawn", a).returncode == 0
    assert storm(repo, "edit", "src/api.py", "--old", "def fetch(url):", "--new", "def fetch(url, timeout=None):",
                 agent="e2").returncode == 0
    assert storm(repo, "commit", "-m", "timeout", agent="e2").returncode == 0
    wt = repo / ".git" / "storm" / "worktrees" / "e1"
    api = str(wt / "src/api.py")
    env = {"STORM_AGENT": ""}
    pre = claude_event(wt, "s1", "PreToolUse", "Read", {"file_path": api}, "r0")
    assert decision(hook(wt, pre, env=env)) is None
    out = decision(hook(wt, claude_event(wt, "s1", "PostToolUse", "Read", {"file_path": api}, "r1"), env=env))
    ctx = out["hookSpecificOutput"]["additionalContext"]
    assert "git storm radar: another agent changed 1 file(s) you just used" in ctx, ctx
    assert "src/api.py" in ctx and "+def fetch(url, timeout=None):" in ctx and "e2" in ctx
    edit = {"file_path": api, "old_string": "def fetch(url):", "new_string": "def fetch(url, retries=3):",
            "replace_all": False}
    assert decision(hook(wt, claude_event(wt, "s1", "PreToolUse", "Edit", edit, "e1"), env=env)) is None
    mine = wt / "src/api.py"
    mine.write_text(mine.read_text().replace("def fetch(url):", "def fetch(url, retries=3):"))
    # told once: the same e2 tip is not repeated
    assert decision(hook(wt, claude_event(wt, "s1", "PostToolUse", "Edit", edit, "e1"), env=env)) is None
    # a new commit of e2 on that file is news again
    assert storm(repo, "edit", "src/api.py", "--old", "return http_get(url)", "--new", "return http_get(url, 1)",
                 agent="e2").returncode == 0
    assert storm(repo, "commit", "-m", "more", agent="e2").returncode == 0
    out = decision(hook(wt, claude_event(wt, "s1", "PostToolUse", "Edit", edit, "e2"), env=env))
    assert "src/api.py" in out["hookSpecificOutput"]["additionalContext"]
