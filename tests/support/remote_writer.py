"""A writer process for the remote tests and benchmark (run as a script).

    python remote_writer.py CLONE AGENT WRITES ACKFILE SEED OWN_PATH SHARED_PATH SHARE

Each logical write starts a fresh task (forget), reads its target — its own file,
or with probability SHARE the file every writer shares — appends ``AGENT k`` and
writes it with validation through the clone's remote workspace. A rejection is
re-planned from its payload (the current content it carries) and retried. Every
accepted write is acknowledged only after ``write()`` returned: one JSON line
(one ``write(2)``) in ACKFILE; every rejection is logged with what justifies it
(the version the agent had seen and the head that rejected it).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time


def main() -> int:
    clone, agent, writes, ackfile, seed, own, shared, share = sys.argv[1:]
    from storm_git import open_workspace

    ws = open_workspace(clone)
    rnd = random.Random(int(seed))
    fd = os.open(ackfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def out(**rec) -> None:
        os.write(fd, (json.dumps(rec) + "\n").encode())

    for k in range(int(writes)):
        target = shared if rnd.random() < float(share) else own
        ws.forget(None, agent=agent)
        [r] = ws.read([target], agent=agent)
        seen, line = r.version, f"{agent} {k}\n".encode()
        t0 = time.monotonic()
        res = ws.write(target, (r.content or b"") + line, agent=agent)
        for _ in range(50):
            if res.accepted:
                break
            rej = res.rejection
            out(kind="rejection", agent=agent, path=rej.path, reason=rej.reason, seen=seen, head=rej.head,
                current=rej.current_version)
            if rej.reason == "reserved":  # shown, not recorded as read: read it again, as the brief says
                [r] = ws.read([target], agent=agent)
                seen, base = r.version, r.content
            else:  # direct_conflict, stale_dependency, unread_target: the payload counts as the re-read
                seen, base = rej.current_version, rej.current_content
            res = ws.write(target, (base or b"") + line, agent=agent)
        if not res.accepted:
            out(kind="gave_up", agent=agent, path=target)
            continue
        out(kind="ack", agent=agent, path=target, commit=res.commit, line=line.decode(), retries=res.cas_retries,
            seconds=time.monotonic() - t0)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
