"""The test-gated merge queue: ``git storm merge --test CMD`` (CAID's self-verification).

Agents are merged one at a time, each on top of the agents merged before it, in
the order their work depends on each other: agent A goes after agent B when a
Python file A's branch changed imports a file of B's (covered by B's assignment,
``git storm assign``, or changed on B's branch); ties, and agents with no such
link, by name; a cycle is broken by name. Each merge commit is a *candidate*:
CMD runs on it (``sh -c``) in a scratch worktree checked out at the candidate
(detached, under ``<git dir>/storm/scratch/``, with ``storm.copyUntracked``
files), and only a candidate whose command exits 0 becomes the base of the next.
A failing agent stays unmerged (``test_failed``) with the command's exit status
and the tail of its output in the report and in its ``merge`` event.

The scratch worktree is removed afterwards, whatever happened: the command
failed, was killed, timed out (``--test-timeout``: SIGTERM then SIGKILL to its
process group), or storm itself got Ctrl-C (the command's process group is
killed first). A scratch worktree left by a storm killed with SIGKILL is removed
by the next ``merge --test``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from typing import Any

import pygit2

from ..core import assignments as scope
from ..core.gitcmd import run_git
from ..core.locks import pid_alive
from ..core.store import Store, git_env
from ..deps.scope import is_python, parse, resolve
from .merge import MergeReport, files_changed, merge
from .worktrees import branch_for, copy_untracked

TAIL_LINES = 40
TAIL_BYTES = 16 << 10
KILL_GRACE = 2.0


def scratch_root(store: Store) -> str:
    return os.path.join(store.commondir, "storm", "scratch")


# -- order ---------------------------------------------------------------------------------------
def _changed(store: Store, tip: pygit2.Oid, target: pygit2.Oid) -> tuple[pygit2.Tree, set[str]]:
    tree = store.commit(tip).tree
    try:
        fork = store.repo.merge_base(tip, target)
    except (pygit2.GitError, KeyError):
        fork = None
    old = store.commit(fork).tree_id if fork is not None else store.empty_tree()
    return tree, {c["path"] for c in files_changed(store, old, tree.id) if c["status"] != "D"}


def dependencies(store: Store, agents: list[str], target: pygit2.Oid) -> dict[str, list[str]]:
    """{agent: the agents whose files its changed Python files import}."""
    assigned = scope.load_all(store)
    info: dict[str, tuple[pygit2.Tree, set[str]]] = {}
    for a in agents:
        tip = store.ref_target("refs/heads/" + branch_for(store, a))
        if tip is not None:
            info[a] = _changed(store, tip, target)

    def owners(path: str) -> set[str]:
        return {b for b in agents if (b in assigned and assigned[b].covers(path)) or path in info.get(b, (None, set()))[1]}

    deps: dict[str, list[str]] = {}
    for a, (tree, changed) in info.items():
        def known(p: str, tree: pygit2.Tree = tree) -> bool:
            return p in tree or any(p in c for _, c in info.values())

        found: set[str] = set()
        for path in sorted(changed):
            if not is_python(path):
                continue
            try:
                mod = parse(store.blob_bytes(tree[path].id))
            except KeyError:
                continue
            for module, level, names in (mod.imports if mod else []):
                for p in resolve(path, module, level, known, [n for n, _ in names] if names else []):
                    found |= owners(p)
        deps[a] = sorted(found - {a})
    return deps


def dependency_order(store: Store, agents: list[str], target: pygit2.Oid,
                     deps: dict[str, list[str]] | None = None) -> list[str]:
    """Agents after the agents they depend on; ties and cycles by name."""
    deps = dependencies(store, agents, target) if deps is None else deps
    left = sorted(agents)
    order: list[str] = []
    while left:
        ready = [a for a in left if not set(deps.get(a, [])) & set(left)]
        pick = ready[0] if ready else left[0]  # a cycle: broken by name
        order.append(pick)
        left.remove(pick)
    return order


# -- one test run ----------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - TAIL_BYTES))
        data = fh.read()
    lines = data.decode("utf-8", "replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first line was cut
    return "\n".join(lines[-TAIL_LINES:])


def remove_scratch(store: Store, path: str) -> None:
    """Remove a scratch worktree and its record, whatever state it is in."""
    run_git(["worktree", "remove", "--force", "--force", path], store.main_workdir, check=False)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
    run_git(["worktree", "prune"], store.main_workdir, check=False)


def remove_leftovers(store: Store) -> list[str]:
    """Scratch worktrees of storm processes that are gone (killed with SIGKILL)."""
    root = scratch_root(store)
    removed = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return removed
    for name in names:
        pid = name.split("-", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        remove_scratch(store, os.path.join(root, name))
        removed.append(name)
    return removed


def run_test(store: Store, command: str, candidate: pygit2.Oid, agent: str,
             timeout: float | None = None) -> dict[str, Any]:
    """Run ``command`` in a scratch worktree at ``candidate``; removed afterwards."""
    root = scratch_root(store)
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"{os.getpid()}-{agent}-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    result: dict[str, Any] = {"command": command, "candidate": str(candidate), "passed": False,
                              "returncode": None, "timed_out": False, "seconds": 0.0, "tail": ""}
    proc: subprocess.Popen | None = None
    fd, out = tempfile.mkstemp(prefix="storm-test-", suffix=".log")
    try:
        r = run_git(["worktree", "add", "--detach", "--quiet", path, str(candidate)], store.main_workdir, check=False)
        if r.returncode != 0:
            result["tail"] = "could not check out the candidate: " + r.stderr.decode("utf-8", "replace").strip()
            return result
        copy_untracked(store, path)
        env = git_env(STORM_MERGE_AGENT=agent, STORM_MERGE_CANDIDATE=str(candidate))
        proc = subprocess.Popen(["sh", "-c", command], cwd=path, env=env, stdin=subprocess.DEVNULL,
                                stdout=fd, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            result["timed_out"] = True
            _kill_group(proc, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                rc = proc.wait()
        _kill_group(proc, signal.SIGKILL)  # what the command left running in its group
        result["returncode"] = rc
        result["passed"] = rc == 0 and not result["timed_out"]
        result["tail"] = _tail(out)
        return result
    except BaseException:
        if proc is not None and proc.poll() is None:  # Ctrl-C or SIGTERM of storm: stop the test too
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        raise
    finally:
        os.close(fd)
        os.unlink(out)
        remove_scratch(store, path)
        result["seconds"] = round(time.monotonic() - started, 3)


# -- the queue ---------------------------------------------------------------------------------------
def merge_tested(store: Store, agents: list[str] | None, command: str, *, into: str | None = None,
                 strategy: str = "abort", by: str = "manager", dry_run: bool = False,
                 timeout: float | None = None) -> MergeReport:
    """``git storm merge --test CMD``: merge.merge with each candidate tested (module docstring)."""
    from ..core.errors import UsageError

    if not command.strip():
        raise UsageError("--test needs a command", hint="git storm merge --test 'pytest -q'")
    remove_leftovers(store)
    why: dict[str, list[str]] = {}

    def order_by(s: Store, pending: list[str], target: pygit2.Oid) -> list[str]:
        why.update(dependencies(s, pending, target))
        return dependency_order(s, pending, target, why)

    rep = merge(store, agents, into=into, strategy=strategy, by=by, dry_run=dry_run,
                check=lambda agent, cand: run_test(store, command, cand, agent, timeout),
                order_by=order_by)
    rep.queue = {"command": command, "order": [r.agent for r in rep.results],
                 "ordered_by": "as named" if agents else "dependencies, then name",
                 "depends_on": {a: d for a, d in why.items() if d}}
    return rep
