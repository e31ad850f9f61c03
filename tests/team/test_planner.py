"""The manager's planning session: storm refuses its writes (``storm.readOnly``) at
every door that validates a write, and its plan is taken from the harness's JSON
output."""
from __future__ import annotations

import json

import pytest

from helpers import claude_event, decision, git, hook, show, storm
from storm_git.team.plan import PlanError
from storm_git.team.planner import answer_text, extract


def test_a_read_only_agent_reads_but_its_writes_are_refused_by_the_cli_and_the_hooks(team_repo):
    git(team_repo, "config", "--add", "storm.readOnly", "team_planner")
    head = git(team_repo, "rev-parse", "refs/storm/workspace").stdout
    assert storm(team_repo, "read", "src/api.py", agent="team_planner").returncode == 0
    r = storm(team_repo, "write", "src/api.py", input="x = 1\n", agent="team_planner")
    assert r.returncode == 2 and "team_planner is read-only here: it may read, not write" in r.stderr
    ev = claude_event(team_repo, "s1", "PreToolUse", "Edit",
                      {"file_path": str(team_repo / "src/api.py"), "old_string": "TIMEOUT = 1",
                       "new_string": "TIMEOUT = 2"}, "t1")
    d = decision(hook(team_repo, ev, env={"STORM_AGENT": "team_planner"}))
    assert d["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "read-only" in d["hookSpecificOutput"]["permissionDecisionReason"]
    assert git(team_repo, "rev-parse", "refs/storm/workspace").stdout == head
    # another agent is not affected
    assert storm(team_repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(team_repo, "write", "src/api.py", input="TIMEOUT = 2\n", agent="engineer_1").returncode == 0
    assert show(team_repo, "refs/storm/workspace", "src/api.py") == b"TIMEOUT = 2\n"


def test_the_plan_is_taken_from_each_harness_json_output(tmp_path):
    plan = {"task": "t", "subtasks": [{"id": "s1", "title": "a", "brief": "b", "files": ["x.py"]}]}
    answer = f"Here is the plan:\n```json\n{json.dumps(plan)}\n```\nDone."
    claude = tmp_path / "claude.out"
    claude.write_text("\n".join(json.dumps(e) for e in [
        {"type": "system", "subtype": "init"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "{\"not\": \"it\"}"}]}},
        {"type": "result", "subtype": "success", "result": answer, "total_cost_usd": 0.01}]) + "\n")
    codex = tmp_path / "codex.out"
    codex.write_text("\n".join(json.dumps(e) for e in [
        {"type": "thread.started"}, {"type": "item.completed", "item": {"type": "agent_message", "text": "thinking"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": answer}},
        {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}}]) + "\n")
    assert extract(answer_text("claude", str(claude))) == plan
    assert extract(answer_text("codex", str(codex))) == plan
    assert extract('prose {"a": 1} then {"task": "t", "subtasks": []} end') == {"task": "t", "subtasks": []}
    with pytest.raises(PlanError, match="holds no JSON plan"):
        extract("I could not make a plan {")
