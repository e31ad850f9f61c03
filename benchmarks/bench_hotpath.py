#!/usr/bin/env python3
"""The write and read hot path, against the bare pygit2 cycle and against
an older revision of storm, measured in one run on the same repositories.

Not a test: it prints figures. For each repository size and each code revision
(the working copy, and ``--baseline REV``, by default the last commit before the
read-set journal), a child process measures on its own copy of the freshly built
repository (a run leaves objects and packs that slow the next one's writes down):

* a write by an agent whose read set holds 1, 50, 500 and 2,000 paths, each
  interleaved with the bare cycle (blob + trees + commit + CAS; benchmarks/bench_core):
  the median, and the mean with the fold of the journal the writes left added (the
  median leaves folds out: one write in a few hundred pays one);
* a read of a new path and a re-read at an unchanged head, against the bare blob
  lookup ``revparse_single("refs/storm/workspace:PATH")``;
* the new loose objects per storm write, its share of the journal's fold included (the floor makes one blob,
  the trees along the path and a commit; automatic maintenance is off for the count);
* 8 writer processes on disjoint files: aggregate accepted writes/s, and beside it
  8 processes running only the bare cycle, serialised by one flock (the most any
  writer that serialises on one ref can land here: storm's write holds its lock for
  the same trees, commit and CAS).

    python3 benchmarks/bench_hotpath.py                   # 1k and 10k files
    python3 benchmarks/bench_hotpath.py --sizes 1000,10000,100000 --writes 200
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_core  # noqa: E402

READ_SETS = (1, 50, 500, 2000)
DEFAULT_BASELINE = "b911baa"  # the last commit before the read-set journal


def loose_objects(repo: str) -> int:
    d = os.path.join(repo, ".git", "objects")
    return sum(len(os.listdir(os.path.join(d, x))) for x in os.listdir(d) if len(x) == 2)


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def child(repo: str, writes: int, throughput: bool) -> dict:
    """Measure in this process with whatever storm_git is importable (see use_rev)."""
    import pygit2

    from storm_git import open_workspace

    paths = json.load(open(os.path.join(repo, ".git", "storm-bench-paths.json")))
    bench_core.reset_repo(repo)
    # no background repack while loose objects are counted (it would pack them away)
    subprocess.run(["git", "-C", repo, "config", "storm.autoMaintenance", "0"], check=True)
    ws = open_workspace(repo)
    r = pygit2.Repository(repo)
    out: dict = {}

    # content new to this repository in every run: the repositories are reused, and an
    # object a former run left in a pack makes a write cheaper and its count smaller
    nonce = os.urandom(6).hex().encode()
    pool = bench_core.pick(paths, 200, offset=1)
    new, floor = [], []
    for p in pool:
        t = time.perf_counter()
        ws.read([p], agent="hp-reader")
        new.append(time.perf_counter() - t)
        t = time.perf_counter()
        _ = r.revparse_single(f"refs/storm/workspace:{p}").data
        floor.append(time.perf_counter() - t)
    again = []
    for _ in range(200):
        t = time.perf_counter()
        ws.read([pool[0]], agent="hp-reader")
        again.append(time.perf_counter() - t)
    out["read_new_ms"], out["read_floor_ms"], out["read_again_ms"] = med(new), med(floor), med(again)

    r.references.create("refs/bench/floor", r.lookup_reference("refs/storm/workspace").target, force=True)
    for k in READ_SETS:
        agent = f"hp-w{k}"
        target = bench_core.pick(paths, 1, offset=7 + k)[0]
        if k > 1:
            ws.read([p for p in bench_core.pick(paths, k - 1, offset=13 + k) if p != target], agent=agent)
        [rr] = ws.read([target], agent=agent)
        w_s, f_s, fd_s = [], [], []
        made = 0  # storm's own new loose objects (counted around its writes only)
        for i in range(writes):
            n0 = loose_objects(repo)
            t = time.perf_counter()
            res = ws.write(target, rr.content + b"# w %s %d\n" % (nonce, i), agent=agent)
            w_s.append(time.perf_counter() - t)
            made += loose_objects(repo) - n0
            if not res.accepted:
                raise RuntimeError(res.rejection.text)
            t = time.perf_counter()
            bench_core.floor_cycle(r, "refs/bench/floor", target, rr.content + b"# f %s %d\n" % (nonce, i))
            f_s.append(time.perf_counter() - t)
            if k == 1:  # the floor plus the working-tree file (its own objects are not counted)
                t = time.perf_counter()
                bench_core.floor_cycle_with_disk(r, "refs/bench/floor", target,
                                                 rr.content + b"# d %s %d\n" % (nonce, i))
                fd_s.append(time.perf_counter() - t)
        if k == 1:
            out["floor_disk_ms"] = med(fd_s)
        try:  # the journal's fold, now, so that it is counted
            from storm_git.core import readsets
            n0 = loose_objects(repo)
            t = time.perf_counter()
            readsets.fold(ws.store, agent)
            fold_s = time.perf_counter() - t
            fold_made = loose_objects(repo) - n0
        except ImportError:  # an older revision without a journal wrote its notes at each write
            fold_s, fold_made = 0.0, 0
        # the median leaves out the folds (one write in a few hundred pays one); the mean
        # with the last fold added is what a write costs amortised
        amortised = (sum(w_s) + fold_s) / writes * 1e3
        out[f"write_{k}"] = {"write_ms": med(w_s), "floor_ms": med(f_s), "ratio": med(w_s) / med(f_s),
                             "amortised_ms": amortised, "floor_mean_ms": statistics.mean(f_s) * 1e3,
                             "fold_ms": fold_s * 1e3,
                             # storm's writes and their fold only, not the floors'
                             "objects_per_write": (made + fold_made) / writes}
    floor_objects = len(bench_core.pick(paths, 1, offset=7)[0].split("/")) + 2  # blob + trees + commit
    out["floor_objects_per_write"] = floor_objects
    if throughput:
        tp = bench_core.bench_throughput(repo, paths, 8, max(20, writes // 2))
        out["throughput_8_writes_per_s"] = tp["writes_per_s"]
        # the ceiling: 8 processes running only the bare cycle, serialised by one flock
        bare = bench_core.bench_throughput(repo, paths, 8, max(20, writes // 2), bare=True)
        out["throughput_8_bare_per_s"] = bare["writes_per_s"]
    return out


def run_child(rev: str | None, repo: str, writes: int, workdir: str, throughput: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", repo, "--writes", str(writes),
           "--workdir", workdir]
    if rev:
        cmd += ["--rev", rev]
    if not throughput:
        cmd += ["--no-throughput"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"child ({rev or 'working copy'}) failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--writes", type=int, default=100, help="writes per read-set size (default 100)")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="older revision measured alongside ('' for none)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--baseline-first", action="store_true",
                    help="measure the baseline first (each child leaves objects the next one finds)")
    ap.add_argument("--child", metavar="REPO", help=argparse.SUPPRESS)
    ap.add_argument("--rev", help=argparse.SUPPRESS)
    args = ap.parse_args()
    workdir = args.workdir or os.path.join(tempfile.gettempdir(), "storm-bench-hotpath")
    os.makedirs(workdir, exist_ok=True)
    if args.child:
        bench_core.LOG = sys.stderr
        if args.rev:
            bench_core.use_rev(args.rev, workdir)
        print(json.dumps(child(args.child, args.writes, not args.no_throughput)))
        return
    revs = [("now", None)] + ([("baseline " + args.baseline, args.baseline)] if args.baseline else [])
    for n in [int(s) for s in args.sizes.split(",")]:
        bench_core.LOG = sys.stderr
        repo, paths = bench_core.build_repo(workdir, n)
        with open(os.path.join(repo, ".git", "storm-bench-paths.json"), "w") as f:
            json.dump(paths, f)
        order = list(reversed(revs)) if args.baseline_first else revs
        done = {}
        for name, rev in order:  # each revision on its own copy: a run leaves objects and packs
            copy = f"{repo}-{'base' if rev else 'now'}"  # that slow the next one's writes down
            shutil.rmtree(copy, ignore_errors=True)
            subprocess.run(["cp", "-a", repo, copy], check=True)
            try:
                done[name] = run_child(rev, copy, args.writes, workdir, not args.no_throughput)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
        res = {name: done[name] for name, _ in revs}  # printed in the usual order
        print(f"\n{bench_core.human(n)} files, {args.writes} writes per row (medians, ms)")
        names = list(res)
        print(f"{'':34}" + "".join(f"{nm:>26}" for nm in names))

        def row(label: str, fn, res=res, names=names) -> None:
            print(f"{label:34}" + "".join(f"{fn(res[nm]):>26}" for nm in names))

        for k in READ_SETS:
            row(f"write, read set of {k}",
                lambda d, k=k: f"{d[f'write_{k}']['write_ms']:.2f} ({d[f'write_{k}']['ratio']:.2f}x floor)")
        row("  bare cycle (floor)", lambda d: f"{d['write_1']['floor_ms']:.2f}")
        for k in READ_SETS:
            row(f"  mean incl. its fold, {k} read(s)", lambda d, k=k: f"{d[f'write_{k}']['amortised_ms']:.2f} "
                f"({d[f'write_{k}']['amortised_ms'] / d[f'write_{k}']['floor_mean_ms']:.2f}x mean floor)"
                if "amortised_ms" in d[f"write_{k}"] else "n/a")
        row("  last fold (read set of 1)",
            lambda d: f"{d['write_1']['fold_ms']:.1f}" if "fold_ms" in d["write_1"] else "n/a")
        row("  floor + the file on disk",
            lambda d: f"{d['floor_disk_ms']:.2f} (write {d['write_1']['write_ms'] / d['floor_disk_ms']:.2f}x)"
            if "floor_disk_ms" in d else "n/a")
        row("  new objects per write",
            lambda d: f"{d['write_1']['objects_per_write']:.1f} (floor {d['floor_objects_per_write']})")
        row("read of a new path",
            lambda d: f"{d['read_new_ms']:.3f} ({d['read_new_ms'] / d['read_floor_ms']:.1f}x lookup)")
        row("re-read, unchanged head", lambda d: f"{d['read_again_ms']:.3f}")
        row("  bare blob lookup", lambda d: f"{d['read_floor_ms']:.3f}")
        if not args.no_throughput:
            row("8 writer processes (writes/s)", lambda d: f"{d['throughput_8_writes_per_s']:.0f}")
            row("  8 bare cycles under one flock", lambda d: f"{d['throughput_8_bare_per_s']:.0f} (storm "
                f"{d['throughput_8_writes_per_s'] / d['throughput_8_bare_per_s']:.0%} of it)"
                if "throughput_8_bare_per_s" in d else "n/a")
        if len(names) == 2 and not args.no_throughput:
            a, b = res[names[0]], res[names[1]]
            print(f"throughput now / baseline: {a['throughput_8_writes_per_s'] / b['throughput_8_writes_per_s']:.2f}x"
                  f" (2x the baseline would be {2 * b['throughput_8_writes_per_s'] / a['throughput_8_bare_per_s']:.0%}"
                  " of the bare cycles' rate in this run)")
        for k in READ_SETS:
            if len(names) == 2:
                print(f"write with {k} reads, now / baseline: "
                      f"{res[names[0]][f'write_{k}']['write_ms'] / res[names[1]][f'write_{k}']['write_ms']:.2f}x")


if __name__ == "__main__":
    main()
