"""``git storm team run --branch NAME --push [REMOTE]`` with the CMD harness: the run
lands on a branch of its own (storm mode: the manager's commit there; worktree mode:
the merges into it) and pushes it to a real bare repository; the branch it started
on stays where it was. A refused push is exit 4 with the commit kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import git, show, storm
from team_helpers import plan_file, team

PLAN = {"task": "timeouts", "subtasks": [
    {"id": "s1", "title": "timeout", "brief": "TIMEOUT = 10", "files": ["src/api.py"]},
    {"id": "s2", "title": "clamp", "brief": "tidy clamp", "files": ["src/util.py"]}]}
STEPS = {
    "s1": {"work": [{"read": ["src/api.py"]}, {"put": "src/api.py", "text": "TIMEOUT = 10\n"}]},
    "s2": {"work": [{"read": ["src/util.py"]},
                    {"put": "src/util.py", "text": "def clamp(x, lo, hi):\n    return min(max(x, lo), hi)\n"}]},
}


def bare_remote(repo: Path, tmp_path: Path, name: str = "origin") -> Path:
    bare = tmp_path / f"{name}.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(repo, "remote", "add", name, str(bare))
    return bare


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("mode", ["storm", "worktree"])
def test_lands_on_its_own_branch_and_pushes_it(team_repo, scenario, tmp_path, mode):
    if mode == "worktree":
        assert storm(team_repo, "mode", "worktree").returncode == 0
    bare = bare_remote(team_repo, tmp_path)
    start = git(team_repo, "rev-parse", "main").stdout.decode().strip()
    cmd, _log = scenario(STEPS)
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path, PLAN)), "--harness-cmd", cmd,
             "--branch", "team/timeouts", "--push", "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    landed = next(e for e in evs if e["event"] == "landed")
    pushed = next(e for e in evs if e["event"] == "pushed")
    assert landed["branch"] == "team/timeouts" and pushed["remote"] == "origin" and pushed["ok"]
    tip = git(team_repo, "rev-parse", "team/timeouts").stdout.decode().strip()
    assert landed["commit"] == tip == pushed["commit"]
    # the branch the run started on did not move; the new branch holds both engineers' work
    assert git(team_repo, "rev-parse", "main").stdout.decode().strip() == start
    assert show(team_repo, "team/timeouts", "src/api.py") == b"TIMEOUT = 10\n"
    assert b"min(max(x, lo), hi)" in show(team_repo, "team/timeouts", "src/util.py")
    msgs = git(team_repo, "log", "--format=%B", f"{start}..team/timeouts").stdout.decode()
    assert "Storm-Agent: engineer_1" in msgs and "Storm-Agent: engineer_2" in msgs, msgs
    # the remote has exactly that commit on that branch, and nothing on main
    assert git(bare, "rev-parse", "refs/heads/team/timeouts").stdout.decode().strip() == tip
    assert git(bare, "rev-parse", "--verify", "-q", "refs/heads/main", check=False).returncode != 0
    # storm mode: the main working tree is on the new branch (the commit went there); worktree mode: untouched
    head = git(team_repo, "symbolic-ref", "--short", "HEAD").stdout.decode().strip()
    assert head == ("team/timeouts" if mode == "storm" else "main")
    run = evs[0]["run"]
    rep = json.loads((team_repo / ".git/storm/team" / run / "report.json").read_text())
    assert rep["phase"] == "landed" and rep["landed"]["branch"] == "team/timeouts"
    assert rep["pushed"] == {"remote": "origin", "branch": "team/timeouts", "commit": tip, "ok": True, "error": ""}
    md = (team_repo / ".git/storm/team" / run / "report.md").read_text()
    assert f"Landed: {tip} on team/timeouts." in md and "Pushed: team/timeouts to origin." in md


def test_a_refused_push_is_exit_4_and_the_commit_stays(team_repo, scenario, tmp_path):
    """The remote's branch already has other work: the push (never forced) is refused."""
    bare = bare_remote(team_repo, tmp_path, "upstream")
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(bare), str(other))
    (other / "x.txt").write_text("someone else's\n")
    git(other, "add", "x.txt")
    git(other, "-c", "user.name=O", "-c", "user.email=o@x", "commit", "-qm", "other")
    git(other, "push", "-q", "origin", "HEAD:refs/heads/main")
    other_tip = git(other, "rev-parse", "HEAD").stdout.decode().strip()
    cmd, _log = scenario(STEPS)
    r = team(team_repo, "run", "--plan", str(plan_file(tmp_path, PLAN)), "--harness-cmd", cmd, "--push", "upstream",
             "--json")
    assert r.returncode == 4, (r.stdout[-3000:], r.stderr[-3000:])
    evs = events(r.stdout)
    failed = next(e for e in evs if e["event"] == "push_failed")
    assert failed["remote"] == "upstream" and failed["branch"] == "main" and not failed["ok"] and failed["error"]
    landed = next(e for e in evs if e["event"] == "landed")
    assert git(team_repo, "rev-parse", "main").stdout.decode().strip() == landed["commit"]  # landed locally
    assert git(bare, "rev-parse", "refs/heads/main").stdout.decode().strip() == other_tip  # not overwritten
    rep = json.loads((team_repo / ".git/storm/team" / evs[0]["run"] / "report.json").read_text())
    assert rep["phase"] == "landed" and not rep["pushed"]["ok"]
    assert any(p.startswith("landed, not pushed to upstream:") for p in rep["problems"]), rep["problems"]


def test_bad_branch_or_remote_changes_nothing(team_repo, scenario, tmp_path):
    cmd, _log = scenario(STEPS)
    plan = str(plan_file(tmp_path, PLAN))
    other = git(team_repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "someone's").stdout.decode().strip()
    git(team_repo, "branch", "taken", other)  # a branch with other work than the run's start
    refs = git(team_repo, "for-each-ref").stdout
    for args, code, words in [(["--branch", "taken"], 3, "branch taken exists at"),
                              (["--branch", "no..pe"], 2, "not a valid branch name"),
                              (["--push", "nowhere"], 2, "no remote named 'nowhere'")]:
        r = team(team_repo, "run", "--plan", plan, "--harness-cmd", cmd, *args)
        assert r.returncode == code and words in r.stderr, (args, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert git(team_repo, "for-each-ref").stdout == refs
    assert not (team_repo / ".git/storm/team").exists() or not list((team_repo / ".git/storm/team").iterdir())
