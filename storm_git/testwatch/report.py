"""The test runner's state as the doors show it: ``status`` lines, ``log`` entries."""
from __future__ import annotations

from typing import Any

from ..core.errors import CorruptState
from . import notices
from .state import alive, load


def head_test_state(commondir: str) -> dict[str, Any]:
    """The shared head's test state for a board (``git storm team``), ``status`` and
    ``log``: the head last tested, green or red, the failing tests, whether a round
    runs now, the open notices. Never raises for a missing or corrupt state."""
    try:
        st = load(commondir)
    except (CorruptState, OSError) as exc:
        return {"state": "corrupt", "error": str(exc)}
    if st.head is None and st.running is None:
        return {"state": "untested"}
    failing = [t for t in st.failing() if t not in st.known_failing]
    running = st.running if st.running and alive(int(st.running.get("pid", 0))) else None
    return {"state": "red" if failing else "green", "head": st.head, "rounds": st.rounds,
            "tests": len(st.results), "failing": failing,
            "known_failing": sorted(t for t in st.known_failing if t in st.results),
            "flaky": sorted(st.flaky), "running": running,
            "notices": [n.summary() for n in notices.all_notices(commondir)[-10:]]}



def status_text(commondir: str) -> str:
    """A few lines for ``git storm status`` ("" when no runner ever ran here)."""
    s = head_test_state(commondir)
    if s["state"] == "untested":
        return ""
    if s["state"] == "corrupt":
        return f"tests: state unreadable ({s['error']}); 'git storm watch' rewrites it at its next round"
    lines = [f"tests: {s['state']} at {str(s['head'] or '')[:10]} (round {s['rounds']}, {s['tests']} tests)"
             + (f", running on {s['running']['head'][:10]}" if s.get("running") else "")]
    if s["failing"]:
        lines.append("  failing: " + ", ".join(s["failing"][:8]) + (" …" if len(s["failing"]) > 8 else ""))
    if s["known_failing"]:
        lines.append("  known failing (red before any agent wrote, blamed on nobody): "
                     + ", ".join(s["known_failing"][:5]))
    if s["flaky"]:
        lines.append("  flaky (blamed on nobody): " + ", ".join(s["flaky"][:5]))
    for n in s["notices"]:
        lines.append(f"  {n['kind']}: {n['test']} — writes {', '.join(n['writes'])} by {', '.join(n['agents'])}")
    return "\n".join(lines)


def log_entries(commondir: str) -> list[dict[str, Any]]:
    """One ``git storm log`` entry per notice (type ``test-notice``)."""
    out = []
    for n in notices.all_notices(commondir):
        what = "semantic conflict" if n.kind == "semantic" else "break"
        out.append({"type": "test-notice", "time": n.time, "agent": ",".join(n.agents),
                    "summary": f"tests: {n.test} fails on {n.head[:10]}: {what} by "
                               + ", ".join(f"{w.commit[:10]} ({w.agent})" for w in n.writes),
                    "notice": n.to_dict()})
    return out
