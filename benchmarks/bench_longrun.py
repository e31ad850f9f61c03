#!/usr/bin/env python3
"""Many writes with the automatic maintenance trigger: does storm keep up?

Not a test: it prints figures. One agent writes ``--writes`` times (default 10,000)
in a repository of ``--files`` files, with ``storm.autoMaintenance`` at its default
(6,700 loose objects, git's gc.auto) unless ``--limit`` says otherwise. Every
``--every`` writes it prints the median write time of that block, the loose-object
count, packs and the size of ``.git``, with the median of a bare pygit2 cycle
run every 10th write in the same repository (what the machine and git's own
growth cost, apart from storm). At the end: write cost at the end ÷ at the
start, the highest loose count seen, and the same run's count without the trigger
(estimated: objects per write x writes).

    python3 benchmarks/bench_longrun.py                    # 10,000 writes, 1k files
    python3 benchmarks/bench_longrun.py --writes 100000 --every 5000
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402


def du(path: str) -> int:
    return int(subprocess.run(["du", "-sk", path], capture_output=True, text=True).stdout.split()[0]) * 1024


def loose_now(repo: str) -> int:
    d = os.path.join(repo, ".git", "objects")
    n = 0
    for x in os.listdir(d):
        if len(x) == 2:
            try:
                n += len(os.listdir(os.path.join(d, x)))
            except FileNotFoundError:  # emptied and removed by a repack meanwhile
                pass
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=None, help="storm.autoMaintenance (default: storm's default)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = args.workdir or os.path.join(tempfile.gettempdir(), "storm-bench-longrun")
    os.makedirs(workdir, exist_ok=True)
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo, paths = bench_core.build_repo(workdir, args.files)
    bench_core.reset_repo(repo)
    subprocess.run(["git", "-C", repo, "repack", "-a", "-d", "-q"], check=True)  # start from a packed repository
    if args.limit is not None:
        subprocess.run(["git", "-C", repo, "config", "storm.autoMaintenance", str(args.limit)], check=True)
    ws = open_workspace(repo)
    store = ws.store
    targets = bench_core.pick(paths, 8, offset=3)
    base = {r.path: r.content for r in ws.read(targets, agent="long")}
    start_size = du(os.path.join(repo, ".git"))
    print(f"{args.writes} writes, {args.files} files, storm.autoMaintenance = {maintenance.auto_limit(store)}")
    print(f"{'writes':>8} {'median ms':>10} {'bare ms':>8} {'loose':>7} {'packs':>6} {'.git MiB':>9}")
    import pygit2

    r = pygit2.Repository(repo)
    r.references.create("refs/bench/floor", r.lookup_reference("refs/storm/workspace").target, force=True)
    block: list[float] = []
    fblock: list[float] = []
    medians: list[float] = []
    floors: list[float] = []
    peak = 0
    t_all = time.monotonic()
    for i in range(args.writes):
        p = targets[i % len(targets)]
        t = time.perf_counter()
        res = ws.write(p, base[p] + b"# %d\n" % i, agent="long")
        block.append(time.perf_counter() - t)
        if not res.accepted:
            raise SystemExit(res.rejection.text)
        if i % 50 == 49:  # the loose count between samples too (a listing of the 256 fan-out
            peak = max(peak, loose_now(repo))  # directories, ~2 ms, outside the timed write)
        if i % 10 == 0:  # the bare cycle in the same repository, same moment: what the machine
            t = time.perf_counter()  # and git's own growth (objects, packs) cost, apart from storm
            bench_core.floor_cycle(r, "refs/bench/floor", p, base[p] + b"# f %d\n" % i)
            fblock.append(time.perf_counter() - t)
        if (i + 1) % args.every == 0:
            c = maintenance.count_objects(store)
            peak = max(peak, c.loose)
            medians.append(statistics.median(block) * 1e3)
            floors.append(statistics.median(fblock) * 1e3)
            print(f"{i + 1:>8} {medians[-1]:>10.2f} {floors[-1]:>8.2f} {c.loose:>7} {c.packs:>6} "
                  f"{du(os.path.join(repo, '.git')) / 2**20:>9.1f}", flush=True)
            block, fblock = [], []
    elapsed = time.monotonic() - t_all
    while maintenance.running(store):
        time.sleep(0.1)
    final = maintenance.count_objects(store)
    print(f"\nwall {elapsed:.1f} s; write cost, last block / first block: {medians[-1] / medians[0]:.2f}x "
          f"(the bare cycle: {floors[-1] / floors[0]:.2f}x; storm's write / bare cycle: "
          f"{medians[0] / floors[0]:.2f}x first block, {medians[-1] / floors[-1]:.2f}x last)")
    print(f"loose objects: highest seen (every 50 writes) {peak} against the bound {maintenance.auto_limit(store)}, at the end {final.loose} (packs {final.packs}); "
          f"without the trigger ~{final.loose + final.packed} objects would be loose")
    print(f".git: {start_size / 2**20:.1f} MiB -> {du(os.path.join(repo, '.git')) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
