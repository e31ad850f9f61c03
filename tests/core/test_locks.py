"""Waiting for storm's flocks under a wait policy, in a worker thread (the MCP server's
tools run in threads, where no signal can interrupt a blocking flock: the lock is
polled). The main thread's timer-interrupted wait is exercised by the command line's
tests (tests/cli/test_ux.py)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from helpers import hold, make_repo
from storm_git.core.locks import LockTimeout, WaitPolicy, flocked, set_wait_policy


@pytest.fixture
def policy():
    seen: list = []
    old = set_wait_policy(WaitPolicy(timeout=lambda commondir: 0.6, notice_after=0.2, on_wait=seen.append))
    yield seen
    set_wait_policy(old)


def _in_thread(fn):
    out: dict = {}

    def run():
        t = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        out["seconds"] = time.monotonic() - t

    th = threading.Thread(target=run)
    th.start()
    th.join(30)
    assert not th.is_alive()
    return out


def test_a_worker_thread_polls_names_the_holder_and_gives_up(tmp_path, policy):
    repo = make_repo(tmp_path / "r")
    common = str(repo / ".git")
    holder = hold(repo, "workspace", seconds=60)
    try:
        out = _in_thread(lambda: flocked(common, "workspace").__enter__())
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert isinstance(out.get("error"), LockTimeout), out
    assert f"pid {holder.pid}" in str(out["error"]) and 0.6 <= out["seconds"] < 10
    assert [w.holder for w in policy] == [holder.pid] and policy[0].name == "workspace"


def test_a_worker_thread_takes_the_lock_once_it_is_free(tmp_path, policy):
    repo = make_repo(tmp_path / "r")
    common = str(repo / ".git")
    set_wait_policy(WaitPolicy(timeout=lambda commondir: 20, notice_after=0.1, on_wait=policy.append))
    holder = hold(repo, "workspace", seconds=60)
    threading.Timer(0.5, lambda: os.killpg(holder.pid, signal.SIGKILL)).start()

    def take():
        with flocked(common, "workspace"):
            return time.monotonic()

    out = _in_thread(take)
    holder.wait()
    assert "error" not in out and 0.4 <= out["seconds"] < 10, out
    assert len(policy) == 1  # told once, then it went on
