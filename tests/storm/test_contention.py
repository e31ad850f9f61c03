"""Contention and progress: 16 writer processes on one file, then on a shared set.

Every writer (tests/support/storm_writer.py) appends its own line to a file with a
validated write and follows the rejection protocol: re-plan from the payload
(its current content) and retry, holding the reservation the rejection gave it.
Checked: every rejection payload names the content and version git has at the
head it names (the writer checks each one against git); every process finishes
(no livelock, no starvation) within a bounded number of retries; and no update
is lost: every acknowledged line is in the final file exactly once, in the
history, and the file holds nothing else. The retry distribution (rejections
before a write was accepted) is recorded.

CI: 16 processes x 5 writes, on one file and on a set of 4 files.
``STORM_LONG=1`` or ``-m slow``: 16 x 40.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from figures import long_run, percentile, record
from helpers import SUPPORT, fsck, git, make_repo

WRITER = str(SUPPORT / "storm_writer.py")
PROCS = 16
MAX_RETRIES = 40  # a bound far above what reservations allow in practice; exceeding it is a livelock


def run_contention(tmp_path: Path, paths: list[str], writes: int, name: str) -> None:
    repo = make_repo(tmp_path / "repo", {p: "" for p in paths})
    ackdir = tmp_path / "acks"
    ackdir.mkdir()
    procs = []
    for i in range(PROCS):
        procs.append(subprocess.Popen(
            [sys.executable, WRITER, str(repo), f"c{i:02d}", str(writes), str(ackdir / f"c{i:02d}.jsonl"),
             str(i), *paths], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        try:
            _, err = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:  # a livelock: fail, never hang CI
            for q in procs:
                q.kill()
            pytest.fail("a writer did not finish in 600 s")
        assert p.returncode == 0, err.decode()
    recs = [json.loads(ln) for f in sorted(ackdir.glob("*.jsonl")) for ln in f.read_text().splitlines()]
    bad = [r for r in recs if r["event"] == "bad_payload"]
    assert not bad, bad
    assert sum(r["event"] == "done" for r in recs) == PROCS
    acks = [r for r in recs if r["event"] == "ack"]
    assert len(acks) == PROCS * writes
    retries = [r["retries"] for r in acks]
    assert max(retries) <= MAX_RETRIES
    reasons = Counter(r["reason"] for r in recs if r["event"] == "rejected")
    # no lost update: each file holds exactly the lines acknowledged for it
    history = set(git(repo, "rev-list", "refs/storm/workspace").stdout.decode().split())
    for path in paths:
        content = git(repo, "show", f"refs/storm/workspace:{path}").stdout.decode().splitlines()
        want = [r["line"] for r in acks if r["path"] == path]
        assert sorted(content) == sorted(want), path
    assert all(r["commit"] in history for r in acks)
    assert fsck(repo).returncode == 0
    record(name, processes=PROCS, writes=len(acks), rejections=sum(reasons.values()),
           reasons=dict(reasons), retries_p50=percentile(retries, 50), retries_p99=percentile(retries, 99),
           retries_max=max(retries), retry_histogram=dict(sorted(Counter(retries).items())))


def _writes() -> int:
    return 40 if long_run() else 5


@pytest.mark.slow
def test_sixteen_writers_one_file(tmp_path):
    run_contention(tmp_path, ["hot.txt"], _writes(), "contention one file" + (" (STORM_LONG)" if long_run() else ""))


def test_sixteen_writers_shared_set(tmp_path):
    run_contention(tmp_path, ["s/a.txt", "s/b.txt", "s/c.txt", "s/d.txt"], _writes(),
                   "contention 4 files" + (" (STORM_LONG)" if long_run() else ""))


@pytest.mark.slow
def test_sixteen_writers_long(tmp_path):
    run_contention(tmp_path / "one", ["hot.txt"], 40, "contention one file long")
    run_contention(tmp_path / "set", ["s/a.txt", "s/b.txt", "s/c.txt", "s/d.txt"], 40, "contention 4 files long")
