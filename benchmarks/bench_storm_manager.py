"""What the STORM paper's manager interface costs over storm's own verbs.

    python benchmarks/bench_storm_manager.py [--files 1000] [--calls 200] [--agents 8] [--workdir DIR]

Not a test: it prints figures. On one repository of ``--files`` files (bench_core's
layout), in one run, interleaved call by call:

* ``Manager.read_file`` against ``SharedWorkspace.read`` of the same file by the same
  kind of agent (the baseline: storm's recorded read, no integer version);
* ``Manager.write_file`` of one file with a snapshot of 10 others against
  ``SharedWorkspace.write`` of another file with ``deps`` of the same 10 (the baseline: the validated
  write without the version numbering, the snapshot recording and the thread hop);

then ``--agents`` agents as asyncio tasks on one event loop, each writing its own file
``--calls``/``--agents`` times through the manager, against the same writes made by as
many threads calling ``SharedWorkspace.write`` (writes per second, wall clock).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_core  # noqa: E402


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200, help="calls per row (default 200)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--workdir", default=None, help="where to build the repository (default: a new temp dir)")
    args = ap.parse_args()

    from storm_git import open_workspace
    from storm_git.paper.manager import Manager

    workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-manager-")
    repo, paths = bench_core.build_repo(workdir, args.files)
    bench_core.reset_repo(repo)
    ws = open_workspace(repo)
    m = Manager(repo)
    picked = bench_core.pick(paths, 12)
    deps, mine, base = picked[:10], picked[10], picked[11]

    async def rows() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {k: [] for k in ("read_m", "read_b", "write_m", "write_b")}
        for p in deps:
            await m.read_file("m_agent", p)
        ws.read(deps, agent="b_agent")
        for i in range(args.calls):
            t0 = time.perf_counter()
            await m.read_file("m_agent", deps[i % 10])
            t1 = time.perf_counter()
            ws.read([deps[i % 10]], agent="b_agent")
            t2 = time.perf_counter()
            out["read_m"].append(t1 - t0)
            out["read_b"].append(t2 - t1)
        version = (await m.read_file("m_agent", mine)).version
        snapshot = {p: (await m.read_file("m_agent", p)).version for p in deps}
        ws.read([base], agent="b_agent")
        for i in range(args.calls):
            snapshot[mine] = version
            t0 = time.perf_counter()
            res = await m.write_file("m_agent", mine, f"m {i}\n", version, snapshot=snapshot)
            t1 = time.perf_counter()
            assert res.success, res
            version = res.new_version
            r = ws.write(base, f"b {i}\n".encode(), agent="b_agent", deps=deps)
            t2 = time.perf_counter()
            assert r.accepted
            out["write_m"].append(t1 - t0)
            out["write_b"].append(t2 - t1)
        return out

    r = asyncio.run(rows())
    print(f"{args.files} files, {args.calls} calls per row (median ms; baseline: storm's own verb)")
    print(f"  read_file   {med(r['read_m']):7.2f}   SharedWorkspace.read   {med(r['read_b']):7.2f}   "
          f"ratio {med(r['read_m']) / med(r['read_b']):.2f}")
    print(f"  write_file  {med(r['write_m']):7.2f}   SharedWorkspace.write  {med(r['write_b']):7.2f}   "
          f"ratio {med(r['write_m']) / med(r['write_b']):.2f}")

    n, per = args.agents, max(1, args.calls // args.agents)
    own = bench_core.pick(paths, 2 * n, offset=7)

    async def tasks() -> float:
        async def one(k: int) -> None:
            agent, p = f"task_{k}", own[k]
            v = (await m.read_file(agent, p)).version
            for i in range(per):
                res = await m.write_file(agent, p, f"{agent} {i}\n", v, snapshot={p: v})
                assert res.success, res
                v = res.new_version
        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(n)))
        return time.perf_counter() - t0

    took_m = asyncio.run(tasks())

    def thread(k: int) -> None:
        w = open_workspace(repo)  # a repository handle per thread, as the manager keeps per agent
        agent, p = f"thread_{k}", own[n + k]
        w.read([p], agent=agent)
        for i in range(per):
            assert w.write(p, f"{agent} {i}\n".encode(), agent=agent).accepted

    t0 = time.perf_counter()
    threads = [threading.Thread(target=thread, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took_b = time.perf_counter() - t0
    print(f"  {n} agents x {per} writes: tasks on one loop {n * per / took_m:6.1f} writes/s, "
          f"threads on SharedWorkspace.write {n * per / took_b:6.1f} writes/s, ratio {took_b / took_m:.2f}")


if __name__ == "__main__":
    main()
