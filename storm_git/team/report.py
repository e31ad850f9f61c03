"""The final report of a team run: JSON for machines, Markdown for people.

Per engineer: its writes and the files they touched, rejections by reason,
re-plans (a rejected path the engineer then wrote), reservation waits, tokens,
cost and time; for the run: the conflicts caught at write (storm's rejections),
at merge (worktree mode), by the tests on the shared head during the run (storm
mode with ``--watch-test``: each semantic conflict or break and the writes it was
blamed on) and by the tests at landing, and what landed where.
"""
from __future__ import annotations

import json
from typing import Any

from ..core.files import replace_file
from .plan import Plan
from .state import RunDir, RunState

WRITE_CONFLICTS = ("direct_conflict", "stale_dependency", "unread_target")


def build(st: RunState, plan: Plan, activity: dict[str, dict[str, Any]]) -> dict[str, Any]:
    subs = plan.by_id()
    engineers = []
    for e in st.engineers:
        a = activity.get(e.agent, {})
        reasons = dict(a.get("reasons") or {})
        paths = list(a.get("paths") or [])
        rejected = list(a.get("rejected_paths") or [])
        replans = sum(1 for p in dict.fromkeys(rejected) if p in paths)
        engineers.append({
            "agent": e.agent, "subtask": e.subtask, "title": subs[e.subtask].title if e.subtask in subs else "",
            "harness": e.harness, "state": e.state, "why": e.why, "attempts": e.attempts,
            "fix_rounds": e.fix_rounds, "exit": e.exit,
            "seconds": round((e.ended or 0) - (e.started or 0), 3) if e.started and e.ended else None,
            "writes": int(a.get("writes") or 0), "paths": paths, "reads": int(a.get("reads") or 0),
            "rejections": int(a.get("rejections") or 0), "reasons": reasons, "replans": replans,
            "reservation_waits": reasons.get("reserved", 0),
            "tokens": e.tokens, "cost": e.cost,
            "transcripts": [f"transcripts/{e.agent}.{i}.out" for i in range(1, e.attempts + 1)],
        })
    at_write = sum(v for x in engineers for k, v in x["reasons"].items() if k in WRITE_CONFLICTS)
    at_merge = sum(1 for m in st.merges for r in m.get("results", []) if r.get("status") == "conflicted")
    by_tests = sum(1 for t in st.tests if not t.get("passed"))
    found = list(st.head_tests.get("found") or [])
    tokens = [x["tokens"] for x in engineers if x["tokens"] is not None]
    costs = [x["cost"] for x in engineers if x["cost"] is not None]
    return {
        "run": st.run, "task": st.task, "mode": st.mode, "phase": st.phase, "problems": st.problems,
        "started": st.started, "ended": st.ended,
        "seconds": round((st.ended or st.started) - st.started, 3), "branch": st.branch,
        "base_commit": st.base_commit, "landed": st.landed, "pushed": st.pushed or None, "engineers": engineers,
        "conflicts": {"at_write": at_write, "at_merge": at_merge, "by_tests": by_tests,
                      **({} if not st.head_tests.get("cmd") else
                         {"on_head": sum(1 for f in found if f.get("kind") == "semantic"),
                          "breaks_on_head": sum(1 for f in found if f.get("kind") == "break")})},
        "head_tests": None if not st.head_tests.get("cmd") else
        {"test": st.head_tests["cmd"], "rounds": int(st.head_tests.get("rounds") or 0),
         "last": {"commit": st.head_tests.get("head"), "result": st.head_tests.get("result")}, "found": found},
        "tests": [{k: v for k, v in t.items() if k != "output"} | {"output_tail": str(t.get("output", ""))[-800:]}
                  for t in st.tests],
        "totals": {"writes": sum(x["writes"] for x in engineers),
                   "rejections": sum(x["rejections"] for x in engineers),
                   "replans": sum(x["replans"] for x in engineers),
                   "reservation_waits": sum(x["reservation_waits"] for x in engineers),
                   "tokens": sum(tokens) if tokens else None,
                   "cost": round(sum(costs), 6) if costs else None},
    }


def markdown(rep: dict[str, Any]) -> str:
    lines = [f"# Team run {rep['run']}: {rep['phase']}", "", f"Task: {rep['task']}", "",
             f"Mode: {rep['mode']}; branch {rep['branch']}; {rep['seconds']:.1f} s."]
    landed = rep.get("landed") or {}
    if landed.get("commit"):
        lines.append(f"Landed: {landed['commit']} on {landed.get('branch') or rep['branch']}.")
    pushed = rep.get("pushed") or {}
    if pushed:
        lines.append(f"Pushed: {pushed['branch']} to {pushed['remote']}." if pushed.get("ok") else
                     f"Not pushed to {pushed['remote']}: {pushed.get('error')}")
    for p in rep.get("problems") or []:
        lines.append(f"Problem: {p}")
    lines += ["", "| engineer | subtask | state | writes | rejections | re-plans | waits | tokens | cost | time |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in rep["engineers"]:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(e["reasons"].items()))
        lines.append(f"| {e['agent']} | {e['subtask']}: {e['title']} | {e['state']} | {e['writes']} | "
                     f"{e['rejections']}{f' ({reasons})' if reasons else ''} | {e['replans']} | "
                     f"{e['reservation_waits']} | {e['tokens'] if e['tokens'] is not None else '-'} | "
                     f"{'{:.4f}'.format(e['cost']) if e['cost'] is not None else '-'} | "
                     f"{'{:.1f} s'.format(e['seconds']) if e['seconds'] is not None else '-'} |")
    c = rep["conflicts"]
    caught = f"Conflicts caught: {c['at_write']} at write, {c['at_merge']} at merge, "
    ht = rep.get("head_tests")
    if ht:
        caught += (f"{c.get('on_head', 0)} semantic conflict(s) and {c.get('breaks_on_head', 0)} break(s) "
                   f"by the tests on the shared head during the run ({ht['rounds']} rounds of `{ht['test']}`), ")
    lines += ["", caught + f"{c['by_tests']} by the tests{' at landing' if ht else ''}.", ""]
    for f in (ht or {}).get("found") or []:
        what = "semantic conflict between" if f["kind"] == "semantic" else "break by"
        lines.append(f"- tests on the shared head: {f['test']} failed on {f['head'][:10]}: {what} "
                     + " and ".join(f"{w['commit'][:10]} ({w['agent']}: {w['subject']})" for w in f["writes"]))
    for e in rep["engineers"]:
        if e["paths"]:
            lines.append(f"- {e['agent']} wrote {', '.join(e['paths'])}")
        if e["why"]:
            lines.append(f"- {e['agent']}: {e['why']}")
    for t in rep["tests"]:
        lines.append(f"- tests{' (' + t['agent'] + ')' if t.get('agent') else ''}: "
                     f"{'passed' if t.get('passed') else 'failed'}")
    lines += ["", "Transcripts: " + ", ".join(t for e in rep["engineers"] for t in e["transcripts"]), ""]
    return "\n".join(lines)


def write(rd: RunDir, rep: dict[str, Any]) -> None:
    replace_file(rd.file("report.json"), (json.dumps(rep, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    replace_file(rd.file("report.md"), markdown(rep).encode("utf-8"))


def load(rd: RunDir) -> dict[str, Any] | None:
    try:
        with open(rd.file("report.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

