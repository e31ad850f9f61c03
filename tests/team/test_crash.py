"""A ``team run`` killed with SIGKILL: its sessions outlive it, ``status`` says so,
``stop`` ends them by pid and releases what they held, ``--resume`` continues and
lands; or ``--resume`` straight away waits for the session that is still working."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import show, storm
from team_helpers import agent_cmd, plan_file, team


def steps(flag: Path) -> dict:
    return {
        # engineer_1 is rejected on README.md (so it holds a reservation), then waits for the flag;
        # engineer_2 writes README.md once engineer_1 has read it
        "s1": {"work": [{"read": ["README.md", "src/api.py"]}, {"sh": f"touch '{flag}.read'"},
                        {"wait_ws": "README.md", "contains": "- util"},
                        {"append": "README.md", "text": "- api\n", "expect": 1},
                        {"wait_file": str(flag), "timeout": 120},
                        {"read": ["README.md"]}, {"append": "README.md", "text": "- api\n"},
                        {"put": "src/api.py", "text": "TIMEOUT = 10\n"}],
               "work2": [{"read": ["README.md", "src/api.py"]}, {"append": "README.md", "text": "- api\n"},
                         {"put": "src/api.py", "text": "TIMEOUT = 10\n"}]},
        "s2": {"work": [{"wait_file": f"{flag}.read", "timeout": 120}, {"read": ["README.md", "src/util.py"]},
                        {"append": "README.md", "text": "- util\n"}]},
        "s3": {"work": [{"sh": "grep -q 'TIMEOUT = 10' src/api.py"}, {"read": ["src/client.py"]},
                        {"put": "src/client.py", "text": "def load(url):\n    return url + '!'\n"}]},
    }


def start(repo: Path, tmp_path: Path, flag: Path) -> tuple[subprocess.Popen, Path, str]:
    log = tmp_path / "log"
    log.mkdir()
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(steps(flag)))
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan_file(tmp_path)),
                             "--harness-cmd", agent_cmd(sc, log), "--test", "python3 check.py", "--json"],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    run = None
    while time.time() < deadline:  # until engineer_1 holds its reservation and engineer_2 is done
        teams = repo / ".git/storm/team"
        runs = sorted(teams.iterdir()) if teams.exists() else []
        if runs:
            run = runs[0].name
            st = json.loads(team(repo, "status", run, "--json").stdout)
            e = {x["agent"]: x for x in st["engineers"]}
            if e["engineer_1"]["holds"] == ["README.md"] and e["engineer_2"]["state"] == "done":
                break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    else:
        raise AssertionError("engineer_1 never held its reservation")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc, log, str(run)


def test_stop_ends_the_sessions_a_killed_run_left_and_resume_lands(team_repo, tmp_path):
    flag = tmp_path / "flag"
    _, log, run = start(team_repo, tmp_path, flag)
    st = json.loads(team(team_repo, "status", run, "--json").stdout)
    e1 = st["engineers"][0]
    assert st["runner"]["alive"] is False and e1["state"] == "running" and e1["alive"] and e1["orphaned"]
    assert (st["engineers"][1]["state"], st["engineers"][2]["state"]) == ("done", "queued")
    pid = e1["pid"]
    listed = json.loads(team(team_repo, "status", "--all", "--json").stdout)["runs"]
    assert [(x["run"], x["orphaned"]) for x in listed] == [(run, ["engineer_1"])]
    r = team(team_repo, "stop", run, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"run": run, "asked_runner": False, "ended": ["engineer_1"], "phase": "stopped"}
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert json.loads(storm(team_repo, "status", "--json").stdout)["reservations"] == []
    st = json.loads(team(team_repo, "status", run, "--json").stdout)
    assert [x["state"] for x in st["engineers"]] == ["stopped", "done", "queued"] and st["phase"] == "stopped"
    transcripts = team_repo / ".git/storm/team" / run / "transcripts"
    assert (transcripts / "engineer_1.1.out").exists() and (transcripts / "engineer_2.1.out").exists()
    # the resumed run starts engineer_1 again (a second attempt), keeps engineer_2's work, and lands
    r = team(team_repo, "run", "--resume", run, "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert sorted(p.stem for p in log.glob("*.json")) == ["engineer_1.work.2", "engineer_2.work", "engineer_3.work"]
    assert show(team_repo, "main", "README.md") == b"# service\n- util\n- api\n"
    assert show(team_repo, "main", "src/client.py") == b"def load(url):\n    return url + '!'\n"
    rep = json.loads((team_repo / ".git/storm/team" / run / "report.json").read_text())
    assert [(x["agent"], x["attempts"], x["state"]) for x in rep["engineers"]] == \
        [("engineer_1", 2, "done"), ("engineer_2", 1, "done"), ("engineer_3", 1, "done")]
    assert rep["phase"] == "landed"


def test_resume_waits_for_a_session_that_outlived_its_run(team_repo, tmp_path):
    flag = tmp_path / "flag"
    _, log, run = start(team_repo, tmp_path, flag)
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--resume", run, "--json"],
                            cwd=team_repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    flag.touch()  # the session the killed run left goes on and finishes its first attempt
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [e["agent"] for e in events if e["event"] == "adopted"] == ["engineer_1"]
    assert sorted(p.stem for p in log.glob("*.json")) == ["engineer_1.work", "engineer_2.work", "engineer_3.work"]
    assert show(team_repo, "main", "README.md") == b"# service\n- util\n- api\n"


def test_stop_asks_a_live_run_to_stop_it_ends_its_sessions_and_reports(team_repo, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"s1": {"work": [{"sh": f"touch {log}/e1.up"}, {"sleep": 600}]},
                              "s2": {"work": [{"sleep": 600}]}}))
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", str(plan_file(tmp_path)),
                             "--harness-cmd", agent_cmd(sc, log), "--json"], cwd=team_repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (log / "e1.up").exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    run = sorted((team_repo / ".git/storm/team").iterdir())[0].name
    pids = [e["pid"] for e in json.loads(team(team_repo, "status", run, "--json").stdout)["engineers"][:2]]
    r = team(team_repo, "stop", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["asked_runner"] is True
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or " Z " in Path(f"/proc/{pid}/stat").read_text()
    evs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert {e["agent"] for e in evs if e["event"] == "stopped_session"} >= {"engineer_1", "engineer_2"}
    rep = json.loads((team_repo / ".git/storm/team" / run / "report.json").read_text())
    assert rep["phase"] == "stopped" and [e["state"] for e in rep["engineers"]] == ["stopped", "stopped", "queued"]
