#!/usr/bin/env python3
"""Where a storm write's CPU goes, next to the bare pygit2 cycle.

Not a test: it prints figures. ``bench_hotpath.py`` says a write costs about twice
the bare cycle (blob + trees + commit + CAS); this script says what the difference
is made of, so that the 1.5x target can be judged against what a write must do.

1. In one process, storm writes and bare cycles interleaved (an agent that read its
   one file, as in bench_hotpath's first row): wall time, and the process's user
   and system CPU (``getrusage``) summed over each kind, per operation.
2. Where ``perf`` exists: the same two loops, each in a process of its own under
   ``perf record``, split by the code that ran: the Python interpreter
   (libpython), the kernel (system calls: files, locks, renames), zlib (object
   compression), libgit2 and pygit2, libc, other. A third process that only starts
   and opens the workspace is subtracted from both, so the figures are per
   operation. The interpreter's share of a storm write against the budget the
   target leaves (0.5x the bare cycle) is the line to read.

    python3 benchmarks/bench_cpu.py                      # 1k files, 1,500 operations a loop
    python3 benchmarks/bench_cpu.py --files 10000 --ops 3000 --workdir /tmp/cpu
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402

GROUPS = (  # perf's shared-object name -> the row it is counted in
    ("python interpreter", re.compile(r"libpython|^python3")),
    ("kernel (system calls)", re.compile(r"kernel")),
    ("zlib (compression)", re.compile(r"libz\.")),
    ("libgit2 + pygit2", re.compile(r"libgit2|_pygit2|_libgit2|_cffi|libffi")),
    ("libc", re.compile(r"libc\.|ld-linux")),
)
OTHER = "other (crypto, vdso, …)"


def prepare(workdir: str, files: int) -> tuple[str, str]:
    """The benchmark repository reset, storm initialised, one agent that read one file."""
    repo, paths = bench_core.build_repo(workdir, files)
    bench_core.reset_repo(repo)
    # no background repack in the middle of a loop: it would land in one kind's CPU
    subprocess.run(["git", "-C", repo, "config", "storm.autoMaintenance", "0"], check=True)
    target = bench_core.pick(paths, 1, offset=8)[0]
    return repo, target


def setup(repo: str, target: str):
    import pygit2

    from storm_git import open_workspace

    ws = open_workspace(repo)
    r = pygit2.Repository(repo)
    if "refs/bench/floor" not in r.references:
        r.references.create("refs/bench/floor", r.lookup_reference("refs/storm/workspace").target)
    [rr] = ws.read([target], agent="cpu")
    return ws, r, rr.content


def op(kind: str, ws, r, target: str, base: bytes, nonce: bytes, i: int) -> None:
    content = base + b"# %s %s %d\n" % (kind.encode(), nonce, i)
    if kind == "storm":
        res = ws.write(target, content, agent="cpu")
        if not res.accepted:
            raise SystemExit(res.rejection.text)
    else:
        bench_core.floor_cycle(r, "refs/bench/floor", target, content)


def interleaved(repo: str, target: str, ops: int) -> dict:
    """Wall and CPU per operation, storm and floor alternating in one process."""
    ws, r, base = setup(repo, target)
    nonce = os.urandom(6).hex().encode()
    wall: dict[str, list[float]] = {"storm": [], "floor": []}
    cpu = {k: [0.0, 0.0] for k in wall}
    for i in range(ops):
        for kind in ("storm", "floor"):
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            op(kind, ws, r, target, base, nonce, i)
            wall[kind].append(time.perf_counter() - t)
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[kind][0] += u1.ru_utime - u0.ru_utime
            cpu[kind][1] += u1.ru_stime - u0.ru_stime
    return {k: {"wall_ms": statistics.median(wall[k]) * 1e3, "user_ms": cpu[k][0] / ops * 1e3,
                "sys_ms": cpu[k][1] / ops * 1e3} for k in wall}


def loop_child(repo: str, target: str, kind: str, ops: int) -> None:
    ws, r, base = setup(repo, target)
    nonce = os.urandom(6).hex().encode()
    for i in range(ops):
        op(kind, ws, r, target, base, nonce, i)


def perf_split(repo: str, target: str, ops: int, workdir: str) -> dict | None:
    """Milliseconds of CPU per operation by shared object, from ``perf record``."""
    if shutil.which("perf") is None:
        return None
    totals: dict[str, dict[str, float]] = {}
    for kind, n in (("idle", 0), ("storm", ops), ("floor", ops)):
        data = os.path.join(workdir, f"perf-{kind}.data")
        cmd = [sys.executable, os.path.abspath(__file__), "--loop", kind, "--ops", str(n), "--repo", repo,
               "--target", target]
        rec = subprocess.run(["perf", "record", "-q", "-F", "2000", "-o", data, "--"] + cmd,
                             capture_output=True, text=True)
        if rec.returncode != 0:
            print(f"  perf record failed ({rec.stderr.strip()[-200:]}): no split", file=sys.stderr)
            return None
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "dso", "-F", "period,dso"],
                             capture_output=True, text=True)
        by: dict[str, float] = {}
        for line in rep.stdout.splitlines():
            m = re.match(r"\s*(\d+)\s+(\S.*?)\s*$", line)
            if not m or line.lstrip().startswith("#"):
                continue
            period_ms, dso = int(m.group(1)) / 1e6, m.group(2)  # cpu-clock periods are nanoseconds
            group = next((g for g, rx in GROUPS if rx.search(dso)), OTHER)
            by[group] = by.get(group, 0.0) + period_ms
        totals[kind] = by
    names = [g for g, _ in GROUPS] + [OTHER]
    out = {}
    for kind in ("storm", "floor"):
        out[kind] = {g: max(0.0, totals[kind].get(g, 0.0) - totals["idle"].get(g, 0.0)) / ops for g in names}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--ops", type=int, default=1500, help="operations per loop (default 1,500)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    ap.add_argument("--loop", choices=("idle", "storm", "floor"), help=argparse.SUPPRESS)
    ap.add_argument("--repo", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        loop_child(args.repo, args.target, args.loop, args.ops)
        return
    workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-cpu-")
    os.makedirs(workdir, exist_ok=True)
    bench_core.LOG = sys.stderr
    repo, target = prepare(workdir, args.files)
    il = interleaved(repo, target, args.ops)
    split = perf_split(repo, target, args.ops, workdir)
    result = {"files": args.files, "ops": args.ops, "interleaved": il, "perf": split}
    if args.json:
        print(json.dumps(result))
        return
    s, f = il["storm"], il["floor"]
    print(f"{args.files} files, {args.ops} operations of each kind (ms per operation)")
    print(f"{'':34} {'storm write':>12} {'bare cycle':>11} {'difference':>11}")
    for key, label in (("wall_ms", "wall (median, interleaved)"), ("user_ms", "user CPU (mean)"),
                       ("sys_ms", "system CPU (mean)")):
        print(f"{label:34} {s[key]:12.3f} {f[key]:11.3f} {s[key] - f[key]:+11.3f}")
    print(f"{'write / bare cycle (wall)':34} {s['wall_ms'] / f['wall_ms']:11.2f}x")
    budget = 0.5 * f["wall_ms"]
    print(f"the 1.5x target leaves {budget:.3f} ms a write for everything beyond the bare cycle")
    if split is None:
        print("(perf not found or not permitted: no split by code)")
        return
    print("\nCPU by code, perf record, a process per loop, start-up subtracted (ms per operation)")
    print(f"{'':34} {'storm write':>12} {'bare cycle':>11} {'difference':>11}")
    for g in list(split["storm"]):
        a, b = split["storm"][g], split["floor"][g]
        print(f"{g:34} {a:12.3f} {b:11.3f} {a - b:+11.3f}")
    ta, tb = sum(split["storm"].values()), sum(split["floor"].values())
    print(f"{'total':34} {ta:12.3f} {tb:11.3f} {ta - tb:+11.3f}   ({ta / tb:.2f}x)")
    py = split["storm"]["python interpreter"] - split["floor"]["python interpreter"]
    budget_cpu = 0.5 * tb
    print(f"\nthe 1.5x target leaves {budget_cpu:.3f} ms of CPU above the bare cycle; storm's Python alone "
          f"adds {py:.3f} ms ({py / budget_cpu:.1f}x that budget), the rest of its work "
          f"{ta - tb - py:+.3f} ms")


if __name__ == "__main__":
    main()
