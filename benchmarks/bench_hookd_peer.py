#!/usr/bin/env python3
"""What the hook daemon's confinement check costs a call, beside the call.

Each hook call through the daemon pays two extra pieces (storm_git.integrations.hookd_peer):
the client reads its own confinement for the daemon's name (``key``), and the
call's child reads the peer's from ``/proc/<pid>`` and compares (``serves``,
with the pidfd check), over a real unix socket pair. Not a test: it prints
medians in microseconds, and the same run's ``python -c pass`` in milliseconds
for scale.

    python3 benchmarks/bench_hookd_peer.py            # 2000 rounds
    python3 benchmarks/bench_hookd_peer.py --rounds 500 --json
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def _median_us(fn, rounds: int) -> float:  # noqa: ANN001
    xs = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from storm_git.integrations import hookd, hookd_peer

    mine = hookd.Peer(hookd_peer.confinement() or (), hookd_peer.exec_env(os.environb))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    creds = a.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    caller = hookd.Caller(int.from_bytes(creds[:4], sys.byteorder), hookd_peer.boottime())
    req = hookd.Request("", b"/", 0o22, [], [], [], dict(os.environb), b"")
    assert hookd.serves(a, mine, caller, req), "this process is not served by a daemon of its own confinement"
    env = dict(os.environb)
    res = {
        "client key (own /proc reads)": _median_us(lambda: hookd_peer.key(env), args.rounds),
        "child check (peer's /proc, pidfd)": _median_us(lambda: hookd.serves(a, mine, caller, req), args.rounds),
    }
    a.close()
    b.close()
    starts = []
    for _ in range(min(args.rounds, 30)):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        starts.append(time.perf_counter() - t)
    res["python -c pass (ms)"] = statistics.median(starts) * 1e3
    if args.json:
        print(json.dumps(res, indent=1))
        return
    for k, v in res.items():
        print(f"{k:<36} {v:>9.1f}{'' if k.endswith('(ms)') else ' us'}")


if __name__ == "__main__":
    main()
