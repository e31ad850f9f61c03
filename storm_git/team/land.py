"""Landing a team's work: the test gate, who gets the fix round, the manager's
commit (storm mode) or the merge in dependency order (worktree mode).

The tests run on what would land: in storm mode an export of the shared head into a
scratch folder (the working tree may hold someone's unmediated edit; the shared
head is the integrated result), in worktree mode each candidate merge
(``git storm merge --test``). Landing goes through storm's own verbs
(``git storm commit``, ``git storm merge``), so their rules and trailers apply.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ..core.errors import RepoStateError
from .launcher import storm_cli

TAIL = 4000


@dataclass
class TestRun:
    passed: bool
    code: int | None
    output: str
    seconds: float
    commit: str
    round: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def export(top: str, commit: str, into: str) -> None:
    """The tree of ``commit`` as files in ``into`` (git archive | tar)."""
    arch = subprocess.Popen(["git", "archive", "--format=tar", commit], cwd=top, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", into], stdin=arch.stdout, capture_output=True, check=False)
    if arch.stdout is not None:
        arch.stdout.close()
    err = arch.stderr.read() if arch.stderr is not None else b""
    if arch.wait() != 0 or tar.returncode != 0:
        raise RepoStateError(f"could not export {commit[:12]} to run the tests: "
                             f"{(err or tar.stderr).decode(errors='replace').strip()[:300]}")


def run_tests(top: str, commit: str, command: str, *, env: dict[str, str], timeout: float | None,
              round_: int = 0) -> TestRun:
    """``sh -c command`` in an export of ``commit``; the folder is removed after."""
    scratch = tempfile.mkdtemp(prefix="storm-team-test.")
    t0 = time.monotonic()
    try:
        export(top, commit, scratch)
        try:
            r = subprocess.run(["sh", "-c", command], cwd=scratch, env=env, capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=timeout, check=False)
            code: int | None = r.returncode
            out = (r.stdout + r.stderr).decode("utf-8", "replace")
        except subprocess.TimeoutExpired as exc:
            code = None
            out = ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", "replace") + \
                f"\n(stopped after {timeout:.0f} s)"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return TestRun(code == 0, code, out[-TAIL:], round(time.monotonic() - t0, 3), commit, round_)


def mentioned(output: str, tracked: list[str]) -> list[str]:
    """The repository files a test output names (a failing test's file, a traceback's frames)."""
    found = []
    words = set(re.findall(r"[A-Za-z0-9_./-]+", output))
    for p in tracked:
        if p in words or any(w.endswith("/" + p) for w in words if "/" in w):
            found.append(p)
    return found


def fix_targets(output: str, tracked: list[str], writes: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(the engineers whose writes touched the files the failure names, those files);
    every engineer that wrote something when the failure names none of theirs."""
    files = mentioned(output, tracked)
    agents = [a for a, paths in writes.items() if any(p in files for p in paths)]
    if not agents:
        agents = [a for a, paths in writes.items() if paths]
    return agents, files


def _commit(cwd: str, message: str, agent: str, env: dict[str, str]) -> tuple[dict[str, Any], str | None]:
    """``git storm commit -m MESSAGE --agent AGENT --json`` in ``cwd``: (its report, its error or None)."""
    r = storm_cli(["commit", "-m", message, "--agent", agent, "--json"], cwd=cwd, env=env, timeout=600)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    if r.returncode != 0:
        return data, (data.get("error") or {}).get("message") or r.stderr.strip()[:300]
    return data, None


def manager_commit(top: str, message: str, manager: str, env: dict[str, str]) -> dict[str, Any]:
    """The manager's commit (storm mode): the shared head onto the branch."""
    data, err = _commit(top, message, manager, env)
    if err is not None:
        raise RepoStateError(f"the manager's commit failed: {err}")
    return data


def commit_worktree(path: str, agent: str, message: str, env: dict[str, str]) -> dict[str, Any]:
    """What the engineer left uncommitted in its worktree, committed to its branch by
    ``git storm commit --agent`` (its assignment's rule applies)."""
    data, err = _commit(path, message, agent, env)
    return {"error": err} if err is not None else data


def merge(top: str, agents: list[str], test: str | None, manager: str, env: dict[str, str],
          timeout: float | None, into: str | None = None) -> dict[str, Any]:
    """``git storm merge AGENT... [--into BRANCH] [--test CMD]`` in the order given; its JSON report."""
    args = ["merge", *agents, "--agent", manager, "--json"] + (["--into", into] if into else [])
    if test:
        args += ["--test", test] + (["--test-timeout", str(timeout)] if timeout else [])
    r = storm_cli(args, cwd=top, env=env, timeout=3600)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        raise RepoStateError(f"git storm merge gave no report: {r.stderr.strip()[:300]}") from None
    if isinstance(data, dict) and "error" in data:
        raise RepoStateError(f"git storm merge failed: {data['error'].get('message')}")
    return data if isinstance(data, dict) else {}

