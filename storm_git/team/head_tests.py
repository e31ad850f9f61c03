"""The shared head's tests while a team works (storm mode, ``team run --watch-test CMD``).

The test runner of ``git storm watch`` (:mod:`storm_git.testwatch`) runs as a process
of its own beside the engineers: ``git storm watch --test CMD --while-pid RUN``,
started when the run starts or resumes. It takes none of storm's locks and tests
exports of the head, never the shared tree. It ends with the run: the end of the
run (landed, failed, ``team stop``) stops it with SIGTERM, which also ends the
round's tests; a ``team run`` killed outright takes it along, as ``--while-pid``
makes it exit once the run's process is gone.

Each tick (at most once a second) reads the runner's state and its notices: a
round it finished is a ``head_tested`` event; a test it blamed on this run's
engineers' writes (a semantic conflict between two writes, or a break by one) is a
``head_conflict`` event and an entry of the run's state (``head_tests.found``, by
notice id, so a resumed run neither loses nor repeats one), which the board and
the report show as conflicts caught by the tests during the run. The engineers
involved are told by the runner's notices, through storm's doors (the harness
hook, the MCP server, the command line's stderr), on their next call.

Worktree mode has no shared head during a run (each engineer commits on a branch
of its own until the merge): there the runner is refused; the merge's tests
(``--test``) are what checks the integration.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Protocol

from ..core.errors import EXIT_REPO_STATE, EXIT_USAGE, UsageError
from ..core.store import Store
from ..testwatch import notices, report as watch_report
from . import launcher
from .state import RunDir, RunState

LOOK_EVERY = 1.0
STOP_GRACE = 10.0


class TeamLike(Protocol):
    store: Store
    rd: RunDir
    st: RunState
    extra: dict[str, Any]

    def emit(self, kind: str, **data: Any) -> None: ...

    def save(self) -> None: ...

    def test_env(self) -> dict[str, str]: ...


def check(mode: str, cmd: str | None) -> None:
    """Refuse ``--watch-test`` where there is no shared head to watch."""
    if cmd is not None and not cmd.strip():
        raise UsageError("--watch-test needs a command", hint="--watch-test 'python -m pytest -q'")
    if cmd and mode != "storm":
        raise UsageError("--watch-test needs storm mode: in worktree mode there is no shared head during the run",
                         hint="drop --watch-test; the merge's --test checks each integration")


class HeadTests:
    """The runner of one team run, driven from the run's ticks."""

    def __init__(self, team: TeamLike, cmd: str) -> None:
        self.team, self.cmd = team, cmd
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_look = 0.0
        self.closed = False
        self.rounds_seen = int(team.st.head_tests.get("rounds") or 0)

    @property
    def state(self) -> dict[str, Any]:
        return self.team.st.head_tests

    # -- the runner's process ---------------------------------------------------------------
    def start(self) -> None:
        st = self.state
        st.setdefault("cmd", self.cmd)
        st.setdefault("found", [])
        old_pid, old_start = st.get("pid"), st.get("pstart")
        if old_pid and launcher.alive(old_pid, old_start):  # the runner of the run's killed process
            launcher.end(int(old_pid), old_start)
        self.spawn()

    def spawn(self) -> None:
        t = self.team
        argv = [sys.executable, "-m", "storm_git", "watch", "--test", self.cmd, "--while-pid", str(os.getpid()),
                "--json"]
        with open(t.rd.file("watch.out"), "ab") as fo, open(t.rd.file("watch.err"), "ab") as fe:
            self.proc = subprocess.Popen(argv, cwd=t.store.main_workdir, env=t.test_env(), stdin=subprocess.DEVNULL,
                                         stdout=fo, stderr=fe, start_new_session=True)
        self.state.update(pid=self.proc.pid, pstart=launcher.proc_start(self.proc.pid), running=True)
        t.save()
        t.emit("head_watch", pid=self.proc.pid, test=self.cmd)

    def _ended(self, code: int) -> None:
        """The runner exited before the run's end: said, not started again (what stopped
        it, a corrupt state or another runner, would stop the next one too)."""
        t = self.team
        self.proc = None
        self.state.update(pid=None, pstart=None, running=False)
        why = {EXIT_REPO_STATE: "another git storm watch runs on this repository (the board shows its rounds), "
                                "or its state is unreadable",
               EXIT_USAGE: "the runner refused its options"}.get(code, "")
        t.emit("head_watch_ended", code=code, why=_tail(t.rd.file("watch.err")) or why)
        t.save()

    def close(self) -> None:
        """Stop the runner (its round's tests with it) and take in its last findings."""
        if self.closed:
            return
        self.closed = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                launcher.end(proc.pid, None, grace=0.5)
                proc.wait()
        self.proc = None
        self.state.update(pid=None, pstart=None, running=False)
        self.look(force=True)
        self.team.save()

    # -- what it found ----------------------------------------------------------------------
    def tick(self) -> None:
        if self.closed:
            return
        proc = self.proc
        if proc is not None and proc.poll() is not None:
            self._ended(int(proc.returncode))
        self.look()

    def look(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_look < LOOK_EVERY:
            return
        self.last_look = now
        t, st = self.team, self.state
        changed = False
        s = watch_report.head_test_state(t.store.commondir)
        rounds = int(s.get("rounds") or 0)
        if rounds != self.rounds_seen and s.get("head"):
            self.rounds_seen = rounds
            st.update(rounds=rounds, head=s["head"], result=s["state"], failing=list(s.get("failing") or []))
            t.emit("head_tested", commit=s["head"], round=rounds, result=s["state"], failing=st["failing"][:8])
            changed = True
        for f in findings(t.store.commondir, t.st):
            if any(x["id"] == f["id"] for x in st["found"]):
                continue
            st["found"].append(f)
            t.emit("head_conflict", found=f["kind"], test=f["test"], commit=f["head"],
                   writes=[w["commit"][:10] for w in f["writes"]], agents=f["agents"])
            changed = True
        if changed:
            t.save()


def findings(commondir: str, st: RunState) -> list[dict[str, Any]]:
    """The runner's notices on this run's engineers' writes since the run started."""
    mine = {e.agent for e in st.engineers}
    out = []
    for n in notices.all_notices(commondir):
        if n.time + 1 < st.started or not mine & set(n.agents):
            continue
        out.append({"id": n.id, "kind": n.kind, "test": n.test, "head": n.head, "time": n.time,
                    "agents": n.agents, "writes": [{"commit": w.commit, "agent": w.agent, "subject": w.subject}
                                                   for w in n.writes]})
    return out


def view(commondir: str, st: RunState) -> dict[str, Any] | None:
    """The board's part: the runner's last round and what it blamed (None: not watched)."""
    ht = st.head_tests
    if not ht.get("cmd"):
        return None
    s = watch_report.head_test_state(commondir)
    running = bool(ht.get("pid")) and launcher.alive(ht.get("pid"), ht.get("pstart"))
    return {"test": ht["cmd"], "runner": {"pid": ht.get("pid"), "alive": running},
            "result": s.get("state"), "head": s.get("head"), "rounds": s.get("rounds", 0),
            "failing": list(s.get("failing") or []), "testing": (s.get("running") or {}).get("head"),
            "found": list(ht.get("found") or [])}


def attach(team: Any) -> HeadTests | None:
    """Start the run's runner when its options ask for one, and hook it into the run's
    ticks and its end."""
    cmd = team.extra.get("watch_test")
    if not cmd or team.st.mode != "storm":
        return None
    ht = HeadTests(team, str(cmd))
    ht.start()
    team.ticks.append(lambda _t: ht.tick())
    team.on_finish.append(lambda _t: ht.close())
    return ht


def _tail(path: str, n: int = 300) -> str:
    """The last line of a log (what a runner that ended said last)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            data = fh.read()
    except OSError:
        return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""
