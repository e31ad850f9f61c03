"""Real processes writing at once: no lost update, no unjustified rejection,
no accepted write that broke the validity rule, and a clean ``git fsck``.

8 writer processes × 50 writes, mixing each agent's own files with three files
every agent fights over. The checks come from git itself: the shared ref's
history, each write's provenance (its commit's trailers, resolved through the
agents' notes) and the blobs the payloads name.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import random
from pathlib import Path

import pytest

from helpers import fsck, git, make_repo, rev

PROCS = 8
WRITES = 50
SHARED = ["shared/a.py", "shared/b.py", "shared/c.py"]


def _worker(repo: str, agent: str, seed: int, out: str) -> None:
    from storm_git import open_workspace

    ws = open_workspace(repo)
    rnd = random.Random(seed)
    log = []
    for k in range(WRITES):
        path = f"own/{agent}.txt" if k % 2 == 0 else rnd.choice(SHARED)
        reads = [path] + ([rnd.choice(SHARED)] if rnd.random() < 0.3 else [])
        ws.read(reads, agent=agent)
        content = f"{agent} write {k}\n".encode()
        res = ws.write(path, content, agent=agent, intent=f"{agent}: write {k}", wait=False)
        item = {"k": k, "path": path, "accepted": res.accepted, "commit": res.commit,
                "version": res.versions.get(path)}
        if not res.accepted:
            r = res.rejection
            item["rejection"] = {
                "reason": r.reason, "head": r.head, "path": r.path,
                "read_version": r.target.read_version if r.target else None,
                "current_version": r.current_version,
                "holder": r.reservation.holder if r.reservation else None,
                "stale": [(s.path, s.read_version, s.current_version) for s in r.stale],
            }
        log.append(item)
        ws.forget(None, agent=agent)  # each write is its own little task
    Path(out).write_text(json.dumps(log))


def _blob(repo: Path, commit: str, path: str) -> str | None:
    r = git(repo, "rev-parse", "-q", "--verify", f"{commit}:{path}", check=False)
    return r.stdout.decode().strip() or None


@pytest.mark.slow
def test_eight_processes_fifty_writes_each(tmp_path: Path) -> None:
    files = {p: "start\n" for p in SHARED}
    files.update({f"own/e{i}.txt": "start\n" for i in range(PROCS)})
    repo = make_repo(tmp_path / "repo", files)
    git(repo, "config", "storm.reservationSeconds", "0.2")
    base = rev(repo, "refs/storm/workspace")
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"e{i}.json" for i in range(PROCS)]
    procs = [ctx.Process(target=_worker, args=(str(repo), f"e{i}", i, str(outs[i]))) for i in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    logs = {f"e{i}": json.loads(outs[i].read_text()) for i in range(PROCS)}
    accepted = [(a, it) for a, items in logs.items() for it in items if it["accepted"] and it["commit"]]
    rejected = [(a, it) for a, items in logs.items() for it in items if not it["accepted"]]
    assert len(accepted) + len(rejected) == PROCS * WRITES
    assert rejected, "the shared files should have produced some conflicts"

    # no lost update: one commit per accepted write, each acknowledged commit on the ref
    history = git(repo, "rev-list", "--first-parent", f"{base}..refs/storm/workspace").stdout.decode().split()
    assert len(history) == len(accepted)
    assert {it["commit"] for _, it in accepted} == set(history)
    assert len(git(repo, "rev-list", f"{base}..refs/storm/workspace", "--merges").stdout.split()) == 0

    # final content of each file is its last accepted write (newest first in history)
    by_commit = {it["commit"]: (a, it) for a, it in accepted}
    last: dict[str, bytes] = {}
    for c in history:
        a, it = by_commit[c]
        last.setdefault(it["path"], f"{a} write {it['k']}\n".encode())
    for path, content in last.items():
        assert git(repo, "show", f"refs/storm/workspace:{path}").stdout == content
        assert (repo / path).read_bytes() == content  # disk converged too

    # every rejection is justified by the state at the head it was judged against
    for a, it in rejected:
        r = it["rejection"]
        if r["reason"] == "reserved":
            assert r["holder"] and r["holder"] != a
            continue
        assert _blob(repo, r["head"], r["path"]) == r["current_version"]
        if r["reason"] == "direct_conflict":
            assert r["read_version"] != r["current_version"]
        for path, seen, now in r["stale"]:
            assert seen != now and _blob(repo, r["head"], path) == now

    # every accepted write was valid: its provenance read set matches its parent
    from storm_git import open_workspace
    from storm_git.core import provenance

    ws = open_workspace(str(repo))
    ws.status()  # folds every agent's journal, which the commits' provenance points into
    for c in history:
        a, it = by_commit[c]
        message = git(repo, "log", "-1", "--format=%B", c).stdout.decode()
        parent = rev(repo, f"{c}^")
        assert f"\nStorm-Validated-At: {parent}\n" in message and "\nStorm-Read-Set: " in message
        header, entries = provenance.load(ws.store, a, c)
        assert header["validated-at"] == parent
        assert any(e.path == it["path"] for e in entries) or _blob(repo, parent, it["path"]) is None
        for e in entries:
            assert e.blob == _blob(repo, parent, e.path), (c, e.path)

    checked = fsck(repo)
    assert checked.returncode == 0, checked.stderr
