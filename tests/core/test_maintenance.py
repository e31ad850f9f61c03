"""Living with git: writers beside gc / pack-refs / maintenance, and bounded loose objects.

* Writer processes run while a loop runs ``git gc``, ``git pack-refs --all``,
  ``git maintenance run`` and ``git storm maintenance`` beside them: no writer
  fails, every acknowledged write is in the history, ``git fsck`` is clean.
* ``git storm maintenance`` keeps the loose-object count bounded: many writes
  with maintenance every 250 writes; the loose count after each run stays under
  a bound that does not grow with the number of writes (without maintenance it
  grows by several objects per write).
* ``git storm maintenance`` never prunes: traced with GIT_TRACE, none of the git
  commands it runs is ``gc --prune=now``, ``prune`` or an ``--expire=now``.

CI: 3 writers x 120 writes beside the loop; 1,000 writes for the bound.
``STORM_LONG=1`` or ``-m slow``: 4 x 600 writes; 10,000 writes.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from figures import long_run, record
from helpers import ROOT, SUPPORT, fsck, git, hold, make_repo, release, storm, storm_json

WRITER = str(SUPPORT / "storm_writer.py")

GIT_LOOP = [
    ["gc", "--quiet"],
    ["pack-refs", "--all"],
    ["maintenance", "run", "--task=gc"],
    ["maintenance", "run", "--task=loose-objects"],
    ["pack-refs", "--all", "--prune"],
]


def run_beside_gc(tmp_path: Path, writers: int, writes: int, name: str) -> None:
    agents = [f"g{i}" for i in range(writers)]
    paths = ["shared.txt"] + [f"own/{a}.txt" for a in agents]
    repo = make_repo(tmp_path / "repo", {p: "" for p in paths})
    ackdir = tmp_path / "acks"
    ackdir.mkdir()
    procs = [subprocess.Popen([sys.executable, WRITER, str(repo), a, str(writes), str(ackdir / f"{a}.jsonl"), str(i),
                               f"own/{a}.txt", "shared.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i, a in enumerate(agents)]
    loops = 0
    errors = []
    while any(p.poll() is None for p in procs):
        for cmd in GIT_LOOP:
            r = git(repo, *cmd, check=False)
            if r.returncode != 0:
                errors.append((cmd, r.stderr.decode()))
        r = storm(repo, "maintenance")
        if r.returncode != 0:
            errors.append(("storm maintenance", r.stderr))
        loops += 1
    for p in procs:
        assert p.wait() == 0, p.stderr.read().decode()
    assert not errors, errors
    acks = [json.loads(ln) for f in ackdir.glob("*.jsonl") for ln in f.read_text().splitlines()]
    acks = [r for r in acks if r["event"] == "ack"]
    assert len(acks) == writers * writes
    history = set(git(repo, "rev-list", "refs/storm/workspace").stdout.decode().split())
    assert all(r["commit"] in history for r in acks)
    for path in paths:
        content = git(repo, "show", f"refs/storm/workspace:{path}").stdout.decode().splitlines()
        assert sorted(content) == sorted(r["line"] for r in acks if r["path"] == path)
    checked = fsck(repo)
    assert checked.returncode == 0, checked.stderr.decode()
    record(name, writers=writers, writes_verified=len(acks), gc_loops=loops,
           git_commands_beside_writers=loops * (len(GIT_LOOP) + 1))


def test_writers_beside_gc_pack_refs_maintenance(tmp_path):
    if long_run():
        run_beside_gc(tmp_path, 4, 600, "gc beside writers (STORM_LONG)")
    else:
        run_beside_gc(tmp_path, 3, 150, "gc beside writers")


def run_bounded(tmp_path: Path, writes: int, every: int, name: str) -> None:
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {f"d{i}/e/f{j}.txt": f"{i} {j}\n" for i in range(4) for j in range(5)})
    ws = open_workspace(str(repo))
    store = ws.store
    after_runs = []
    peak_loose = 0
    start = maintenance.count_objects(store).loose
    for k in range(writes):
        path = f"d{k % 4}/e/f{k % 5}.txt"
        agent = f"m{k % 3}"
        [cur] = ws.read([path], agent=agent)
        res = ws.write(path, cur.content + f"{k}\n".encode(), agent=agent, deps=[])
        assert res.accepted
        if (k + 1) % every == 0:
            peak_loose = max(peak_loose, maintenance.count_objects(store).loose)
            after_runs.append(maintenance.run(store).after.loose)
    final = maintenance.count_objects(store)
    per_interval = peak_loose  # loose objects one interval of writes produces, at most
    # bounded: after every run the loose count stays under what two intervals produce,
    # however many writes came before (without maintenance it is ~writes x objects/write)
    assert max(after_runs) <= 2 * per_interval + start, after_runs
    assert final.loose <= 2 * per_interval + start
    assert after_runs[-1] <= after_runs[len(after_runs) // 2] * 1.5 + every
    checked = fsck(repo)
    assert checked.returncode == 0, checked.stderr.decode()
    assert len(git(repo, "rev-list", "refs/storm/workspace").stdout.split()) == writes + 1
    record(name, writes=writes, maintenance_every=every, loose_peak_between_runs=peak_loose,
           loose_after_runs_max=max(after_runs), loose_after_last_run=after_runs[-1],
           packed_objects=final.packed, packs=final.packs,
           loose_after_runs=after_runs[:: max(1, len(after_runs) // 10)])


@pytest.mark.slow
def test_maintenance_keeps_loose_objects_bounded(tmp_path):
    if long_run():
        run_bounded(tmp_path, 10_000, 500, "loose objects bounded (STORM_LONG)")
    else:
        run_bounded(tmp_path, 500, 125, "loose objects bounded")


def test_storm_maintenance_never_prunes(tmp_path, repo):
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    ws.read(["src/api.py"], agent="e1")
    ws.write("src/api.py", b"x\n", agent="e1")
    trace = tmp_path / "trace"
    for _ in range(2):
        r = storm(repo, "maintenance", "--json", env={"GIT_TRACE": str(trace)})
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert set(out) == {"before", "after", "tasks"}
    cmds = [ln for ln in trace.read_text().splitlines() if "trace: " in ln and ("built-in" in ln or "exec" in ln)]
    assert cmds
    joined = "\n".join(cmds)
    assert "--prune=now" not in joined and "--expire=now" not in joined, joined
    assert " git prune " not in joined.replace("'", " ").replace('"', " ") + " ", joined
    # and storm's own source never runs or advises it outside of a warning
    root = ROOT
    for f in list((root / "storm_git").rglob("*.py")) + list((root / "cli").rglob("*.py")):
        for ln in f.read_text().splitlines():
            if "prune=now" in ln:
                assert "never" in ln.lower() or "corrupt" in ln.lower() or "deletes" in ln.lower(), (f, ln)


@pytest.mark.slow
def test_long_living_with_git(tmp_path):
    run_beside_gc(tmp_path / "gc", 4, 600, "gc beside writers long")
    run_bounded(tmp_path / "bound", 10_000, 500, "loose objects bounded long")


def test_ref_directories_pruned_by_pack_refs_under_a_writer(tmp_path):
    """Regression: ``git pack-refs --all --prune`` removes empty directories under refs/;
    libgit2 then failed to create a notes ref's lock ("failed to make directory") and the
    write died with exit 3. Store.cas now retries that race, as git does."""
    from storm_git import open_workspace

    repo = make_repo(tmp_path / "repo", {"f.txt": "f\n"})
    loop = subprocess.Popen(["sh", "-c", "while :; do git pack-refs --all --prune; done"], cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ws = open_workspace(str(repo))
        for k in range(400):
            ws.read(["f.txt"], agent=f"p{k % 7}")
    finally:
        loop.kill()
        loop.wait()
    assert fsck(repo).returncode == 0


def test_one_maintenance_run_leaves_few_loose_objects(tmp_path):
    """git's loose-objects task packs, and removes the loose copies only on its next run:
    storm runs it twice, so one `git storm maintenance` is enough."""
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {f"d{i}/f.txt": "x\n" for i in range(4)})
    ws = open_workspace(str(repo))
    for k in range(150):
        ws.read([f"d{k % 4}/f.txt"], agent="e1")
        assert ws.write(f"d{k % 4}/f.txt", f"{k}\n".encode(), agent="e1").accepted
    before = maintenance.count_objects(ws.store).loose
    r = storm(repo, "maintenance", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["before"]["loose"] >= before >= 600 and rep["after"]["loose"] <= 5, rep  # (+ the fold's notes)
    assert fsck(repo).returncode == 0


@pytest.mark.slow
def test_writes_start_maintenance_by_themselves(tmp_path):
    """Like git gc --auto: past storm.autoMaintenance loose objects, a write starts
    `git storm maintenance --auto` in the background; the loose count stays bounded."""
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {f"d{i}/f.txt": "x\n" for i in range(4)})
    git(repo, "config", "storm.autoMaintenance", "250")
    ws = open_workspace(str(repo))
    store = ws.store
    peak, ran = 0, False
    for k in range(750):
        ws.read([f"d{k % 4}/f.txt"], agent="e1")
        assert ws.write(f"d{k % 4}/f.txt", f"{k}\n".encode(), agent="e1").accepted
        if k % 50 == 0:
            loose = maintenance.count_objects(store).loose
            peak = max(peak, loose)
            ran = ran or maintenance.count_objects(store).packs > 0
    deadline = time.monotonic() + 60
    while maintenance.running(store) and time.monotonic() < deadline:
        time.sleep(0.1)
    final = maintenance.count_objects(store)
    assert ran and final.packs >= 1
    # and each background run is recorded, by the process that ran it
    runs = maintenance.history(store)
    assert runs and all(r.auto for r in runs) and {r.task for r in runs} <= {maintenance.LOOSE, maintenance.ROLLUP}
    assert any(r.task == maintenance.LOOSE and r.before.loose > 250 and r.after.loose < r.before.loose for r in runs)
    # without the trigger: ~750 writes x 6 objects; with it, a few batches above the bound
    # (the estimate samples one fan-out directory, as git's does)
    assert peak <= 1500 and final.loose <= 1000, (peak, final)
    # one pack per background run would leave ~15; the roll-up keeps them few
    assert final.packs <= 6, final
    assert fsck(repo).returncode == 0
    r = storm(repo, "maintenance", "--auto", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"ran": False} or out["after"]["loose"] <= out["before"]["loose"]


def test_one_maintenance_at_a_time(tmp_path):
    """--auto never queues behind a running maintenance: with the lock held it reports
    that it did not run, and changes nothing."""
    import pygit2

    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {"a.txt": "x\n"})
    git(repo, "config", "storm.autoMaintenance", "0")  # no background run while the objects pile up
    ws = open_workspace(str(repo))
    for k in range(2000):  # until the estimate (one fan-out directory, as git's) passes 1
        if k % 20 == 0 and maintenance.estimate_loose(ws.store) > 1:
            break
        ws.read(["a.txt"], agent="e1")
        assert ws.write("a.txt", f"{k}\n".encode(), agent="e1").accepted
    git(repo, "config", "storm.autoMaintenance", "1")
    assert maintenance.due(open_workspace(str(repo)).store)  # so "did not run" can only be the held lock
    holder = hold(repo, "maintenance", seconds=60)
    try:
        before = git(repo, "count-objects", "-v").stdout
        r = storm(repo, "maintenance", "--auto", "--json", timeout=20)
        assert r.returncode == 0 and json.loads(r.stdout) == {"ran": False}
        assert git(repo, "count-objects", "-v").stdout == before
        # a write that would look (commit id ending in a multiple of 16) starts no
        # process while one runs: each would cost a Python start to find the lock taken
        due_commit = next(c for c in (pygit2.Oid(raw=bytes([i]) * 20) for i in range(256))
                          if c.raw[-1] % maintenance.CHECK_EVERY == 0)
        store = open_workspace(str(repo)).store
        assert maintenance.after_write(store, due_commit) is False
    finally:
        release(holder)
    assert maintenance.after_write(store, due_commit) is True  # free again: it starts one
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not maintenance.running(store)
                                           and maintenance.count_objects(store).packs == 0):
        time.sleep(0.05)
    while maintenance.running(store) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert maintenance.count_objects(store).packs >= 1


def _writes(ws, n: int, start: int = 0) -> None:
    for k in range(start, start + n):
        ws.read([f"d{k % 4}/f.txt"], agent="e1")
        assert ws.write(f"d{k % 4}/f.txt", f"{k}\n".encode(), agent="e1").accepted


def test_the_loose_step_runs_while_a_roll_up_holds_its_lock(tmp_path):
    """A roll-up can take long (now and then it repacks the whole repository); it has its
    own lock, so the loose objects written meanwhile are still packed by the next run."""

    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {f"d{i}/f.txt": "x\n" for i in range(4)})
    git(repo, "config", "storm.autoMaintenance", "0")  # no background run while the objects pile up
    ws = open_workspace(str(repo))
    _writes(ws, 200)
    for _ in range(maintenance.ROLLUP_AT + 1):  # enough packs that --auto wants a roll-up
        _writes(ws, 5, 1000 + _ * 5)
        git(repo, "repack", "-d", "-q")
    _writes(ws, 200, 2000)
    git(repo, "config", "storm.autoMaintenance", "2")
    assert maintenance.due(ws.store) and maintenance.count_objects(ws.store).packs > maintenance.ROLLUP_AT
    holder = hold(repo, maintenance.ROLLUP_LOCK, seconds=60)
    try:
        r = storm(repo, "maintenance", "--auto", "--json", timeout=30)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        # the roll-up was skipped, not waited for
        assert out["tasks"] == ["loose-objects", "loose-objects", "pack-refs"], out
        # the last 200 writes: 4 new objects each (blob, two trees, commit; no note per write)
        assert out["before"]["loose"] >= 800 and out["after"]["loose"] <= 5, out
        assert out["after"]["packs"] == out["before"]["packs"] + 1
    finally:
        release(holder)
    r = storm(repo, "maintenance", "--auto", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    assert fsck(repo).returncode == 0


@pytest.mark.slow
def test_a_roll_up_keeps_the_packs_few(tmp_path):
    """Packs made one per maintenance run are rolled up geometrically: however many runs,
    a few packs (object lookups, storm's and git's, slow down with each pack)."""
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {f"d{i}/f.txt": "x\n" for i in range(4)})
    git(repo, "config", "storm.autoMaintenance", "0")
    ws = open_workspace(str(repo))
    for i in range(8):
        _writes(ws, 30, i * 30)
        git(repo, "repack", "-d", "-q")  # what one loose step leaves: one more pack
    before = maintenance.count_objects(ws.store)
    assert before.packs >= 8
    r = storm(repo, "maintenance", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tasks"] == ["loose-objects", "loose-objects", "pack-refs", "geometric-rollup"], out
    assert out["after"]["packs"] <= 3 and out["after"]["loose"] <= 5, out
    assert out["after"]["packed"] >= before.packed
    assert fsck(repo).returncode == 0


def test_each_run_is_recorded_and_history_reads_the_record(tmp_path):
    """Record state rather than infer it: every task run leaves a line (when, how
    long, git's CPU, counts before and after); a torn line is skipped; past
    RECORD_MAX the record moves to .1 and both are read; --history runs nothing."""
    from storm_git import open_workspace
    from storm_git.core import maintenance

    repo = make_repo(tmp_path / "repo", {"f.txt": "x\n"})
    git(repo, "config", "storm.autoMaintenance", "0")
    ws = open_workspace(str(repo))
    for k in range(40):
        ws.read(["f.txt"], agent="e1")
        assert ws.write("f.txt", f"{k}\n".encode(), agent="e1").accepted
    code, out = storm_json(repo, "maintenance", "--history")
    assert code == 0 and out == {"runs": []}
    t0 = time.time()
    code, res = storm_json(repo, "maintenance")
    assert code == 0
    code, out = storm_json(repo, "maintenance", "--history")
    runs = out["runs"]
    assert [r["task"] for r in runs] == ["loose-objects", "geometric-rollup"], runs
    loose = runs[0]
    assert loose["auto"] is False and loose["started"] >= t0 - 1 and loose["seconds"] > 0 and loose["cpu_s"] > 0
    assert loose["before"]["loose"] == res["before"]["loose"] >= 120 and loose["after"]["loose"] < 20
    assert runs[1]["after"]["packs"] == res["after"]["packs"]
    text = storm(repo, "maintenance", "--history").stdout
    assert "loose-objects:" in text and f"loose objects {loose['before']['loose']} -> " in text
    # a torn last line (a full disk mid-append) is skipped; the next run still appends
    rec = repo / ".git" / "storm" / maintenance.RECORD
    with open(rec, "a") as f:
        f.write('{"task": "loose-obj')
    assert len(maintenance.history(ws.store)) == 2
    # past RECORD_MAX the record moves aside, one generation kept, and both are read
    with open(rec, "a") as f:
        f.write("\n" + "x" * (maintenance.RECORD_MAX + 1) + "\n")
    assert storm(repo, "maintenance").returncode == 0
    assert (rec.parent / (maintenance.RECORD + ".1")).exists() and rec.stat().st_size < 2048
    assert [r.task for r in maintenance.history(ws.store)] == ["loose-objects", "geometric-rollup"] * 2
    assert [r.task for r in maintenance.history(ws.store, since=time.time() + 60)] == []
    # --history changes nothing and is not combined with --auto
    before = rec.read_bytes()
    r = storm(repo, "maintenance", "--history", "--auto")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--history" in r.stderr
    assert rec.read_bytes() == before
