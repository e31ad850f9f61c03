#!/usr/bin/env python3
"""What ``git storm read`` and ``git storm write`` of a small file cost, process
start included, through the repository's resident process and in their own
process, beside a bare interpreter and ``git show`` measured in the same loop.

Not a test: it prints medians and ratios. Each round runs, one after the other:

* ``daemon``      the installed ``git-storm`` relayed to the resident process
                  (started and warmed before the rounds);
* ``in-process``  the same with ``STORM_NO_DAEMON=1``: pygit2 and click imported;
* ``git storm``   ``git storm read`` as an agent types it: git's own start and its
                  dispatch to ``git-storm`` added (served by a daemon of its own:
                  git puts its exec-path first on PATH);
* ``python -S``   ``python3 -S -c pass`` (the target's baseline);
* ``python``      ``python -c pass`` of the interpreter ``git-storm`` runs on,
                  with its site-packages (an editable install's finder included):
                  the floor of any console script;
* ``git show``    ``git show HEAD:src/api.py``.

Then one ``write`` of ``--big-mib`` MiB (default 100) streamed from ``cat`` on a
pipe, each way: the client's peak RSS (from wait4; a process started by this
small script inherits its high-water mark, so it is an upper bound) and, through
the daemon, the peak RSS of the daemon's child that ran it (VmHWM, polled from
/proc while it runs; pages it shares with the daemon count in full) and the peak
of what it holds alone (Private_Clean + Private_Dirty of smaps_rollup, polled).

A shared machine's load moves the medians; the ratios, measured in the same
loop, move much less.

    python3 benchmarks/bench_cli.py               # 15 rounds
    python3 benchmarks/bench_cli.py --rounds 30 --big-mib 0 --json
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
import threading
import time

GIT_STORM = shutil.which("git-storm") or "git-storm"
CONTENT = (b"def fetch(url):\n    return http_get(url)\n", b"def fetch(uri):\n    return http_get(uri)\n")


def git(repo: str, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_repo(top: str) -> str:
    repo = os.path.join(top, "repo")
    os.makedirs(os.path.join(repo, "src"))
    with open(os.path.join(repo, "src/api.py"), "wb") as fh:
        fh.write(CONTENT[0])
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    subprocess.run([GIT_STORM, "init"], cwd=repo, check=True, capture_output=True)
    git(repo, "config", "storm.maxFileBytes", str(1 << 30))
    return repo


def env_for(route: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STORM_NO_DAEMON"}
    env["STORM_AGENT"] = "bench"
    if route == "in-process":
        env["STORM_NO_DAEMON"] = "1"
    return env


def interpreter() -> str:
    """The interpreter of the installed ``git-storm`` (its #! line)."""
    with open(GIT_STORM, "rb") as fh:
        first = fh.readline().strip()
    return first[2:].decode() if first.startswith(b"#!") else sys.executable


def run(argv: list[str], repo: str, env: dict[str, str], data: bytes | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=repo, env=env, input=data, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       stdin=None if data is not None else subprocess.DEVNULL)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-500:]}")
    return dt


def daemon_pid(repo: str) -> int | None:
    common = os.path.join(repo, ".git").encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if any(b"integrations.hookd import main" in a for a in argv) and common in argv:
                return int(d)
    return None


def warm(repo: str) -> int:
    env = env_for("daemon")
    run([GIT_STORM, "read", "src/api.py"], repo, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pid = daemon_pid(repo)
        if pid and os.path.exists(os.path.join(repo, ".git/storm/hookd")) and any(
                n.endswith(".sock") for n in os.listdir(os.path.join(repo, ".git/storm/hookd"))):
            for _ in range(3):
                run([GIT_STORM, "read", "src/api.py"], repo, env)
            warm_git(repo, env)
            return pid
        time.sleep(0.1)
    raise SystemExit("no resident process came up")


def warm_git(repo: str, env: dict[str, str]) -> None:
    """The daemon of ``git storm`` callers: git puts its exec-path first on PATH, so
    they are served by a daemon of their own (it picks the same programs for them)."""
    hookd = os.path.join(repo, ".git/storm/hookd")
    before = {n for n in os.listdir(hookd) if n.endswith(".sock")}
    run(["git", "storm", "read", "src/api.py"], repo, env)
    deadline = time.monotonic() + 60
    while not {n for n in os.listdir(hookd) if n.endswith(".sock")} - before:
        if time.monotonic() > deadline:
            raise SystemExit("no resident process came up for git storm")
        time.sleep(0.1)
    for _ in range(3):
        run(["git", "storm", "read", "src/api.py"], repo, env)


def rounds(repo: str, n: int) -> dict[str, list[float]]:
    py = interpreter()
    routes = {
        "read daemon": lambda i: run([GIT_STORM, "read", "src/api.py"], repo, env_for("daemon")),
        "read in-process": lambda i: run([GIT_STORM, "read", "src/api.py"], repo, env_for("in-process")),
        "git storm read": lambda i: run(["git", "storm", "read", "src/api.py"], repo, env_for("daemon")),
        "write daemon": lambda i: run([GIT_STORM, "write", "src/api.py", "-m", "bench"], repo, env_for("daemon"),
                                      CONTENT[(2 * i + 1) % 2]),
        "write in-process": lambda i: run([GIT_STORM, "write", "src/api.py", "-m", "bench"], repo,
                                          env_for("in-process"), CONTENT[(2 * i) % 2]),
        "python3 -S -c pass": lambda i: run(["python3", "-S", "-c", "pass"], repo, os.environ.copy()),
        "python -c pass": lambda i: run([py, "-c", "pass"], repo, os.environ.copy()),
        "git show": lambda i: run(["git", "show", "HEAD:src/api.py"], repo, os.environ.copy()),
    }
    out: dict[str, list[float]] = {k: [] for k in routes}
    for i in range(n):
        for name, f in routes.items():
            out[name].append(f(i))
    return out


def vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def private_kb(pid: int) -> int:
    """The memory only ``pid`` holds (Private_Clean + Private_Dirty of smaps_rollup):
    what a forked child adds beyond the pages it still shares with its parent."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return total


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def big_write(repo: str, top: str, mib: int, route: str, daemon: int | None) -> dict[str, float]:
    """Peak RSS (MiB) of one streamed write of ``mib`` MiB: the client's, and the
    daemon child's through the daemon."""
    path = os.path.join(top, "big.bin")
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(block)
    env = env_for(route)
    run([GIT_STORM, "read", f"src/big-{route}.bin"], repo, env)
    cat = subprocess.Popen(["cat", path], stdout=subprocess.PIPE)
    client = subprocess.Popen([GIT_STORM, "write", f"src/big-{route}.bin", "-m", "big"], cwd=repo, env=env,
                              stdin=cat.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert cat.stdout is not None
    cat.stdout.close()
    peak = {"child": 0, "child_own": 0}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            for k in children(daemon) if daemon else []:
                peak["child"] = max(peak["child"], vm_hwm_kb(k))
                peak["child_own"] = max(peak["child_own"], private_kb(k))
            time.sleep(0.005)

    watcher = threading.Thread(target=poll)
    watcher.start()
    t = time.perf_counter()
    _, status, usage = os.wait4(client.pid, 0)
    dt = time.perf_counter() - t
    done.set()
    watcher.join()
    client.returncode = os.waitstatus_to_exitcode(status)
    cat.wait()
    err = client.stderr.read() if client.stderr else b""
    if client.returncode != 0:
        raise SystemExit(f"the big write failed ({client.returncode}): {err.decode(errors='replace')[-500:]}")
    os.unlink(path)
    out = {"seconds": dt, "client_peak_mib": usage.ru_maxrss / 1024}
    if route == "daemon":
        out["child_peak_mib"] = peak["child"] / 1024
        out["child_own_peak_mib"] = peak["child_own"] / 1024
        out["daemon_rss_mib"] = vm_hwm_kb(daemon) / 1024 if daemon else 0.0
    return out


def wrapper_imports_re() -> bool:
    """The console script the installer wrote imports ``re`` (pip before 25.0 does;
    pip 25 and uv do not): a cost of every call that is the installer's."""
    try:
        with open(GIT_STORM, "rb") as fh:
            return any(line.strip() == b"import re" for line in fh.read(4096).splitlines())
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--big-mib", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    top = tempfile.mkdtemp(prefix="bench-cli-")
    daemon = None
    try:
        repo = make_repo(top)
        daemon = warm(repo)
        load = os.getloadavg()
        times = rounds(repo, a.rounds)
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        big = {r: big_write(repo, top, a.big_mib, r, daemon) for r in ("daemon", "in-process")} if a.big_mib else {}
        base = med["python3 -S -c pass"]
        ratios = {f"{op} daemon / python3 -S": med[f"{op} daemon"] / base for op in ("read", "write")}
        ratios.update({f"{op} daemon / python -c pass": med[f"{op} daemon"] / med["python -c pass"]
                       for op in ("read", "write")})
        ratios.update({f"{op} in-process / daemon": med[f"{op} in-process"] / med[f"{op} daemon"]
                       for op in ("read", "write")})
        ratios["read daemon / git show"] = med["read daemon"] / med["git show"]
        ratios["git storm read / python3 -S"] = med["git storm read"] / base
        report = {"rounds": a.rounds, "load_before": load, "load_after": os.getloadavg(), "median_ms": med,
                  "ratios": ratios, "big_write_mib": a.big_mib, "big_write": big,
                  "wrapper_imports_re": wrapper_imports_re()}
        if a.json:
            print(json.dumps(report, indent=2))
            return
        print(f"{a.rounds} rounds, load average {load[0]:.2f} before, {report['load_after'][0]:.2f} after")
        if report["wrapper_imports_re"]:
            print(f"  ({GIT_STORM} imports re, as the console scripts of pip < 25 do: about 10 ms of every call)")
        for k, v in med.items():
            print(f"  {k:<22} {v:8.1f} ms")
        for k, v in ratios.items():
            print(f"  {k:<34} {v:6.2f}x")
        for route, b in big.items():
            extra = (f", the daemon's child {b['child_peak_mib']:.0f} MiB, {b['child_own_peak_mib']:.0f} MiB of "
                     f"it its own (the daemon itself {b['daemon_rss_mib']:.0f} MiB)") if route == "daemon" else ""
            print(f"  write of {a.big_mib} MiB {route}: {b['seconds']:.2f} s, client peak "
                  f"{b['client_peak_mib']:.0f} MiB{extra}")
    finally:
        if daemon:
            try:
                os.kill(daemon, 15)
            except ProcessLookupError:
                pass
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
