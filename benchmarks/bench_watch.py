"""What a round of ``git storm watch`` costs besides the tests themselves.

    python benchmarks/bench_watch.py CLICK_CLONE [--runs 5] [--test tests/test_context.py]

On a clone of pallets/click (``git clone ../shared/data/click.bundle``), at its
``main``, prints medians of:

* the plain baseline: pytest on one test file in a checkout of the same commit;
* the export of the head's tree (``git archive | tar -x``), what every run adds;
* the import-graph selection for a change of ``src/click/core.py`` (parse, cached
  by blob after the first round, and the reverse closure), first and warm;
* the runner's run of the same test file (export, the results plugin, parsing),
  and the ratio of its test processes' CPU time to the baseline's (on a loaded
  machine wall times mostly measure waiting for a core).

Figures only, no assertions on timing.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CPU: list[float] = []  # the last median()'s CPU seconds of child processes, per run


def median(fn, runs: int) -> float:
    """The median wall time of ``fn``; the CPU time of the processes it ran goes to CPU."""
    out = []
    CPU.clear()
    for _ in range(runs):
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        CPU.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clone")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--test", default="tests/test_context.py")
    args = ap.parse_args()
    import pygit2

    from storm_git.testwatch import graph
    from storm_git.testwatch.run import TestCommand, export_tree

    repo = pygit2.Repository(args.clone)
    commondir = repo.path.rstrip("/")
    head = repo.revparse_single("main").peel(pygit2.Commit)
    tree = str(head.tree_id)
    pytest = f"PYTHONPATH=src {sys.executable} -m pytest -q -p no:cacheprovider"
    checkout = tempfile.mkdtemp(prefix="bench-watch-")
    export_tree(commondir, tree, checkout)
    try:
        base = median(lambda: subprocess.run(f"{pytest} {args.test}", shell=True, cwd=checkout,
                                             capture_output=True, check=True), args.runs)
        base_cpu = statistics.median(CPU)

        def export() -> None:
            d = tempfile.mkdtemp(prefix="bench-watch-x-")
            export_tree(commondir, tree, d)
            shutil.rmtree(d)

        exp = median(export, args.runs)
        t0 = time.perf_counter()
        sel = graph.affected(repo, head.tree, ["src/click/core.py"], [])
        cold = time.perf_counter() - t0
        warm = median(lambda: graph.affected(repo, head.tree, ["src/click/core.py"], []), args.runs)

        def runner() -> None:
            TestCommand(commondir, pytest).run(tree, [args.test])

        run = median(runner, args.runs)
        run_cpu = statistics.median(CPU)
    finally:
        shutil.rmtree(checkout, ignore_errors=True)
        shutil.rmtree(os.path.join(commondir, "storm"), ignore_errors=True)
    n = len(sel.tests or [])
    print(f"click at {str(head.id)[:10]}, {args.runs} runs each, medians")
    print(f"  plain pytest {args.test} in a checkout:   {base:7.3f} s ({base_cpu:.2f} s CPU)")
    print(f"  export of the tree (git archive | tar):    {exp:7.3f} s")
    print(f"  selection for src/click/core.py:           {cold:7.3f} s first, {warm:.3f} s warm ({n} test files)")
    print(f"  the runner's run of {args.test}: {run:7.3f} s ({run_cpu:.2f} s CPU, {run_cpu / base_cpu:.2f}x the "
          "plain run's CPU)")


if __name__ == "__main__":
    main()
