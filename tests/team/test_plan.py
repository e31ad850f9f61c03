"""Plan validation: every problem of a bad plan on its own line, exit 2, nothing started
or changed; globs expanded against the shared head."""
from __future__ import annotations

import json

import pytest

from helpers import snapshot_refs
from team_helpers import PLAN, plan_file, team

BAD = {
    "task": "x", "extra": 1,
    "subtasks": [
        {"id": "s1", "title": "a", "brief": "b", "files": ["src/*.py"], "depends_on": ["s3"]},
        {"id": "s2", "title": "a", "brief": "b", "files": ["src/api.py", "nowhere/new.py"], "depends_on": ["s9"],
         "color": "red"},
        {"id": "s3", "title": "", "brief": "b", "files": ["docs/**"], "depends_on": ["s1", "s3"]},
        {"id": "s1", "title": "a", "brief": "b", "files": ["../etc/passwd"], "harness": "vim"},
    ],
}
EXPECTED = [
    "unknown key 'extra' at the top (known: task, subtasks)",
    "subtask s2: unknown key 'color' (known: brief, depends_on, files, harness, id, title)",
    "subtask s3: 'title' must be a non-empty string",
    "subtask s1: 'harness' must be one of claude, codex, cmd (got 'vim')",
    "subtask id 's1' is used 2 times",
    "subtask s2 depends on 's9', which is not a subtask",
    "subtask s3 depends on itself",
    "depends_on has a cycle: s1 -> s3 -> s1",
    "subtasks s1 and s2 both have src/api.py among their primary files (primary files must be disjoint)",
    "subtask s2: nowhere/new.py does not exist and its folder nowhere/ does not either",
    "subtask s3: the glob docs/** matches no file",
    "subtask s1: file pattern '../etc/passwd' leads outside the repository",
]


def test_a_bad_plan_gets_one_line_per_problem_exit_2_and_changes_nothing(team_repo, tmp_path):
    before = snapshot_refs(team_repo)
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path, BAD)), "--harness-cmd", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"git storm: bad plan: {p}" for p in EXPECTED]
    assert snapshot_refs(team_repo) == before
    assert not (team_repo / ".git/storm/team").exists()
    r = team(team_repo, "plan", "--check", str(plan_file(tmp_path, BAD)), "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["problems"] == EXPECTED


@pytest.mark.parametrize("text, line", [
    ("{not json", "not JSON"),
    ("[]", "the plan must be a JSON object with 'task' and 'subtasks'"),
    ('{"task": "t", "subtasks": []}', "'subtasks' must be a non-empty list"),
    ("[" * 100000 + "]" * 100000, "not a plan: JSON nested too deeply"),
    ('{"task": "t", "subtasks": [{"id": "a b", "title": "t", "brief": "b", "files": "src/api.py"}]}',
     "subtask 1: 'id' must be 1-40 letters, digits, _ . - (got 'a b')"),
])
def test_malformed_plans(team_repo, tmp_path, text, line):
    p = tmp_path / "p.json"
    p.write_text(text)
    r = team(team_repo, "plan", "--check", str(p))
    assert r.returncode == 2 and line in r.stderr.splitlines()[0], r.stderr


def test_a_good_plan_new_files_under_existing_folders_and_globs(team_repo, tmp_path):
    plan = json.loads(json.dumps(PLAN))
    plan["subtasks"][0]["files"] = ["src/api.py", "src/new_module.py"]
    plan["subtasks"][1]["files"] = ["src/u*.py", "README.md"]
    r = team(team_repo, "plan", "--check", str(plan_file(tmp_path, plan)), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["subtasks"][0]["files"] == ["src/api.py", "src/new_module.py"]
    # a glob overlapping another subtask's file is caught once expanded
    plan["subtasks"][2]["files"] = ["src/*.py"]
    r = team(team_repo, "plan", "--check", str(plan_file(tmp_path, plan)))
    assert r.returncode == 2
    assert "git storm: bad plan: subtasks s1 and s3 both have src/api.py among their primary files " \
           "(primary files must be disjoint)" in r.stderr.splitlines()


def test_run_refuses_a_mode_the_repository_is_not_in_and_a_missing_command(team_repo, tmp_path):
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path)), "--harness-cmd", "true", "--mode", "worktree")
    assert r.returncode == 3 and "the repository is in storm mode, the run asks for worktree" in r.stderr
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path)), "--harness", "cmd")
    assert r.returncode == 2 and "the cmd harness needs --harness-cmd" in r.stderr
    assert not (team_repo / ".git/storm/team").exists()


def test_a_new_team_run_starts_each_engineer_with_a_new_read_set(team_repo, tmp_path):
    """engineer_1 of an earlier run read src/util.py, which changed since; in a new run
    its subtask is a new task: that old read is gone (it would refuse its writes as stale)."""
    from helpers import storm

    assert storm(team_repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(team_repo, "read", "src/util.py", agent="other").returncode == 0
    assert storm(team_repo, "write", "src/util.py", input="changed = 1\n", agent="other").returncode == 0
    seen = tmp_path / "seen.json"
    plan = {"task": "t", "subtasks": [{"id": "s1", "title": "a", "brief": "b", "files": ["src/api.py"],
                                       "depends_on": []}]}
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path, plan)),
             "--harness-cmd", f"git storm status --json > {seen}")
    assert r.returncode == 0, r.stderr
    [me] = [a for a in json.loads(seen.read_text())["agents"] if a["agent"] == "engineer_1"]
    assert me["reads"] == 0 and me["stale"] == [], me
