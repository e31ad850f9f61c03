"""What ``git storm team run`` costs around the engineers' own work.

    python benchmarks/bench_team.py [--engineers 8] [--think 8] [--rounds 3] [--workdir DIR]

Not a test: it prints figures. Each round makes a fresh repository with one file per
engineer and a plan of ``--engineers`` independent subtasks, and runs ``git storm
team run`` with the CMD harness (``--parallel`` = engineers) as a new process:

* orchestration overhead per engineer: from the moment ``team run`` is started to
  the engineer's first tool call, minus the harness's own start-up. The engineer's
  command stamps the time first thing (``date +%s.%N``), so its start-up is one
  ``sh``; the baseline, measured in the same round, is ``sh -c 'date ...'`` started
  directly. The figure covers the interpreter start of ``team run``, validation,
  the assignments, briefs and the process-group start;
* CPU of ``team run`` while the engineers think: each engineer then sleeps
  ``--think`` seconds before its write; the runner's user+system time from
  ``/proc/<pid>/stat`` over the window in which all engineers are started and
  none has finished, divided by the window's wall time; and its CPU time until the
  last engineer has started (the orchestration's own work, which a loaded machine
  does not inflate as it does wall time);
* all start and all land: every engineer writes its file with ``git storm write``,
  the manager's commit lands, and the report's writes add up to the engineers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")


def git(cwd: str, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def repo(path: str, n: int) -> str:
    os.makedirs(os.path.join(path, "src"))
    for i in range(1, n + 1):
        with open(os.path.join(path, "src", f"m{i}.py"), "w") as fh:
            fh.write(f"X{i} = 0\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init")
    subprocess.run([sys.executable, "-m", "storm_git", "init"], cwd=path, check=True, capture_output=True)
    return path


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            rest = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / TICK


def one_round(work: str, n: int, think: float) -> dict:
    top = repo(tempfile.mkdtemp(dir=work), n)
    stamps = tempfile.mkdtemp(dir=work)
    plan = {"task": "bench", "subtasks": [{"id": f"s{i}", "title": f"m{i}", "brief": f"set X{i}",
                                           "files": [f"src/m{i}.py"]} for i in range(1, n + 1)]}
    pfile = os.path.join(stamps, "plan.json")
    with open(pfile, "w") as fh:
        json.dump(plan, fh)
    storm = f"{sys.executable} -m storm_git"
    cmd = (f'date +%s.%N > {stamps}/$STORM_AGENT.start; sleep {think}; '
           f'{storm} read src/m${{STORM_TEAM_SUBTASK#s}}.py >/dev/null && '
           f'echo "X${{STORM_TEAM_SUBTASK#s}} = 1" | {storm} write src/m${{STORM_TEAM_SUBTASK#s}}.py >/dev/null')
    # the harness's own start-up: the same sh started directly
    base = []
    for _ in range(5):
        t = time.time()
        out = subprocess.run(["sh", "-c", "date +%s.%N"], capture_output=True, text=True, check=False).stdout
        base.append(float(out) - t)
    cli = []
    for _ in range(3):  # any storm command's own start, for scale
        t = time.time()
        subprocess.run([sys.executable, "-m", "storm_git", "status", "--json"], cwd=top, capture_output=True,
                       check=False)
        cli.append(time.time() - t)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "team", "run", "--plan", pfile, "--harness-cmd", cmd,
                             "--parallel", str(n), "--json"], cwd=top, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    starts: dict[str, float] = {}
    while len(starts) < n and proc.poll() is None:
        for name in os.listdir(stamps):
            if name.endswith(".start") and name not in starts:
                try:
                    with open(os.path.join(stamps, name)) as fh:
                        starts[name] = float(fh.read())
                except ValueError:
                    continue
        time.sleep(0.02)
    c0, w0 = cpu_seconds(proc.pid), time.time()
    window = max(0.5, think - (w0 - max(starts.values())) - 0.5)
    time.sleep(window)
    c1, w1 = cpu_seconds(proc.pid), time.time()
    out, err = proc.communicate(timeout=600)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    rep_path = next(e["json"] for e in events if e["event"] == "report")
    with open(rep_path) as fh:
        rep = json.load(fh)
    overhead = sorted(s - t0 - statistics.median(base) for s in starts.values())
    return {"exit": proc.returncode, "overhead": overhead, "baseline": statistics.median(base),
            "cli": statistics.median(cli), "start_cpu": c0,
            "cpu": (c1 - c0) / (w1 - w0) if c0 is not None and c1 is not None else None, "window": w1 - w0,
            "landed": rep["phase"] == "landed", "writes": rep["totals"]["writes"],
            "engineers_done": sum(1 for e in rep["engineers"] if e["state"] == "done"), "seconds": rep["seconds"],
            "err": err[-500:] if proc.returncode else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engineers", type=int, default=8)
    ap.add_argument("--think", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="bench-team.")
    rows = [one_round(work, a.engineers, a.think) for _ in range(a.rounds)]
    first = [r["overhead"][0] for r in rows]
    per = [r["overhead"][-1] for r in rows]
    allov = [x for r in rows for x in r["overhead"]]
    cpu = [r["cpu"] for r in rows if r["cpu"] is not None]
    print(f"team run, {a.engineers} engineers (CMD harness, --parallel {a.engineers}), {a.rounds} rounds, "
          f"{os.cpu_count()} cores")
    print(f"  harness start-up (sh, baseline)    median {statistics.median(r['baseline'] for r in rows) * 1e3:.1f} ms")
    print(f"  git storm status (a command's own start, same round) median "
          f"{statistics.median(r['cli'] for r in rows):.3f} s")
    print(f"  overhead to the first engineer     median {statistics.median(first):.3f} s")
    print(f"  overhead to the last engineer      median {statistics.median(per):.3f} s")
    print(f"  overhead per engineer (all)        median {statistics.median(allov):.3f} s, max {max(allov):.3f} s")
    print(f"  CPU of team run until all started  median {statistics.median(r['start_cpu'] for r in rows):.3f} s "
          f"(interpreter, imports, validation, assignments, briefs, starts)")
    print(f"  CPU of team run while they think   median {statistics.median(cpu) * 100:.2f} % of a core "
          f"(windows of {statistics.median(r['window'] for r in rows):.1f} s)")
    print(f"  all landed: {all(r['landed'] and r['exit'] == 0 for r in rows)}; engineers done "
          f"{[r['engineers_done'] for r in rows]}; report writes {[r['writes'] for r in rows]}; "
          f"run seconds {[round(r['seconds'], 1) for r in rows]}")
    for r in rows:
        if r["err"]:
            print("  error:", r["err"])


if __name__ == "__main__":
    main()
