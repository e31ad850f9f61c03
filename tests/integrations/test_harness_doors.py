"""The harness hooks fail closed: every event goes through ``git storm harness hook``
in a real process on a real repository, as Claude Code and Codex run it.

* a write built on a stale read never lands, even when the read file changes
  while the tool runs (after the pre hook allowed the edit);
* before a tool, whatever is not "allowed" is a deny the model reads (a name no
  file can have, a Write over storm.maxFileBytes, an internal error); after it,
  whatever storm refuses is a block the model reads; nothing exits 1, which
  both harnesses treat as "carry on".
"""
from __future__ import annotations

import json
import os

from helpers import claude_event, codex_event, decision, git, hook, rev, show, snapshot_refs, storm


def read(repo, session, rel, use_id):
    e = claude_event(repo, session, "PostToolUse", "Read", {"file_path": str(repo / rel)}, use_id)
    assert decision(hook(repo, e)) is None


def test_a_file_read_and_changed_while_the_edit_ran_refuses_the_write(repo):
    """Write skew: A reads util and api, A's pre hook for an edit of api allows it
    (its read set is valid then) and leases api only; B changes util meanwhile; A's
    post hook must refuse A's api: A built it on a util that is no longer there."""
    read(repo, "sess-A", "src/util.py", "r1")
    read(repo, "sess-A", "src/api.py", "r2")
    edit = {"file_path": str(repo / "src/api.py"), "old_string": "def fetch(url):",
            "new_string": "def fetch(url, retries=3):", "replace_all": False}
    assert decision(hook(repo, claude_event(repo, "sess-A", "PreToolUse", "Edit", edit, "e1"))) is None
    # while A's Edit runs (a permission prompt, a slow disk), B writes util through its own hooks
    read(repo, "sess-B", "src/util.py", "r3")
    w = {"file_path": str(repo / "src/util.py"), "content": "def helper():\n    return 2\n"}
    assert decision(hook(repo, claude_event(repo, "sess-B", "PreToolUse", "Write", w, "w1"))) is None
    (repo / "src/util.py").write_text(w["content"])
    assert decision(hook(repo, claude_event(repo, "sess-B", "PostToolUse", "Write", w, "w1"))) is None
    head = rev(repo, "refs/storm/workspace")
    # A's Edit tool writes api, then A's post hook
    api = repo / "src/api.py"
    api.write_text(api.read_text().replace("def fetch(url):", "def fetch(url, retries=3):"))
    out = decision(hook(repo, claude_event(repo, "sess-A", "PostToolUse", "Edit", edit, "e1")))
    assert out is not None and out["decision"] == "block", out
    assert "stale_dependency" in out["reason"] and "src/util.py" in out["reason"]
    assert "NOT part of the shared state" in out["reason"]
    assert "hookSpecificOutput" not in out  # said once
    assert rev(repo, "refs/storm/workspace") == head  # A's stale write did not land
    assert b"retries" not in show(repo, "refs/storm/workspace", "src/api.py")


def _pre_write(repo, tool_input, tool="Write", session="s1", harness="claude"):
    e = claude_event(repo, session, "PreToolUse", tool, tool_input, "t1")
    return hook(repo, json.dumps(e), "--harness", harness)


def test_a_name_no_file_can_have_is_denied_not_passed(repo):
    before = snapshot_refs(repo)
    for name in (str(repo / "src") + "/a\u0000b.py", str(repo / "src") + "/a\udcffb.py"):
        # json.dumps writes the lone surrogate as \udcff: valid JSON, as a harness may send
        r = _pre_write(repo, {"file_path": name, "content": "x = 1\n"})
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        spec = json.loads(r.stdout)["hookSpecificOutput"]
        assert spec["permissionDecision"] == "deny", spec
        assert "not a usable file name" in spec["permissionDecisionReason"]
    assert snapshot_refs(repo) == before


def test_a_write_over_max_file_bytes_is_denied_before_it_lands(repo):
    git(repo, "config", "storm.maxFileBytes", "200")
    path = repo / "src/util.py"
    assert path.stat().st_size < 200
    r = _pre_write(repo, {"file_path": str(path), "content": "x" * 500})
    spec = json.loads(r.stdout)["hookSpecificOutput"]
    assert r.returncode == 0 and spec["permissionDecision"] == "deny"
    assert "storm.maxFileBytes" in spec["permissionDecisionReason"]
    # an edit that grows a file past the limit after the tool ran: a block the model reads
    read(repo, "s2", "src/util.py", "r1")
    edit = {"file_path": str(path), "old_string": "def", "new_string": "y" * 500, "replace_all": False}
    assert decision(hook(repo, claude_event(repo, "s2", "PreToolUse", "Edit", edit, "e1"))) is None
    path.write_text("y" * 500 + "\n")
    r = hook(repo, claude_event(repo, "s2", "PostToolUse", "Edit", edit, "e1"))
    out = decision(r)
    assert out["decision"] == "block" and "storm.maxFileBytes" in out["reason"], out
    assert "NOT part of the shared state" in out["reason"]
    st = json.loads(storm(repo, "status", "--json").stdout)
    assert st["reservations"] == []  # the refused edit's lease ended with it


def test_an_internal_error_denies_before_and_blocks_after(repo):
    """A hook that crashes (here: its Python cannot import storm's library) must not
    let the tool run unchecked: deny before, block after, never exit 1."""
    broken = repo.parent / "broken"
    broken.mkdir()
    (broken / "pygit2.py").write_text("raise RuntimeError('simulated broken install')\n")
    env = {"PYTHONPATH": str(broken)}

    def hook(repo, event, *args, env):  # a new interpreter, which sees PYTHONPATH
        return storm(repo, "harness", "hook", *args, input=json.dumps(event), env=env, fresh=True)

    w = {"file_path": str(repo / "src/util.py"), "content": "x = 1\n"}
    r = hook(repo, claude_event(repo, "s1", "PreToolUse", "Write", w, "w1"), env=env)
    assert r.returncode == 0, (r.returncode, r.stderr)
    spec = json.loads(r.stdout)["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "internal error" in spec["permissionDecisionReason"]
    r = hook(repo, claude_event(repo, "s1", "PostToolUse", "Write", w, "w1"), env=env)
    out = decision(r)
    assert out["decision"] == "block" and "internal error" in out["reason"]
    # Codex after a shell command: the refusal is context, the command's output stays
    r = hook(repo, codex_event(repo, "s1", "PostToolUse", "Bash", "cat x", "b1"), "--harness", "codex", env=env)
    out = decision(r)
    assert "decision" not in out and "internal error" in out["hookSpecificOutput"]["additionalContext"]


def test_an_event_that_is_not_json_blocks_with_exit_2(repo):
    before = snapshot_refs(repo)
    for bad in ("not json", "[1, 2]", "{\"tool_name\": 1}"):
        r = hook(repo, bad)
        assert r.returncode == 2 and r.stdout == "", (bad, r.returncode, r.stdout)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = hook(repo, "{}", "--harness", "nope")
    assert r.returncode == 2 and "--harness" in r.stderr
    assert snapshot_refs(repo) == before


def test_no_agent_id_is_a_deny_before_an_edit(repo):
    e = claude_event(repo, "", "PreToolUse", "Write", {"file_path": str(repo / "a.py"), "content": ""}, "x")
    r = hook(repo, e, env={"STORM_AGENT": ""})
    spec = json.loads(r.stdout)["hookSpecificOutput"]
    assert r.returncode == 0 and spec["permissionDecision"] == "deny" and "no agent id" in \
        spec["permissionDecisionReason"]
    assert not os.path.exists(repo / "a.py")


def test_two_codex_sessions_started_in_one_millisecond_are_two_agents(repo):
    """Codex session ids are UUIDv7: the first 12 hex digits are the start time in ms."""
    a, b = "019ac3f2-7d10-7a3b-9c4e-1f2a3b4c5d6e", "019ac3f2-7d10-7f00-8123-abcdefabcdef"
    util = str(repo / "src/util.py")
    for sid, use in ((a, "r1"), (b, "r2")):
        e = claude_event(repo, sid, "PostToolUse", "Read", {"file_path": util}, use)
        assert decision(hook(repo, json.dumps(e), "--harness", "codex")) is None
    agents = {row["agent"] for row in json.loads(storm(repo, "status", "--json").stdout)["agents"]}
    ids = {f"codex-{x.replace('-', '')}" for x in (a, b)}
    assert ids <= agents, agents
    # and a write by one is a conflict for the other, not its own earlier write
    w = {"file_path": util, "content": "A = 1\n"}
    assert decision(hook(repo, json.dumps(claude_event(repo, a, "PreToolUse", "Write", w, "w1")), "--harness",
                         "codex")) is None


def _pre(repo, session, tool_input, use_id, tool="Write"):
    return decision(hook(repo, claude_event(repo, session, "PreToolUse", tool, tool_input, use_id)))


def _a_leases_util(repo, wait_seconds: str):
    """A and B read util; A's pre hook for a Write of it takes a 30 s lease."""
    git(repo, "config", "storm.leaseSeconds", "30")
    git(repo, "config", "storm.harnessWaitSeconds", wait_seconds)
    util = repo / "src/util.py"
    read(repo, "A", "src/util.py", "r1")
    read(repo, "B", "src/util.py", "r2")
    assert _pre(repo, "A", {"file_path": str(util), "content": "a = 1\n"}, "w1") is None
    return util


def test_a_lease_whose_edit_never_ran_is_taken_over_after_a_second(repo):
    """A's pre hook leases util; A's tool never runs and no post hook comes (Codex after
    a failed apply_patch, Claude Code refusing the edit). B must not wait out the
    lease: with harnessWaitSeconds at 4, a 30 s lease held it to a 'reserved' denial."""
    util = _a_leases_util(repo, "4")
    assert _pre(repo, "B", {"file_path": str(util), "content": "b = 2\n"}, "w2") is None  # after ~1 s
    util.write_text("b = 2\n")
    assert decision(hook(repo, claude_event(repo, "B", "PostToolUse", "Write",
                                            {"file_path": str(util), "content": "b = 2\n"}, "w2"))) is None
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"b = 2\n"
    # A's edit runs after all (a permission prompt answered late): refused, B's write stays
    util.write_text("a = 1\n")
    out = decision(hook(repo, claude_event(repo, "A", "PostToolUse", "Write",
                                           {"file_path": str(util), "content": "a = 1\n"}, "w1")))
    assert out["decision"] == "block" and "direct_conflict" in out["reason"]
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"b = 2\n"


def test_a_lease_whose_edit_ran_is_waited_for(repo):
    """The tool wrote the file and its post hook has not come yet: the lease holds."""
    util = _a_leases_util(repo, "2")
    util.write_text("a = 1\n")  # A's Write tool ran
    out = _pre(repo, "B", {"file_path": str(util), "content": "b = 2\n"}, "w2")
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "reserved" in out["hookSpecificOutput"]["permissionDecisionReason"]


def test_a_re_read_tells_the_diff_and_who_made_it(repo):
    """Claude Code refuses a stale edit itself ("modified since read") before any hook
    runs, so the model never sees storm's rejection: its re-read carries the news."""
    api = repo / "src/api.py"
    read(repo, "sessA", "src/api.py", "r1")
    read(repo, "sessB", "src/api.py", "r2")
    edit = {"file_path": str(api), "old_string": "def fetch(url):", "new_string": "def fetch(url, timeout=10):",
            "replace_all": False}
    assert _pre(repo, "sessA", edit, "e1", tool="Edit") is None
    api.write_text(api.read_text().replace("def fetch(url):", "def fetch(url, timeout=10):  # sessA: hangs"))
    assert decision(hook(repo, claude_event(repo, "sessA", "PostToolUse", "Edit", edit, "e1"))) is None
    e = claude_event(repo, "sessB", "PostToolUse", "Read", {"file_path": str(api)}, "r3")
    out = decision(hook(repo, e))
    note = out["hookSpecificOutput"]["additionalContext"]
    assert "src/api.py changed since your previous read" in note and "by claude-sessA" in note
    assert "+def fetch(url, timeout=10):  # sessA: hangs" in note and "-def fetch(url):" in note
    assert "decision" not in out  # once, as context
    # read again: nothing new to tell; A's own re-read of its write: nothing either
    assert decision(hook(repo, claude_event(repo, "sessB", "PostToolUse", "Read", {"file_path": str(api)}, "r4"))) \
        is None
    read(repo, "sessA", "src/api.py", "r5")


def test_codex_install_says_what_codex_lacks_and_writes_trust_only_when_asked(repo, tmp_path):
    home = tmp_path / "codex-home"
    env = {"CODEX_HOME": str(home)}
    r = storm(repo, "harness", "install", "codex", env=env)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Codex will NOT run these hooks" in r.stderr and "is not trusted" in r.stderr
    assert not (home / "config.toml").exists()  # nothing written without --trust
    doc = json.loads(storm(repo, "doctor", "--json", env=env).stdout)
    assert any(f["kind"] == "codex_hooks_untrusted" for f in doc["findings"])
    home.mkdir()
    (home / "config.toml").write_text('model = "m"\n\n[projects."/elsewhere"]\ntrust_level = "trusted"\n')
    r = storm(repo, "harness", "install", "codex", "--trust", env=env)
    assert r.returncode == 0, r.stderr
    config = (home / "config.toml").read_text()
    assert config.startswith('model = "m"\n') and "/elsewhere" in config  # kept
    hooks_json = str(repo / ".codex/hooks.json")
    for line in (f'[projects."{repo}"]', 'trust_level = "trusted"', f'[hooks.state."{hooks_json}:pre_tool_use:0:0"]',
                 f'[hooks.state."{hooks_json}:post_tool_use:0:0"]', 'trusted_hash = "sha256:'):
        assert line in config and line in r.stdout, line  # written, and shown
    st = json.loads(storm(repo, "harness", "status", "--json", env=env).stdout)
    assert [s for s in st if s["harness"] == "codex"][0]["active"] is True
    # another command (here --agent) is another hash: untrusted again, and said so
    r = storm(repo, "harness", "install", "codex", "--agent", "eng1", env=env)
    assert r.returncode == 3 and "trusted with an old hash" in r.stderr
    r = storm(repo, "harness", "status", env=env)
    assert r.returncode == 3 and "codex: NOT active" in r.stdout
    assert storm(repo, "harness", "install", "codex", "--agent", "eng1", "--trust", env=env).returncode == 0
    config = (home / "config.toml").read_text()
    assert config.count(f'[hooks.state."{hooks_json}:pre_tool_use:0:0"]') == 1  # replaced, not duplicated


def test_claude_install_names_the_subdirectory_gap_and_user_scope_closes_it(repo, tmp_path):
    cfg = tmp_path / "claude-config"
    env = {"CLAUDE_CONFIG_DIR": str(cfg)}
    r = storm(repo, "harness", "install", "claude", env=env)
    assert r.returncode == 0 and "started in a subdirectory" in r.stderr and "--user" in r.stderr
    st = {s["harness"]: s for s in json.loads(storm(repo, "harness", "status", "--json", env=env).stdout)}
    assert st["claude"]["active"] and not st["claude"]["subdirectories"]
    (cfg).mkdir()
    (cfg / "settings.json").write_text(json.dumps({"model": "x", "hooks": {"Stop": [{"hooks": []}]}}))
    r = storm(repo, "harness", "install", "claude", "--user", env=env)
    assert r.returncode == 0, r.stderr
    # it says that it changed the user's settings, for every session in every repository
    assert f"{cfg / 'settings.json'} changed" in r.stderr and "every Claude Code session of this user" in r.stderr
    assert "every repository" in r.stderr, r.stderr
    data = json.loads((cfg / "settings.json").read_text())
    assert data["model"] == "x" and "Stop" in data["hooks"] and "PreToolUse" in data["hooks"]
    st = {s["harness"]: s for s in json.loads(storm(repo, "harness", "status", "--json", env=env).stdout)}
    assert st["claude"]["subdirectories"] is True
    assert storm(repo, "harness", "uninstall", "claude", "--user", env=env).returncode == 0
    data = json.loads((cfg / "settings.json").read_text())
    assert data == {"model": "x", "hooks": {"Stop": [{"hooks": []}]}}
    assert storm(repo, "harness", "install", "codex", "--user", env=env).returncode == 2


def test_the_hook_knows_without_pygit2_only_what_is_surely_not_storm(repo, tmp_path):
    from storm_git.integrations.hook_main import surely_not_storm

    env = {"HOME": str(tmp_path / "nohome")}
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    git(plain, "init", "-q")
    assert surely_not_storm(str(plain / "sub"), env)  # a repository without storm
    assert surely_not_storm("/", env)  # no repository at all
    assert not surely_not_storm(str(repo / "src"), env)  # storm.mode is in its config
    assert not surely_not_storm(str(plain), {**env, "GIT_DIR": str(repo / ".git")})
    git(plain, "config", "include.path", str(repo / ".git/config"))  # storm's settings by include
    assert not surely_not_storm(str(plain), env)
    # a linked worktree of a storm repository: its .git is a file
    git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
    assert not surely_not_storm(str(tmp_path / "wt"), env)
