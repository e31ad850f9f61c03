"""A writer process for the crash, contention and gc tests (run as a script).

    python storm_writer.py REPO AGENT WRITES ACKFILE SEED PATH [PATH...]

Each logical write reads the target (and, with several paths, one other path
as a dependency), appends a line ``AGENT k`` to the target and writes it with
validation. On a rejection the agent follows the protocol: re-plan from the
payload (the current content it carries) and retry; reservations stop others
from invalidating it meanwhile. Only after ``write()`` returned *accepted* is
the write acknowledged: a JSON line appended to ACKFILE (one ``write(2)``, so a
SIGKILL cannot leave half a line). Every rejection payload is checked against
git (the content and version it names are those at the head it names).
"""
from __future__ import annotations

import json
import os
import random
import sys


def main() -> int:
    repo, agent, writes, ackfile, seed, *paths = sys.argv[1:]
    from storm_git import open_workspace
    from storm_git.core.payloads import REASONS

    ws = open_workspace(repo)
    store = ws.store
    rnd = random.Random(int(seed))
    fd = os.open(ackfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def out(**rec) -> None:
        os.write(fd, (json.dumps(rec) + "\n").encode())

    def check_payload(rej) -> str | None:
        if rej.reason not in REASONS:
            return f"unknown reason {rej.reason}"
        head = store.commit(__import__("pygit2").Oid(hex=rej.head))
        e = store.entry(head.tree, rej.path)
        if (str(e.oid) if e else None) != rej.current_version:
            return f"current_version {rej.current_version} is not {rej.path} at {rej.head}"
        if (store.blob_bytes(e.oid) if e else None) != rej.current_content:
            return "current_content is not the content at the named head"
        if rej.reason == "reserved" and (rej.reservation is None or rej.reservation.holder == agent):
            return "reserved by nobody else"
        if rej.reason == "direct_conflict" and rej.target.read_version == rej.current_version:
            return "direct conflict on an unchanged file"
        return None

    out(event="ready", pid=os.getpid())
    for k in range(int(writes)):
        target = rnd.choice(paths)
        deps = [target] + ([rnd.choice([p for p in paths if p != target])] if len(paths) > 1 else [])
        [cur, *_] = ws.read(deps, agent=agent)
        base = cur.content or b""
        retries = 0
        while True:
            res = ws.write(target, base + f"{agent} {k}\n".encode(), agent=agent, intent=f"{agent} write {k}")
            if res.accepted:
                out(event="ack", commit=res.commit, path=target, line=f"{agent} {k}", retries=retries)
                break
            bad = check_payload(res.rejection)
            if bad:
                out(event="bad_payload", reason=res.rejection.reason, problem=bad)
            retries += 1
            out(event="rejected", reason=res.rejection.reason, path=target)
            # re-plan from the payload: its current content is the new base
            base = res.rejection.current_content or b""
            if res.rejection.reason == "reserved":
                ws.read([target], agent=agent)
            stale = [st.path for st in res.rejection.stale]
            if stale:  # shown as diffs only: they count as read once read again
                ws.read(stale, agent=agent)
    out(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
