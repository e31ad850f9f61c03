"""Large directories and large read sets.

    python benchmarks/bench_disk.py [--entries 20000] [--reads 2000] [--runs 7] [--exec-files 2000]

Builds one repository whose directory ``d/`` holds ``--entries`` files (git
fast-import), runs ``git storm init`` and prints medians, in the same run:

* the bare pygit2 cycle in that directory (blob, trees along the path, commit,
  CAS): the floor of any write there;
* a storm write (in-process) by an agent whose read set holds 1 path, and by one
  whose read set holds ``--reads`` paths of that directory; ratio of the two;
* one read of 1 path and one read of ``--reads`` paths; ratio; and the floor of
  such a batch in pygit2 alone (tree lookup, blob read and ``lstat`` per path);
* ``exec`` of a command creating ``--exec-files`` files in ``d/``, then one
  deleting them, each against ``git add -A && git commit`` of the same change.

Figures only, no assertions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time


def build(path: str, n: int) -> None:
    subprocess.run(["git", "init", "-q", "-b", "main", path], check=True)
    chunks = [b"commit refs/heads/main\ncommitter Bench <bench@example.invalid> 0 +0000\ndata 4\ninit\n"]
    for i in range(n):
        data = f"VALUE = {i}\n".encode()
        chunks.append(f"M 100644 inline d/f{i:06d}.py\ndata {len(data)}\n".encode() + data + b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=b"".join(chunks), check=True)
    subprocess.run(["git", "checkout", "-q", "-f", "main"], cwd=path, check=True)
    for k, v in (("user.name", "Bench"), ("user.email", "bench@example.invalid")):
        subprocess.run(["git", "config", k, v], cwd=path, check=True)


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--exec-files", type=int, default=2000)
    args = ap.parse_args()

    import pygit2

    from storm_git import init, open_workspace
    from storm_git.core.store import Store

    base = tempfile.mkdtemp(prefix="storm-bench-disk-")
    path = os.path.join(base, "repo")
    build(path, args.entries)
    init(Store.discover(path))
    ws = open_workspace(path)
    repo, store = ws.store.repo, ws.store
    n, k = args.entries, min(args.reads, args.entries)
    names = [f"d/f{i:06d}.py" for i in range(0, n, max(1, n // k))][:k]
    counter = iter(range(10 ** 9))

    floor_ref = "refs/bench/floor"
    repo.references.create(floor_ref, repo.head.target)

    def bare() -> None:
        ref = repo.lookup_reference(floor_ref)
        c = repo[ref.target]
        blob = repo.create_blob(f"x = {next(counter)}\n".encode())
        tree = store.tree_with(c.tree, {"d/f000001.py": (blob, pygit2.GIT_FILEMODE_BLOB)})
        sig = pygit2.Signature("b", "b@x")
        ref.set_target(repo.create_commit(None, sig, sig, "m", tree, [c.id]))

    ws.read(["d/f000003.py"], agent="small")
    ws.read(names, agent="big")

    def write(agent: str, target: str) -> None:
        res = ws.write(target, f"x = {next(counter)}\n".encode(), agent=agent)
        assert res.accepted, res.rejection and res.rejection.message

    def bare_read() -> None:
        """The floor of a batch read: each path looked up in the head's tree, its blob
        read, its file lstat'ed (what any read that reports the disk must do)."""
        tree = repo[repo.lookup_reference("refs/storm/workspace").target].tree
        for p in names:
            _ = repo[tree[p].id].data
            os.lstat(os.path.join(path, p))

    out = {
        "bare pygit2 cycle": median_ms(bare, args.runs),
        f"bare: {k} lookups + blob reads + lstats": median_ms(bare_read, args.runs),
        "write, read set 1 path": median_ms(lambda: write("small", "d/f000003.py"), args.runs),
        f"write, read set {k} paths": median_ms(lambda: write("big", names[0]), args.runs),
        # a new agent each run: a first read (recorded), not a re-read at an unchanged head
        "read of 1 path": median_ms(lambda: ws.read(["d/f000005.py"], agent=f"r1-{next(counter)}"), args.runs),
        f"read of {k} paths": median_ms(lambda: ws.read(names, agent=f"r2-{next(counter)}"), max(3, args.runs // 2)),
        "re-read of 1 path": median_ms(lambda: ws.read(["d/f000005.py"], agent="r3"), args.runs),
    }
    m = args.exec_files
    mk = f"for i in $(seq 1 {m}); do echo $i > d/new_$i.py; done"
    rmc = "rm -f d/new_*.py"
    t0 = time.perf_counter()
    ws.exec(["sh", "-c", mk], agent="ex")
    out[f"exec creating {m} files"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    ws.exec(["sh", "-c", rmc], agent="ex")
    out[f"exec deleting {m} files"] = (time.perf_counter() - t0) * 1000
    ws.read(["d/f000007.py"], agent="ex")
    out["write by that agent afterwards"] = median_ms(lambda: write("ex", "d/f000007.py"), args.runs)
    git_env = dict(os.environ, GIT_DIR=os.path.join(base, "baseline.git"), GIT_WORK_TREE=path)
    subprocess.run(["git", "init", "-q"], env=git_env, check=True, capture_output=True)
    subprocess.run(["git", "add", "-A"], env=git_env, check=True)
    subprocess.run(["git", "commit", "-qm", "base"], env=git_env, check=True)
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", mk + " && git add -A && git commit -qm add"], cwd=path, env=git_env, check=True)
    out[f"plain git: create {m} files + add + commit"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", rmc + " && git add -A && git commit -qm rm"], cwd=path, env=git_env, check=True)
    out[f"plain git: delete {m} files + add + commit"] = (time.perf_counter() - t0) * 1000

    print(f"directory of {n} entries, {args.runs} runs, medians")
    for name, ms in out.items():
        print(f"  {name:<44} {ms:10.2f} ms")
    print(f"  write with {k}-path read set / 1-path: "
          f"{out[f'write, read set {k} paths'] / out['write, read set 1 path']:.2f}x")
    print(f"  write (1 path) / bare cycle:            {out['write, read set 1 path'] / out['bare pygit2 cycle']:.2f}x")
    print(f"  read of {k} paths / read of 1 path:   {out[f'read of {k} paths'] / out['read of 1 path']:.1f}x")
    floor = out[f"bare: {k} lookups + blob reads + lstats"]
    print(f"  read of {k} paths / its bare floor:   {out[f'read of {k} paths'] / floor:.2f}x")
    print(f"  bare floor of {k} paths / read of 1 path: {floor / out['read of 1 path']:.1f}x")


if __name__ == "__main__":
    main()
