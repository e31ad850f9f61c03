"""The board from another terminal: ``team status`` shows an engineer waiting on another's
reservation (and whose), ``team watch`` follows the run's events until it ends."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from team_helpers import agent_cmd, plan_file, team

PLAN2 = {"task": "two notes", "subtasks": [
    {"id": "a", "title": "note a", "brief": "note a", "files": ["src/api.py"]},
    {"id": "b", "title": "note b", "brief": "note b", "files": ["src/util.py"]}]}


def test_status_shows_a_wait_on_a_reservation_and_watch_follows_to_the_end(team_repo, tmp_path):
    subprocess.run(["git", "config", "storm.reservationSeconds", "300"], cwd=team_repo, check=True)
    log = tmp_path / "log"
    log.mkdir()
    f1, f2 = tmp_path / "e1-holds", tmp_path / "go"
    steps = {
        # engineer_1 is rejected on README.md after engineer_2's write: it holds the reservation
        "a": {"work": [{"read": ["README.md"]}, {"wait_ws": "README.md", "contains": "- x"},
                       {"append": "README.md", "text": "- e1\n", "expect": 1}, {"sh": f"touch {f1}"},
                       {"wait_file": str(f2), "timeout": 300}, {"read": ["README.md"]},
                       {"append": "README.md", "text": "- e1\n"}]},
        # engineer_2 then finds README.md reserved (--no-wait: rejected 'reserved') and waits
        "b": {"work": [{"read": ["README.md"]}, {"append": "README.md", "text": "- x\n"},
                       {"wait_file": str(f1), "timeout": 300},
                       {"read": ["README.md"]}, {"append": "README.md", "text": "- e2\n", "expect": 1},
                       {"wait_file": str(f2), "timeout": 300}, {"wait_ws": "README.md", "contains": "- e1"},
                       {"read": ["README.md"]}, {"append": "README.md", "text": "- e2\n"}]},
    }
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps))
    run = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan_file(tmp_path, PLAN2)),
                            "--harness-cmd", agent_cmd(sc, log)], cwd=team_repo, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (team_repo / ".git/storm/team").exists() or not list((team_repo / ".git/storm/team").iterdir()):
        assert time.time() < deadline and run.poll() is None
        time.sleep(0.1)
    watch = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "watch"], cwd=team_repo,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:
        st = json.loads(team(team_repo, "status", "--json").stdout)
        e2 = st["engineers"][1]
        if e2["state"] == "waiting":
            break
        assert time.time() < deadline and run.poll() is None, st
        time.sleep(0.2)
    assert e2["waits_for"] == "engineer_1" and st["engineers"][0]["holds"] == ["README.md"], st
    assert e2["reasons"] == {"reserved": 1} and e2["on"] == "README.md" and e2["writes"] == 1
    text = team(team_repo, "status").stdout
    assert any(line.startswith("⏸ engineer_2") and "⏸engineer_1" in line.replace(" ", "") for line in
               text.splitlines()), text
    f2.touch()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, (out, err)
    wout, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0
    lines = wout.splitlines()
    assert any(" engineer_1 started a (cmd, pid " in x for x in lines), wout
    assert any(" landed " in x for x in lines) and lines[-1].endswith(": landed")
    # team run's own output, not a terminal: the same lines, then its summary on stdout
    assert any(" engineer_2 done after " in x for x in out.splitlines()) and "landed; report:" in out


def test_on_a_terminal_the_board_is_a_table_redrawn_in_place(team_repo, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"a": {"work": [{"read": ["src/api.py"]}, {"sleep": 3},
                                             {"put": "src/api.py", "text": "TIMEOUT = 3\n"}]},
                              "b": {"work": [{"sleep": 3}]}}))
    cmd = (f"{sys.executable} -m storm_git team run --plan {plan_file(tmp_path, PLAN2)} "
           f"--harness-cmd '{agent_cmd(sc, log)}'")
    r = subprocess.run(["script", "-qfec", cmd, "/dev/null"], cwd=team_repo, capture_output=True, text=True,
                       timeout=180, env={**os.environ, "TERM": "xterm"}, check=False)
    assert r.returncode == 0, r.stdout[-2000:]
    assert len(re.findall(r"\x1b\[\d+F", r.stdout)) >= 2, r.stdout[-2000:]  # redrawn over the last frame
    last = r.stdout[r.stdout.rindex("  storm mode  "):]  # the last frame
    assert "engineer    subtask" in last and "✓ engineer_1  a" in last and "✓ engineer_2  b" in last
    assert "landed" in last
