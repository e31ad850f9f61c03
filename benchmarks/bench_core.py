#!/usr/bin/env python3
"""Core performance benchmark of git storm (storm mode): read, write, CLI, throughput.

Not a test: it asserts nothing about timing. It prints medians and p90s, each
with its ratio against a baseline measured in the same run, then a markdown
table of the targets with MET / NOT MET. See benchmarks/README.md.

    python3 benchmarks/bench_core.py                      # 1k, 10k, 100k files
    python3 benchmarks/bench_core.py --quick              # smoke run: 1k, 10k, fewer iterations
    python3 benchmarks/bench_core.py --sizes 1000,100000 --workdir ~/.cache/storm-bench --json
    python3 benchmarks/bench_core.py --only cli --sizes 1000,10000   # the command-line rows only

Repositories are built once per size (git fast-import + one checkout) under
--workdir and reused; each run resets their storm state first.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

BUILD_VERSION = "1"          # bump when the repository layout below changes
MIN_PER_DIR, MAX_PER_DIR = 20, 50
N_WORKERS = 8
FILES_PER_WORKER = 4

LOG = sys.stdout             # human output; stderr when --json


def log(msg: str = "") -> None:
    print(msg, file=LOG, flush=True)


# ----------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------
def stats(samples_s: list[float]) -> dict[str, float]:
    """Median, p10 and p90 (nearest rank), min, max, in milliseconds."""
    xs = sorted(samples_s)
    if not xs:
        nan = float("nan")
        return {"n": 0, "median_ms": nan, "p10_ms": nan, "p90_ms": nan, "min_ms": nan, "max_ms": nan}

    def rank(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] * 1e3

    return {"n": len(xs), "median_ms": statistics.median(xs) * 1e3, "p10_ms": rank(0.1), "p90_ms": rank(0.9),
            "min_ms": xs[0] * 1e3, "max_ms": xs[-1] * 1e3}


def fmt(st: dict[str, Any]) -> str:
    if "error" in st:
        return f"FAILED: {st['error']}"
    return f"median {st['median_ms']:8.2f} ms   p90 {st['p90_ms']:8.2f} ms   (n={st['n']})"


def fmt_cli(st: dict[str, Any], bases: list[tuple[dict[str, Any], str]] | None = None) -> str:
    """A command-line row: the median with its spread over the runs, and the ratio to git in the same run.

    Process start-up dominates these and swings with machine load (the same
    command measured 125 ms on one run and 160-310 ms on another), so the spread
    and the ratio are the figures to compare, not the absolute milliseconds.
    """
    if "error" in st:
        return f"FAILED: {st['error']}"
    out = (f"median {st['median_ms']:6.0f} ms  p10-p90 {st['p10_ms']:4.0f}-{st['p90_ms']:<4.0f} ms  "
           f"min-max {st['min_ms']:4.0f}-{st['max_ms']:<4.0f} ms  (n={st['n']})")
    for base, what in bases or []:
        if "error" not in base:
            out += f"  = {ratio(st['median_ms'], base['median_ms']):5.1f}x {what}"
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def vs(a: dict[str, Any], b: dict[str, Any], what: str) -> str:
    """'= 1.23x what' when both figures exist."""
    if "error" in a or "error" in b:
        return ""
    return f"   = {ratio(a['median_ms'], b['median_ms']):5.2f}x {what}"


# ----------------------------------------------------------------------------
# building the repositories
# ----------------------------------------------------------------------------
def git(repo: str, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["git", *args], cwd=repo, input=input, capture_output=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {r.stderr.decode(errors='replace')}")
    return r


def layout(n: int) -> list[str]:
    """``n`` file paths like a real project: 3 directory levels, 20-50 files per
    leaf directory, an ``__init__.py`` in upper directories, a few top-level files."""
    leaves_needed = max(1, n // ((MIN_PER_DIR + MAX_PER_DIR) // 2))
    b = max(2, math.ceil(leaves_needed ** (1 / 3)))
    top = ["README.md", "pyproject.toml", ".gitignore", "Makefile"]
    paths = list(top)
    leaf_dirs = []
    for i in range(b ** 3):
        a, m, s = i // (b * b), (i // b) % b, i % b
        leaf_dirs.append(f"pkg{a:02d}/mod{m:02d}/sub{s:02d}")
    uppers = sorted({d.rsplit("/", 1)[0] for d in leaf_dirs} | {d.split("/", 1)[0] for d in leaf_dirs})
    paths += [f"{u}/__init__.py" for u in uppers]
    i = 0
    while len(paths) < n:
        d = leaf_dirs[i % len(leaf_dirs)]
        k = MIN_PER_DIR + (i * 2654435761 % (MAX_PER_DIR - MIN_PER_DIR + 1))
        for j in range(k):
            if len(paths) >= n:
                break
            paths.append(f"{d}/file_{j:03d}.py")
        i += 1
        if i >= len(leaf_dirs):  # pragma: no cover - b is chosen large enough
            break
    return paths[:n]


def content_for(path: str) -> bytes:
    h = sum(path.encode()) % 97
    body = "".join(f"    value_{k} = compute({k}, '{path}')  # line {k}\n" for k in range(8 + h % 8))
    return (f'"""Module {path}."""\n\n\ndef function_{h}(x):\n{body}    return x\n').encode()


def build_repo(workdir: str, n: int) -> tuple[str, list[str]]:
    """A repository of ``n`` files with a checked-out working tree; cached under workdir."""
    repo = os.path.join(workdir, f"repo-{n}")
    marker = os.path.join(repo, ".git", "storm-bench-built")
    paths = layout(n)
    if os.path.exists(marker):
        with open(marker) as fh:
            if fh.read().split()[0] == BUILD_VERSION:
                return repo, paths
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    t0 = time.perf_counter()
    git(repo, "init", "-q", "-b", "main")
    for k, v in (("user.name", "bench"), ("user.email", "bench@storm.invalid"), ("gc.auto", "0"),
                 ("maintenance.auto", "false"), ("commit.gpgSign", "false")):
        git(repo, "config", k, v)
    chunks = []
    chunks.append(b"commit refs/heads/main\ncommitter bench <bench@storm.invalid> 1700000000 +0000\n"
                  b"data 5\nbase\n")
    for p in paths:
        data = content_for(p)
        chunks.append(b"M 100644 inline %s\ndata %d\n%s\n" % (p.encode(), len(data), data))
    chunks.append(b"\n")
    git(repo, "fast-import", "--quiet", input=b"".join(chunks))
    t1 = time.perf_counter()
    git(repo, "reset", "-q", "--hard", "main")   # the one real checkout of all files
    t2 = time.perf_counter()
    base = git(repo, "rev-parse", "main").stdout.decode().strip()
    with open(marker, "w") as fh:
        fh.write(f"{BUILD_VERSION} {base}\n")
    log(f"  built {n} files: fast-import {t1 - t0:.1f}s, checkout {t2 - t1:.1f}s")
    return repo, paths


def reset_repo(repo: str) -> str:
    """Bring a cached repository back to its built state and (re)initialise storm."""
    with open(os.path.join(repo, ".git", "storm-bench-built")) as fh:
        base = fh.read().split()[1]
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/storm", "refs/notes", "refs/bench").stdout.decode()
    stdin = "".join(f"delete {r}\n" for r in refs.split())
    stdin += f"update refs/heads/main {base}\n"
    git(repo, "update-ref", "--stdin", input=stdin.encode())
    git(repo, "config", "--unset-all", "core.hooksPath", check=False)  # set by BUILD_VERSION 1 builds
    git(repo, "reset", "-q", "--hard", base)
    # Drop the loose objects of earlier runs (nothing references them any more and
    # nothing else writes to this private repository), so every run starts alike.
    git(repo, "prune", "--expire=now")
    shutil.rmtree(os.path.join(repo, ".git", "storm"), ignore_errors=True)
    from storm_git import init
    from storm_git.core.store import Store

    init(Store.discover(repo))
    return base


# ----------------------------------------------------------------------------
# in-process measurements
# ----------------------------------------------------------------------------
def floor_cycle(repo, refname: str, path: str, content: bytes) -> None:
    """The bare pygit2 write: blob + trees along the path + commit + CAS of a ref."""
    import pygit2

    ref = repo.lookup_reference(refname)
    head = ref.target
    parts = path.split("/")
    trees = [repo[head].tree]
    for part in parts[:-1]:
        trees.append(repo[trees[-1][part].id])
    oid, mode = repo.create_blob(content), pygit2.GIT_FILEMODE_BLOB
    for i in range(len(parts) - 1, -1, -1):
        tb = repo.TreeBuilder(trees[i])
        tb.insert(parts[i], oid, mode)
        oid, mode = tb.write(), pygit2.GIT_FILEMODE_TREE
    sig = pygit2.Signature("floor", "floor@bench.invalid")
    new = repo.create_commit(None, sig, sig, "floor\n", oid, [head])
    for _ in range(200):  # git pack-refs (storm's maintenance) holds each ref's lock for moments
        try:
            ref.set_target(new, "bench floor")
            return
        except OSError as exc:
            if "lock" not in str(exc):
                raise
            time.sleep(0.001)
    ref.set_target(new, "bench floor")


def floor_cycle_with_disk(repo, refname: str, path: str, content: bytes) -> None:
    """The bare cycle plus what any tool that keeps a working tree must add: the
    file written to disk, the way git's checkout writes it (unlink, then create:
    the cheapest way, not atomic for readers). Storm's write does this atomically
    and checks each directory; the bare cycle alone writes no file."""
    floor_cycle(repo, refname, path, content)
    # beside the file, not over it: over it, storm would see an edit made outside
    # it and (rightly) keep it instead of writing its own next version
    full = os.path.join(repo.workdir, path + ".floor-copy")
    try:
        os.unlink(full)
    except FileNotFoundError:
        pass
    with open(full, "xb") as f:
        f.write(content)


def pick(paths: list[str], k: int, offset: int = 0) -> list[str]:
    """``k`` leaf files spread over the tree (distinct directories where possible)."""
    leaf = [p for p in paths if p.count("/") == 3]
    step = max(1, len(leaf) // (k + 1))
    return [leaf[(offset + (i + 1) * step) % len(leaf)] for i in range(k)]


def bench_inprocess(repo: str, paths: list[str], it: dict[str, int]) -> dict[str, Any]:
    import pygit2

    from storm_git import open_workspace

    ws = open_workspace(repo)
    res: dict[str, Any] = {}

    # open cost (what every CLI call pays before doing anything)
    samples = []
    for _ in range(it["open"]):
        t = time.perf_counter()
        w = open_workspace(repo)
        w.head()
        samples.append(time.perf_counter() - t)
    res["open_workspace"] = stats(samples)

    # 1. read: a path the agent has not read yet (its read set grows: one notes commit)
    pool = pick(paths, it["read"], offset=1)
    samples = []
    for p in pool:
        t = time.perf_counter()
        ws.read([p], agent="bench-reader")
        samples.append(time.perf_counter() - t)
    res["read_new"] = stats(samples)
    # ... and a re-read at the same head (read-set note unchanged: no notes commit)
    samples = []
    for _ in range(it["read"]):
        t = time.perf_counter()
        ws.read([pool[0]], agent="bench-reader")
        samples.append(time.perf_counter() - t)
    res["read_again"] = stats(samples)
    # baseline: the bare lookup of the blob at the head (what a read must at least do)
    samples = []
    r = pygit2.Repository(repo)
    for p in pool:
        t = time.perf_counter()
        r[r[r.lookup_reference("refs/storm/workspace").target].tree[p].id].data
        samples.append(time.perf_counter() - t)
    res["read_floor"] = stats(samples)

    # 2 + 3. write by an agent that has read the file, interleaved with the floor
    target = pick(paths, 1, offset=7)[0]
    [rr] = ws.read([target], agent="bench-writer")
    base = rr.content
    r.references.create("refs/bench/floor", r.lookup_reference("refs/storm/workspace").target)
    w_s, f_s = [], []
    for i in range(it["write"]):
        c = base + b"# storm write %d\n" % i
        t = time.perf_counter()
        out = ws.write(target, c, agent="bench-writer")
        w_s.append(time.perf_counter() - t)
        if not out.accepted:
            raise RuntimeError(f"benchmark write rejected: {out.rejection.text}")
        t = time.perf_counter()
        floor_cycle(r, "refs/bench/floor", target, base + b"# floor write %d\n" % i)
        f_s.append(time.perf_counter() - t)
    res["write"] = stats(w_s)
    res["floor"] = stats(f_s)

    # the same write by an agent holding a read set of 50 files (validation grows with it)
    target2 = pick(paths, 1, offset=11)[0]
    ws.read(pick(paths, 49, offset=13), agent="bench-writer50")
    [rr] = ws.read([target2], agent="bench-writer50")
    samples = []
    for i in range(it["write"] // 2):
        t = time.perf_counter()
        out = ws.write(target2, rr.content + b"# w50 %d\n" % i, agent="bench-writer50")
        samples.append(time.perf_counter() - t)
        assert out.accepted
    res["write_readset50"] = stats(samples)
    return res


# ----------------------------------------------------------------------------
# phase breakdown: wrappers installed from outside (no library change)
# ----------------------------------------------------------------------------
class PhaseProfiler:
    """A tiny hierarchical profiler: wrapped functions record inclusive time per call path."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.total: dict[tuple[str, ...], float] = defaultdict(float)
        self.calls: dict[tuple[str, ...], int] = defaultdict(int)
        self.undo: list[Callable[[], None]] = []

    def _enter(self, label: str) -> tuple[tuple[str, ...], float]:
        self.stack.append(label)
        return tuple(self.stack), time.perf_counter()

    def _exit(self, key: tuple[str, ...], t0: float) -> None:
        self.total[key] += time.perf_counter() - t0
        self.calls[key] += 1
        self.stack.pop()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:  # a phase of an older (or newer) revision: nothing to time
            return
        prof = self

        def wrapper(*a, **kw):
            key, t0 = prof._enter(label)
            try:
                return orig(*a, **kw)
            finally:
                prof._exit(key, t0)

        setattr(owner, name, wrapper)
        self.undo.append(lambda: setattr(owner, name, orig))

    def wrap_cm(self, owner: Any, name: str) -> None:
        """Wrap a context manager factory (``flocked``): time held, labelled by lock name."""
        orig = getattr(owner, name)
        prof = self

        @contextlib.contextmanager
        def wrapper(commondir, lockname):
            label = f"lock[{lockname.split('-')[0]}] (acquire + held)"
            key, t0 = prof._enter(label)
            try:
                with orig(commondir, lockname):
                    yield
            finally:
                prof._exit(key, t0)

        setattr(owner, name, wrapper)
        self.undo.append(lambda: setattr(owner, name, orig))

    def restore(self) -> None:
        for u in reversed(self.undo):
            u()
        self.undo.clear()

    def report(self, root: tuple[str, ...], n: int) -> list[dict[str, Any]]:
        tot = self.total[root]
        rows = []

        def walk(key: tuple[str, ...], depth: int) -> None:
            kids = sorted((k for k in self.total if len(k) == len(key) + 1 and k[:len(key)] == key),
                          key=lambda k: -self.total[k])
            rows.append({"phase": "  " * depth + key[-1], "ms_per_write": self.total[key] / n * 1e3,
                         "calls_per_write": self.calls[key] / n, "pct": 100 * self.total[key] / tot})
            for k in kids:
                walk(k, depth + 1)
            if kids:
                own = self.total[key] - sum(self.total[k] for k in kids)
                rows.append({"phase": "  " * (depth + 1) + "(rest, not in a wrapped call)",
                             "ms_per_write": own / n * 1e3, "calls_per_write": None, "pct": 100 * own / tot})

        walk(root, 0)
        return rows


def install_phases(prof: PhaseProfiler) -> None:
    import storm_git.core.locks as locks
    import storm_git.core.notes as notes
    import storm_git.core.readsets as readsets
    import storm_git.core.reservations as reservations
    import storm_git.core.store as store
    import storm_git.disk.safe_fs as safe_fs
    import storm_git.disk.sync as disk_sync
    import storm_git.storm.validate as validate
    import storm_git.storm.workspace as workspace
    import storm_git.storm.write as write

    SW, St = workspace.SharedWorkspace, store.Store
    prof.wrap(SW, "write", "SharedWorkspace.write")
    prof.wrap(SW, "read", "SharedWorkspace.read")
    prof.wrap(SW, "path", "path checks (normalize + check_on_disk)")
    prof.wrap(SW, "check_size", "check_size (reads git config)")
    prof.wrap(SW, "head_ref", "head ref lookup")
    prof.wrap(validate, "verdict", "validate read set (validate.verdict)")
    prof.wrap(St, "config_int", "config read (repo.config)")
    prof.wrap(St, "write_blob", "write_blob")
    prof.wrap(St, "tree_with", "rebuild trees (tree_with)")
    prof.wrap(St, "make_commit", "create commit")
    prof.wrap(St, "cas", "CAS set_target")
    prof.wrap(St, "ref", "ref lookup")
    prof.wrap(St, "entry", "tree entry lookup")
    import storm_git.core.intents as intents

    prof.wrap(readsets, "load", "readsets.load (whole read set)")
    prof.wrap(readsets, "load_view", "readsets.load_view (journal + notes)")
    prof.wrap(readsets, "record_write", "readsets.record_write (journal append)")
    prof.wrap(readsets, "fold", "readsets.fold (notes commit)")
    prof.wrap(reservations, "live_on", "reservation check (batch)")
    prof.wrap(intents, "flag_write", "intents.flag_write")
    prof.wrap(write, "flag_storm_write", "assignment flag")
    prof.wrap(validate, "verdict_at", "validate under the lock (validate.verdict_at)")
    prof.wrap(readsets, "record", "readsets.record (notes)")
    prof.wrap(notes, "update_notes", "notes commit (update_notes)")
    prof.wrap(reservations, "get", "reservation check")
    prof.wrap(write, "materialize", "materialize to disk")
    prof.wrap(safe_fs, "disk_oid", "hash file on disk (disk_oid)")
    prof.wrap(safe_fs, "write_file", "write file + rename")
    for mod in (write, readsets, disk_sync):
        prof.wrap_cm(mod, "flocked")

    class _Fcntl:  # time the flock() syscall (waiting) separately
        def __getattr__(self, name):
            return getattr(_real_fcntl, name)

    import fcntl as _real_fcntl
    proxy = _Fcntl()
    proxy.flock = _real_fcntl.flock  # type: ignore[attr-defined]
    locks.fcntl = proxy  # type: ignore[assignment]
    prof.wrap(proxy, "flock", "flock() wait")
    prof.undo.append(lambda: setattr(locks, "fcntl", _real_fcntl))


def bench_profile(repo: str, paths: list[str], n: int, cprof_n: int) -> dict[str, Any]:
    from storm_git import open_workspace

    ws = open_workspace(repo)
    target = pick(paths, 1, offset=17)[0]
    [rr] = ws.read([target], agent="bench-prof")
    pool = pick(paths, n // 2, offset=19)
    prof = PhaseProfiler()
    install_phases(prof)
    try:
        for i in range(n):
            ws.write(target, rr.content + b"# prof %d\n" % i, agent="bench-prof")
        for p in pool:  # reads of paths new to the agent's read set
            ws.read([p], agent="bench-prof-reader")
    finally:
        prof.restore()
    phases = prof.report(("SharedWorkspace.write",), n)
    read_phases = prof.report(("SharedWorkspace.read",), len(pool))

    pr = cProfile.Profile()
    pr.enable()
    for i in range(cprof_n):
        ws.write(target, rr.content + b"# cprof %d\n" % i, agent="bench-prof")
    pr.disable()
    st = pstats.Stats(pr)
    total = sum(v[2] for v in st.stats.values())  # total tottime
    rows = []
    for (fn, line, name), (cc, nc, tt, ct, _callers) in st.stats.items():
        short = f"{os.path.basename(fn)}:{line}({name})" if fn != "~" else name
        rows.append({"function": short, "calls_per_write": nc / cprof_n, "tottime_ms_per_write": tt / cprof_n * 1e3,
                     "pct_tottime": 100 * tt / total, "cumtime_ms_per_write": ct / cprof_n * 1e3})
    rows.sort(key=lambda r: -r["tottime_ms_per_write"])
    return {"writes": n, "phases": phases, "reads": len(pool), "read_phases": read_phases, "cprofile_writes": cprof_n,
            "cprofile_total_ms_per_write": total / cprof_n * 1e3, "cprofile_top": rows[:18]}


# ----------------------------------------------------------------------------
# command-line measurements
# ----------------------------------------------------------------------------
def entry_script() -> str | None:
    import sysconfig

    p = os.path.join(sysconfig.get_path("scripts"), "git-storm")
    return p if os.path.exists(p) else None


def timed_run(cmd: list[str], cwd: str, input: bytes | None = None, env: dict | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')[:400]}")
    return dt


def bench_cli(repo: str, paths: list[str], it: dict[str, int]) -> dict[str, Any]:
    from storm_git import open_workspace

    env = dict(os.environ)
    env.pop("STORM_AGENT", None)
    ws = open_workspace(repo)
    target = pick(paths, 1, offset=23)[0]
    [rr] = ws.read([target], agent="bench-cli")
    gfile = pick(paths, 1, offset=29)[0]
    with open(os.path.join(repo, gfile), "rb") as fh:
        gbase = fh.read()
    direct = entry_script()
    # plain git: without the hooks git storm init installs (its pre-commit refuses
    # engineers' commits in storm mode, and a Python hook would be a different baseline)
    nohooks = os.path.join(os.path.dirname(repo), "no-hooks")
    os.makedirs(nohooks, exist_ok=True)
    series: dict[str, list[float]] = {"storm_write": [], "storm_write_direct": [], "git_add_commit": []}
    errors: dict[str, str] = {}

    def attempt(key: str, fn: Callable[[], float]) -> None:
        if key in errors:
            return
        try:
            series[key].append(fn())
        except RuntimeError as exc:  # the library is a moving target: report, go on
            errors[key] = str(exc).replace("\n", " ")[:300]

    def git_cycle(i: int) -> float:
        with open(os.path.join(repo, gfile), "wb") as fh:
            fh.write(gbase + b"# git %d\n" % i)
        t = time.perf_counter()
        timed_run(["git", "add", gfile], repo)
        timed_run(["git", "-c", f"core.hooksPath={nohooks}", "commit", "-q", "-m", "x"], repo)
        return time.perf_counter() - t

    for i in range(it["cli"]):
        attempt("storm_write", lambda: timed_run(["git", "storm", "write", target, "--agent", "bench-cli"], repo,
                                                 input=rr.content + b"# cli %d\n" % i, env=env))
        if direct:
            attempt("storm_write_direct", lambda: timed_run([direct, "write", target, "--agent", "bench-cli"], repo,
                                                            input=rr.content + b"# cli direct %d\n" % i, env=env))
        attempt("git_add_commit", lambda: git_cycle(i))
    res: dict[str, Any] = {}
    for k, v in series.items():
        if k == "storm_write_direct" and not direct:
            continue
        res[k] = {"error": errors[k]} if k in errors else stats(v)

    # start-up: status and read (a re-read: no notes commit after the first)
    rpath = pick(paths, 1, offset=31)[0]
    cmds = {"storm_status": ["git", "storm", "status"],
            "git_status": ["git", "status", "--porcelain"],  # the same kind of scan, by git
            "storm_read": ["git", "storm", "read", rpath, "--agent", "bench-cli-reader"],
            "git_show": ["git", "show", f"HEAD:{rpath}"],  # git's own read of a committed file
            # the floor of any Python command that uses pygit2, under the same load
            "python_pygit2": [sys.executable, "-c", "import pygit2"]}
    samples: dict[str, list[float]] = {k: [] for k in cmds}
    failed: dict[str, str] = {}
    for _ in range(it["startup"]):
        for k, cmd in cmds.items():
            if k in failed:
                continue
            try:
                samples[k].append(timed_run(cmd, repo, env=env))
            except RuntimeError as exc:  # the library is a moving target: report, go on
                failed[k] = str(exc).replace("\n", " ")[:300]
    for k in cmds:
        res[k] = {"error": failed[k]} if k in failed else stats(samples[k])
    return res


def bench_startup_floor(repo: str, n: int) -> dict[str, Any]:
    """Size-independent costs every CLI call pays: interpreter, imports, launcher."""
    py = sys.executable
    out = {}
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import pygit2'": [py, "-c", "import pygit2"],
        "python -c 'import storm_git.cli.main' (all imports)": [py, "-c", "import storm_git.cli.main"],
        "git storm -h (git + launcher + click)": ["git", "storm", "-h"],
    }
    d = entry_script()
    if d:
        cases["git-storm -h (entry script: no git, no launcher)"] = [d, "-h"]
    for name, cmd in cases.items():
        out[name] = stats([timed_run(cmd, repo) for _ in range(n)])
    return out


# ----------------------------------------------------------------------------
# throughput: 8 writer processes
# ----------------------------------------------------------------------------
def worker_main(argv: list[str]) -> None:
    """``--worker REPO AGENT N PATH...``: read PATHs, wait for 'go', write N times, print JSON.

    An AGENT named ``floor-…`` runs the bare cycle instead (:func:`floor_cycle` on
    ``refs/bench/floor-tp``, each one under an exclusive flock on a file in the git
    directory, as storm serialises its writers): the most any writer serialised on one
    ref can land on this machine, measured beside storm's writers."""
    repo, agent, n, files = argv[0], argv[1], int(argv[2]), argv[3:]
    bare = agent.startswith("floor-")
    if bare:
        import fcntl

        import pygit2

        r = pygit2.Repository(repo)
        base = {p: r.revparse_single(f"refs/bench/floor-tp:{p}").data for p in files}
        lock = os.open(os.path.join(r.path, "bench-floor-tp.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    else:
        from storm_git import open_workspace

        ws = open_workspace(repo)
        base = {r.path: r.content for r in ws.read(files, agent=agent)}
    print("ready", flush=True)
    sys.stdin.readline()
    lat, acc, rej, retries = [], 0, 0, 0
    t0 = time.monotonic()
    for i in range(n):
        p = files[i % len(files)]
        content = base[p] + b"# %s %d\n" % (agent.encode(), i)
        t = time.perf_counter()
        if bare:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                floor_cycle(r, "refs/bench/floor-tp", p, content)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
            acc += 1
        else:
            res = ws.write(p, content, agent=agent)
            acc += res.accepted
            rej += not res.accepted
            retries += res.cas_retries
        lat.append(time.perf_counter() - t)
    t1 = time.monotonic()
    print(json.dumps({"t0": t0, "t1": t1, "lat": lat, "accepted": acc, "rejected": rej, "retries": retries}),
          flush=True)


def bench_throughput(repo: str, paths: list[str], procs: int, writes: int, *, bare: bool = False) -> dict[str, Any]:
    """``procs`` writer processes on disjoint files; ``bare``: the bare cycle under one flock
    (see :func:`worker_main`) instead of storm's write."""
    files = pick(paths, procs * FILES_PER_WORKER, offset=37 + procs)
    if bare:
        git(repo, "update-ref", "refs/bench/floor-tp", "refs/storm/workspace")
    ws_procs = []
    for k in range(procs):
        mine = files[k * FILES_PER_WORKER:(k + 1) * FILES_PER_WORKER]
        agent = f"floor-{procs}-{k}" if bare else f"tp{procs}-{k}"
        ws_procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", repo, agent, str(writes), *mine],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in ws_procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"worker failed to start: {line!r}")
    for p in ws_procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in ws_procs:
        out, _ = p.communicate()
        results.append(json.loads(out.strip().splitlines()[-1]))
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    acc = sum(r["accepted"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    return {"processes": procs, "writes_per_process": writes, "accepted": acc,
            "rejected": sum(r["rejected"] for r in results), "cas_retries": sum(r["retries"] for r in results),
            "seconds": t1 - t0, "writes_per_s": acc / (t1 - t0), "latency": stats(lat)}


# ----------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------
def human(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([1000, 10000] if args.quick else
                                                                         [1000, 10000, 100000])
    if args.quick:
        it = {"open": 20, "read": 100, "write": 100, "cli": 6, "startup": 6, "prof": 100, "cprof": 60,
              "tp_writes": 40, "tp1_writes": 60, "floor_n": 5}
    else:
        it = {"open": 50, "read": 300, "write": 300, "cli": 20, "startup": 15, "prof": 300, "cprof": 200,
              "tp_writes": 150, "tp1_writes": 200, "floor_n": 10}
    workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-")
    os.makedirs(workdir, exist_ok=True)
    import pygit2

    out: dict[str, Any] = {"sizes": sizes, "quick": args.quick, "iterations": it, "workdir": workdir,
                           "python": sys.version.split()[0], "pygit2": pygit2.__version__,
                           "libgit2": pygit2.LIBGIT2_VERSION,
                           "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip(),
                           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "per_size": {}}
    log(f"# git storm core benchmark  ({out['git']}, pygit2 {pygit2.__version__} / libgit2 {pygit2.LIBGIT2_VERSION},"
        f" Python {out['python']}, {out['cpus']} cpus, load {out['loadavg_start'][0]:.2f})")
    log(f"workdir {workdir}; sizes {', '.join(human(s) for s in sizes)}{' (quick)' if args.quick else ''}")
    t_all = time.perf_counter()

    for n in sizes:
        log(f"\n## {human(n)} files")
        t = time.perf_counter()
        repo, paths = build_repo(workdir, n)
        reset_repo(repo)
        log(f"  repository ready in {time.perf_counter() - t:.1f}s ({repo})")
        r: dict[str, Any] = {}
        r["inprocess"] = ip = bench_inprocess(repo, paths, it)
        log(f"  open_workspace()           {fmt(ip['open_workspace'])}")
        log(f"  1. read, new path          {fmt(ip['read_new'])}   = {ratio(ip['read_new']['median_ms'], ip['read_floor']['median_ms']):5.1f}x bare lookup")
        log(f"     read, same path again   {fmt(ip['read_again'])}")
        log(f"     baseline: bare lookup   {fmt(ip['read_floor'])}")
        log(f"  2. write (read set of 1)   {fmt(ip['write'])}   = {ratio(ip['write']['median_ms'], ip['floor']['median_ms']):5.2f}x floor")
        log(f"     write (read set of 50)  {fmt(ip['write_readset50'])}   = {ratio(ip['write_readset50']['median_ms'], ip['floor']['median_ms']):5.2f}x floor")
        log(f"  3. floor (pygit2 cycle)    {fmt(ip['floor'])}")

        r["profile"] = bench_profile(repo, paths, it["prof"], it["cprof"])

        r["cli"] = cl = bench_cli(repo, paths, it)
        log_cli(cl, "  4. ")

        r["throughput1"] = tp1 = bench_throughput(repo, paths, 1, it["tp1_writes"])
        r["throughput"] = tp = bench_throughput(repo, paths, N_WORKERS, it["tp_writes"])
        log(f"  6. {N_WORKERS} writer processes      {tp['writes_per_s']:8.0f} writes/s  ({tp['accepted']} accepted, "
            f"{tp['rejected']} rejected, {tp['cas_retries']} CAS retries; per-write {fmt(tp['latency'])})")
        log(f"     1 writer process        {tp1['writes_per_s']:8.0f} writes/s  (per-write {fmt(tp1['latency'])})"
            f"   8 procs = {ratio(tp['writes_per_s'], tp1['writes_per_s']):4.2f}x 1 proc")
        out["per_size"][str(n)] = r
        log(f"  ({time.perf_counter() - t:.0f}s for this size)")

    big = str(sizes[-1])
    out["startup_floor"] = sf = bench_startup_floor(os.path.join(workdir, f"repo-{big}"), it["floor_n"])
    log("\n## Size-independent CLI costs (every call pays these)")
    for k, v in sf.items():
        log(f"  {k:52s} {fmt(v)}")

    prof = out["per_size"][big]["profile"]
    log(f"\n## Where an in-process write goes ({human(int(big))} files, {prof['writes']} writes, "
        f"wrappers installed from outside; wrapper overhead ~1 us per wrapped call)")
    log(f"  {'phase':62s} {'ms/write':>9s} {'calls':>6s} {'%':>6s}")
    for row in prof["phases"]:
        c = "" if row["calls_per_write"] is None else f"{row['calls_per_write']:.1f}"
        log(f"  {row['phase']:62s} {row['ms_per_write']:9.3f} {c:>6s} {row['pct']:5.1f}%")
    log(f"\n## Where an in-process read of a new path goes ({human(int(big))} files, {prof['reads']} reads)")
    log(f"  {'phase':62s} {'ms/read':>9s} {'calls':>6s} {'%':>6s}")
    for row in prof["read_phases"]:
        c = "" if row["calls_per_write"] is None else f"{row['calls_per_write']:.1f}"
        log(f"  {row['phase']:62s} {row['ms_per_write']:9.3f} {c:>6s} {row['pct']:5.1f}%")
    log(f"\n## cProfile of {prof['cprofile_writes']} writes ({human(int(big))} files): top functions by own time "
        f"(profiled total {prof['cprofile_total_ms_per_write']:.2f} ms/write; cProfile inflates Python-heavy code)")
    log(f"  {'function':58s} {'calls/w':>8s} {'own ms/w':>9s} {'own %':>6s} {'cum ms/w':>9s}")
    for row in prof["cprofile_top"]:
        log(f"  {row['function'][:58]:58s} {row['calls_per_write']:8.1f} {row['tottime_ms_per_write']:9.3f} "
            f"{row['pct_tottime']:5.1f}% {row['cumtime_ms_per_write']:9.3f}")

    out["targets"] = targets(out)
    out["seconds"] = time.perf_counter() - t_all
    out["loadavg_end"] = os.getloadavg()
    log("\n## Targets\n")
    log("| # | target | size | measured | goal | result |")
    log("|---|---|---|---|---|---|")
    for t in out["targets"]:
        log(f"| {t['id']} | {t['what']} | {t['size']} | {t['measured']} | {t['goal']} | "
            f"{'MET' if t['met'] else 'NOT MET'} |")
    log(f"\ntotal {out['seconds']:.0f}s; load average at end {out['loadavg_end'][0]:.2f} "
        "(figures on a busy machine are noisy; compare ratios, not absolutes)")
    return out


PY_FLOOR = ("python_pygit2", "python+pygit2")
CLI_ROWS = [  # (key, label, [(baseline key, baseline label)...]); the first baseline is the table's
    ("storm_write", "git storm write", [("git_add_commit", "git add+commit"), PY_FLOOR]),
    ("storm_write_direct", "git-storm write (entry script)", [("git_add_commit", "git add+commit"), PY_FLOOR]),
    ("git_add_commit", "baseline: git add F && git commit", []),
    ("storm_read", "git storm read", [("git_show", "git show"), PY_FLOOR]),
    ("git_show", "baseline: git show HEAD:F", []),
    ("storm_status", "git storm status", [("git_status", "git status"), PY_FLOOR]),
    ("git_status", "baseline: git status --porcelain", []),
    ("python_pygit2", "floor: python -c 'import pygit2'", []),
]


def log_cli(cl: dict[str, Any], prefix: str = "  ") -> None:
    for i, (key, label, bases) in enumerate(CLI_ROWS):
        if key in cl:
            head = prefix if i == 0 else " " * len(prefix)
            log(f"{head}{label:34s} {fmt_cli(cl[key], [(cl[b], w) for b, w in bases if b in cl])}")


def run_cli_only(args: argparse.Namespace) -> dict[str, Any]:
    """``--only cli``: the command-line rows at each size, nothing else (a short run)."""
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [1000, 10000]
    it = {"cli": 6, "startup": 6} if args.quick else {"cli": 20, "startup": 20}
    workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-")
    os.makedirs(workdir, exist_ok=True)
    out: dict[str, Any] = {"only": "cli", "sizes": sizes, "iterations": it, "workdir": workdir,
                           "python": sys.version.split()[0],
                           "git": subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip(),
                           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "per_size": {}}
    log(f"# git storm command-line benchmark ({out['git']}, Python {out['python']}, {out['cpus']} cpus, "
        f"load {out['loadavg_start'][0]:.2f})")
    log("each row: median, p10-p90 and min-max over the runs, and the ratio to the git command measured in the"
        " same loop; absolute times swing with machine load, compare the ratios")
    t_all = time.perf_counter()
    for n in sizes:
        log(f"\n## {human(n)} files")
        repo, paths = build_repo(workdir, n)
        reset_repo(repo)
        out["per_size"][str(n)] = cl = {"cli": bench_cli(repo, paths, it)}["cli"]
        log_cli(cl)
    out["seconds"] = time.perf_counter() - t_all
    out["loadavg_end"] = os.getloadavg()
    log("\n| command | " + " | ".join(f"{human(n)} files" for n in sizes) + " |")
    log("| --- |" + " --- |" * len(sizes))
    for key, label, bases in CLI_ROWS:
        if not bases or key not in out["per_size"][str(sizes[0])]:
            continue
        base, what = bases[0]
        cells = []
        for n in sizes:
            cl = out["per_size"][str(n)]
            st, b = cl[key], cl[base]
            if "error" in st or "error" in b:
                cells.append("failed")
                continue
            floor = cl.get(PY_FLOOR[0], {"error": "-"})
            fl = "" if "error" in floor else f"; {ratio(st['median_ms'], floor['median_ms']):.1f}x python+pygit2"
            cells.append(f"{ratio(st['median_ms'], b['median_ms']):.1f}x {what}: {st['median_ms']:.0f} ms "
                         f"(p10-p90 {st['p10_ms']:.0f}-{st['p90_ms']:.0f}) vs {b['median_ms']:.0f} ms{fl}")
        log(f"| `{label}` | " + " | ".join(cells) + " |")
    log(f"\ntotal {out['seconds']:.0f}s; load average {out['loadavg_start'][0]:.2f} at start, "
        f"{out['loadavg_end'][0]:.2f} at end")
    return out


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    ps = out["per_size"]
    sizes = [str(s) for s in out["sizes"]]
    rows = []

    def add(i, what, size, measured, goal, met):
        rows.append({"id": i, "what": what, "size": human(int(size)) if size.isdigit() else size,
                     "measured": measured, "goal": goal, "met": bool(met)})

    for s in sizes:
        m = ps[s]["inprocess"]["read_new"]["median_ms"]
        add(1, "in-process read (new path, recorded)", s, f"{m:.2f} ms", "<= 1 ms", m <= 1.0)
    for s in sizes:
        m = ps[s]["inprocess"]["write"]["median_ms"]
        add(2, "in-process write", s, f"{m:.2f} ms", "<= 3 ms", m <= 3.0)
    for s in sizes:
        ip = ps[s]["inprocess"]
        q = ratio(ip["write"]["median_ms"], ip["floor"]["median_ms"])
        add(3, "in-process write / pygit2 floor", s, f"{q:.2f}x ({ip['floor']['median_ms']:.2f} ms floor)",
            "<= 1.5x", q <= 1.5)
    for s in sizes:
        c = ps[s]["cli"]
        if s in ("10000", "100000") and ("error" in c["storm_write"] or "error" in c["git_add_commit"]):
            add(4, "CLI write / git add+commit", s, "command failed (see report)", "-", False)
            continue
        q = ratio(c["storm_write"]["median_ms"], c["git_add_commit"]["median_ms"]) if s in ("10000", "100000") else 0
        if s == "100000":
            add(4, "CLI write / git add+commit", s, f"{q:.2f}x", "< 1x (faster than git)", q < 1.0)
        elif s == "10000":
            add(4, "CLI write / git add+commit", s, f"{q:.2f}x", "<= 2x", q <= 2.0)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for verb in ("status", "read"):
            sa, sb = ps[lo]["cli"][f"storm_{verb}"], ps[hi]["cli"][f"storm_{verb}"]
            if "error" in sa or "error" in sb:
                add(5, f"CLI start-up (git storm {verb}) {human(int(hi))} / {human(int(lo))}",
                    f"{human(int(lo))}->{human(int(hi))}", "command failed (see report)", "<= 1.25x (flat)", False)
                continue
            a, b = sa["median_ms"], sb["median_ms"]
            add(5, f"CLI start-up (git storm {verb}) {human(int(hi))} / {human(int(lo))}", f"{human(int(lo))}->{human(int(hi))}",
                f"{a:.0f} -> {b:.0f} ms ({ratio(b, a):.2f}x)", "<= 1.25x (flat)", ratio(b, a) <= 1.25)
    for s in sizes:
        w = ps[s]["throughput"]["writes_per_s"]
        add(6, f"throughput, {N_WORKERS} writer processes", s, f"{w:.0f} writes/s", ">= 500/s", w >= 500)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        a, b = ps[lo]["throughput"]["writes_per_s"], ps[hi]["throughput"]["writes_per_s"]
        add(6, f"throughput cost {human(int(hi))} / {human(int(lo))}", f"{human(int(lo))}->{human(int(hi))}",
            f"{ratio(a, b):.2f}x", "<= 2x", ratio(a, b) <= 2.0)
    return rows


def use_rev(rev: str, workdir: str) -> None:
    """Export storm_git (+ cli, hooks as storm_git.cli / storm_git.hooks) at ``rev`` and import it from there."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sha = git(src, "rev-parse", "--verify", f"{rev}^{{commit}}").stdout.decode().strip()
    dest = os.path.join(workdir, f"code-{sha[:12]}")
    if not os.path.isdir(os.path.join(dest, "storm_git")):
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        tar = git(src, "archive", sha, "storm_git", "cli", "hooks").stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        for sub in ("cli", "hooks"):
            if os.path.isdir(os.path.join(tmp, sub)):
                os.rename(os.path.join(tmp, sub), os.path.join(tmp, "storm_git", sub))
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    os.environ["PYTHONPATH"] = dest + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, dest)
    log(f"library: {rev} = {sha[:12]} exported to {dest}")


def main() -> None:
    global LOG
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None, help="comma-separated file counts (default 1000,10000,100000)")
    ap.add_argument("--quick", action="store_true", help="smoke run: sizes 1k,10k and fewer iterations")
    ap.add_argument("--only", choices=["all", "cli"], default="all",
                    help="cli: only the command-line rows (git storm write/read/status beside git), default sizes "
                         "1k,10k")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout (report on stderr)")
    ap.add_argument("--workdir", default=None, help="where to build and cache the repositories (default: a temp dir)")
    ap.add_argument("--rev", default=None,
                    help="benchmark the library as committed at REV (exported under --workdir and put first on "
                         "PYTHONPATH for this process, its workers and git storm) instead of the working tree")
    args = ap.parse_args()
    if args.json:
        LOG = sys.stderr
    if args.rev:
        args.workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-")
        use_rev(args.rev, args.workdir)
    out = run_cli_only(args) if args.only == "cli" else run(args)
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
