"""The board: a run as rows (one per engineer) and as event lines.

``snapshot`` is what ``team status --json`` prints and what the live table shows:
per engineer its state, the file it is on, reads, accepted and rejected writes,
reservations held and the holder it waits for, tokens, cost and elapsed time; for
the run its phase, the shared head, the last test result and, with a runner on the
shared head (:mod:`.head_tests`), its last round and the writes it blamed. Rendering is plain
text (the CLI redraws it in place on a terminal, prints one line per event
otherwise): a dozen rows refreshed once a second need no terminal library.
"""
from __future__ import annotations

import time
from typing import Any

from ..core.store import WORKSPACE_REF, Store
from . import head_tests, launcher
from .progress import Activity
from .state import RunState

STATE_MARK = {"queued": "·", "running": "▶", "waiting": "⏸", "done": "✓", "failed": "✗", "stopped": "■"}


def snapshot(store: Store, st: RunState, activity: dict[str, Activity]) -> dict[str, Any]:
    runner_alive = launcher.alive(st.runner_pid, st.runner_pstart)
    now = time.time()
    rows = []
    for e in st.engineers:
        a = activity.get(e.agent) or Activity()
        session_alive = launcher.alive(e.pid, e.pstart) if e.pid else False
        rows.append({
            "agent": e.agent, "subtask": e.subtask, "harness": e.harness, "state": e.state, "pid": e.pid,
            "alive": session_alive, "orphaned": session_alive and not runner_alive,
            "attempts": e.attempts, "exit": e.exit, "why": e.why, "on": a.on, "reads": a.reads,
            "writes": a.writes, "rejections": a.rejections, "reasons": a.reasons, "holds": a.holds,
            "waits_for": a.waiting_on, "waiting_for": a.waiting_for, "tokens": e.tokens, "cost": e.cost,
            "elapsed": round(((e.ended or now) - e.started), 1) if e.started else None,
        })
    head = store.ref_target(WORKSPACE_REF)
    last = st.tests[-1] if st.tests else None
    return {"run": st.run, "task": st.task, "mode": st.mode, "phase": st.phase,
            "runner": {"pid": st.runner_pid, "alive": runner_alive},
            "head": str(head) if head is not None else None, "branch": st.branch,
            "last_test": None if last is None else {"passed": bool(last.get("passed")), "round": last.get("round"),
                                                   "agent": last.get("agent")},
            "head_tests": head_tests.view(store.commondir, st),
            "landed": st.landed, "problems": st.problems, "engineers": rows,
            "elapsed": round((st.ended or now) - st.started, 1)}


def table(snap: dict[str, Any]) -> list[str]:
    """The board as lines of text."""
    test = snap["last_test"]
    head = (snap["head"] or "-")[:10]
    result = "-" if test is None else ("pass" if test["passed"] else "FAIL")
    lines = [(f"team run {snap['run']}  {snap['mode']} mode  {snap['phase']}  {snap['elapsed']:.0f}s  "
              f"shared head {head}  tests {result}" + head_line(snap.get("head_tests"))),
             (f"{'':2}{'engineer':<12}{'subtask':<10}{'state':<9}{'on':<24}{'reads':>6}{'writes':>7}"
              f"{'rejected':>9}  {'holds/waits':<18}{'tokens':>8}{'cost':>8}{'time':>7}")]
    for r in snap["engineers"]:
        holds = ",".join(r["holds"])[:10]
        waits = (r["waits_for"] or "")[:10]
        hw = (holds + (" ⏸" + waits if waits else ""))[:18]
        lines.append(f"{STATE_MARK.get(r['state'], '?'):<2}{r['agent']:<12}{r['subtask'][:9]:<10}{r['state']:<9}"
                     f"{(r['on'] or '-')[-23:]:<24}{r['reads']:>6}{r['writes']:>7}{r['rejections']:>9}  "
                     f"{hw:<18}{r['tokens'] if r['tokens'] is not None else '-':>8}"
                     f"{'{:.3f}'.format(r['cost']) if r['cost'] is not None else '-':>8}"
                     f"{'{:.0f}s'.format(r['elapsed']) if r['elapsed'] is not None else '-':>7}")
    lines += [f"  {r['agent']} {waiting(r['waits_for'], r['waiting_for'])}" for r in snap["engineers"]
              if r["waits_for"] and r["state"] in ("running", "waiting")]
    return lines


def waiting(holder: str | None, path: str | None) -> str:
    return f"waiting on {holder}" + (f" for {path}" if path else "")


def head_line(ht: dict[str, Any] | None) -> str:
    """The runner on the shared head, for the board's first line ("" when none)."""
    if not ht:
        return ""
    text = f"  head tests {ht['result'] or '-'}"
    if ht.get("head"):
        text += f" at {ht['head'][:10]} (round {ht['rounds']})"
    if ht.get("testing"):
        text += f", testing {ht['testing'][:10]}"
    for f in ht.get("found") or []:
        text += f"; {f['kind']} {f['test'].rsplit('::', 1)[-1]} by {'+'.join(f['agents'])}"
    return text


def event_line(ev: dict[str, Any]) -> str:
    """One event as one line of text."""
    t = time.strftime("%H:%M:%S", time.localtime(float(ev.get("time", 0))))
    kind = ev.get("event", "?")
    who = ev.get("agent")
    rest = {k: v for k, v in ev.items() if k not in ("time", "run", "event", "agent", "brief", "cwd")}
    if kind == "started":
        text = f"started {ev.get('subtask')} ({ev.get('harness')}, pid {ev.get('pid')}, {ev.get('round')})"
    elif kind == "ended":
        text = f"{ev.get('state')}" + (f": {ev['why']}" if ev.get("why") else "") + f" after {ev.get('seconds')}s"
    elif kind == "tested":
        text = f"tests {'passed' if ev.get('passed') else 'failed'} (round {ev.get('round')}, {ev.get('seconds')}s)"
    elif kind == "head_tested":
        failing = ev.get("failing") or []
        text = (f"shared head {str(ev.get('commit'))[:10]} tested (round {ev.get('round')}): {ev.get('result')}"
                + (f", failing {', '.join(failing)}" if failing else ""))
    elif kind == "head_conflict":
        what = "semantic conflict" if ev.get("found") == "semantic" else "break"
        text = (f"tests on the shared head: {ev.get('test')} fails: {what} by writes "
                f"{', '.join(ev.get('writes') or [])} ({', '.join(ev.get('agents') or [])}): told on their next call")
    elif kind == "landed":
        text = f"landed {str(ev.get('commit'))[:12]} on {ev.get('branch')}"
    elif kind == "waiting":
        text = waiting(ev.get("holder"), ev.get("path"))
    elif kind == "pushed":
        text = f"pushed {ev.get('branch')} to {ev.get('remote')}"
    elif kind == "push_failed":
        text = f"not pushed to {ev.get('remote')}: {ev.get('error')}"
    elif kind == "report":
        text = f"run {ev.get('phase')}" + (f": {ev['why']}" if ev.get("why") else "") + f"; report {ev.get('markdown')}"
    else:
        text = kind + ("" if not rest else " " + " ".join(f"{k}={v}" for k, v in rest.items()))
    return f"{t} {who + ' ' if who else ''}{text}"
