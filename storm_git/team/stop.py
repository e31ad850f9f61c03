"""Ending a run's sessions: ``team stop``, a stopped ``team run``, and the sessions a
killed run left behind (found by pid and start time, ended by process group).
Their engineers' reservations and leases are released, so the shared state is
left as if they had finished."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ..core import reservations
from ..core.errors import StormError
from ..core.store import Store
from . import launcher
from .state import RunDir, RunState


def end_sessions(store: Store, st: RunState, emit: Callable[..., None]) -> list[str]:
    """End the run's live sessions by pid (their process groups), mark their engineers
    stopped, and release the reservations and leases they held."""
    ended = []
    for e in st.engineers:
        if e.state in ("running", "waiting") or (e.pid and launcher.alive(e.pid, e.pstart)):
            if e.pid and launcher.end(e.pid, e.pstart):
                ended.append(e.agent)
            if e.state not in ("done", "failed"):
                e.state, e.why = "stopped", "stopped by git storm team stop"
            emit("stopped_session", agent=e.agent, pid=e.pid)
    agents = {e.agent for e in st.engineers}
    try:
        held = [r for r in reservations.active(store) if r.holder in agents]
    except Exception:  # noqa: BLE001 - a missing or unreadable reservations ref holds nothing of ours
        held = []
    for r in held:
        launcher.storm_cli(["release", r.path, "--agent", r.holder], cwd=store.main_workdir)
        emit("released", agent=r.holder, path=r.path)
    return ended


def orphaned(commondir: str, skip: str | None = None) -> list[dict[str, Any]]:
    """Sessions still alive whose ``team run`` is not: what ``team stop RUN`` ends."""
    from .state import runs

    out = []
    for r in runs(commondir):
        if r == skip:
            continue
        try:
            st = RunDir(commondir, r).load()
        except StormError:  # an unreadable run is reported by its own status
            continue
        if launcher.alive(st.runner_pid, st.runner_pstart):
            continue
        out += [{"run": r, "agent": e.agent, "pid": e.pid} for e in st.engineers
                if e.pid and launcher.alive(e.pid, e.pstart)]
    return out


def stop_run(store: Store, run: str, emit: Callable[..., None], *, wait: float = 30.0) -> dict[str, Any]:
    """``team stop``: ask the run's ``team run`` to stop (SIGTERM; it ends its sessions),
    then end whatever outlived it: sessions of a run whose ``team run`` was killed."""
    rd = RunDir(store.commondir, run)
    st = rd.load()
    asked = False
    if launcher.alive(st.runner_pid, st.runner_pstart) and st.runner_pid:
        os.kill(st.runner_pid, signal.SIGTERM)
        asked = True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and launcher.alive(st.runner_pid, st.runner_pstart):
            time.sleep(0.1)
        st = rd.load()
    with rd.locked():
        st = rd.load()
        ended = end_sessions(store, st, emit)
        if st.phase not in ("landed", "failed", "stopped") or ended:
            st.phase = "stopped"
            st.ended = time.time()
        rd.save(st)
    return {"run": run, "asked_runner": asked, "ended": ended, "phase": st.phase}


