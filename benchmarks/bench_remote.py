#!/usr/bin/env python3
"""Benchmark of the shared workspace on a git remote. Not a test.

Against a ``git daemon`` on 127.0.0.1 started here (and a bare repository with or
without storm's pre-receive guard), it prints medians of:

* latency: a remote validated write vs a local one on the same machine (library
  calls, no CLI start-up), beside one bare ``git fetch`` of the storm refs and one
  bare ``git push --atomic --force-with-lease``: the target is remote - local <= fetch + push;
* throughput: aggregate accepted writes/s with 2, 4 and 8 clones on disjoint files,
  with one writer process per clone and with several (--per-clone: the writers of one
  clone share its pushes, group commit), for --seconds each, and pushes per write;
  only writes acknowledged inside the window count (those still in flight when it
  closes are reported apart, 'late': under contention they land seconds later);
* contention: 4 clones writing one shared file (read, write, re-plan on rejection):
  lease retries and rejections per accepted write;
* sustained: the most clones with the most writers each, for --sustained seconds
  (20), last (the workspace aged by every point before): the issue's target. Busy
  clones take turns of 2 s (docs/remote.md), so a window shorter than a round of
  eight turns (~18 s) holds the start-up race and three or four clones' turns, not
  eight clones' work. It also says in how many clones storm's maintenance ran during
  it, and git's CPU in those runs (as storm records them: git storm maintenance --history).

    python3 benchmarks/bench_remote.py                 # guard installed: docs/remote.md's table
    python3 benchmarks/bench_remote.py --no-guard      # its other column
    python3 benchmarks/bench_remote.py --no-guard --seconds 3 --per-clone 1,4,8 --clones 8 --json
    python3 benchmarks/bench_remote.py --no-guard --transport file   # the same, without the network
    python3 benchmarks/bench_remote.py --no-guard --sustained 0      # without the last, 20 s point
    python3 benchmarks/bench_remote.py --no-guard --no-relay         # storm's git commands without the relay
    TMPDIR=/dev/shm python3 benchmarks/bench_remote.py --no-guard     # server and clones in memory (tmpfs)

The server and the clones are made under TMPDIR (Python's tempfile): on this project's
VM /tmp is an ext4 without a journal, where creating a file costs far more CPU after
many were deleted (docs/remote.md, "Cost"); TMPDIR=/dev/shm measures without that disk.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WS = "refs/storm/workspace"


def git(cwd: str, *args: str, input: bytes | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, input=input, check=True)
    return r.stdout.decode().strip()


def storm(cwd: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, check=True, capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(base: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(["git", "daemon", "--enable=receive-pack", "--export-all", f"--base-path={base}",
                             "--listen=127.0.0.1", f"--port={port}", "--reuseaddr", base],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    raise SystemExit("git daemon did not start")


def make_project(path: str, n_files: int = 64) -> None:
    os.makedirs(path)
    git(path, "init", "-q", "-b", "main")
    for i in range(n_files):
        with open(os.path.join(path, f"f{i:02d}.txt"), "w") as fh:
            fh.write(f"file {i}\n")
    with open(os.path.join(path, "shared.txt"), "w") as fh:
        fh.write("shared\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "init")


WORKER = r'''
import json, os, sys, time
from storm_git import open_workspace
clone, agent, path, seconds, shared, go = sys.argv[1:7]
ws = open_workspace(clone)
[r] = ws.read([path], agent=agent)
content = r.content or b""
open(go + "." + agent, "w").close()  # ready: the timed window starts when every writer is
while not os.path.exists(go):
    time.sleep(0.01)
acc = rej = retries = late = 0
lat = []
pushes0 = getattr(ws, "pushes", 0)
cpu0 = os.times()
end = time.monotonic() + float(seconds)
while time.monotonic() < end:
    t0 = time.monotonic()
    if shared == "1":
        ws.forget(None, agent=agent)
        [r] = ws.read([path], agent=agent)
        content = r.content
    res = ws.write(path, content + f"{agent} {acc}\n".encode(), agent=agent)
    retries += res.cas_retries
    if res.accepted:
        acc += 1
        content = content + f"{agent} {acc - 1}\n".encode()
        lat.append(time.monotonic() - t0)
        late += time.monotonic() > end  # landed after the window closed: not counted in writes/s
    else:
        rej += 1
        content = res.rejection.current_content or b""
cpu1 = os.times()
print(json.dumps({"accepted": acc, "late": late, "rejected": rej, "retries": retries, "latency": lat,
                  "pushes": getattr(ws, "pushes", 0) - pushes0,
                  "cpu_self": cpu1.user + cpu1.system - cpu0.user - cpu0.system,  # storm's Python in this writer
                  "cpu_git": cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system}))
'''


def setup(tmp: str, guard: bool, clones: int, transport: str = "daemon",
          turns: bool = True, relay: bool = True) -> tuple[subprocess.Popen, str, list[str]]:
    """The served bare repository and ``clones`` clones of it. ``transport``: the clones
    reach it through a ``git daemon`` on loopback (``daemon``), or by ``file://`` (no
    network: git runs the server's side as a local process, as over ssh)."""
    base = os.path.join(tmp, "served")
    os.makedirs(base)
    srv = os.path.join(base, "proj.git")
    git(base, "init", "-q", "--bare", "-b", "main", srv)
    if guard:
        storm(srv, "server-hook", "install", srv)
    proc, port = start_daemon(base)  # started either way: the caller stops it
    url = f"git://127.0.0.1:{port}/proj.git" if transport == "daemon" else f"file://{srv}"
    seed = os.path.join(tmp, "c0")
    make_project(seed)
    if not relay:  # before storm's first command, which would start one
        git(seed, "config", "storm.remoteRelay", "false")
    git(seed, "remote", "add", "origin", url)
    git(seed, "push", "-q", "origin", "main")
    storm(seed, "init", "--remote", "origin")
    out = [seed]
    for i in range(1, clones):
        c = os.path.join(tmp, f"c{i}")
        git(tmp, "clone", "-q", url, c)
        if not relay:
            git(c, "config", "storm.remoteRelay", "false")
        storm(c, "join", "origin")
        out.append(c)
    for c in out:
        git(c, "config", "storm.reservationSeconds", "0.2")
        if not turns:
            git(c, "config", "storm.remoteTurns", "false")
    return proc, srv, out


def loose_objects(repo: str) -> int:
    """The loose objects of a clone (``git count-objects``): they fall only when storm's
    maintenance packs them, so a fall across a window says that it ran there."""
    out = git(repo, "count-objects", "-v")
    return int(dict(line.split(": ", 1) for line in out.splitlines() if ": " in line).get("count", 0))


def maintenance_runs(repo: str, t0: float, t1: float) -> list[dict]:
    """The maintenance runs storm recorded in ``repo`` that ran at some time between
    ``t0`` and ``t1`` (one that started before ``t0`` and ended after it included)."""
    out = subprocess.run([sys.executable, "-m", "storm_git", "maintenance", "--history", "--json"], cwd=repo,
                         capture_output=True, text=True, check=True).stdout
    return [r for r in json.loads(out)["runs"] if r["started"] < t1 and r["started"] + r["seconds"] > t0]


def cpu_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy (all cores, /proc/stat): the
    server's processes, the clients' git processes and the writers alike."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


def run_workers(clones: list[str], seconds: float, shared: bool, per_clone: int = 1) -> list[dict]:
    """Start the writers, wait until each has opened its clone and read its file, then
    open the timed window for all of them at once (process start-up is not counted)."""
    run = time.monotonic_ns()
    go = os.path.join(os.path.dirname(clones[0]), f"go-{run}")
    procs, names = [], []
    for i, c in enumerate(clones):
        for k in range(per_clone):
            # writer k of clone i is the same agent at every point (an agent works from
            # one clone at a time): the server holds the notes refs of at most 8 x 32
            # agents, as it would for eight machines of 32 agents. New ids at every
            # point left ~750 of them by the last point, and every fetch and push of
            # every clone walks them all: 700 extra notes refs took a fresh 8 x 32 on
            # tmpfs from 112 to 64 writes/s (docs/remote.md, "Cost")
            path = "shared.txt" if shared else f"c{i}w{k}.txt"
            names.append(f"c{i}w{k}")
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER, c, names[-1], path, str(seconds),
                                           "1" if shared else "0", go], stdout=subprocess.PIPE))
    while not all(os.path.exists(f"{go}.{a}") for a in names):
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a writer failed to start")
        time.sleep(0.02)
    c0, t0, opened = cpu_busy(), time.monotonic(), time.time()
    open(go, "w").close()
    out = [json.loads(p.communicate()[0]) for p in procs]
    out[0]["cpu_s"] = cpu_busy() - c0  # the whole machine, from the window's start until the last writer ended
    out[0]["wall_s"] = time.monotonic() - t0  # the same span (the writers' start-up is not in it)
    out[0]["opened"] = opened  # when the window opened (unix time)
    return out


GIT_WORKER = r'''
import os, subprocess, sys, time
clone, name, seconds, go, ref = sys.argv[1:6]
def git(*a, input=None):
    return subprocess.run(["git", *a], cwd=clone, capture_output=True, input=input)
open(go + "." + name, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
ok = fail = 0
end = time.monotonic() + float(seconds)
while time.monotonic() < end:
    git("-c", "protocol.version=0", "fetch", "-q", "--no-tags", "origin", f"+{ref}:refs/bench/shared")
    h = git("rev-parse", "refs/bench/shared").stdout.decode().strip()
    blob = git("hash-object", "-w", "--stdin", input=f"{name} {ok} {time.time()}\n".encode()).stdout.decode().strip()
    tree = git("mktree", input=f"100644 blob {blob}\t{name}.txt\n".encode()).stdout.decode().strip()
    new = git("-c", "user.name=b", "-c", "user.email=b@x", "commit-tree", "-p", h, "-m", name, tree).stdout.decode().strip()
    r = git("push", "-q", "--atomic", "--porcelain", f"--force-with-lease={ref}:{h}", "origin", f"{new}:{ref}")
    if time.monotonic() > end:
        break  # finished after the window closed: not counted
    ok, fail = (ok + 1, fail) if r.returncode == 0 else (ok, fail + 1)
print(ok, fail)
'''


def plain_git(clones: list[str], seconds: float) -> tuple[int, int, float]:
    """The same race without storm: each clone loops fetch, one new commit on the
    fetched head, push with a lease on it (one write per push), on a scratch ref."""
    ref = "refs/bench/plain"
    git(clones[0], "push", "-q", "origin", f"+{WS}:{ref}")
    go = os.path.join(os.path.dirname(clones[0]), f"go-git-{time.monotonic_ns()}")
    names = [f"g{i}" for i in range(len(clones))]
    procs = [subprocess.Popen([sys.executable, "-c", GIT_WORKER, c, n, str(seconds), go, ref], stdout=subprocess.PIPE)
             for c, n in zip(clones, names)]
    while not all(os.path.exists(f"{go}.{n}") for n in names):
        time.sleep(0.02)
    c0 = cpu_busy()
    open(go, "w").close()
    outs = [p.communicate()[0].decode().split() for p in procs]
    return sum(int(o[0]) for o in outs), sum(int(o[1]) for o in outs), cpu_busy() - c0


def latency(tmp: str, clones: list[str], n: int, srv: str | None = None) -> dict[str, float]:
    """Median seconds: local write, remote write, bare fetch, bare push (same machine);
    with the guard installed on ``srv``, also the guard's own run on one write."""
    from storm_git import open_workspace

    local = os.path.join(tmp, "local")
    make_project(local)
    storm(local, "init")
    lws = open_workspace(local)
    rws = open_workspace(clones[0])
    out: dict[str, list[float]] = {"local_write": [], "remote_write": [], "git_fetch": [], "git_push": []}
    for ws, key in ((lws, "local_write"), (rws, "remote_write")):
        [r] = ws.read(["f15.txt"], agent="lat")
        content = r.content
        for i in range(n):
            content += b"x\n"
            t0 = time.perf_counter()
            res = ws.write("f15.txt", content, agent="lat")
            out[key].append(time.perf_counter() - t0)
            assert res.accepted
    c = clones[0]
    for _ in range(n):
        t0 = time.perf_counter()
        git(c, "-c", "protocol.version=0", "fetch", "-q", "--no-tags", "origin", "+refs/storm/*:refs/bench/storm/*")
        out["git_fetch"].append(time.perf_counter() - t0)
    # a push with a lease of one new commit (a new blob in it) to a scratch ref: the
    # objects a write sends, without storm (the guard only looks at storm's refs)
    cur = git(c, "rev-parse", WS)
    git(c, "push", "-q", "origin", f"{cur}:refs/bench/x")
    env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "bench-index"))
    for i in range(n):
        subprocess.run(["git", "read-tree", cur], cwd=c, env=env, check=True)
        blob = git(c, "hash-object", "-w", "--stdin", input=f"bench {i} {time.time()}\n".encode())
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},bench.txt"], cwd=c, env=env,
                       check=True)
        tree = subprocess.run(["git", "write-tree"], cwd=c, env=env, check=True, capture_output=True).stdout.decode().strip()
        new = git(c, "-c", "user.name=b", "-c", "user.email=b@x", "commit-tree", "-p", cur, "-m", f"bench {i}", tree)
        t0 = time.perf_counter()
        git(c, "push", "-q", "--atomic", "--porcelain", f"--force-with-lease=refs/bench/x:{cur}", "origin",
            f"{new}:refs/bench/x")
        out["git_push"].append(time.perf_counter() - t0)
        cur = new
    if srv is not None and guarded(srv):
        out["guard_run"] = guard_runs(srv, n)
    return {k: statistics.median(v) for k, v in out.items()}


def guarded(srv: str) -> bool:
    try:
        with open(os.path.join(srv, "hooks", "pre-receive")) as fh:
            return "storm" in fh.read()
    except FileNotFoundError:
        return False


def guard_runs(srv: str, n: int) -> list[float]:
    """Seconds the server's pre-receive hook takes to pass each of the last ``n`` writes
    on the shared ref, run as git runs it (the update on its stdin, in the bare
    repository): what a push to a guarded server costs on top of a bare push (the bare
    push above goes to a ref the guard lets through without starting Python)."""
    hook = os.path.join(srv, "hooks", "pre-receive")
    commits = git(srv, "rev-list", f"-{n}", WS).split()
    out = []
    for c in commits:
        line = f"{git(srv, 'rev-parse', c + '^')} {c} {WS}\n".encode()
        t0 = time.perf_counter()
        r = subprocess.run([hook], cwd=srv, input=line, capture_output=True, env=dict(os.environ, GIT_DIR="."))
        out.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"the guard refused a landed write: {r.stderr.decode()}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-guard", action="store_true", help="no pre-receive guard on the server")
    ap.add_argument("--seconds", type=float, default=6.0, help="duration of each throughput point")
    ap.add_argument("--latency-n", type=int, default=15)
    ap.add_argument("--clones", default="1,2,4,8")
    ap.add_argument("--per-clone", default="1,16,32",
                    help="writer processes per clone (default 1,16,32: more writers per clone, bigger group commits)")
    ap.add_argument("--transport", choices=("daemon", "file"), default="daemon",
                    help="git daemon on loopback (default), or file:// to the same bare repository: "
                         "what the network round trip costs, measured apart")
    ap.add_argument("--no-turns", action="store_true",
                    help="storm.remoteTurns false in every clone: clones race for every push, and the clone "
                         "whose push just landed wins (docs/remote.md, the turn)")
    ap.add_argument("--sustained", type=float, default=20.0,
                    help="seconds of the last point: the most clones x the most writers each, after the others "
                         "(0: skip); the target is 100 writes/s with 8 clones")
    ap.add_argument("--no-relay", action="store_true",
                    help="storm.remoteRelay false in every clone: storm's git commands connect to the git daemon "
                         "themselves, and wait on Nagle's algorithm (git storm relay --help)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.clones.split(",")]
    result: dict = {"guard": not args.no_guard, "seconds": args.seconds, "transport": args.transport,
                    "turns": not args.no_turns, "relay": not args.no_relay and args.transport == "daemon"}
    log = sys.stderr if args.json else sys.stdout
    # a server gc --auto that receive-pack detached may still be writing when the run ends
    with tempfile.TemporaryDirectory(prefix="bench-remote-", ignore_cleanup_errors=True) as tmp:
        proc, srv, clones = setup(tmp, not args.no_guard, max(counts + [4]), args.transport, not args.no_turns,
                                  not args.no_relay)
        try:
            lat = latency(tmp, clones, args.latency_n, srv)
            result["latency_ms"] = {k: round(v * 1000, 1) for k, v in lat.items()}
            extra = lat["remote_write"] - lat["local_write"]
            bound = lat["git_fetch"] + lat["git_push"]
            print(f"latency (median): local write {lat['local_write'] * 1000:.1f} ms, remote write "
                  f"{lat['remote_write'] * 1000:.1f} ms; git fetch {lat['git_fetch'] * 1000:.1f} ms + git push "
                  f"{lat['git_push'] * 1000:.1f} ms; remote - local = {extra * 1000:.1f} ms "
                  f"({'within' if extra <= bound else 'over'} one fetch + one push)", file=log)
            if "guard_run" in lat:  # a push the guard checks costs its run on top of a bare push
                with_guard = bound + lat["guard_run"]
                print(f"the server's guard runs {lat['guard_run'] * 1000:.1f} ms per write pushed: remote - local "
                      f"{'within' if extra <= with_guard else 'over'} one fetch + one guarded push "
                      f"({with_guard * 1000:.1f} ms)", file=log)
            result["throughput"] = {}
            result["plain_git"] = {}
            for n in counts:
                ok, fail, cpu = plain_git(clones[:n], args.seconds)
                result["plain_git"][n] = {"writes_per_s": ok / args.seconds, "failed_leases_per_write": fail / max(ok, 1),
                                          "cpu_ms_per_write": round(cpu * 1000 / max(ok, 1), 1)}
                print(f"plain git, {n} clones (fetch, commit, leased push; one write per push): "
                      f"{ok / args.seconds:.1f} writes/s, {fail / max(ok, 1):.2f} failed leases per write, "
                      f"{cpu * 1000 / max(ok, 1):.0f} ms of the machine's CPU per write", file=log)
            for per in [int(x) for x in args.per_clone.split(",")]:
                for n in counts:
                    h0 = git(srv, "rev-parse", WS)
                    res = run_workers(clones[:n], args.seconds, shared=False, per_clone=per)
                    wall = res[0]["wall_s"]  # from the window's start until the last writer ended
                    acc = sum(r["accepted"] for r in res)
                    late = sum(r["late"] for r in res)  # acknowledged after the window closed
                    landed = int(git(srv, "rev-list", "--count", f"{h0}..{WS}"))
                    pushes = sum(r["pushes"] for r in res)
                    per_write = statistics.median([x for r in res for x in r["latency"]] or [0])
                    longest = max([x for r in res for x in r["latency"]] or [0])  # a starved clone's writes show here
                    cpu = res[0]["cpu_s"]
                    own = sum(r["cpu_self"] for r in res)
                    gits = sum(r["cpu_git"] for r in res)
                    # each clone's writes in the window: eight busy clones are not peers (the
                    # clone whose push just landed pushes again at once; the turn, storm_git.remote.gate,
                    # lets each clone land back to back for a slice, one after the other)
                    by_clone = [sum(r["accepted"] - r["late"] for r in res[i * per:(i + 1) * per]) for i in range(n)]
                    if landed != acc:  # every commit on the server is one acknowledged write
                        print(f"ERROR: {landed} commits on the server for {acc} acknowledged writes", file=sys.stderr)
                    point = {"clones": n, "per_clone": per, "accepted": acc, "late": late, "on_server": landed,
                             "cpu_ms_per_write": round(cpu * 1000 / max(acc, 1), 1),
                             "cpu_ms_per_write_storm": round(own * 1000 / max(acc, 1), 1),
                             "cpu_ms_per_write_git_client": round(gits * 1000 / max(acc, 1), 1),
                             "writes_per_s": (acc - late) / args.seconds,
                             "whole_run_writes_per_s": round(landed / wall, 1),  # the tail included
                             "median_write_ms": round(per_write * 1000, 1),
                             "longest_write_ms": round(longest * 1000, 1),
                             "pushes_per_write": pushes / max(acc, 1),
                             "retries_per_write": sum(r["retries"] for r in res) / max(acc, 1),
                             "window_writes_by_clone": by_clone}
                    result["throughput"][f"{n}x{per}"] = point
                    print(f"{n} clones x {per} writer(s), disjoint files: {acc - late} accepted in {args.seconds:.0f} s = "
                          f"{point['writes_per_s']:.1f} writes/s ({late} more acknowledged after the window; server "
                          f"commits {landed}, {point['whole_run_writes_per_s']:.1f}/s over the whole run; median write "
                          f"{per_write * 1000:.0f} ms, longest {longest * 1000:.0f} ms; "
                          f"{point['pushes_per_write']:.2f} pushes/write; "
                          f"{point['retries_per_write']:.2f} lease retries/write; "
                          f"{point['cpu_ms_per_write']:.0f} ms of the machine's CPU per write, of which storm's "
                          f"Python {point['cpu_ms_per_write_storm']:.0f} and its git processes "
                          f"{point['cpu_ms_per_write_git_client']:.0f}; wall {wall:.1f} s)", file=log)
                    if n > 1:
                        print(f"    the window's writes by clone: {' / '.join(map(str, by_clone))} (the busiest "
                              f"{100 * max(by_clone) / max(sum(by_clone), 1):.0f} %; "
                              f"{sum(1 for x in by_clone if x)} of {n} clones landed writes)", file=log)
            if args.sustained > 0:
                n, per = max(counts), max(int(x) for x in args.per_clone.split(","))
                h0 = git(srv, "rev-parse", WS)
                loose0 = [loose_objects(c) for c in clones[:n]]
                res = run_workers(clones[:n], args.sustained, shared=False, per_clone=per)
                t0 = res[0]["opened"]
                t1 = t0 + args.sustained  # the window (the writes that land after it are not counted)
                loose1 = [loose_objects(c) for c in clones[:n]]
                runs = [maintenance_runs(c, t0, t1) for c in clones[:n]]
                acc = sum(r["accepted"] for r in res)
                late = sum(r["late"] for r in res)
                landed = int(git(srv, "rev-list", "--count", f"{h0}..{WS}"))
                if landed != acc:
                    print(f"ERROR: {landed} commits on the server for {acc} acknowledged writes", file=sys.stderr)
                by_clone = [sum(r["accepted"] - r["late"] for r in res[i * per:(i + 1) * per]) for i in range(n)]
                lat = [x for r in res for x in r["latency"]] or [0]
                result["sustained"] = {"clones": n, "per_clone": per, "seconds": args.sustained,
                                       "writes_per_s": (acc - late) / args.sustained, "late": late,
                                       "median_write_ms": round(statistics.median(lat) * 1000, 1),
                                       "longest_write_ms": round(max(lat) * 1000, 1),
                                       "window_writes_by_clone": by_clone,
                                       # storm records each maintenance run (git storm maintenance --history)
                                       "maintenance": {
                                           "clones_with_loose_step": sum(any(r["task"] == "loose-objects" for r in rs)
                                                                         for rs in runs),
                                           "clones_with_rollup": sum(any(r["task"] != "loose-objects" for r in rs)
                                                                     for rs in runs),
                                           "git_cpu_s": round(sum(r["cpu_s"] for rs in runs for r in rs), 2),
                                           "runs_by_clone": [[(r["task"], round(r["started"] - t0, 1), r["cpu_s"])
                                                              for r in rs] for rs in runs]},
                                       "loose_objects_before_after": list(zip(loose0, loose1))}
                print(f"sustained, {n} clones x {per} writers, {args.sustained:.0f} s (after the points above): "
                      f"{(acc - late) / args.sustained:.1f} writes/s; {sum(1 for x in by_clone if x)} of {n} clones "
                      f"landed writes ({' / '.join(map(str, by_clone))}); median write {statistics.median(lat) * 1000:.0f}"
                      f" ms, longest {max(lat) * 1000:.0f} ms", file=log)
                m = result["sustained"]["maintenance"]
                print(f"    storm's maintenance during it (as recorded): the loose step in {m['clones_with_loose_step']} "
                      f"of {n} clones, a roll-up in {m['clones_with_rollup']}, {m['git_cpu_s']:.1f} s of git's CPU "
                      f"(loose objects before -> after: {', '.join(f'{a}->{b}' for a, b in zip(loose0, loose1))})",
                      file=log)
            res = run_workers(clones[:4], args.seconds, shared=True)
            acc = sum(r["accepted"] for r in res)
            result["shared"] = {"clones": 4, "accepted": acc, "rejected": sum(r["rejected"] for r in res),
                                "retries_per_write": sum(r["retries"] for r in res) / max(acc, 1),
                                "rejections_per_write": sum(r["rejected"] for r in res) / max(acc, 1)}
            print(f"4 clones, one shared file: {acc} accepted, {result['shared']['retries_per_write']:.2f} lease "
                  f"retries and {result['shared']['rejections_per_write']:.2f} rejections per accepted write",
                  file=log)
            fsck = subprocess.run(["git", "fsck", "--no-progress"], cwd=srv, capture_output=True)
            result["server_fsck_ok"] = fsck.returncode == 0
        finally:
            proc.terminate()
            proc.wait()
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
