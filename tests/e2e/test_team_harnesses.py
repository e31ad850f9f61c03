"""``git storm team`` with the real Claude Code and Codex, driven by the scripted model:
the team's launcher starts each engineer as a headless session with storm's hooks
installed and checked, its agent id in its environment; the subtask briefs carry
the model's session markers. Run with ``pytest -m harness tests/e2e``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import harnesses as hx
import pytest
from model_server import Script, serve

sys.path.insert(0, str(Path(__file__).parent.parent))
from helpers import git, storm

pytestmark = pytest.mark.harness

QUESTION = "if grep -q '\"?\"' src/client.py; then echo 'FAIL src/client.py: a question mark'; exit 1; fi"
SHELL_EDIT = ('if [ "$STORM_TEAM_ROUND" = fix ]; then sed -i \'s/ + "?"//\' src/client.py; '
              'else sed -i \'s/return fetch(url)/return fetch(url) + "?"/\' src/client.py; fi; echo edited')


def plan(tmp: Path, mixed: bool = False) -> Path:
    subtasks = [
        {"id": "s1", "title": "clamp defaults", "brief": "[[e1]] give clamp defaults", "files": ["src/util.py"]},
        {"id": "s2", "title": "clamped fetch", "brief": "[[e2]] clamp what fetch returns", "files": ["src/api.py"]},
        {"id": "s3", "title": "client", "brief": "[[e3]] the client", "files": ["src/client.py"],
         "depends_on": ["s1"]},
    ]
    if mixed:
        subtasks[2]["harness"] = "codex"
    p = tmp / "plan.json"
    p.write_text(json.dumps({"task": "sturdier service", "subtasks": subtasks}))
    return p


def claude_steps(repo: Path) -> dict:
    api, util = str(repo / "src/api.py"), str(repo / "src/util.py")
    return {
        "e1": [{"tool": "Read", "input": {"file_path": util}},
               {"after": ["e2", 2], "tool": "Edit",  # after e2's reads
                "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                          "new_string": "def clamp(x, lo=0, hi=1):  # e1: defaults"}}],
        # e2 read util.py before e1 changed it: its edit of api.py is a stale dependency
        "e2": [{"tool": "Read", "input": {"file_path": util}},
               {"tool": "Read", "input": {"file_path": api}},
               {"after": ["e1", 2], "tool": "Edit",
                "input": {"file_path": api, "old_string": "return http_get(url)",
                          "new_string": "return clamp(http_get(url), 0, 9)"}},
               {"tool": "Read", "input": {"file_path": util}},
               {"tool": "Edit", "input": {"file_path": api, "old_string": "return http_get(url)",
                                          "new_string": "return clamp(http_get(url), 0, 9)"}}],
        # a shell edit; its first version fails the tests, the fix round's removes the bug
        "e3": [{"tool": "Bash", "input": {"command": SHELL_EDIT, "description": "edit the client"}}],
    }


def env_for(home: Path, log: Path, port: int, bin_dir: Path) -> dict[str, str]:
    env = hx.base_env(home, log)
    env.update(ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}", ANTHROPIC_API_KEY="sk-storm-test", IS_SANDBOX="1",
               DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CONFIG_DIR=str(home / ".claude"),
               CODEX_HOME=str(home / ".codex"), STORM_TEST_KEY="sk-storm-test",
               STORM_TEAM_CLAUDE=str(bin_dir / "claude"), STORM_TEAM_CODEX=str(bin_dir / "codex"))
    return env


def run_team(repo: Path, env: dict[str, str], *args: str):
    return storm(repo, "team", *args, "--json", env=env, fresh=True, timeout=600)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def report(repo: Path, evs: list[dict]) -> dict:
    return json.loads(Path(next(e["json"] for e in evs if e["event"] == "report")).read_text())


def test_three_claude_code_engineers_in_storm_mode(harness_bin, world, tmp_path):
    repo, home, log = world
    script = Script(claude_steps(repo))
    server, port = serve(script)
    try:
        r = run_team(repo, env_for(home, log, port, harness_bin), "run", "--plan", str(plan(tmp_path)),
                     "--harness", "claude", "--test", QUESTION, "--parallel", "3")
    finally:
        server.shutdown()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    assert [e for e in evs if e["event"] == "hooks"] == [{**next(e for e in evs if e["event"] == "hooks"),
                                                          "harness": "claude", "active": True, "why": ""}]
    # e2 was denied for a stale dependency with the diff, and its retry landed
    out = script.outputs("e2")
    assert "stale_dependency" in out[2] and "+def clamp(x, lo=0, hi=1):  # e1: defaults" in out[2], out[2]
    assert "updated successfully" in out[4]
    # every write is the engineer's, not a session's
    assert set(hx.writers(log, "src/util.py")) == {"engineer_1"}
    assert set(hx.writers(log, "src/api.py")) == {"engineer_2"}
    assert set(hx.writers(log, "src/client.py")) == {"engineer_3"}
    assert [e["agents"] for e in evs if e["event"] == "fix_round"] == [["engineer_3"]]
    assert hx.workspace(repo, "src/client.py") == b"from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n"
    assert b"clamp(http_get(url), 0, 9)" in hx.workspace(repo, "src/api.py")
    assert git(repo, "rev-parse", "main^{tree}").stdout == git(repo, "rev-parse", "refs/storm/workspace^{tree}").stdout
    msg = git(repo, "log", "-1", "--format=%B", "main").stdout.decode()
    assert all(f"Storm-Agent: engineer_{n}" in msg for n in (1, 2, 3)), msg
    rep = report(repo, evs)
    e = {x["agent"]: x for x in rep["engineers"]}
    assert e["engineer_2"]["reasons"] == {"stale_dependency": 1} and e["engineer_2"]["replans"] == 1
    assert e["engineer_3"]["fix_rounds"] == 1 and e["engineer_3"]["attempts"] == 2
    assert all(x["tokens"] is not None for x in rep["engineers"])  # from Claude Code's result event
    brief = (repo / ".git/storm/team" / rep["run"] / "briefs/engineer_3.2.md").read_text()
    assert "[[e3]] the client" in brief and "FAIL src/client.py: a question mark" in brief
    assert st_states(repo) == ["done", "done", "done"]


def st_states(repo: Path) -> list[str]:
    return [x["state"] for x in json.loads(storm(repo, "team", "status", "--json").stdout)["engineers"]]


def test_a_mixed_team_two_claude_code_one_codex(harness_bin, world, tmp_path):
    repo, home, log = world
    steps = claude_steps(repo)
    steps["e3"] = [{"tool": "apply_patch", "patch": "*** Begin Patch\n*** Update File: src/client.py\n@@\n"
                                                    "-    return fetch(url)\n+    return fetch(url)  # e3\n"
                                                    "*** End Patch\n"}]
    script = Script(steps)
    server, port = serve(script)
    hx.codex_home(home, port)
    try:
        r = run_team(repo, env_for(home, log, port, harness_bin), "run", "--plan", str(plan(tmp_path, mixed=True)),
                     "--harness", "claude")
    finally:
        server.shutdown()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    assert {(e["harness"], e["active"]) for e in evs if e["event"] == "hooks"} == {("claude", True), ("codex", True)}
    assert [e["harness"] for e in evs if e["event"] == "started"] == ["claude", "claude", "codex"]
    assert set(hx.writers(log, "src/client.py")) == {"engineer_3"}
    assert hx.workspace(repo, "src/client.py").endswith(b"return fetch(url)  # e3\n")
    assert json.loads((repo / ".codex/hooks.json").read_text())  # installed for the run, at project scope
    msg = git(repo, "log", "-1", "--format=%B", "main").stdout.decode()
    assert all(f"Storm-Agent: engineer_{n}" in msg for n in (1, 2, 3)), msg


def test_the_manager_session_makes_the_plan_and_cannot_write(harness_bin, world, tmp_path):
    repo, home, log = world
    answer = {"task": "sturdier", "subtasks": [
        {"id": "s1", "title": "defaults", "brief": "clamp defaults", "files": ["src/util.py"], "depends_on": []},
        {"id": "s2", "title": "fetch", "brief": "clamp fetch", "files": ["src/api.py"], "depends_on": ["s1"]}]}
    script = Script({"plan": [
        {"tool": "Read", "input": {"file_path": str(repo / "README.md")}},
        {"tool": "Edit", "input": {"file_path": str(repo / "README.md"), "old_string": "# service",
                                   "new_string": "# planned"}},
        {"text": "The plan:\n```json\n" + json.dumps(answer) + "\n```"}]})
    server, port = serve(script)
    try:
        r = run_team(repo, env_for(home, log, port, harness_bin), "plan", "[[plan]] make it sturdier",
                     "--agents", "2", "--harness", "claude")
    finally:
        server.shutdown()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["plan"] == answer and Path(out["path"]).name == "plan.json"
    assert json.loads(Path(out["path"]).read_text()) == answer
    assert (repo / "README.md").read_text() == "# service\n"  # the manager's edit did not happen
    assert hx.workspace(repo, "README.md") == b"# service\n"
    denied = script.outputs("plan")[1]
    assert "team_planner is read-only here: it may read, not write" in denied, denied  # storm's hook said no
    assert git(repo, "config", "--get-all", "storm.readOnly", check=False).stdout == b""


def test_run_a_task_the_manager_plans_it_then_the_engineers_do_it(harness_bin, world, tmp_path):
    repo, home, log = world
    util, api = str(repo / "src/util.py"), str(repo / "src/api.py")
    answer = {"task": "defaults", "subtasks": [
        {"id": "s1", "title": "defaults", "brief": "[[e1]] clamp defaults", "files": ["src/util.py"]},
        {"id": "s2", "title": "fetch", "brief": "[[e2]] a timeout", "files": ["src/api.py"], "depends_on": ["s1"]}]}
    script = Script({
        "plan": [{"text": "```json\n" + json.dumps(answer) + "\n```"}],
        "e1": [{"tool": "Read", "input": {"file_path": util}},
               {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                                          "new_string": "def clamp(x, lo=0, hi=1):"}}],
        "e2": [{"tool": "Read", "input": {"file_path": api}},
               {"tool": "Edit", "input": {"file_path": api, "old_string": "def fetch(url):",
                                          "new_string": "def fetch(url, timeout=10):"}}]})
    server, port = serve(script)
    try:
        r = run_team(repo, env_for(home, log, port, harness_bin), "run", "[[plan]] give things defaults",
                     "--agents", "2", "--harness", "claude")
    finally:
        server.shutdown()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    assert evs[0]["event"] == "planned"
    started = [(e["agent"], e["subtask"]) for e in evs if e["event"] == "started"]
    assert started == [("engineer_1", "s1"), ("engineer_2", "s2")]  # s2 after s1, as planned
    assert set(hx.writers(log, "src/util.py")) == {"engineer_1"} and set(hx.writers(log, "src/api.py")) == \
        {"engineer_2"}
    assert b"timeout=10" in git(repo, "show", "main:src/api.py").stdout
    assert b"lo=0" in git(repo, "show", "main:src/util.py").stdout


NO_MARKERS = "if grep -rn '^<<<<<<<\\|^>>>>>>>' src; then echo 'FAIL: conflict markers'; exit 1; fi"
RESOLVED = "def fetch(url):\n    return clamp(http_get(url), 0, 9)  # person: raw\n"


def worktree_steps(repo: Path, flag: Path) -> dict:
    """The same three subtasks, each engineer in its own worktree; engineer_2's branch
    conflicts with a person's commit on main, and its conflict round merges and resolves."""
    wt = repo / ".git/storm/worktrees"
    util, client = str(wt / "engineer_1/src/util.py"), str(wt / "engineer_3/src/client.py")
    resolve = ("if [ \"$STORM_TEAM_ROUND\" = conflict ]; then git merge -q main; sed -n 1,9p src/api.py; "
               "printf 'def fetch(url):\\n    return clamp(http_get(url), 0, 9)  # person: raw\\n' > src/api.py && "
               "git add -A && git commit -q --no-edit && echo resolved; "
               "else sed -i 's/return http_get(url)/return clamp(http_get(url), 0, 9)/' src/api.py && echo edited; fi")
    return {
        "e1": [{"tool": "Read", "input": {"file_path": util}},
               {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                                          "new_string": "def clamp(x, lo=0, hi=1):  # e1: defaults"}}],
        "e2": [{"tool": "Read", "input": {"file_path": str(wt / "engineer_2/src/api.py")}},
               {"wait": str(flag), "tool": "Bash", "input": {"command": resolve, "description": "fetch"}}],
        # engineer_3 starts from engineer_1's branch: its worktree has the defaults
        "e3": [{"tool": "Bash", "input": {"command": "grep -c 'e1: defaults' src/util.py", "description": "dep"}},
               {"tool": "Read", "input": {"file_path": client}},
               {"tool": "Edit", "input": {"file_path": client, "old_string": "return fetch(url)",
                                          "new_string": "return fetch(url)  # e3"}}],
    }


def test_three_claude_code_engineers_in_worktree_mode_a_conflict_handed_back(harness_bin, world, tmp_path):
    import threading
    import time

    repo, home, log = world
    assert storm(repo, "mode", "worktree").returncode == 0
    flag = tmp_path / "person-committed"
    script = Script(worktree_steps(repo, flag))
    server, port = serve(script)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=run_team(
        repo, env_for(home, log, port, harness_bin), "run", "--plan", str(plan(tmp_path)), "--harness", "claude",
        "--mode", "worktree", "--test", NO_MARKERS, "--parallel", "3")))
    t.start()
    try:
        deadline = time.monotonic() + 120
        while script.progress.get("e2", -1) < 1:  # engineer_2 has read api.py and waits on the flag
            assert t.is_alive() and time.monotonic() < deadline, box
            time.sleep(0.05)
        (repo / "src/api.py").write_text("def fetch(url):\n    return http_get(url)  # person: raw\n")
        git(repo, "commit", "-qam", "api: a person's note")
        flag.touch()
        t.join(600)
    finally:
        server.shutdown()
    r = box["r"]
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    assert not [e for e in evs if e["event"] == "hooks"]  # worktree mode: isolation, no hooks installed
    handed = [e for e in evs if e["event"] == "handed_back"]
    assert [(h["agents"], h["why"]) for h in handed] == [(["engineer_2"], {"engineer_2": "conflicted"})]
    assert [e["round"] for e in evs if e["event"] == "started" and e["agent"] == "engineer_2"] == ["work", "conflict"]
    assert {e["agent"]: e["cwd"] for e in evs if e["event"] == "started"} == \
        {a: str(repo / ".git/storm/worktrees" / a) for a in ("engineer_1", "engineer_2", "engineer_3")}
    # what each session received: engineer_3's worktree had engineer_1's work; engineer_2's
    # conflict round saw git's conflict markers, and its brief named the file
    assert script.outputs("e3")[0].strip() == "1", script.outputs("e3")
    assert "updated successfully" in script.outputs("e1")[1] and "updated successfully" in script.outputs("e3")[2]
    conflict_out = script.outputs("e2")[-1]
    assert "<<<<<<<" in conflict_out and "resolved" in conflict_out, conflict_out
    rep = report(repo, evs)
    brief = (repo / ".git/storm/team" / rep["run"] / "briefs/engineer_2.2.md").read_text()
    assert "Merge conflict handed back" in brief and "src/api.py" in brief and "[[e2]]" in brief
    # the merged branch: everyone's work, the person's commit, no markers
    assert git(repo, "show", "main:src/api.py").stdout.decode() == RESOLVED
    assert b"lo=0, hi=1" in git(repo, "show", "main:src/util.py").stdout
    assert git(repo, "show", "main:src/client.py").stdout.endswith(b"return fetch(url)  # e3\n")
    subjects = git(repo, "log", "--format=%s", "main").stdout.decode()
    assert "api: a person's note" in subjects
    log_msgs = git(repo, "log", "--format=%B", "main").stdout.decode()
    assert all(f"Storm-Agent: engineer_{n}" in log_msgs for n in (1, 2, 3)), log_msgs
    assert rep["phase"] == "landed" and rep["conflicts"]["at_merge"] == 1
    assert rep["landed"]["commit"] == git(repo, "rev-parse", "main").stdout.decode().strip()
    e = {x["agent"]: x for x in rep["engineers"]}
    assert e["engineer_2"]["fix_rounds"] == 1 and e["engineer_2"]["attempts"] == 2
    assert e["engineer_1"]["fix_rounds"] == 0 and e["engineer_3"]["fix_rounds"] == 0
    assert all(x["tokens"] is not None for x in rep["engineers"])
    assert st_states(repo) == ["done", "done", "done"]


def test_a_killed_run_of_claude_code_engineers_is_stopped_and_resumed(harness_bin, world, tmp_path):
    """``team run`` SIGKILLed while a real Claude Code session works: ``status`` names the
    orphan, ``stop`` ends it by pid, ``--resume`` starts that engineer again and lands
    everyone's work (the finished engineer's is kept, not redone)."""
    repo, home, log = world
    flag = tmp_path / "go"
    api, util, client = (str(repo / p) for p in ("src/api.py", "src/util.py", "src/client.py"))
    script = Script({
        "e1": [{"tool": "Read", "input": {"file_path": util}},
               {"wait": str(flag), "timeout": 120, "tool": "Bash",
                "input": {"command": "echo go", "description": "go"}},
               {"tool": "Edit", "input": {"file_path": util, "old_string": "def clamp(x, lo, hi):",
                                          "new_string": "def clamp(x, lo=0, hi=1):  # e1"}}],
        "e2": [{"tool": "Read", "input": {"file_path": api}},
               {"tool": "Edit", "input": {"file_path": api, "old_string": "return http_get(url)",
                                          "new_string": "return http_get(url)  # e2"}}],
        "e3": [{"tool": "Read", "input": {"file_path": client}},
               {"tool": "Edit", "input": {"file_path": client, "old_string": "return fetch(url)",
                                          "new_string": "return fetch(url)  # e3"}}],
    })
    server, port = serve(script)
    env = env_for(home, log, port, harness_bin)
    try:
        # the runner itself, not `git storm` (git would wait for it as a child a SIGKILL leaves running)
        proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan(tmp_path)),
                                 "--harness", "claude", "--parallel", "3", "--json"],
                                cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline:  # engineer_2 done, engineer_1's session waiting on the model
            assert proc.poll() is None, proc.communicate()
            runs = sorted((repo / ".git/storm/team").glob("*/state.json"))
            if runs:
                run = runs[0].parent.name
                st = json.loads(storm(repo, "team", "status", run, "--json", env=env).stdout)
                e = {x["agent"]: x for x in st["engineers"]}
                if e["engineer_2"]["state"] == "done" and e["engineer_1"]["state"] == "running" \
                        and e["engineer_1"].get("alive"):
                    break
            time.sleep(0.3)
        else:
            raise AssertionError("engineer_2 never finished while engineer_1 worked")
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        st = json.loads(storm(repo, "team", "status", run, "--json", env=env).stdout)
        e1 = st["engineers"][0]
        assert st["runner"]["alive"] is False and e1["orphaned"] and e1["alive"], st
        r = storm(repo, "team", "stop", run, "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ended"] == ["engineer_1"]
        assert not os.path.exists(f"/proc/{e1['pid']}") or "Z" in Path(f"/proc/{e1['pid']}/stat").read_text()
        flag.touch()
        r = run_team(repo, env, "run", "--resume", run)
    finally:
        server.shutdown()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert b"# e1" in hx.workspace(repo, "src/util.py") and b"# e2" in hx.workspace(repo, "src/api.py")
    assert b"# e3" in hx.workspace(repo, "src/client.py")
    assert set(hx.writers(log, "src/util.py")) == {"engineer_1"}
    assert set(hx.writers(log, "src/api.py")) == {"engineer_2"}
    rep = report(repo, events(r.stdout))
    assert [(x["agent"], x["attempts"], x["state"]) for x in rep["engineers"]] == \
        [("engineer_1", 2, "done"), ("engineer_2", 1, "done"), ("engineer_3", 1, "done")]
    assert rep["phase"] == "landed"
    msg = git(repo, "log", "-1", "--format=%B", "main").stdout.decode()
    assert all(f"Storm-Agent: engineer_{n}" in msg for n in (1, 2, 3)), msg
