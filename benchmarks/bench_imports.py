"""What importing a library costs a fresh ``git storm`` process.

    python benchmarks/bench_imports.py [--runs 21]

Each module is imported by a new interpreter (``python -c "import M"``), ``--runs``
times, interleaved with the baseline (``python -c pass``) so a busy machine slows
both alike; the figure is the median wall time over the baseline's. It answers
whether a library may be imported on the hook's and the command line's path:
pygit2 is (objects and refs), GitPython (``git``) is compared to it.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

MODULES = ["pygit2", "git", "click", "unidiff", "storm_git.cli.main", "storm_git.integrations.hook_main",
           "storm_git.storm.write"]


def once(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"(baseline: python -c pass)": [], **{m: [] for m in MODULES}}
    for _ in range(args.runs):
        for name in times:
            times[name].append(once("pass" if name.startswith("(") else f"import {name}"))
    base = statistics.median(times["(baseline: python -c pass)"])
    print(f"| import | median ms | over the baseline, ms |  ({args.runs} runs each, interleaved)")
    print("| --- | ---: | ---: |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med * 1000:.0f} | {(med - base) * 1000:+.0f} |")


if __name__ == "__main__":
    main()
