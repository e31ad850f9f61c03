#!/usr/bin/env python3
"""Worktree-mode benchmark: spawn vs ``git worktree add``, and merging 8 agent branches.

Not a test: prints medians and ratios, asserts nothing. Targets:

* ``spawn`` vs ``git worktree add`` on 10k files: ratio <= 1.2;
* merging 8 agent branches at 10k and 100k files: merge cost flat in repository size.

    python3 benchmarks/bench_worktree.py                 # 10k and 100k files, 5 repetitions
    python3 benchmarks/bench_worktree.py --reps 3 --workdir /tmp/storm-bench-wt

Repositories are built with ``git fast-import`` (never through the index file by
file) under --workdir and reused between runs. Agent branches are built with
pygit2 (one commit each, two files changed in its own directory), so the
measurement is the merge, not the setup.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pygit2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from storm_git.core.store import MODE_BLOB, Store  # noqa: E402
from storm_git.worktree.merge import merge  # noqa: E402
from storm_git.worktree.worktrees import spawn  # noqa: E402

PER_DIR = 50
AGENTS = 8


def git(cwd: str, *args: str, input: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, input=input, check=True, capture_output=True).stdout


def _dir(i: int) -> str:
    """Nested layout, no directory over PER_DIR entries: d<top>/s<sub>/m<i>.py."""
    leaf = i // PER_DIR
    return f"d{leaf // PER_DIR:03d}/s{leaf % PER_DIR:02d}"


def build(root: str, n: int) -> str:
    path = os.path.join(root, f"repo-nested-{n}")
    if os.path.exists(os.path.join(path, ".git", "storm-bench-ok")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    git(path, "init", "-q", "-b", "main")
    chunks = ["commit refs/heads/main\ncommitter bench <b@x> 0 +0000\ndata 5\nbase\n"]
    for i in range(n):
        data = f"# module {i}\nVALUE = {i}\n\n\ndef f{i}(x):\n    return x + {i}\n".encode()
        chunks.append(f"M 100644 inline {_dir(i)}/m{i}.py\ndata {len(data)}\n")
        chunks.append(data.decode() + "\n")
    git(path, "fast-import", "--quiet", input="".join(chunks).encode())
    git(path, "checkout", "-q", "-f", "main")
    for k, v in (("user.name", "bench"), ("user.email", "b@x"), ("storm.mode", "worktree"),
                 ("gc.auto", "0"), ("maintenance.auto", "false")):
        git(path, "config", k, v)
    open(os.path.join(path, ".git", "storm-bench-ok"), "w").close()
    return path


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def reset_worktrees(path: str) -> None:
    for line in git(path, "worktree", "list", "--porcelain").decode().splitlines()[1:]:
        if line.startswith("worktree "):
            git(path, "worktree", "remove", "--force", "--force", line[len("worktree "):])
    git(path, "worktree", "prune")
    for ref in git(path, "for-each-ref", "--format=%(refname)", "refs/heads/").decode().split():
        if ref != "refs/heads/main":
            git(path, "update-ref", "-d", ref)


def bench_spawn(path: str, reps: int) -> dict[str, float]:
    reset_worktrees(path)
    wt_root = os.path.join(path, ".git", "storm", "worktrees")
    plain, lib, cli = [], [], []

    def run_plain(i: int) -> None:
        t = time.perf_counter()
        git(path, "worktree", "add", "-q", "-b", f"plain{i}", os.path.join(wt_root, f"plain{i}"), "main")
        plain.append(time.perf_counter() - t)

    def run_lib(i: int) -> None:
        store = Store.discover(path)
        t = time.perf_counter()
        spawn(store, f"lib{i}")
        lib.append(time.perf_counter() - t)

    def run_cli(i: int) -> None:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "storm_git", "spawn", f"cli{i}"], cwd=path, check=True,
                       capture_output=True)
        cli.append(time.perf_counter() - t)

    runs = [run_plain, run_lib, run_cli]
    for i in range(reps):
        for k in range(3):  # rotate the order: whichever runs first pays for the last cleanup's writeback
            runs[(i + k) % 3](i)
            os.sync()
        reset_worktrees(path)
        os.sync()
    return {"git worktree add": med(plain), "spawn (library)": med(lib), "git storm spawn (CLI)": med(cli)}


def make_agent_branches(path: str, n_files: int) -> list[str]:
    """8 branches off main, each changing 2 files in its own directory."""
    store = Store.discover(path)
    repo = store.repo
    base = repo.revparse_single("main")
    agents = []
    n_dirs = (n_files + PER_DIR - 1) // PER_DIR
    for k in range(AGENTS):
        d = (k * n_dirs) // AGENTS
        changes = {}
        for j in range(2):
            i = d * PER_DIR + j
            changes[f"{_dir(i)}/m{i}.py"] = (repo.create_blob(f"# changed by a{k}\nVALUE = {-i}\n".encode()),
                                            MODE_BLOB)
        tree = store.tree_with(base.tree, changes)
        sig = pygit2.Signature(f"a{k}", f"a{k}@storm.invalid")
        c = repo.create_commit(None, sig, sig, f"a{k} work", tree, [base.id])
        repo.create_reference(f"refs/heads/storm/a{k}", c, force=True)
        agents.append(f"a{k}")
    return agents


def bench_merge(path: str, reps: int) -> dict[str, float]:
    reset_worktrees(path)
    agents = make_agent_branches(path, int(path.rsplit("-", 1)[1]))
    base = git(path, "rev-parse", "main").decode().strip()
    store = Store.discover(path)
    ref_only, checked_out, per_agent = [], [], []
    for _ in range(reps):
        git(path, "update-ref", "refs/heads/target", base)
        t = time.perf_counter()
        rep = merge(store, agents, into="target")
        ref_only.append(time.perf_counter() - t)
        assert rep.ok and len([r for r in rep.results if r.status == "merged"]) == AGENTS
        per_agent.extend(r.ms / 1000 for r in rep.results)
        t = time.perf_counter()
        rep = merge(store, agents, into="main")
        checked_out.append(time.perf_counter() - t)
        assert rep.ok and rep.updated and rep.updated.startswith("worktree")
        git(path, "reset", "-q", "--hard", base)  # the benchmark's own repository
    return {"8 merges into a branch (ref)": med(ref_only),
            "8 merges into the checked-out branch": med(checked_out),
            "one agent's merge (median)": med(per_agent)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "storm-bench-worktree"))
    ap.add_argument("--reps", type=int, default=9)  # 5 let cleanup writeback skew one series 4x
    ap.add_argument("--sizes", default="10000,100000")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"git {git('.', 'version').decode().split()[-1]}, pygit2 {pygit2.__version__}, "
          f"{os.cpu_count()} CPU(s), {args.reps} repetitions, medians in ms")
    repos = {}
    for n in sizes:
        t = time.perf_counter()
        repos[n] = build(args.workdir, n)
        print(f"repository with {n} files ready in {time.perf_counter() - t:.1f} s")
    if 10000 in repos:
        s = bench_spawn(repos[10000], args.reps)
        print("\nspawn at 10k files")
        for k, v in s.items():
            print(f"  {k:<36} {v:8.1f} ms")
        base = s["git worktree add"]
        print(f"  ratio spawn (library) / git worktree add: {s['spawn (library)'] / base:.2f}  (target <= 1.2)")
        print(f"  ratio git storm spawn (CLI) / git worktree add: {s['git storm spawn (CLI)'] / base:.2f}"
              "  (includes the Python interpreter start)")
    results = {}
    for n in sizes:
        results[n] = bench_merge(repos[n], args.reps)
        print(f"\nmerging {AGENTS} agent branches at {n} files")
        for k, v in results[n].items():
            print(f"  {k:<36} {v:8.1f} ms")
    if len(sizes) >= 2:
        lo, hi = results[sizes[0]], results[sizes[-1]]
        print(f"\nmerge cost ratio {sizes[-1]} / {sizes[0]} files (target: flat, ~1.0)")
        for k in lo:
            print(f"  {k:<36} {hi[k] / lo[k]:.2f}")


if __name__ == "__main__":
    main()
