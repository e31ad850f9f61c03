#!/usr/bin/env python3
"""Which calls grow with the size of the working tree: the shell door, ``exec``,
``status`` through the resident process, and the write path in the library.

Not a test: it prints medians and ratios against the smallest tree (and, for the
library's write, against 10k files), all measured in one run.

Trees: generated ones of ``--sizes`` files (bench_tree's layout: 100 top
directories x 10 subdirectories, ~1,100 directories), built once with git
fast-import and cached under ``--cache`` (reused between runs: building 200k files
takes minutes here), plus ``--click``: the click repository from
``../shared/data/click.bundle`` checked out at its newest commit. Per tree:

* through the resident process (its watch answering the snapshots): a Bash
  PreToolUse + PostToolUse pair of harness hooks (two processes, as a harness runs
  them), ``git storm exec -- true``, ``git storm status``; beside them ``git status
  --porcelain`` (git's own walk) and ``python3 -S -c pass`` (a process start);
* in the library, in a process of its own (the resident process still running, so
  the manager's commit asks its watch): a write of one small file (new content
  each time) by an agent, an in-process read of a path not read yet beside the
  bare blob lookup (``revparse_single``) measured in the same loop, the manager's
  commit after one write;
* the resident process's start (from the first call: its socket answering, then its
  watch up) and its resident memory after the rounds; the watch's own start,
  in-process; beside the manager's commit, git's own floor for changing one entry
  of an index that size (``git update-index --index-info`` on a copy: a read and a
  write of the whole index file).

    python3 benchmarks/bench_flat.py                          # 1k, 50k, 200k + click
    python3 benchmarks/bench_flat.py --sizes 1000,10000,50000,200000 --rounds 11
    python3 benchmarks/bench_flat.py --walk                   # the same with storm.watch=false
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_hook import event  # noqa: E402
from bench_tree import build  # noqa: E402

CLICK_BUNDLE = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data", "click.bundle"))


def ensure_tree(cache: str, name: str, n: int | None) -> str:
    path = os.path.join(cache, name)
    done = os.path.join(path, ".git", "storm-bench-built")
    if os.path.exists(done):
        return path
    subprocess.run(["rm", "-rf", path], check=True)
    if n is None:
        head = subprocess.run(["git", "bundle", "list-heads", CLICK_BUNDLE], capture_output=True, check=True,
                              text=True).stdout.split()
        subprocess.run(["git", "clone", "-q", "-b", head[1].rsplit("/", 1)[-1], CLICK_BUNDLE, path], check=True)
        for k, v in (("user.name", "Bench"), ("user.email", "bench@example.invalid")):
            subprocess.run(["git", "config", k, v], cwd=path, check=True)
    else:
        build(path, n)
    subprocess.run(["git", "config", "maintenance.auto", "false"], cwd=path, check=True)
    subprocess.run(["git", "config", "gc.auto", "0"], cwd=path, check=True)
    subprocess.run(["git-storm", "init"], cwd=path, check=True, capture_output=True)
    open(done, "w").close()
    return path


def files_in(path: str) -> int:
    r = subprocess.run(["git", "ls-files", "-z"], cwd=path, capture_output=True, check=True)
    return r.stdout.count(b"\0")


WALK = False  # --walk: storm.watch=false, every snapshot walks (the figures without the watch)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STORM_NO_DAEMON", "GIT_INDEX_FILE")}
    env.update(STORM_HOOKD_IDLE="900", STORM_AGENT="bench", **extra)
    return env


def timed(argv: list[str], cwd: str, env: dict[str, str], data: bytes | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, input=data, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-400:]}")
    return dt


def daemon_pid(repo: str, env: dict[str, str]) -> int | None:
    import storm_git
    from storm_git.integrations import hookd_place

    fp = hookd_place.fingerprint(os.path.dirname(storm_git.__file__), storm_git.__version__)
    name = hookd_place.name(fp, {os.fsencode(k): os.fsencode(v) for k, v in env.items()})
    path = hookd_place.socket_path(os.path.join(repo, ".git"), name, env)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[:4], "little")
    except OSError:
        return None
    finally:
        s.close()


def stop_daemon(repo: str, env: dict[str, str]) -> None:
    pid = daemon_pid(repo, env)
    if pid:
        os.kill(pid, signal.SIGTERM)
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def how(repo: str) -> str:
    try:
        with open(os.path.join(repo, ".git", "storm", "exec-watch")) as fh:
            return str(json.load(fh)["how"])
    except (OSError, ValueError, KeyError):
        return "none"


def door_rounds(repo: str, rounds: int) -> dict[str, float]:
    env = base_env()
    stop_daemon(repo, env)
    t0 = time.perf_counter()
    subprocess.run(["git-storm", "status"], cwd=repo, env=env, capture_output=True, check=True)
    while daemon_pid(repo, env) is None:
        time.sleep(0.01)
    listening = time.perf_counter() - t0
    pid = daemon_pid(repo, env)
    assert pid is not None
    state = os.path.join(repo, ".git", "storm", "tree-watch")
    deadline = time.monotonic() + 120
    while not WALK and time.monotonic() < deadline:  # its watch is up once it names itself in its state
        try:
            with open(state) as fh:
                if json.load(fh).get("pid") == pid:
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    watching = time.perf_counter() - t0
    hook = ["git-storm", "harness", "hook"]
    counter = [0]

    def bash() -> float:
        counter[0] += 1
        uid = f"b{counter[0]}-{time.time_ns()}"
        pre = event(repo, "PreToolUse", "Bash", {"command": "true"}, uid)
        post = event(repo, "PostToolUse", "Bash", {"command": "true"}, uid)
        return timed(hook, repo, env, pre) + timed(hook, repo, env, post)

    calls = {
        "bash_pre_post": bash,
        "exec_true": lambda: timed(["git-storm", "exec", "--", "true"], repo, env),
        "status": lambda: timed(["git-storm", "status"], repo, env),
        "git_status": lambda: timed(["git", "status", "--porcelain"], repo, env),
        "python_S": lambda: timed([sys.executable, "-S", "-c", "pass"], repo, env),
    }
    for fn in calls.values():
        fn()  # warm-up: the first snapshot under the watch walks
    samples: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            samples[k].append(fn())
    out = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    out["daemon_listen_ms"] = listening * 1e3
    out["daemon_watching_ms"] = watching * 1e3
    out["daemon_rss_mb"] = rss_kb(pid) / 1024
    out["how"] = "walk (storm.watch=false)" if WALK else how(repo)  # type: ignore[assignment]
    out.update(lib_rounds(repo, rounds))  # the daemon still runs: the manager's commit asks its watch
    stop_daemon(repo, env)
    return out


LIB = r"""
import json, os, statistics, sys, time
from storm_git import open_workspace
from storm_git.storm import tree_watch
repo, rounds = sys.argv[1], int(sys.argv[2])
ws = open_workspace(repo)
r = ws.store.repo
t = time.perf_counter(); w = tree_watch.TreeWatch(repo); w.start(); watch_start = time.perf_counter() - t
watch_dirs = len(w.dirs); w.close()
head = r.revparse_single("refs/storm/workspace").peel(2)
paths = []
def walk(tree, prefix):
    for e in tree:
        if len(paths) >= 3 * rounds + 10:
            return
        if e.type_str == "tree":
            walk(r[e.id], prefix + e.name + "/")
        else:
            paths.append(prefix + e.name)
walk(head, "")
agent = f"reader{time.time_ns()}"
reads, floors = [], []
for p in paths[:2 * rounds]:
    t = time.perf_counter(); ws.read([p], agent=agent); reads.append(time.perf_counter() - t)
    t = time.perf_counter(); r.revparse_single(f"refs/storm/workspace:{p}").data; floors.append(time.perf_counter() - t)
target = "bench_flat_write.txt"
writes = []
for i in range(2 * rounds):
    data = f"write {time.time_ns()} {i}\n".encode()
    t = time.perf_counter()
    res = ws.write(target, data, agent="writer", intent="bench")
    writes.append(time.perf_counter() - t)
    assert res.accepted, res
commits, floors_index = [], []
import shutil, subprocess
copy = os.path.join(ws.store.gitdir, "index.bench-floor")
for i in range(max(3, rounds // 3)):
    ws.write(target, f"c {time.time_ns()}\n".encode(), agent="writer", intent="bench")
    t = time.perf_counter(); ws.commit(f"bench {i}", agent="manager"); commits.append(time.perf_counter() - t)
    # git's own floor for changing one entry of this index: read it, replace one entry, write it
    shutil.copyfile(os.path.join(ws.store.gitdir, "index"), copy)
    blob = str(r.revparse_single(f"HEAD:{target}").id)
    t = time.perf_counter()
    subprocess.run(["git", "update-index", "-z", "--index-info"], cwd=repo, check=True,
                   env=dict(os.environ, GIT_INDEX_FILE=copy), input=f"100644 {blob}\t{target}\0".encode())
    floors_index.append(time.perf_counter() - t)
os.unlink(copy)
m = lambda xs: statistics.median(xs) * 1e3
print(json.dumps({"write_ms": m(writes), "read_new_ms": m(reads), "blob_ms": m(floors),
                  "read_ratio": statistics.median(reads) / statistics.median(floors), "commit_ms": m(commits),
                  "index_floor_ms": m(floors_index),
                  "watch_start_ms": watch_start * 1e3, "watch_dirs": watch_dirs}))
"""


def lib_rounds(repo: str, rounds: int) -> dict[str, float]:
    env = base_env()
    r = subprocess.run([sys.executable, "-c", LIB, repo, str(rounds)], cwd=repo, env=env, capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"library rounds failed: {r.stderr.decode()[-800:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,50000,200000")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cache", default="/tmp/storm-bench-flat")
    ap.add_argument("--no-click", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--walk", action="store_true", help="storm.watch=false: every snapshot walks the tree")
    args = ap.parse_args()
    global WALK
    WALK = args.walk
    os.makedirs(args.cache, exist_ok=True)
    trees = [(f"gen{n}", int(n)) for n in args.sizes.split(",")]
    if not args.no_click and os.path.exists(CLICK_BUNDLE):
        trees.append(("click", None))  # type: ignore[arg-type]
    results = {}
    for name, n in trees:
        t = time.perf_counter()
        repo = ensure_tree(args.cache, name, n)
        built = time.perf_counter() - t
        res: dict[str, object] = {"files": files_in(repo), "ready_s": built}
        if WALK:  # (the repository's config: libgit2 reads no GIT_CONFIG_* variables)
            subprocess.run(["git", "config", "storm.watch", "false"], cwd=repo, check=True)
        try:
            res.update(door_rounds(repo, args.rounds))
        finally:
            if WALK:
                subprocess.run(["git", "config", "--unset", "storm.watch"], cwd=repo, check=True)
        results[name] = res
        print(f"{name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    if args.json:
        print(json.dumps({"load": load, "results": results}, indent=1))
        return
    first = results[trees[0][0]]
    ten = results.get("gen10000", first)
    print(f"medians of {args.rounds} rounds; load average {' '.join(load)}; ratios against {trees[0][0]}")
    rows = [("Bash Pre+Post hooks", "bash_pre_post", first), ("git storm exec -- true", "exec_true", first),
            ("git storm status", "status", first), ("git status --porcelain", "git_status", first),
            ("python3 -S -c pass", "python_S", first),
            ("library write (vs 10k)", "write_ms", ten), ("read of a new path", "read_new_ms", first),
            ("  bare blob lookup", "blob_ms", first), ("manager's commit", "commit_ms", first),
            ("  git update-index, 1 entry", "index_floor_ms", first)]
    head = f"{'':28}" + "".join(f"{name:>20}" for name, _ in trees)
    print(head)
    for label, key, ref in rows:
        cells = ""
        for name, _ in trees:
            v = float(results[name][key])  # type: ignore[arg-type]
            cells += f"{v:10.2f} ms {v / float(ref[key]):5.2f}x"  # type: ignore[arg-type]
        print(f"{label:28}{cells}")
    for label, key in (("read new ÷ blob lookup", "read_ratio"), ("daemon listens (ms)", "daemon_listen_ms"),
                       ("daemon watches (ms)", "daemon_watching_ms"),
                       ("watch start (ms)", "watch_start_ms"), ("watched directories", "watch_dirs"),
                       ("daemon RSS (MB)", "daemon_rss_mb"), ("files", "files")):
        print(f"{label:28}" + "".join(f"{float(results[n][key]):20.1f}" for n, _ in trees))  # type: ignore[arg-type]
    print(f"{'last snapshot was':28}" + "".join(f"{str(results[n]['how']):>20}" for n, _ in trees))


if __name__ == "__main__":
    main()
