"""``git storm team run --mode worktree`` with the CMD harness: one worktree and branch
per engineer, a dependent subtask starting from its dependency's branch, the merge
in dependency order through the test gate, and a merge conflict handed back once."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from helpers import git, show, storm
from team_helpers import agent_cmd, plan_file


def test_worktree_mode_merges_in_order_hands_back_a_conflict_once_and_fixes_a_test(team_repo, tmp_path):
    assert storm(team_repo, "mode", "worktree").returncode == 0
    log = tmp_path / "log"
    log.mkdir()
    flag = tmp_path / "main-moved"
    steps = {
        "s1": {"work": [{"read": ["src/api.py"]}, {"put": "src/api.py", "text": "TIMEOUT = 10\n"}]},
        # engineer_2 changes util.py where a person changes it on main meanwhile: its merge conflicts
        "s2": {"work": [{"sh": f"touch {log}/e2.started"}, {"wait_file": str(flag)}, {"read": ["src/util.py"]},
                        {"put": "src/util.py", "text": "def clamp(x, lo, hi):\n    return min(max(x, lo), hi)\n"}],
               "conflict": [{"sh": "git merge -q main; test -f .git || true"},
                            {"sh": "printf 'def clamp(x, lo, hi):\\n    return min(max(x, lo), hi)  # both\\n' "
                                   "> src/util.py && git add src/util.py && git commit -q --no-edit"}]},
        # engineer_3 starts from engineer_1's branch; its first version fails the gate
        "s3": {"work": [{"sh": "grep -q 'TIMEOUT = 10' src/api.py"},
                        {"read": ["src/client.py"]},
                        {"put": "src/client.py", "text": "def load(url):\n    return url + '?'\n"}],
               "fix": [{"read": ["src/client.py"]},
                       {"put": "src/client.py", "text": "def load(url):\n    return url + '!'\n"},
                       {"sh": "git add -A && git commit -q -m 'client: no question mark'"}]},
    }
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps))
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan_file(tmp_path)),
                             "--harness-cmd", agent_cmd(sc, log), "--test", "python3 check.py", "--mode", "worktree",
                             "--json"], cwd=team_repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (log / "e2.started").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    (team_repo / "src/util.py").write_text("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))  # person\n")
    git(team_repo, "commit", "-qam", "util: a person's note")
    flag.touch()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    handed = [e for e in events if e["event"] == "handed_back"]
    assert [sorted(h["agents"]) for h in handed] == [["engineer_2", "engineer_3"]]
    assert handed[0]["why"] == {"engineer_2": "conflicted", "engineer_3": "test_failed"}
    assert kinds.count("merging") == 2 and kinds[-2:] == ["landed", "report"]
    # each engineer worked in its own worktree; engineer_3's started from engineer_1's branch
    got = {p.stem: json.loads(p.read_text()) for p in log.glob("*.json")}
    assert sorted(got) == ["engineer_1.work", "engineer_2.conflict", "engineer_2.work", "engineer_3.fix",
                           "engineer_3.work"]
    for a in ("engineer_1", "engineer_2", "engineer_3"):
        assert got[f"{a}.work"]["cwd"].endswith(f".git/storm/worktrees/{a}")
        assert got[f"{a}.work"]["STORM_TEAM_MODE"] == "worktree"
    assert "Merge conflict handed back" in got["engineer_2.conflict"]["brief"] and "src/util.py" in \
        got["engineer_2.conflict"]["brief"]
    assert "Fix round" in got["engineer_3.fix"]["brief"]
    # main holds everyone's work in dependency order, the tests pass on it
    assert show(team_repo, "main", "src/api.py") == b"TIMEOUT = 10\n"
    assert show(team_repo, "main", "src/util.py").endswith(b"# both\n")
    assert show(team_repo, "main", "src/client.py") == b"def load(url):\n    return url + '!'\n"
    subjects = git(team_repo, "log", "--format=%s", "main").stdout.decode()
    assert "util: a person's note" in subjects
    run = events[0]["run"]
    rep = json.loads((team_repo / ".git/storm/team" / run / "report.json").read_text())
    assert rep["phase"] == "landed" and rep["conflicts"]["at_merge"] == 1 and rep["conflicts"]["by_tests"] >= 1
    assert {e["agent"]: e["fix_rounds"] for e in rep["engineers"]} == {"engineer_1": 0, "engineer_2": 1,
                                                                        "engineer_3": 1}
    assert rep["landed"]["commit"] == git(team_repo, "rev-parse", "main").stdout.decode().strip()
