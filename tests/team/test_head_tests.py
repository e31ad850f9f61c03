"""``git storm team run --watch-test``: git storm watch's runner on the shared head
while the engineers work (storm mode), with the CMD harness and real processes.

Two engineers each change one constant; each change passes the repository's test
alone, both together fail it. The runner blames the failure on one write of each (a
semantic conflict) while they work; both engineers hear it on a later command of
theirs (the CLI's stderr), the events and the board show it, the report counts it
beside the conflicts at write and at merge, and the runner is gone when the run is."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import git, make_repo, storm
from team_helpers import agent_cmd, team

FILES = {
    "src/a.py": "A = 1\n",
    "src/b.py": "B = 1\n",
    "tests/test_sum.py": "from a import A\nfrom b import B\n\n\ndef test_sum_stays_small():\n    assert A + B < 4\n",
    "conftest.py": "import sys\nsys.path.insert(0, 'src')\n",
    "README.md": "# sum\n",
}
PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -q -p no:cacheprovider"
PLAN = {"task": "raise both limits", "subtasks": [
    {"id": "s1", "title": "raise A", "brief": "A = 2.", "files": ["src/a.py"], "depends_on": []},
    {"id": "s2", "title": "raise B", "brief": "B = 2.", "files": ["src/b.py"], "depends_on": []},
]}


def told(out: Path) -> str:
    """A step: the engineer runs `git storm status` until its stderr carries a notice
    (at most a minute), keeping that stderr in ``out``."""
    return (f"for i in $(seq 1 240); do {sys.executable} -m storm_git status >/dev/null 2>{out}; "
            f"grep -q 'semantic conflict' {out} && exit 0; sleep 0.25; done; exit 1")


@pytest.fixture
def sum_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", FILES)
    git(repo, "config", "storm.watch.quietSeconds", "0.5")
    return repo


def test_a_semantic_conflict_found_while_the_team_works_is_told_shown_and_reported(sum_repo, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    heard = {a: tmp_path / f"{a}.stderr" for a in ("engineer_1", "engineer_2")}
    steps = {"s1": {"work": [{"read": ["src/a.py"]}, {"put": "src/a.py", "text": "A = 2\n"},
                             {"sh": told(heard["engineer_1"])}]},
             "s2": {"work": [{"read": ["src/b.py"]}, {"put": "src/b.py", "text": "B = 2\n"},
                             {"sh": told(heard["engineer_2"])}]}}
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    r = team(sum_repo, "run", "--plan", str(plan), "--harness-cmd", agent_cmd(sc, log), "--test", PYTEST,
             "--watch-test", PYTEST, "--fix-rounds", "0", "--json")
    # the tests fail on the shared head at landing too: the run does not land
    assert r.returncode == 1, (r.stdout[-3000:], r.stderr[-3000:])
    events = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    got = {p.stem: json.loads(p.read_text()) for p in log.iterdir()}
    assert all(x["results"][-1].get("rc") == 0 for x in got.values()), got  # both were told (their wait ended)
    for a in ("engineer_1", "engineer_2"):
        text = heard[a].read_text()
        assert "semantic conflict" in text and "tests/test_sum.py::test_sum_stays_small" in text, text
    # the events: the runner started, rounds, the conflict blamed on one write of each engineer
    kinds = [e["event"] for e in events]
    assert "head_watch" in kinds and "head_tested" in kinds, kinds
    (found,) = [e for e in events if e["event"] == "head_conflict"]
    assert found["found"] == "semantic" and sorted(found["agents"]) == ["engineer_1", "engineer_2"]
    assert found["test"] == "tests/test_sum.py::test_sum_stays_small"
    run = events[0]["run"]
    # the report: beside the conflicts at write and at merge, the one the tests found on the head
    rd = sum_repo / ".git" / "storm" / "team" / run
    rep = json.loads((rd / "report.json").read_text())
    assert rep["conflicts"]["on_head"] == 1 and rep["conflicts"]["at_merge"] == 0
    (f,) = rep["head_tests"]["found"]
    assert f["kind"] == "semantic" and sorted(w["agent"] for w in f["writes"]) == ["engineer_1", "engineer_2"]
    assert rep["head_tests"]["last"]["result"] == "red"
    md = (rd / "report.md").read_text()
    assert "1 semantic conflict(s) and 0 break(s) by the tests on the shared head during the run" in md
    assert "tests/test_sum.py::test_sum_stays_small failed on" in md
    # the board (team status --json) shows the head's test state and the blame
    snap = json.loads(team(sum_repo, "status", run, "--json").stdout)
    ht = snap["head_tests"]
    assert ht["result"] == "red" and ht["failing"] == ["tests/test_sum.py::test_sum_stays_small"]
    assert len(ht["found"]) == 1 and ht["runner"]["alive"] is False
    first = team(sum_repo, "status", run).stdout.splitlines()[0]
    assert "head tests red at" in first and "semantic test_sum_stays_small by engineer_" in first, first
    # the runner is gone with the run, and left no export behind
    st = json.loads((rd / "state.json").read_text())
    assert st["head_tests"]["pid"] is None
    work = sum_repo / ".git" / "storm" / "tests" / "work"
    assert not work.exists() or not any(work.iterdir())
    # the board's first line carries it too
    lines = team(sum_repo, "watch", run).stdout
    assert "semantic conflict by writes" in lines and "told on their next call" in lines


def test_watch_test_is_refused_in_worktree_mode_and_changes_nothing(tmp_path):
    repo = make_repo(tmp_path / "repo", FILES)
    assert storm(repo, "mode", "worktree").returncode == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    r = team(repo, "run", "--plan", str(plan), "--harness-cmd", "true", "--watch-test", PYTEST)
    assert r.returncode == 2 and "--watch-test needs storm mode" in r.stderr, r.stderr
    assert not (repo / ".git" / "storm" / "team").exists() or not any((repo / ".git" / "storm" / "team").iterdir())


def _gone(pid: int) -> bool:
    try:
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True


def _until(cond, what: str, proc=None, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        assert proc is None or proc.poll() is None, proc.communicate() if proc is not None else ""
        time.sleep(0.1)


@pytest.mark.slow
def test_the_runner_ends_with_a_killed_run_resume_keeps_its_findings_once_and_stop_ends_it(sum_repo, tmp_path):
    log, flag = tmp_path / "log", tmp_path / "flag"
    log.mkdir()
    wait = [{"wait_file": str(flag), "timeout": 300}]
    steps = {"s1": {"work": [{"read": ["src/a.py"]}, {"put": "src/a.py", "text": "A = 2\n"}, *wait]},
             "s2": {"work": [{"read": ["src/b.py"]}, {"put": "src/b.py", "text": "B = 2\n"}, *wait]}}
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    argv = [sys.executable, "-m", "storm_git", "team", "run"]
    proc = subprocess.Popen([*argv, "--plan", str(plan), "--harness-cmd", agent_cmd(sc, log), "--test", PYTEST,
                             "--watch-test", PYTEST, "--json"], cwd=sum_repo, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    teams = sum_repo / ".git" / "storm" / "team"

    def state() -> dict:
        runs = sorted(teams.iterdir()) if teams.exists() else []
        f = runs[0] / "state.json" if runs else None
        return json.loads(f.read_text()) if f is not None and f.exists() else {}

    _until(lambda: len(state().get("head_tests", {}).get("found") or []) == 1, "no finding", proc)
    runner = state()["head_tests"]["pid"]
    assert runner and not _gone(runner)
    proc.kill()  # SIGKILL: no cleanup of its own
    proc.wait()
    _until(lambda: _gone(runner), "the runner outlived its killed run", timeout=20)
    run = sorted(teams.iterdir())[0].name
    resumed = subprocess.Popen([*argv, "--resume", run, "--json"], cwd=sum_repo, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    _until(lambda: state().get("runner_pid") == resumed.pid and state()["head_tests"].get("pid") not in (None, runner),
           "the resumed run started no runner", resumed)
    second = state()["head_tests"]["pid"]
    time.sleep(2)  # a tick or two: the finding is read again, and kept once
    r = team(sum_repo, "stop", run, "--json")
    assert r.returncode == 0, r.stderr
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 143, err[-2000:]
    assert _gone(second)
    st = state()
    assert len(st["head_tests"]["found"]) == 1 and st["head_tests"]["pid"] is None
    rep = json.loads((teams / run / "report.json").read_text())
    assert rep["phase"] == "stopped" and rep["conflicts"]["on_head"] == 1
    events = [json.loads(x) for x in (teams / run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("head_conflict") == 1
    assert [e["event"] for e in events].count("head_watch") == 2
