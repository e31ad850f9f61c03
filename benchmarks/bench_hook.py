#!/usr/bin/env python3
"""What one harness hook call costs, process start included, beside a plain
``python -c pass`` started the same way.

A harness starts ``git storm harness hook`` for every tool call (an Edit pays
two, a Read one): hundreds a session. Not a test: it prints medians and ratios.

For each kind of call, on a fresh storm repository with the default files:

* ``nothing``   PreToolUse of a Read: storm has nothing to do before a read;
* ``read``      PostToolUse of a Read: the version seen goes into the read set;
* ``pre-edit``  PreToolUse of an Edit: the read set validated, the file leased;
* ``post-edit`` PostToolUse of that Edit: the file recorded as a write;
* ``bash``      Pre- and PostToolUse of a Bash command that changes nothing (two calls);

each run as the harness runs it (the installed ``git-storm``, the event on stdin)
three ways: through the repository's hook daemon (the default: the client hands
the call to a forked child of a process that has imported everything), without
it (``STORM_NO_DAEMON=1``: the hook runs in the new process), and through the
click command line (``python -m storm_git.cli.main``'s route, what the hook cost
before it had its own entry). For the daemon also the *first call* (no daemon
running: it runs the hook itself and starts one) and *daemon ready* (from that
call's start until the daemon listens). With bytecode cached and without
(``PYTHONDONTWRITEBYTECODE=1`` and an empty ``PYTHONPYCACHEPREFIX``: every module
compiled at every start, as an editable install that never wrote its .pyc files;
the daemon then compiles everything once, when it starts).

A shared machine's load moves wall-clock medians by a factor of several;
``--instructions`` counts instructions instead (valgrind's callgrind, one run of
each call, the harness's process and its children): the same count whatever the
load, so two builds compare exactly; for the daemon route the daemon runs under
callgrind too and a call counts the client plus the call's forked child (whose
inherited counts are zeroed by dumping the daemon's before each call).
``--before PATH`` adds another build's
``git-storm`` as a route (the hook as it was).

    python3 benchmarks/bench_hook.py              # 15 rounds
    python3 benchmarks/bench_hook.py --rounds 40 --json
    python3 benchmarks/bench_hook.py --instructions --before /old/venv/bin/git-storm
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

FILES = {"src/api.py": "def fetch(url):\n    return http_get(url)\n", "src/util.py": "def clamp(x):\n    return x\n"}
CLICK_ROUTE = ("import sys; sys.argv = ['git-storm', 'harness', 'hook'] + sys.argv[1:]; "
               "from storm_git.cli.main import main; main()")


def git(repo: str, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_repo(root: str) -> str:
    repo = os.path.join(root, "repo")
    os.makedirs(os.path.join(repo, "src"))
    git(repo, "init", "-q", "-b", "main")
    for rel, text in FILES.items():
        with open(os.path.join(repo, rel), "w") as fh:
            fh.write(text)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init")
    subprocess.run(["git-storm", "init"], cwd=repo, check=True, capture_output=True)
    return repo


def event(repo: str, name: str, tool: str, tool_input: dict, use_id: str) -> bytes:
    e = {"session_id": "bench", "cwd": repo, "hook_event_name": name, "tool_name": tool, "tool_input": tool_input,
         "tool_use_id": use_id, "permission_mode": "default"}
    if name == "PostToolUse":
        e["tool_response"] = {"success": True}
    return json.dumps(e).encode()


INSTRUCTIONS = False  # --instructions: "time" is a count of instructions (callgrind)


def timed(argv: list[str], data: bytes, cwd: str, env: dict[str, str]) -> float:
    if INSTRUCTIONS:
        argv = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null", *argv]
    t = time.perf_counter()
    r = subprocess.run(argv, input=data, cwd=cwd, env=env, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    if INSTRUCTIONS:
        counts = [int(line.split()[-1]) for line in r.stderr.decode().splitlines() if "Collected :" in line]
        return float(sum(counts))
    return dt


def envs(tmp: str) -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("STORM_", "PYTHON"))}
    base["STORM_HOOKD_IDLE"] = "600"
    cold = dict(base, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=os.path.join(tmp, "no-pycache"))
    return {"cached": base, "storm not compiled": storm_uncompiled(tmp, base), "no bytecode": cold}


def storm_uncompiled(tmp: str, base: dict[str, str]) -> dict[str, str]:
    """Bytecode for the standard library and pygit2 but none for storm: an editable
    install under PYTHONDONTWRITEBYTECODE=1 that never wrote storm's .pyc files. A
    pycache prefix of its own, filled by importing everything, then storm's part of
    it removed."""
    import storm_git

    prefix = os.path.join(tmp, "pycache-without-storm")
    fill = ("from storm_git.integrations import hookd; hookd.preload(); import storm_git.cli.main; "
            "import storm_git.integrations.hook_client")
    subprocess.run([sys.executable, "-c", fill], env=dict(base, PYTHONPYCACHEPREFIX=prefix), check=True,
                   capture_output=True)
    import storm_git.cli

    for pkg in (storm_git, storm_git.cli):
        shutil.rmtree(prefix + os.path.dirname(os.path.abspath(pkg.__file__)), ignore_errors=True)
    return dict(base, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=prefix)


def daemon_socket(repo: str, env: dict[str, str]) -> str:
    import storm_git
    from storm_git.integrations import hookd_place

    fp = hookd_place.fingerprint(os.path.dirname(os.path.abspath(storm_git.__file__)), storm_git.__version__)
    return hookd_place.socket_path(os.path.join(repo, ".git"), fp, env)


def daemon_pid(path: str) -> int | None:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[:4], sys.byteorder)
    except OSError:
        return None
    finally:
        s.close()


def wait_daemon(path: str, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = daemon_pid(path)
        if pid:
            return pid
        time.sleep(0.01)
    raise SystemExit(f"the hook daemon never listened on {path}")


def stop_daemon(path: str) -> None:
    pid = daemon_pid(path)
    if pid:
        os.kill(pid, signal.SIGTERM)
        while os.path.exists(f"/proc/{pid}") and daemon_pid(path) == pid:
            time.sleep(0.01)
        time.sleep(0.05)


class CallgrindDaemon:
    """Under --instructions: the daemon started under callgrind, so that each call's
    forked child is counted too. A child inherits its parent's counts, so the daemon's
    are dumped (and so zeroed) before each call: the child then counts its own work."""

    def __init__(self, tmp: str, repo: str, env: dict[str, str]) -> None:
        self.dir = os.path.join(tmp, "cg")
        os.makedirs(self.dir, exist_ok=True)
        self.path = daemon_socket(repo, env)
        code = ("import sys; del sys.path[0]; from storm_git.integrations.hookd import main; main(sys.argv[1:])")
        self.proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--trace-children=yes",
                                      f"--callgrind-out-file={self.dir}/cg.%p", sys.executable, "-c", code,
                                      os.path.join(repo, ".git"), self.path], env=env, cwd="/",
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = wait_daemon(self.path)
        time.sleep(2)  # the child that answered that probe writes its count now, not into a call's

    def before(self) -> set[str]:
        subprocess.run(["callgrind_control", "-d", str(self.pid)], capture_output=True, timeout=120)
        return set(os.listdir(self.dir))

    def child_count(self, seen: set[str]) -> float:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = [f for f in set(os.listdir(self.dir)) - seen if f != f"cg.{self.pid}" and
                   not f.startswith(f"cg.{self.pid}.")]
            for f in new:
                with open(os.path.join(self.dir, f)) as fh:
                    for line in fh:
                        if line.startswith("totals:") or line.startswith("summary:"):
                            return float(line.split()[1])
            time.sleep(0.05)
        return 0.0

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


def run(rounds: int, before: str | None = None, cached_only: bool = False) -> dict:
    tmp = tempfile.mkdtemp(prefix="bench-hook-")
    try:
        repo = make_repo(tmp)
        api = os.path.join(repo, "src/api.py")
        exe = shutil.which("git-storm")
        if exe is None:
            raise SystemExit("git-storm is not on PATH: run with the interpreter that has it installed")
        hook_argv = [exe, "harness", "hook", "--harness", "claude"]
        routes = {"daemon": (hook_argv, {}), "no daemon": (hook_argv, {"STORM_NO_DAEMON": "1"}),
                  "click CLI": ([sys.executable, "-c", CLICK_ROUTE, "--harness", "claude"], {})}
        if before:
            routes["before"] = ([before, "harness", "hook", "--harness", "claude"], {"STORM_NO_DAEMON": "1"})
        outside = os.path.join(tmp, "plain")  # a repository without storm (a user-level install)
        os.makedirs(outside)
        git(outside, "init", "-q")
        baseline = [sys.executable, "-c", "pass"]
        out: dict = {"rounds": rounds, "python": sys.version.split()[0], "rows": []}
        for env_name, env0 in envs(tmp).items():
            if cached_only and env_name != "cached":
                continue
            if env_name == "cached":  # make sure the bytecode is there
                subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(
                    os.path.dirname(__import__("storm_git").__file__))], capture_output=True)
            base = statistics.median(timed(baseline, b"", repo, env0) for _ in range(rounds))
            out["rows"].append({"env": env_name, "route": "python -c pass", "kind": "baseline",
                                "median": base if INSTRUCTIONS else base * 1e3, "ratio": 1.0})
            sock = daemon_socket(repo, env0)
            for route, (argv, extra) in routes.items():
                env = dict(env0, **extra)
                cg = None
                if route == "daemon":
                    stop_daemon(sock)
                    if INSTRUCTIONS:
                        cg = CallgrindDaemon(tmp, repo, env)
                    else:
                        first, ready = first_calls(argv, repo, api, env, sock, rounds)
                        for kind, xs in (("first call", first), ("daemon ready", ready)):
                            m = statistics.median(xs)
                            out["rows"].append({"env": env_name, "route": route, "kind": kind, "median": m * 1e3,
                                                "ratio": m / base})

                def call(data: bytes, cwd: str, cg=cg, argv=argv, env=env) -> float:
                    if cg is None or cwd != repo:
                        return timed(argv, data, cwd, env)
                    seen = cg.before()
                    return timed(argv, data, cwd, env) + cg.child_count(seen)

                samples: dict[str, list[float]] = {k: [] for k in ("not storm", "nothing", "read", "pre-edit",
                                                                   "post-edit", "bash")}
                for i in range(rounds):
                    samples["not storm"].append(call(event(outside, "PreToolUse", "Write", {
                        "file_path": os.path.join(outside, "a.py"), "content": "x"}, f"p{i}"), outside))
                    uid = f"{env_name}-{route}-{i}"
                    samples["nothing"].append(call(event(repo, "PreToolUse", "Read", {"file_path": api}, uid), repo))
                    samples["read"].append(call(event(repo, "PostToolUse", "Read", {"file_path": api}, uid), repo))
                    edit = {"file_path": api, "old_string": "url", "new_string": "url", "replace_all": True}
                    samples["pre-edit"].append(call(event(repo, "PreToolUse", "Edit", edit, uid), repo))
                    with open(api, "a") as fh:  # the Edit tool's own write
                        fh.write(f"# {i}\n")
                    samples["post-edit"].append(call(event(repo, "PostToolUse", "Edit", edit, uid), repo))
                    bash = {"command": "true"}
                    samples["bash"].append(call(event(repo, "PreToolUse", "Bash", bash, uid + "b"), repo)
                                           + call(event(repo, "PostToolUse", "Bash", bash, uid + "b"), repo))
                if cg is not None:
                    cg.stop()
                for kind, xs in samples.items():
                    m = statistics.median(xs)
                    out["rows"].append({"env": env_name, "route": route, "kind": kind,
                                        "median": m if INSTRUCTIONS else m * 1e3, "ratio": m / base})
            stop_daemon(sock)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def first_calls(argv: list[str], repo: str, api: str, env: dict[str, str], sock: str,
                rounds: int) -> tuple[list[float], list[float]]:
    """The first call with no daemon running (it runs the hook itself and starts one),
    and how long from its start until the daemon listens; then the daemon is left up."""
    first, ready = [], []
    for i in range(rounds):
        stop_daemon(sock)
        t = time.perf_counter()
        first.append(timed(argv, event(repo, "PostToolUse", "Read", {"file_path": api}, f"first{i}"), repo, env))
        wait_daemon(sock)
        ready.append(time.perf_counter() - t)
    return first, ready


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="JSON on stdout")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions with valgrind's callgrind instead of timing (load-independent)")
    ap.add_argument("--before", metavar="GIT_STORM", help="another build's git-storm, measured as a third route")
    ap.add_argument("--cached-only", action="store_true", help="only with bytecode cached (an uncached run under "
                                                                 "callgrind mostly counts the compiler)")
    args = ap.parse_args()
    global INSTRUCTIONS
    INSTRUCTIONS = args.instructions
    res = run(1 if args.instructions else args.rounds, args.before, args.cached_only)
    res["unit"] = "instructions" if args.instructions else "ms"
    if args.json:
        print(json.dumps(res, indent=1))
        return
    unit = "Minstr" if args.instructions else "ms"
    print(f"hook call cost, median of {res['rounds']} (Python {res['python']}, process start included)")
    print(f"{'bytecode':<19} {'route':<15} {'call':<10} {'median ' + unit:>12} {'x python -c pass':>17}")
    for r in res["rows"]:
        value = r["median"] / 1e6 if args.instructions else r["median"]
        print(f"{r['env']:<19} {r['route']:<15} {r['kind']:<10} {value:>12.1f} {r['ratio']:>17.1f}")


if __name__ == "__main__":
    main()
