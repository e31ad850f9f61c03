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
    f0, f1, f2 = tmp_path / "e1-read", tmp_path / "e1-holds", tmp_path / "go"
    steps = {
        # engineer_1 is rejected on README.md after engineer_2's write: it holds the reservation
        "a": {"work": [{"read": ["README.md"]}, {"sh": f"touch {f0}"}, {"wait_ws": "README.md", "contains": "- x"},
                       {"append": "README.md", "text": "- e1\n", "expect": 1}, {"sh": f"touch {f1}"},
                       {"wait_file": str(f2), "timeout": 300}, {"read": ["README.md"]},
                       {"append": "README.md", "text": "- e1\n"}]},
        # engineer_2 then finds README.md reserved (--no-wait: rejected 'reserved') and waits
        "b": {"work": [{"read": ["README.md"]}, {"wait_file": str(f0), "timeout": 120},
                       {"append": "README.md", "text": "- x\n"},
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


def test_waiting_is_shown_while_a_write_waits_inside_storm_and_not_after(team_repo, tmp_path):
    """engineer_2's write waits inside storm (no --no-wait) for the reservation engineer_1
    holds after its rejection: no rejection yet, yet the board says whom it waits on and
    for which file, while it lasts; once the reservation ends the write lands and the
    board says running again."""
    subprocess.run(["git", "config", "storm.reservationSeconds", "8"], cwd=team_repo, check=True)
    log = tmp_path / "log"
    log.mkdir()
    f0, f1 = tmp_path / "e1-read", tmp_path / "e1-holds"
    steps = {
        # engineer_1's write of README.md is rejected after engineer_2's: it holds README.md for 8 s
        "a": {"work": [{"read": ["README.md"]}, {"sh": f"touch {f0}"}, {"wait_ws": "README.md", "contains": "- x"},
                       {"append": "README.md", "text": "- e1\n", "expect": 1}, {"sh": f"touch {f1}"}]},
        # engineer_2 writes README.md again: storm holds that write until the reservation ends
        "b": {"work": [{"read": ["README.md"]}, {"wait_file": str(f0), "timeout": 120},
                       {"append": "README.md", "text": "- x\n"},
                       {"wait_file": str(f1), "timeout": 120}, {"read": ["README.md"]},
                       {"append": "README.md", "text": "- e2\n", "wait": True}]},
    }
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps))
    run = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan_file(tmp_path, PLAN2)),
                            "--harness-cmd", agent_cmd(sc, log), "--json"], cwd=team_repo, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not f1.exists():
        assert time.time() < deadline and run.poll() is None
        time.sleep(0.05)
    seen = None
    while seen is None and run.poll() is None:
        st = json.loads(team(team_repo, "status", "--json").stdout)
        e2 = st["engineers"][1]
        if e2["waits_for"]:
            seen = (st, team(team_repo, "status").stdout)
        assert time.time() < deadline, st
    assert seen is not None, "the board never showed engineer_2 waiting"
    st, text = seen
    e2 = st["engineers"][1]
    assert (e2["waits_for"], e2["waiting_for"], e2["on"]) == ("engineer_1", "README.md", "README.md"), e2
    assert e2["reasons"] == {}, e2  # blocked inside storm: no rejection
    assert "  engineer_2 waiting on engineer_1 for README.md" in text.splitlines(), text
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, (out[-3000:], err[-3000:])
    evs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    mine = [(e["event"], e.get("holder"), e.get("path")) for e in evs if e.get("agent") == "engineer_2" and
            e["event"] in ("waiting", "resumed_work")]
    # (its session may end before the next look notices the wait is over: no resumed_work then)
    assert mine in ([("waiting", "engineer_1", "README.md"), ("resumed_work", None, None)],
                    [("waiting", "engineer_1", "README.md")]), mine
    got = json.loads((log / "engineer_2.work.json").read_text())
    assert [x.get("rc") for x in got["results"] if "write" in x] == [0, 0]  # the waiting write landed
    after = json.loads(team(team_repo, "status", "--json").stdout)["engineers"][1]
    assert after["waits_for"] is None and after["state"] == "done"
    assert not list((team_repo / ".git/storm/waits").iterdir())  # the mark went with the wait
