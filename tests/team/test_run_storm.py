"""``git storm team run`` in storm mode with the CMD harness: three engineers, real
processes, storm's own verbs; what each session received, the shared head, the
branch, the disk and the report."""
from __future__ import annotations

import json
from pathlib import Path

from helpers import git, show
from team_helpers import PLAN, plan_file, team


def steps(read_flag: Path) -> dict:
    """engineer_2 reads README.md and src/api.py before engineer_1 writes both (engineer_1
    waits for ``read_flag``): engineer_2's README write is a direct conflict, its retry
    (README re-read) a stale dependency (api.py), its third try lands; engineer_3 (after
    s1) edits through the shell with a bug that check.py catches and fixes it in the fix
    round."""
    return {
        "s1": {"work": [{"wait_file": str(read_flag), "timeout": 120},
                        {"read": ["src/api.py", "README.md"]},
                        {"put": "src/api.py", "text": "TIMEOUT = 10\n"},
                        {"append": "README.md", "text": "- api: timeout 10\n"}]},
        "s2": {"work": [{"read": ["README.md", "src/api.py", "src/util.py"]},
                        {"sh": f"touch '{read_flag}'"},
                        {"wait_ws": "README.md", "contains": "- api"},
                        {"append": "README.md", "text": "- util: clamp\n", "expect": 1},
                        {"read": ["README.md"]},
                        {"append": "README.md", "text": "- util: clamp\n", "expect": 1},
                        {"read": ["src/api.py"]},
                        {"append": "README.md", "text": "- util: clamp\n"},
                        {"put": "src/util.py", "text": "def clamp(x, lo, hi):\n    return min(max(x, lo), hi)\n"}]},
        "s3": {"work": [{"read": ["src/client.py", "src/api.py"]},
                        {"exec": "sed -i 's/return url/return url + \"?\"/' src/client.py"}],
               "fix": [{"read": ["src/client.py"]},
                       {"edit": "src/client.py", "old": "url + \"?\"", "new": "url + \"!\""}]},
    }


def test_three_engineers_conflict_stale_shell_edit_fix_round_and_the_commit(team_repo, scenario, tmp_path):
    cmd, log = scenario(steps(tmp_path / "engineer_2-read"))
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path)), "--harness-cmd", cmd, "--test",
             "python3 check.py", "--parallel", "3")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    got = {p.stem: json.loads(p.read_text()) for p in log.iterdir()}
    assert sorted(got) == ["engineer_1.work", "engineer_2.work", "engineer_3.fix", "engineer_3.work"]
    # what each session received: its id, subtask, run, and a brief with storm's rules and its subtask
    runs = {g["STORM_TEAM_RUN"] for g in got.values()}
    assert len(runs) == 1
    for n, s in enumerate(PLAN["subtasks"], 1):
        g = got[f"engineer_{n}.work"]
        assert (g["STORM_AGENT"], g["STORM_TEAM_SUBTASK"], g["STORM_TEAM_MODE"]) == (f"engineer_{n}", s["id"], "storm")
        assert s["brief"] in g["brief"] and s["files"][0] in g["brief"] and "git storm" in g["brief"]
        assert Path(g["cwd"]).resolve() == team_repo.resolve()
    assert "It builds on: s1 (longer timeout, done by engineer_1: src/api.py" in got["engineer_3.work"]["brief"]
    fix = got["engineer_3.fix"]
    assert fix["STORM_TEAM_ROUND"] == "fix" and "FAIL src/client.py: load(x) returned 'x?'" in fix["brief"]
    # engineer_2 was rejected twice, each time for the reason the scenario made
    reasons = [x.get("reason") for x in got["engineer_2.work"]["results"] if "write" in x]
    assert reasons == ["direct_conflict", "stale_dependency", None, None]
    # the shared head holds every engineer's work, the branch has it in the manager's commit
    assert show(team_repo, "refs/storm/workspace", "README.md").decode() == \
        "# service\n- api: timeout 10\n- util: clamp\n"
    assert show(team_repo, "refs/storm/workspace", "src/client.py") == b'def load(url):\n    return url + "!"\n'
    ws_tree = git(team_repo, "rev-parse", "refs/storm/workspace^{tree}").stdout
    assert git(team_repo, "rev-parse", "main^{tree}").stdout == ws_tree
    assert (team_repo / "src/client.py").read_bytes() == show(team_repo, "main", "src/client.py")
    msg = git(team_repo, "log", "-1", "--format=%B", "main").stdout.decode()
    assert msg.startswith("make the service sturdier\n")
    for a in ("engineer_1", "engineer_2", "engineer_3"):
        assert f"Storm-Agent: {a}" in msg
    assert "- engineer_2 (s2: clamp notes): 2 write(s) to README.md, src/util.py" in msg
    assert "- engineer_3 (s3: client marks): 2 write(s) to src/client.py" in msg
    ops = git(team_repo, "log", "--format=%(trailers:key=Storm-Agent,valueonly)%(trailers:key=Storm-Op,valueonly)",
              "refs/storm/workspace").stdout.decode().split()
    assert "exec" in ops  # the shell edit is engineer_3's write
    # the report adds up
    run = runs.pop()
    rep = json.loads((team_repo / ".git/storm/team" / run / "report.json").read_text())
    main = git(team_repo, "rev-parse", "main").stdout.decode().strip()
    assert rep["phase"] == "landed" and rep["landed"]["commit"] == main
    e = {x["agent"]: x for x in rep["engineers"]}
    assert e["engineer_2"]["reasons"] == {"direct_conflict": 1, "stale_dependency": 1}
    assert e["engineer_2"]["replans"] == 1 and e["engineer_3"]["fix_rounds"] == 1
    assert [x["writes"] for x in rep["engineers"]] == [2, 2, 2]
    assert rep["conflicts"] == {"at_write": 2, "at_merge": 0, "by_tests": 1}
    assert [t["passed"] for t in rep["tests"]] == [False, True]
    md = (team_repo / ".git/storm/team" / run / "report.md").read_text()
    assert "| engineer_2 | s2: clamp notes | done | 2 | 2" in md
    st = json.loads(team(team_repo, "status", "--json").stdout)
    assert [(x["agent"], x["subtask"], x["state"]) for x in st["engineers"]] == \
        [("engineer_1", "s1", "done"), ("engineer_2", "s2", "done"), ("engineer_3", "s3", "done")]
    assert st["phase"] == "landed" and st["runner"]["alive"] is False


def test_a_dependents_brief_names_what_its_dependency_wrote_since_the_last_look(team_repo):
    """The engineers' figures are looked at once a second; a subtask started just
    after its dependency wrote still hears what it wrote (the brief looks itself)."""
    from storm_git import open_workspace
    from storm_git.core.store import Store
    from storm_git.team import runner

    t = runner.prepare(Store.discover(str(team_repo)), PLAN, runner.Options(harness_cmd="true"))
    by_sub = {e.subtask: e for e in t.st.engineers}
    t.tick()  # the last look: nothing written yet
    ws = open_workspace(str(team_repo))
    ws.read(["src/api.py"], agent=by_sub["s1"].agent)
    assert ws.write("src/api.py", b"TIMEOUT = 10\n", agent=by_sub["s1"].agent).accepted
    brief = t.prompt(by_sub["s3"], "work")
    assert f"s1 (longer timeout, done by {by_sub['s1'].agent}: src/api.py)" in brief, brief
