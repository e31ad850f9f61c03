"""Running the project's tests on a tree: an export of the tree into a directory of
the runner's own (never the shared working tree), the command with the tests to run,
and each test's outcome (from the pytest plugin :mod:`.pytest_results`, or, for a
command that is not pytest, the command as one test).

Results are cached per (tree, test), so a bisection that meets a tree again, or two
rounds on the same content, run nothing twice.
"""
from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from ..core.locks import pid_alive

WHOLE = "(command)"  # the test id of a command that reports no tests of its own
TIMEOUT = 900
PLUGIN = "storm_watch_results"


@dataclass
class Outcome:
    outcome: str  # passed, failed, skipped, absent
    tail: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"


@dataclass
class RunStats:
    runs: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0  # user + system time of the test processes


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def export_tree(commondir: str, tree: str, dest: str) -> None:
    """The files of ``tree`` under ``dest`` (git archive, as ``git archive | tar -x``)."""
    arch = subprocess.Popen(["git", f"--git-dir={commondir}", "archive", "--format=tar", tree],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", dest], check=False, stdin=arch.stdout, capture_output=True)
    assert arch.stdout is not None
    arch.stdout.close()
    err = arch.stderr.read() if arch.stderr else b""
    if arch.wait() != 0 or untar.returncode != 0:
        raise OSError(f"cannot export tree {tree[:10]}: {(err or untar.stderr).decode(errors='replace').strip()}")


def work_root(commondir: str) -> str:
    return os.path.join(commondir, "storm", "tests", "work")


def clear_dead_work(commondir: str) -> None:
    """Remove the exports of runners that died (named by pid), killing a test process
    they left running there."""
    root = work_root(commondir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        pid = name.split("-", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        path = os.path.join(root, name)
        _kill_inside(path)
        shutil.rmtree(path, ignore_errors=True)




def _kill_inside(path: str) -> None:
    """Kill the processes whose working directory is inside ``path`` (a test command
    orphaned by a runner killed mid-run)."""
    real = os.path.realpath(path)
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == real or cwd.startswith(real + os.sep):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


@dataclass
class TestCommand:
    """``cmd`` run in an export of a tree. The tests to run reach it as ``$STORM_TESTS``
    (space-separated paths or pytest node ids) and, unless the command names that
    variable, as arguments appended to it; a full run passes none (or, with
    ``universe``, every test file of the tree)."""

    commondir: str
    cmd: str
    timeout: float = TIMEOUT
    stats: RunStats = field(default_factory=RunStats)
    cache: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    full: dict[str, dict[str, Outcome]] = field(default_factory=dict)
    _seq: int = 0
    _proc: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        """End the test command running now (its whole session), if any: the runner
        is being stopped."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def _workdir(self) -> str:
        root = work_root(self.commondir)
        os.makedirs(root, exist_ok=True)
        self._seq += 1
        return tempfile.mkdtemp(prefix=f"{os.getpid()}-{self._seq}-", dir=root)

    def run(self, tree: str, tests: list[str] | None) -> dict[str, Outcome]:
        """Run ``tests`` (None: all) on ``tree``; every test the command reported."""
        if tests is None and tree in self.full:
            return self.full[tree]
        work = self._workdir()
        plugin_dir = os.path.join(work, "plugin")
        out_dir = os.path.join(work, "tree")
        os.makedirs(plugin_dir)
        os.makedirs(out_dir)
        shutil.copyfile(os.path.join(os.path.dirname(__file__), "pytest_results.py"),
                        os.path.join(plugin_dir, PLUGIN + ".py"))
        results = os.path.join(work, "results.json")
        try:
            export_tree(self.commondir, tree, out_dir)
            if not os.path.exists(os.path.join(out_dir, PLUGIN + ".py")):  # `python -m pytest` finds it there
                shutil.copyfile(os.path.join(plugin_dir, PLUGIN + ".py"), os.path.join(out_dir, PLUGIN + ".py"))
            cmd = self.cmd
            sel = " ".join(tests or [])
            if tests and "STORM_TESTS" not in cmd:
                cmd = cmd + " " + " ".join(shlex.quote(t) for t in tests)
            env = dict(os.environ, STORM_TESTS=sel, STORM_WATCH_RESULTS=results, PYTHONDONTWRITEBYTECODE="1",
                       PYTEST_ADDOPTS=f"-p {PLUGIN} --rootdir={out_dir} " + os.environ.get("PYTEST_ADDOPTS", ""),
                       PYTHONPATH=os.pathsep.join(x for x in (plugin_dir, os.environ.get("PYTHONPATH")) if x))
            t0, c0 = time.monotonic(), _children_cpu()
            proc = subprocess.Popen(cmd, shell=True, cwd=out_dir, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            self._proc = proc
            try:
                output, _ = proc.communicate(timeout=self.timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                rc, output = -1, output + f"\ntimed out after {self.timeout:.0f}s".encode()
            finally:
                self._proc = None
            self.stats.runs += 1
            self.stats.seconds += time.monotonic() - t0
            self.stats.cpu_s += _children_cpu() - c0
            got = self._parse(results, rc, output.decode(errors="replace"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if tests is None:
            self.full[tree] = got
        for t, o in got.items():
            self.cache[(tree, t)] = o
        for t in tests or []:
            if not any(k == t or k.startswith(t + "::") for k in got):
                self.cache.setdefault((tree, t), Outcome("absent"))
        return got

    @staticmethod
    def _parse(results: str, rc: int, output: str) -> dict[str, Outcome]:
        tail = "\n".join(output.rstrip().splitlines()[-15:])
        try:
            with open(results, encoding="utf-8") as fh:
                raw = json.load(fh)
        except (OSError, ValueError):
            raw = None
        if not isinstance(raw, dict):
            return {WHOLE: Outcome("passed" if rc == 0 else "failed", "" if rc == 0 else tail)}
        got = {str(k): Outcome(str(v.get("outcome", "failed")), str(v.get("tail", ""))) for k, v in raw.items()
               if isinstance(v, dict)}
        if rc not in (0, 1, 5) and not any(o.failed for o in got.values()):
            got[WHOLE] = Outcome("failed", tail)  # pytest itself failed (usage, internal error, timeout)
        return got

    def outcomes(self, tree: str, tests: list[str]) -> dict[str, Outcome]:
        """Each of ``tests`` on ``tree``, running together those not known yet; a test
        the tree does not have is ``absent``."""
        missing = [t for t in tests if (tree, t) not in self.cache and t != WHOLE]
        if missing or (WHOLE in tests and (tree, WHOLE) not in self.cache):
            self.run(tree, None if WHOLE in tests else missing)
        return {t: self.cache.get((tree, t), Outcome("absent")) for t in tests}
