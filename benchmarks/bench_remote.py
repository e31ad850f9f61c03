#!/usr/bin/env python3
"""Remote mode under a realistic load: a team's clones writing to one git server. Not a test.

For each transport (``file://``; ``git://`` to a ``git daemon`` on 127.0.0.1; ``ssh://``
to an sshd of this script's own on 127.0.0.1, with a throwaway host key and one
authorized key), a bare repository with storm's hooks (the pre-receive guard and the
proc-receive hook that orders clones' writes; ``--lease``: the guard alone, and clones
race for a lease), ``--clones`` clones joined to it, and ``--agents`` agents per clone. Each agent is a long-lived
process using storm's Python API (benchmarks/remote_agent.py): 1-3 s after its last
write ended (its own seeded random gaps) it forgets its read set, reads a file -- its
own, or with probability ``--share`` the one file all agents share -- appends a line
and writes it; a rejection is re-planned and written again. It runs for ``--seconds``.

It prints, per transport: writes offered, landed, rejected (by reason; each checked
against the server's history: the file had changed since the agent read it) and
failed (any exception: must be 0); landed writes per clone (min/max, and each clone's
longest stretch without a landing: does a clone starve?) and per agent; p50/p99
latency of landed writes (own file, shared file) and of tasks, their re-plans
included; CPU per landed write (the agents, their git processes, the server); the
load on the machine (``/proc/loadavg`` during the window; other work shares the
machine); and the comparison the design is held to: remote write - local write at
p50 against one plain ``git fetch`` + one plain leased ``git push`` to the same
server, medians measured by this script -- idle before the load, and under the
load by a probe that runs beside the agents (a local-mode write on a local
repository, a fetch of the storm refs, a leased push of a new commit to a ref
outside storm's namespace, every 1-3 s). At the end every acknowledged write is
looked up on the server: its commit on the shared ref's history (and nothing else
there), its line in the file's final version.

    python3 benchmarks/bench_remote.py                       # 8 clones x 4 agents, 60 s, file git ssh
    python3 benchmarks/bench_remote.py --quick               # smoke run: 3 clones x 4 agents, 15 s
    python3 benchmarks/bench_remote.py --transports git --lease   # the same load racing for a lease
    python3 benchmarks/bench_remote.py --transports git --seconds 30 --json > remote.json
    python3 benchmarks/bench_remote.py --clones 4 --agents 8 --share 0.3 --seed 7

Nothing here asserts on timing; the exit status is 1 only when a write failed, an
acknowledged write is missing from the server, or a rejection is not justified.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WS = "refs/storm/workspace"
SHARED = "shared.txt"
PROBE_REF = "refs/bench/probe"  # outside storm's namespaces: a bare push, the guard does not run
TRANSPORTS = ("file", "git", "ssh")


def git(cwd: str, *args: str, input: bytes | None = None, check: bool = True) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, input=input)
    if check and r.returncode:
        raise RuntimeError(f"git {' '.join(args)} in {cwd}: {r.stderr.decode().strip()}")
    return r.stdout.decode().strip()


def storm(cwd: str, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, capture_output=True)
    if r.returncode:
        raise RuntimeError(f"git storm {' '.join(args)} in {cwd}: {r.stderr.decode().strip()}")


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no samples."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(len(s) * q / 100) - 1))] if s else None


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


def fmt(x: float | None) -> str:
    """Milliseconds for the report ('-' when there were no samples)."""
    return "-" if x is None else f"{x:.0f}"


def loadavg() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def cpu_busy() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat, every core)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


def agent_name(clone: int, k: int) -> str:
    return f"c{clone}a{k}"


# -- the server, the clones ------------------------------------------------------------------------
def make_project(path: str, agents: list[str]) -> None:
    """A small project: some source files, one file per agent, the shared file."""
    os.makedirs(os.path.join(path, "src"))
    os.makedirs(os.path.join(path, "agents"))
    git(path, "init", "-q", "-b", "main")
    for i in range(40):
        with open(os.path.join(path, "src", f"mod{i:02d}.py"), "w") as fh:
            fh.write(f'"""Module {i}."""\n\n' + "".join(f"def f{j}():\n    return {i * j}\n\n" for j in range(20)))
    for a in agents + ["probe"]:
        with open(os.path.join(path, "agents", f"{a}.txt"), "w") as fh:
            fh.write(f"{a}'s notes\n")
    with open(os.path.join(path, SHARED), "w") as fh:
        fh.write("shared\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "init")


@dataclass
class Site:
    """One transport's server and clones."""

    transport: str
    srv: str
    url: str
    clones: list[str]
    plain: str  # a plain git clone of the server: the baseline's fetches and pushes
    local: str  # a local-mode storm repository: the local write of the comparison
    server: loopback.Server | None = None


def build_site(tmp: str, transport: str, n_clones: int, agents: list[str], guard: bool,
               sshd: loopback.Server | None, order: bool = True) -> Site:
    base = os.path.join(tmp, "served")
    os.makedirs(base)
    srv = os.path.join(base, "proj.git")
    git(base, "init", "-q", "--bare", "-b", "main", srv)
    if guard:  # with the ordering of clones' writes, unless --lease
        storm(srv, "server-hook", "install", *([] if order else ["--no-order"]), srv)
    server = None
    if transport == "file":
        url = f"file://{srv}"
    elif transport == "git":
        server = loopback.start_daemon(base)
        url = server.url(srv)
    else:
        assert sshd is not None
        server = sshd  # shared by every run, stopped by main()
        url = sshd.url(srv)
    try:
        seed = os.path.join(tmp, "c0")
        make_project(seed, agents)
        git(seed, "remote", "add", "origin", url)
        git(seed, "push", "-q", "origin", "main")
        storm(seed, "init", "--remote", "origin")
        clones = [seed]
        for i in range(1, n_clones):
            c = os.path.join(tmp, f"c{i}")
            git(tmp, "clone", "-q", url, c)
            storm(c, "join", "origin")
            clones.append(c)
        plain = os.path.join(tmp, "plain")
        git(tmp, "clone", "-q", url, plain)
        local = os.path.join(tmp, "local")
        make_project(local, agents)
        storm(local, "init")
    except BaseException:
        if server and transport == "git":
            server.stop()
        raise
    return Site(transport, srv, url, clones, plain, local, server)


# -- the plain-git baseline and the local write ----------------------------------------------------
class Probe:
    """One plain ``git fetch`` of the storm refs, one plain leased ``git push`` of a new
    commit (one new blob) to PROBE_REF, and one local-mode write, on demand."""

    def __init__(self, site: Site) -> None:
        from storm_git import open_workspace

        self.site = site
        self.contents: dict[str, bytes] = {}
        self.local = self._open(open_workspace(site.local))
        self.remote = self._open(open_workspace(site.clones[0]))
        # storm's own choice of protocol for its fetches (storm_git.remote.transport: v0 on git://)
        self.fetch_pre = ["-c", "protocol.version=0"] if site.url.startswith("git://") else []
        self.head = git(site.plain, "rev-parse", "HEAD")
        git(site.plain, "push", "-q", "origin", f"{self.head}:{PROBE_REF}")
        self.n = 0
        self.guard_cpu: list[float] = []  # CPU seconds of each guard run (its Python, its git)

    def _open(self, ws):
        [r] = ws.read(["agents/probe.txt"], agent="probe")
        self.contents[ws.store.main_workdir] = r.content or b""
        return ws

    def _write(self, ws) -> float:
        """Seconds of one accepted write of the probe's file (a line more) in ``ws``."""
        key = ws.store.main_workdir
        self.contents[key] += b"x\n"
        t0 = time.perf_counter()
        res = ws.write("agents/probe.txt", self.contents[key], agent="probe")
        took = time.perf_counter() - t0
        if not res.accepted:
            raise RuntimeError(f"the probe's write in {key} was rejected: {res.rejection.reason}")
        return took

    def local_write(self) -> float:
        return self._write(self.local)

    def remote_write(self) -> float:
        return self._write(self.remote)

    def fetch(self) -> float:
        t0 = time.perf_counter()
        git(self.site.plain, *self.fetch_pre, "fetch", "-q", "--no-tags", "origin", "+refs/storm/*:refs/bench/storm/*")
        return time.perf_counter() - t0

    def push(self) -> float:
        p = self.site.plain
        self.n += 1
        blob = git(p, "hash-object", "-w", "--stdin", input=f"probe {self.n} {time.time()}\n".encode())
        tree = git(p, "mktree", input=f"100644 blob {blob}\tprobe.txt\n".encode())
        new = git(p, "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit-tree", "-p",
                  self.head, "-m", f"probe {self.n}", tree)
        t0 = time.perf_counter()
        git(p, "push", "-q", "--atomic", "--porcelain", f"--force-with-lease={PROBE_REF}:{self.head}", "origin",
            f"{new}:{PROBE_REF}")
        took = time.perf_counter() - t0
        self.head = new
        return took

    def guard(self) -> float:
        """The server's guard run as git runs it on the last write of the shared ref (the
        update on its stdin): what a storm push pays on top of the bare push above."""
        srv = self.site.srv
        c = git(srv, "rev-parse", WS)
        line = f"{git(srv, 'rev-parse', c + '^')} {c} {WS}\n".encode()
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([os.path.join(srv, "hooks", "pre-receive")], cwd=srv, input=line, capture_output=True,
                           env=dict(os.environ, GIT_DIR="."))
        took = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.guard_cpu.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        if r.returncode:
            raise RuntimeError(f"the guard refused a landed write: {r.stderr.decode()}")
        return took


def probe_round(probe: Probe, out: dict[str, list[float]], guard: bool, remote: bool) -> None:
    """One of each measurement, interleaved so that the machine's other load hits them alike."""
    out.setdefault("local_write", []).append(probe.local_write())
    if remote:
        out.setdefault("remote_write", []).append(probe.remote_write())
    out.setdefault("git_fetch", []).append(probe.fetch())
    out.setdefault("git_push", []).append(probe.push())
    if guard:
        out.setdefault("guard_run", []).append(probe.guard())


def idle_baseline(probe: Probe, n: int, guard: bool) -> dict[str, list[float]]:
    """``n`` rounds of local write, remote write (one agent, nothing else of this
    benchmark running), fetch, push (and the guard's run)."""
    out: dict[str, list[float]] = {}
    for _ in range(n):
        probe_round(probe, out, guard, remote=True)
    return out


# -- the load ---------------------------------------------------------------------------------------
@dataclass
class Window:
    records: list[dict]
    seconds: float  # the schedule's length
    tail: float  # from the schedule's end until the last agent finished its write in flight
    load: list[float]  # /proc/loadavg's 1-minute figure, sampled through the window
    cpu_share: float  # the machine's busy CPU over the window, share of all cores
    server_cpu: float | None  # the server process and its reaped children over the window (git://, ssh)
    probe: dict[str, list[float]] = field(default_factory=dict)
    killed: int = 0


def run_load(site: Site, tmp: str, agents_per_clone: int, args: argparse.Namespace, probe: Probe) -> Window:
    go = os.path.join(tmp, "go")
    outdir = os.path.join(tmp, "acks")
    os.makedirs(outdir)
    procs: list[tuple[str, subprocess.Popen]] = []
    for i, c in enumerate(site.clones):
        for k in range(agents_per_clone):
            a = agent_name(i, k)
            spec = {"clone": c, "agent": a, "own": f"agents/{a}.txt", "shared": SHARED, "share": args.share,
                    "seed": args.seed * 100003 + i * 1000 + k, "min_gap": args.min_gap, "max_gap": args.max_gap,
                    "max_replans": args.max_replans, "go": go, "out": os.path.join(outdir, f"{a}.jsonl")}
            procs.append((a, subprocess.Popen([sys.executable, os.path.join(HERE, "remote_agent.py"),
                                               json.dumps(spec)], stdout=subprocess.DEVNULL,
                                              stderr=open(os.path.join(outdir, f"{a}.err"), "wb"))))
    while not all(os.path.exists(f"{go}.{a}") for a, _ in procs):
        dead = [a for a, p in procs if p.poll() is not None]
        if dead:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
            err = open(os.path.join(outdir, f"{dead[0]}.err")).read()[-1500:]
            raise RuntimeError(f"agent {dead[0]} exited before starting:\n{err}")
        time.sleep(0.05)
    t0 = time.monotonic() + 0.2
    end = t0 + args.seconds
    with open(go + ".tmp", "w") as fh:
        json.dump({"t0": t0, "end": end}, fh)
    os.rename(go + ".tmp", go)
    c0 = cpu_busy()
    s0 = site.server.cpu() if site.server else None
    load = [loadavg()]
    rnd = random.Random(args.seed)
    probed: dict[str, list[float]] = {}
    next_sample = time.monotonic() + 5
    while time.monotonic() < end:  # the probe: one more "agent", doing the baseline's three operations
        time.sleep(max(0.0, min(end - time.monotonic(), rnd.uniform(args.min_gap, args.max_gap))))
        if time.monotonic() >= end:
            break
        probe_round(probe, probed, not args.no_guard, remote=False)
        if time.monotonic() >= next_sample:
            load.append(loadavg())
            next_sample += 5
    if not probed:  # a window shorter than a gap: one round while the agents finish
        probe_round(probe, probed, not args.no_guard, remote=False)
    deadline = time.monotonic() + max(300.0, 2 * args.seconds)
    killed = 0
    for _a, p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed += 1
    finished = time.monotonic()
    time.sleep(0.2)  # the server reaps its last connections
    server_cpu = site.server.cpu() - s0 if site.server and s0 is not None else None
    cpu = (cpu_busy() - c0) / (os.cpu_count() or 1) / max(finished - t0, 1e-9)
    load.append(loadavg())
    records = []
    for a, _ in procs:
        path = os.path.join(outdir, f"{a}.jsonl")
        if os.path.exists(path):
            records += [json.loads(line) for line in open(path) if line.strip()]
        err = open(os.path.join(outdir, f"{a}.err")).read().strip()
        if err:
            records.append({"kind": "failed", "agent": a, "error": "stderr", "message": err[-500:], "path": "",
                            "shared": False, "task": -1})
    return Window(records, args.seconds, finished - end, load, cpu, server_cpu, probed, killed)


# -- what the window shows ---------------------------------------------------------------------------
def verify(srv: str, h0: str, records: list[dict]) -> dict:
    """Every acknowledged write on the server, nothing else on the shared ref, every
    rejection justified by the server's history (the same checks as tests/remote/test_workspace.py)."""
    acks = [r for r in records if r["kind"] == "ack"]
    history = git(srv, "rev-list", f"{h0}..{WS}").split()
    on_server = set(history)
    missing_commit = [r for r in acks if r["commit"] not in on_server]
    acked = Counter(r["commit"] for r in acks)
    extra = [c for c in history if c not in acked]
    twice = [c for c, n in acked.items() if n > 1]
    finals: dict[str, str] = {}
    missing_line = []
    for r in acks:
        if r["path"] not in finals:
            finals[r["path"]] = git(srv, "show", f"{WS}:{r['path']}")
        if r["line"].rstrip("\n") not in finals[r["path"]].splitlines():
            missing_line.append(r)
    unjustified = []
    for r in (r for r in records if r["kind"] == "rejection" and r["reason"] != "reserved"):
        at = git(srv, "rev-parse", f"{r['head']}:{r['path']}", check=False) or None
        if r["head"] not in on_server and r["head"] != h0 or at != r["current"] or at == r["seen"]:
            unjustified.append(r)
    fsck = subprocess.run(["git", "fsck", "--no-progress"], cwd=srv, capture_output=True)
    return {"acknowledged": len(acks), "server_commits": len(history),
            "acknowledged_commit_not_on_server": len(missing_commit), "server_commit_not_acknowledged": len(extra),
            "acknowledged_twice": len(twice), "acknowledged_line_missing": len(missing_line),
            "unjustified_rejections": len(unjustified), "server_fsck_ok": fsck.returncode == 0,
            "ok": not (missing_commit or extra or twice or missing_line or unjustified) and fsck.returncode == 0}


def summarise(site: Site, w: Window, agents_per_clone: int) -> dict:
    recs = w.records
    acks = [r for r in recs if r["kind"] == "ack"]
    rejs = [r for r in recs if r["kind"] == "rejection"]
    fails = [r for r in recs if r["kind"] == "failed"]
    gave_up = [r for r in recs if r["kind"] == "gave_up"]
    clone_of = {agent_name(i, k): i for i in range(len(site.clones)) for k in range(agents_per_clone)}
    by_clone = [0] * len(site.clones)
    offered_by_clone = [0] * len(site.clones)
    by_agent = Counter({a: 0 for a in clone_of})
    for r in acks:
        by_clone[clone_of[r["agent"]]] += 1
        by_agent[r["agent"]] += 1
    for r in acks + rejs + fails:
        if r["agent"] in clone_of:
            offered_by_clone[clone_of[r["agent"]]] += 1
    lat = [r["seconds"] for r in acks]
    # a task: from its first write() to the one that landed (re-plans after rejections included)
    first: dict[tuple[str, int], float] = {}
    for r in acks + rejs:
        key = (r["agent"], r["task"])
        first[key] = min(first.get(key, r["at"]), r["at"])
    task_lat = [r["at"] + r["seconds"] - first[(r["agent"], r["task"])] for r in acks]
    shared_task = [t for t, r in zip(task_lat, acks, strict=True) if r["shared"]]
    own = [r["seconds"] for r in acks if not r["shared"]]
    shared = [r["seconds"] for r in acks if r["shared"]]
    tasks = {(r["agent"], r["task"]) for r in recs if r.get("task", -1) >= 0}
    landings = [sorted(r["at"] + r["seconds"] for r in acks if clone_of[r["agent"]] == i)
                for i in range(len(site.clones))]
    # a starving clone shows as a long stretch without one of its writes landing
    silent = [max((b - a for a, b in zip([0.0] + ts, ts, strict=False)), default=w.seconds) for ts in landings]
    # ... while every agent was still starting tasks (the schedule's window): after it, one
    # task's re-plans (a shared file, a reservation waited out) can land a clone's last
    # write long after its others, which the stretch above counts too
    in_window = [[t for t in ts if t <= w.seconds] + [w.seconds] for ts in landings]
    silent_window = [max(b - a for a, b in zip([0.0] + ts, ts, strict=False)) for ts in in_window]
    cpu = [r for r in recs if r["kind"] == "cpu"]
    per = max(len(acks), 1)
    cpu_ms = {"agents_python": ms(sum(r["self"] for r in cpu) / per),
              # file://: git runs the server's side as the client's child, so it is in here
              "agents_git_processes": ms(sum(r["children"] for r in cpu) / per),
              "server": ms(w.server_cpu / per) if w.server_cpu is not None else None}
    cpu_ms["total"] = round(sum(v for v in cpu_ms.values() if v is not None), 1)
    return {
        "offered": len(acks) + len(rejs) + len(fails), "landed": len(acks), "rejected": len(rejs),
        "rejected_by_reason": dict(Counter(r["reason"] for r in rejs)),
        "rejected_on_own_file": sum(1 for r in rejs if not r["shared"]),
        "failed": len(fails), "failures": [f"{r['agent']}: {r['error']}: {r['message']}" for r in fails][:10],
        "gave_up": len(gave_up), "agents_killed": w.killed, "tasks": len(tasks),
        "landed_per_s": round(len(acks) / w.seconds, 2),
        "offered_per_s": round((len(acks) + len(rejs) + len(fails)) / w.seconds, 2),
        "landed_by_clone": by_clone, "offered_by_clone": offered_by_clone,
        "clone_min_max": [min(by_clone), max(by_clone)],
        "agent_min_max": [min(by_agent.values()), max(by_agent.values())],
        "longest_silence_by_clone_s": [round(x, 1) for x in silent],
        "longest_silence_in_window_by_clone_s": [round(x, 1) for x in silent_window],
        "most_moves_in_one_write": max((r["cas_retries"] for r in acks), default=0),
        "latency_ms": {"p50": ms(pct(lat, 50)), "p99": ms(pct(lat, 99)), "max": ms(max(lat, default=0)),
                       "own_p50": ms(pct(own, 50)), "own_p99": ms(pct(own, 99)),
                       "shared_p50": ms(pct(shared, 50)), "shared_p99": ms(pct(shared, 99)),
                       "task_p50": ms(pct(task_lat, 50)), "task_p99": ms(pct(task_lat, 99)),
                       "shared_task_p50": ms(pct(shared_task, 50)), "shared_task_p99": ms(pct(shared_task, 99)),
                       "read_p50": ms(pct([r["read_seconds"] for r in acks], 50)),
                       "rejection_p50": ms(pct([r["seconds"] for r in rejs], 50))},
        "reservation_waits": sum(1 for r in acks if r["reservation_wait"] > 0),
        # WriteResult.cas_retries: each time the queued write was moved onto a newer head (its
        # clone's push lost the lease) or dropped and validated again
        "moves": sum(r["cas_retries"] for r in acks),
        "tail_s": round(w.tail, 2),
        "cpu_ms_per_landed_write": cpu_ms,
        "load": {"start": w.load[0], "end": w.load[-1], "mean": round(statistics.fmean(w.load), 2),
                 "cpu_share": round(w.cpu_share, 2)},
    }


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {k: ms(statistics.median(v)) for k, v in samples.items() if v}


def compare(remote_p50: float | None, m: dict[str, float]) -> dict:
    """remote - local at p50 against one fetch + one push (all in ms)."""
    if remote_p50 is None:  # nothing landed
        return {"remote_write_p50": None, "local_write_p50": m["local_write"], "remote_minus_local": None,
                "fetch_plus_push": round(m["git_fetch"] + m["git_push"], 1), "ratio": None}
    extra = round(remote_p50 - m["local_write"], 1)
    bound = round(m["git_fetch"] + m["git_push"], 1)
    out = {"remote_write_p50": remote_p50, "local_write_p50": m["local_write"], "remote_minus_local": extra,
           "fetch_plus_push": bound, "ratio": round(extra / bound, 2) if bound else None}
    if "guard_run" in m:  # a push of storm's ref runs the guard: the bound with it
        guarded = round(bound + m["guard_run"], 1)
        out.update(fetch_plus_guarded_push=guarded, ratio_guarded=round(extra / guarded, 2) if guarded else None)
    return out


# -- one transport ------------------------------------------------------------------------------------
def run_transport(transport: str, args: argparse.Namespace, sshd: loopback.Server | None, log) -> dict:
    agents = [agent_name(i, k) for i in range(args.clones) for k in range(args.agents)]
    with tempfile.TemporaryDirectory(prefix=f"bench-remote-{transport}-", ignore_cleanup_errors=True) as tmp:
        t_setup = time.monotonic()
        site = build_site(tmp, transport, args.clones, agents, not args.no_guard, sshd, not args.lease)
        try:
            probe = Probe(site)
            idle_load = loadavg()
            idle = idle_baseline(probe, args.samples, not args.no_guard)
            setup_s = time.monotonic() - t_setup
            h0 = git(site.srv, "rev-parse", WS)
            w = run_load(site, tmp, args.agents, args, probe)
            out = summarise(site, w, args.agents)
            if args.records:
                with open(args.records, "a") as fh:
                    fh.writelines(json.dumps(dict(r, transport=transport)) + "\n" for r in w.records)
            out["verify"] = verify(site.srv, h0, w.records)
            out["idle"] = {"medians_ms": medians(idle), "load": idle_load, "n": args.samples}
            out["idle"]["compare"] = compare(out["idle"]["medians_ms"]["remote_write"], out["idle"]["medians_ms"])
            out["under_load"] = {"medians_ms": medians(w.probe), "n": len(w.probe["git_push"])}
            out["under_load"]["compare"] = compare(out["latency_ms"]["p50"], out["under_load"]["medians_ms"])
            if probe.guard_cpu:
                out["guard_cpu_ms_p50"] = ms(statistics.median(probe.guard_cpu))
            out["setup_s"] = round(setup_s, 1)
        finally:
            if site.server and transport == "git":
                site.server.stop()
    report(transport, args, out, log)
    return out


def report(transport: str, args: argparse.Namespace, r: dict, log) -> None:
    L = r["latency_ms"]
    v = r["verify"]
    ld = r["load"]
    print(f"\n== {transport}: {args.clones} clones x {args.agents} agents, {args.seconds:.0f} s, gaps "
          f"{args.min_gap:g}-{args.max_gap:g} s, shared file {args.share:.0%} ==", file=log)
    print(f"offered {r['offered']} ({r['offered_per_s']}/s), landed {r['landed']} ({r['landed_per_s']}/s), "
          f"rejected {r['rejected']}{' ' + str(r['rejected_by_reason']) if r['rejected'] else ''} "
          f"({r['rejected_on_own_file']} on an own file), "
          f"failed {r['failed']}, gave up {r['gave_up']}", file=log)
    for f in r["failures"]:
        print(f"    FAILED {f}", file=log)
    print(f"landed by clone {' / '.join(map(str, r['landed_by_clone']))} (min {r['clone_min_max'][0]}, max "
          f"{r['clone_min_max'][1]}); by agent min {r['agent_min_max'][0]}, max {r['agent_min_max'][1]}; longest "
          f"stretch without a landing, by clone: {' / '.join(f'{x:.0f}' for x in r['longest_silence_by_clone_s'])} s "
          f"(in the schedule's window: {' / '.join(f'{x:.0f}' for x in r['longest_silence_in_window_by_clone_s'])} s)",
          file=log)
    print(f"landed write latency: p50 {fmt(L['p50'])} ms, p99 {fmt(L['p99'])} ms, max {fmt(L['max'])} ms (own file "
          f"p50 {fmt(L['own_p50'])} / p99 {fmt(L['own_p99'])}; shared file p50 {fmt(L['shared_p50'])} / p99 "
          f"{fmt(L['shared_p99'])}); a task, its re-plans included, p50 {fmt(L['task_p50'])} / p99 "
          f"{fmt(L['task_p99'])} ms; a rejection p50 {fmt(L['rejection_p50'])} ms; read p50 {fmt(L['read_p50'])} ms; "
          f"{r['reservation_waits']} waited on a reservation; writes moved onto a newer head {r['moves']} times (at "
          f"most {r['most_moves_in_one_write']} in one write); tail {r['tail_s']} s", file=log)
    print(f"load: loadavg {ld['start']} -> {ld['end']} (mean {ld['mean']}), machine CPU busy {ld['cpu_share']:.0%}",
          file=log)
    for name, part in (("idle", r["idle"]), ("under load", r["under_load"])):
        m, c = part["medians_ms"], part["compare"]
        print(f"{name} (medians, n={part['n']}): local write {m['local_write']:.1f} ms, "
              + (f"remote write {m['remote_write']:.1f} ms, " if "remote_write" in m else
                 f"remote write p50 {fmt(c['remote_write_p50'])} ms (the agents), ")
              + f"git fetch {m['git_fetch']:.1f} ms, git push {m['git_push']:.1f} ms"
              + (f", the guard's run {m['guard_run']:.1f} ms" if "guard_run" in m else "")
              + f": remote - local {fmt(c['remote_minus_local'])} ms vs fetch + push {c['fetch_plus_push']:.1f} ms = "
              f"{c['ratio']} x" + (f"; vs fetch + push + guard {c['fetch_plus_guarded_push']:.1f} ms = "
                                   f"{c['ratio_guarded']} x" if "ratio_guarded" in c else ""), file=log)
    if "guard_cpu_ms_p50" in r:
        print(f"the server's guard (in every storm push, not in the bare push): {r['guard_cpu_ms_p50']:.0f} ms of CPU "
              f"per run (median)", file=log)
    c = r["cpu_ms_per_landed_write"]
    print(f"CPU per landed write: {c['total']:.0f} ms = agents' Python {c['agents_python']:.0f} + their git processes "
          f"{c['agents_git_processes']:.0f}" + (f" + server {c['server']:.0f}" if c["server"] is not None else
                                                " (the server's side included: file://)"), file=log)
    print(f"server check: {v['acknowledged']} acknowledged, {v['server_commits']} commits on {WS}; "
          f"{'all there, nothing else, every rejection justified' if v['ok'] else 'PROBLEM: ' + json.dumps(v)}",
          file=log)


def baseline_rows(label: str, key: str) -> list[tuple[str, Callable[[dict], str]]]:
    """The table's rows comparing remote - local with the plain baseline (idle or under load)."""
    def m(r: dict) -> dict:
        return r[key]["medians_ms"]

    def c(r: dict) -> dict:
        return r[key]["compare"]

    return [(f"{label}: remote - local p50", lambda r: f"{fmt(c(r)['remote_minus_local'])} ms"),
            (f"{label}: git fetch + git push",
             lambda r: f"{m(r)['git_fetch']:.0f} + {m(r)['git_push']:.0f} = {c(r)['fetch_plus_push']:.0f} ms "
                       f"({c(r)['ratio']} x)"),
            (f"{label}: the guard's run", lambda r: f"{fmt(m(r).get('guard_run'))} ms"),
            (f"{label}: remote - local / (fetch + push + guard)", lambda r: f"{c(r).get('ratio_guarded', '-')} x")]


def table(results: dict[str, dict]) -> str:
    rows = [("offered / landed / rejected / failed",
             lambda r: f"{r['offered']} / {r['landed']} / {r['rejected']} / {r['failed']}"),
            ("rejection reasons", lambda r: ", ".join(f"{k} {v}" for k, v in r["rejected_by_reason"].items()) or "-"),
            ("landed per clone, min / max", lambda r: f"{r['clone_min_max'][0]} / {r['clone_min_max'][1]}"),
            ("a clone's longest stretch without a landing",
             lambda r: f"{max(r['longest_silence_by_clone_s']):.0f} s"),
            ("... in the schedule's window",
             lambda r: f"{max(r['longest_silence_in_window_by_clone_s']):.0f} s"),
            ("writes moved onto a newer head (most in one write)",
             lambda r: f"{r['moves']} ({r['most_moves_in_one_write']})"),
            ("write latency p50 / p99", lambda r: f"{fmt(r['latency_ms']['p50'])} / {fmt(r['latency_ms']['p99'])} ms"),
            ("a task, re-plans included, p50 / p99",
             lambda r: f"{fmt(r['latency_ms']['task_p50'])} / {fmt(r['latency_ms']['task_p99'])} ms"),
            ("own file p50 / p99",
             lambda r: f"{fmt(r['latency_ms']['own_p50'])} / {fmt(r['latency_ms']['own_p99'])} ms"),
            ("shared file p50 / p99",
             lambda r: f"{fmt(r['latency_ms']['shared_p50'])} / {fmt(r['latency_ms']['shared_p99'])} ms"),
            ("a shared-file task, re-plans included, p50 / p99",
             lambda r: f"{fmt(r['latency_ms']['shared_task_p50'])} / {fmt(r['latency_ms']['shared_task_p99'])} ms"),
            *baseline_rows("under load", "under_load"), *baseline_rows("idle", "idle"),
            ("guard CPU per run (median)",
             lambda r: f"{r['guard_cpu_ms_p50']:.0f} ms" if "guard_cpu_ms_p50" in r else "-"),
            ("CPU per landed write (storm + git, both sides)",
             lambda r: f"{r['cpu_ms_per_landed_write']['total']:.0f} ms"),
            ("every ack on the server", lambda r: "yes" if r["verify"]["ok"] else "NO"),
            ("load (1-min avg, start / mean / end)",
             lambda r: f"{r['load']['start']} / {r['load']['mean']} / {r['load']['end']}")]
    names = list(results)
    out = ["| | " + " | ".join(f"`{n}://`" if n != "file" else "`file://`" for n in names) + " |",
           "|---|" + "---|" * len(names)]
    for label, f in rows:
        out.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--clones", type=int, default=None, help="clones joined to the server (default 8; --quick 3)")
    ap.add_argument("--agents", type=int, default=4, help="agent processes per clone (default 4)")
    ap.add_argument("--seconds", type=float, default=None, help="length of the agents' schedule (default 60; "
                                                                "--quick 15)")
    ap.add_argument("--min-gap", type=float, default=1.0,
                    help="shortest wait (s) from the end of an agent's write to its next")
    ap.add_argument("--max-gap", type=float, default=3.0,
                    help="longest wait (s) from the end of an agent's write to its next")
    ap.add_argument("--share", type=float, default=0.1, help="probability that a write goes to the shared file")
    ap.add_argument("--seed", type=int, default=1, help="seed of every agent's schedule and choices")
    ap.add_argument("--max-replans", type=int, default=5, help="re-plans after rejections before an agent gives up")
    ap.add_argument("--samples", type=int, default=None, help="idle baseline rounds (default 15; --quick 5)")
    ap.add_argument("--transports", default=",".join(TRANSPORTS), help="any of file,git,ssh (default all three; "
                                                                       "ssh needs sshd, see loopback.py)")
    ap.add_argument("--no-guard", action="store_true", help="no storm hooks on the server (clones race for the lease)")
    ap.add_argument("--lease", action="store_true", help="the guard without the server's ordering of writes "
                                                         "(server-hook install --no-order): clones race for the lease")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 clones, 15 s, 5 idle rounds")
    ap.add_argument("--json", action="store_true", help="JSON on stdout, the report on stderr")
    ap.add_argument("--records", metavar="FILE", help="also write every agent's records (JSON lines, one per "
                                                      "offered write, with its transport) to FILE")
    args = ap.parse_args()
    args.clones = args.clones or (3 if args.quick else 8)
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    args.samples = args.samples or (5 if args.quick else 15)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports or not 0 <= args.share <= 1 or not 0 < args.min_gap <= args.max_gap:
        ap.error(f"bad --transports {bad}" if bad else "need 0 <= --share <= 1 and 0 < --min-gap <= --max-gap")
    log = sys.stderr if args.json else sys.stdout
    commit = git(ROOT, "rev-parse", "--short", "HEAD", check=False)
    dirty = bool(git(ROOT, "status", "--porcelain", "--untracked-files=no", check=False))
    meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "commit": commit + ("+" if dirty else ""),
            "git": git(ROOT, "--version"), "cpus": os.cpu_count(), "clones": args.clones, "agents": args.agents,
            "seconds": args.seconds, "gaps": [args.min_gap, args.max_gap], "share": args.share, "seed": args.seed,
            "guard": not args.no_guard, "order": not (args.no_guard or args.lease), "tmpdir": tempfile.gettempdir(),
            "argv": sys.argv[1:]}
    print(f"bench_remote at {meta['commit']}, {meta['git']}, {meta['cpus']} CPUs, {meta['date_utc']} UTC, "
          f"TMPDIR {meta['tmpdir']}", file=log)
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    sshd = None
    with tempfile.TemporaryDirectory(prefix="bench-remote-sshd-", ignore_cleanup_errors=True) as sshhome:
        try:
            if "ssh" in transports:
                try:
                    sshd = loopback.start_sshd("/", sshhome)
                    meta["ssh"] = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
                except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                    skipped["ssh"] = str(exc)
                    print(f"ssh skipped: {exc}", file=log)
            for t in transports:
                if t in skipped:
                    continue
                saved = os.environ.get("GIT_SSH_COMMAND")
                if t == "ssh":  # the clones' git and storm's git subprocesses inherit it
                    os.environ["GIT_SSH_COMMAND"] = sshd.ssh_command
                try:
                    results[t] = run_transport(t, args, sshd, log)
                finally:
                    if saved is None:
                        os.environ.pop("GIT_SSH_COMMAND", None)
                    else:
                        os.environ["GIT_SSH_COMMAND"] = saved
        finally:
            if sshd:
                sshd.stop()
    if results:
        print("\n" + table(results), file=log)
    if args.json:
        print(json.dumps({"meta": meta, "skipped": skipped, "transports": results}, indent=2))
    bad_runs = [t for t, r in results.items() if r["failed"] or not r["verify"]["ok"]]
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
