"""One agent of bench_remote.py's realistic load: a long-lived process (run as a script).

    python remote_agent.py SPEC_JSON

An agent works the way a coding agent driven through storm's Python API does: it
keeps its workspace open (no interpreter start per write: a ``git storm`` process
per write would add ~150 ms of Python start-up that has nothing to do with the
remote) and, on its own schedule -- a gap drawn uniformly from [min_gap, max_gap]
seconds from the end of one task to the start of the next (an agent waits for
its tool call's answer before it goes on; from its own seeded random generator) --
starts a task: forget its read set, read the target (its own file, or with
probability ``share`` the file every agent shares), append one line ``AGENT k``
and write it. A rejection is re-planned from what it carries (the current content,
or a fresh read after a reservation) and written again at once, up to
``max_replans`` times, as an agent re-plans after a conflict.

Every ``write()`` call is one offered write and gets one JSON line in the agent's
output file (one ``write(2)`` each, so a killed agent leaves whole lines):
``ack`` (landed: its commit and line, to check on the server), ``rejection``
(reason, and the version the agent had seen and the head that refused it, to
check that the conflict was real) or ``failed`` (an exception: must not happen).
The schedule starts when the parent writes the go file: ``{"t0": T, "end": E}``
in ``time.monotonic()`` seconds (one clock for every process of the machine);
no task starts at or after ``E``, the one in flight then finishes.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time


def main() -> int:
    spec = json.loads(sys.argv[1])
    from storm_git import open_workspace

    agent = spec["agent"]
    ws = open_workspace(spec["clone"])
    rnd = random.Random(spec["seed"])
    fd = os.open(spec["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def out(**rec: object) -> None:
        os.write(fd, (json.dumps(rec) + "\n").encode())

    open(spec["go"] + "." + agent, "w").close()  # ready: opened, imports done
    while not os.path.exists(spec["go"]):
        time.sleep(0.01)
    with open(spec["go"]) as fh:
        window = json.load(fh)
    t0, end = window["t0"], window["end"]
    cpu0 = os.times()
    next_at = t0 + rnd.uniform(0, spec["max_gap"])  # agents do not all start at once
    k = 0
    while next_at < end:
        time.sleep(max(0.0, next_at - time.monotonic()))
        target = spec["shared"] if rnd.random() < spec["share"] else spec["own"]
        line = f"{agent} {k}\n".encode()
        common = {"agent": agent, "path": target, "shared": target == spec["shared"], "task": k}
        try:
            ws.forget(None, agent=agent)  # a new task: only what it reads is in its read set
            r0 = time.monotonic()
            [r] = ws.read([target], agent=agent)
            read_s = time.monotonic() - r0
            seen, base = r.version, r.content or b""
            for attempt in range(spec["max_replans"] + 1):
                w0 = time.monotonic()
                res = ws.write(target, base + line, agent=agent)
                took = time.monotonic() - w0
                wait = res.reservation_wait.seconds if res.reservation_wait else 0.0
                if res.accepted:
                    out(kind="ack", commit=res.commit, line=line.decode(), seconds=took, read_seconds=read_s,
                        attempt=attempt, cas_retries=res.cas_retries, reservation_wait=wait,
                        at=w0 - t0, **common)
                    break
                rej = res.rejection
                out(kind="rejection", reason=rej.reason, seen=seen, head=rej.head, current=rej.current_version,
                    seconds=took, attempt=attempt, at=w0 - t0, **common)
                if rej.reason == "reserved":  # shown, not recorded as read: read it again
                    [r] = ws.read([target], agent=agent)
                    seen, base = r.version, r.content or b""
                else:  # the rejection's payload is the re-read
                    seen, base = rej.current_version, rej.current_content or b""
            else:
                out(kind="gave_up", **common)
        except Exception as exc:  # noqa: BLE001 - every failure is a figure, and must be 0
            out(kind="failed", error=type(exc).__name__, message=str(exc)[:500], **common)
        k += 1
        next_at = time.monotonic() + rnd.uniform(spec["min_gap"], spec["max_gap"])
    t, c = os.times(), cpu0  # this agent's CPU in the window: storm's Python, and the git processes it ran
    out(kind="cpu", agent=agent, self=t.user + t.system - c.user - c.system,
        children=t.children_user + t.children_system - c.children_user - c.children_system)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
