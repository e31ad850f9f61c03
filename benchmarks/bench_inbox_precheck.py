#!/usr/bin/env python3
"""What the pre-receive check of an inbox push costs: one push of one queued write to
a clone's inbox over ``file://``, with storm's hooks as installed (the pre-receive
hook checks what the push carries, storm_git.remote.inbox_check, then the
proc-receive hook orders it) beside the same push with the pre-receive hook's
inbox check left out (the proc-receive hook alone checks and orders), and a plain
``git push`` of a new commit to a branch (no hook runs). Interleaved rounds on one
server; medians of the wall time and of the CPU of the push's processes (both
sides: over ``file://`` the server's are the push's children), and the ratios. Not
a test: it prints figures.

    python3 benchmarks/bench_inbox_precheck.py [--rounds 15] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pygit2

from storm_git.core import readsets
from storm_git.core.store import Store
from storm_git.remote import inbox

WS = "refs/storm/workspace"
CHECK_LINE = "storm_git.remote.inbox_check pre-receive"


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, check=True).stdout.decode()


def storm(cwd: Path, *args: str, agent: str | None = None, input: str | None = None) -> None:
    env = dict(os.environ, **({"STORM_AGENT": agent} if agent else {}))
    subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, env=env, check=True,
                   input=input.encode() if input is not None else None, capture_output=True)


def queued(c: Path, n: int) -> tuple[Store, pygit2.Oid, pygit2.Oid]:
    """A write validated and queued in clone ``c`` (local mode on its copy of the head), not pushed."""
    storm(c, "sync")
    storm(c, "read", "notes.txt", agent="al")
    git(c, "config", "--unset", "storm.remote")
    try:
        storm(c, "write", "notes.txt", agent="al", input=f"round {n}\n")
    finally:
        git(c, "config", "storm.remote", "origin")
    st = Store(pygit2.Repository(str(c)))
    readsets.fold(st, "al")
    return st, st.ref_target(WS), st.ref_target("refs/notes/storm/agents/al")


def _children_cpu() -> float:
    """User + system seconds of this process's reaped descendants (the push, and over
    file:// the server's receive-pack and hooks, its children)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        srv = base / "proj.git"
        git(base, "init", "-q", "--bare", "-b", "main", str(srv))
        storm(srv, "server-hook", "install", str(srv))
        hook = srv / "hooks" / "pre-receive"
        with_check = hook.read_text()
        without = "".join(ln for ln in with_check.splitlines(True)
                          if CHECK_LINE not in ln and "grep \" refs/storm/inbox/\" |" not in ln
                          and "what the push carries" not in ln)
        without = without.replace("    fi\nesac", "    fi ;;\nesac")
        c = base / "c"
        c.mkdir()
        git(c, "init", "-q", "-b", "main")
        (c / "notes.txt").write_text("start\n")
        git(c, "add", "notes.txt")
        git(c, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "start")
        git(c, "remote", "add", "origin", f"file://{srv}")
        git(c, "push", "-q", "origin", "main")
        storm(c, "init", "--remote", "origin")
        times: dict[str, list[float]] = {"with the pre-receive check": [], "proc-receive alone": [],
                                          "plain push": []}
        cpu: dict[str, list[float]] = {k: [] for k in times}  # user + system of the push's processes
        for n in range(args.rounds):
            for name, script in (("with the pre-receive check", with_check), ("proc-receive alone", without)):
                hook.write_text(script)
                st, q, notes = queued(c, 2 * n + (name == "proc-receive alone"))
                t0, c0 = time.perf_counter(), _children_cpu()
                ans = inbox.push(st, "origin", q, {"al": notes})
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(_children_cpu() - c0)
                assert ans.landed, ans
            commit = git(c, "commit-tree", "-m", f"plain {n}", "HEAD^{tree}").strip()
            t0, c0 = time.perf_counter(), _children_cpu()
            git(c, "push", "-q", "origin", f"{commit}:refs/heads/plain-{n}")
            times["plain push"].append(time.perf_counter() - t0)
            cpu["plain push"].append(_children_cpu() - c0)
        hook.write_text(with_check)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    med_cpu = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
    load = os.getloadavg()[0]
    out = {"rounds": args.rounds, "median_ms": med, "median_cpu_ms": med_cpu, "load_1min": load,
           "ratio_check_vs_alone": med["with the pre-receive check"] / med["proc-receive alone"],
           "cpu_ratio_check_vs_alone": med_cpu["with the pre-receive check"] / med_cpu["proc-receive alone"]}
    if args.json:
        print(json.dumps(out, indent=2))
    where = sys.stderr if args.json else sys.stdout
    for k, v in med.items():
        print(f"{k:>28}: {v:7.1f} ms wall, {med_cpu[k]:7.1f} ms CPU (medians of {args.rounds})", file=where)
    print(f"{'ratio':>28}: {out['ratio_check_vs_alone']:.2f} x wall, {out['cpu_ratio_check_vs_alone']:.2f} x CPU"
          f"   (1-minute load {load:.1f})", file=where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
