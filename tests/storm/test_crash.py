"""Crash safety: writer processes SIGKILLed at random moments.

Three writer processes (tests/support/storm_writer.py) write at once, on their own file
and on a file they share; one of them is SIGKILLed at a random moment, then
replaced by a new process with the same agent id (an agent restarting). After
every kill:

* every storm ref (the shared ref, reservations, log, every notes ref)
  resolves to a commit and ``git fsck`` reports no error (dangling objects are
  fine: a killed writer leaves unreferenced objects behind);
* every write that had been acknowledged (the writer records it only after
  ``write()`` returned accepted) is in the shared ref's history, its line is in
  the file at the head, and its provenance (its commit's trailers) resolves to a
  read set validated at its parent;
* the next writer (the killed agent, restarted) succeeds without manual help:
  ``Store.cas`` clears a ``<ref>.lock`` left by the dead writer;
* ``git storm doctor --fix`` repairs what is left (e.g. a temporary file of a
  writer killed mid-materialise) and a second ``doctor`` finds all is well and
  changes nothing.

CI: 50 kills. ``STORM_LONG=1`` or ``-m slow``: 300 kills.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from figures import long_run, record
from helpers import SUPPORT, git, make_repo, no_maintenance, snapshot_refs
from storm_git.core.store import STALE_REF_LOCK_SECONDS

WRITER = str(SUPPORT / "storm_writer.py")
AGENTS = ["w0", "w1", "w2"]


def _spawn(repo: Path, agent: str, ackdir: Path, seed: int) -> subprocess.Popen:
    ack = ackdir / f"{agent}.{seed}.jsonl"
    return subprocess.Popen([sys.executable, WRITER, str(repo), agent, "100000", str(ack), str(seed),
                             f"own/{agent}.txt", "shared.txt"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))


def _acks(ackdir: Path) -> list[dict]:
    out = []
    for f in ackdir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)  # one write(2) per line: a kill never leaves half a line
            out.append(rec)
    return out


def _check_repo(repo: Path, acked: list[dict]) -> None:
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objecttype)", "refs/storm", "refs/notes/storm")
    lines = refs.stdout.decode().split("\n")
    assert all(ln.endswith(" commit") for ln in lines if ln), lines
    fsck = git(repo, "fsck", "--no-progress", "--no-dangling", check=False)  # callers hold the maintenance flock
    assert fsck.returncode == 0, fsck.stderr.decode() + fsck.stdout.decode()
    history = set(git(repo, "rev-list", "refs/storm/workspace").stdout.decode().split())
    head_files = {}
    for a in acked:
        assert a["commit"] in history, f"acknowledged write {a} lost"
        if a["path"] not in head_files:
            head_files[a["path"]] = git(repo, "show", f"refs/storm/workspace:{a['path']}").stdout.decode()
        assert a["line"] + "\n" in head_files[a["path"]], f"line of acknowledged write {a} lost"
    # provenance of every acknowledged write (checked on a sample): its commit's trailers,
    # resolved through the folded journal, or the live one of a writer killed before its
    # fold or stopped right now holding its lock (folding never waits for a busy agent)
    from storm_git.core import provenance, readsets
    from storm_git.core.store import Store

    store = Store.discover(str(repo))
    readsets.fold_all(store)
    for a in random.sample(acked, min(5, len(acked))):
        agent = a["line"].split()[0]
        got = provenance.load(store, agent, a["commit"])
        parent = git(repo, "rev-parse", a["commit"] + "^").stdout.decode().strip()
        assert got is not None and got[0]["validated-at"] == parent, a
        assert a["path"] in {e.path for e in got[1]}, a  # the writer read the file it wrote


def _walk(root: Path, suffix_re: str, skip_git: bool) -> list[Path]:
    """Files under root whose name matches; tolerant of directories that vanish mid-walk.

    The writers spawn ``git storm maintenance --auto`` in the background, and it keeps
    packing and pruning (``.git/objects/xx`` and loose refs disappear) while this test
    looks, so ``Path.rglob`` (which raises on a vanished directory) is not usable here.
    """
    pat = re.compile(suffix_re)
    out = []
    for d, dirs, names in os.walk(root):  # os.walk ignores scandir errors by default
        if skip_git and ".git" in dirs:
            dirs.remove(".git")
        out.extend(Path(d) / n for n in names if pat.search(n))
    return out


def _temp_files(repo: Path) -> list[Path]:
    """Storm's temporary files live beside their target in the working tree, never in .git."""
    return _walk(repo, r"\.storm-tmp-", skip_git=True)


def _dead_ref_locks(repo: Path) -> int:
    """``<ref>.lock`` files whose guarding storm flock no live process holds: left by the dead."""
    from storm_git.admin.doctor import guard_of
    from storm_git.core.locks import is_locked

    n = 0
    for f in _walk(repo / ".git" / "refs", r"\.lock\Z", skip_git=False):
        ref = str(f.relative_to(repo / ".git"))[:-len(".lock")]
        guard = guard_of(ref)
        if guard is None or not is_locked(str(repo / ".git"), guard):
            n += 1
    return n


def _next_writer(repo: Path, agent: str) -> float:
    """The killed agent comes back: its next write must succeed on its own."""
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    t0 = time.monotonic()
    ws.forget(None, agent=agent)  # a restarted agent starts a new task with a fresh read set
    [cur] = ws.read([f"own/{agent}.txt"], agent=agent)
    res = ws.write(f"own/{agent}.txt", (cur.content or b"") + f"{agent} after-kill\n".encode(), agent=agent)
    assert res.accepted, res.rejection and res.rejection.message
    return time.monotonic() - t0


def run_crashes(tmp_path: Path, kills: int, name: str) -> None:
    from storm_git.admin.doctor import diagnose
    from storm_git.core.store import Store

    files = {"shared.txt": "", **{f"own/{a}.txt": "" for a in AGENTS}}
    repo = make_repo(tmp_path / "repo", files)
    git(repo, "config", "storm.reservationSeconds", "5")
    ackdir = tmp_path / "acks"
    ackdir.mkdir()
    rnd = random.Random(1234)
    seed = 0
    procs: dict[str, subprocess.Popen] = {}
    for a in AGENTS:
        seed += 1
        procs[a] = _spawn(repo, a, ackdir, seed)
    stale_locks = temp_files = doctor_fixes = 0
    recover = []
    done = 0
    try:
        while done < kills:
            # kill at a random moment once every writer is writing
            time.sleep(rnd.uniform(0.05, 0.4))
            victim = rnd.choice(AGENTS)
            p = procs[victim]
            assert p.poll() is None, p.stderr.read().decode()
            p.send_signal(signal.SIGKILL)
            p.wait()
            done += 1
            # the others pause while we inspect (SIGSTOP: a consistent picture, not a crash)
            for a, q in procs.items():
                if a != victim:
                    q.send_signal(signal.SIGSTOP)
            # and a background `maintenance --auto` finishes first: git fsck beside a
            # running repack reports objects that move from loose to a pack as missing
            with no_maintenance(repo):
                stale_locks += _dead_ref_locks(repo)
                acked = [r for r in _acks(ackdir) if r.get("event") == "ack"]
                bad = [r for r in _acks(ackdir) if r.get("event") == "bad_payload"]
                assert not bad, bad
                _check_repo(repo, acked)
            for a, q in procs.items():
                if a != victim:
                    q.send_signal(signal.SIGCONT)
            recover.append(_next_writer(repo, victim))
            seed += 1
            procs[victim] = _spawn(repo, victim, ackdir, seed)
            if done % 10 == 0 or done == kills:
                # every writer dies at once; doctor repairs what is left, then a second
                # doctor finds nothing to repair and changes nothing
                for q in procs.values():
                    q.send_signal(signal.SIGKILL)
                    q.wait()
                    done += 1
                # a background `maintenance --auto` a writer started may outlive it (it packs
                # refs, taking ref locks); hold its flock so the picture is of the dead alone
                with no_maintenance(repo):
                    stale_locks += _dead_ref_locks(repo)
                    temp_files += len(_temp_files(repo))
                    time.sleep(STALE_REF_LOCK_SECONDS)  # doctor leaves younger ref locks to git
                    rep = diagnose(Store.discover(str(repo)), fix=True)
                    assert rep.ok, rep.to_dict()
                    doctor_fixes += sum(f.fixed for f in rep.findings)
                    assert not _walk(repo / ".git" / "refs", r"\.lock\Z", skip_git=False)
                    assert not _temp_files(repo)
                    before = snapshot_refs(repo)
                    again = diagnose(Store.discover(str(repo)), fix=True)
                    assert [f for f in again.findings if not f.harmless] == [], again.to_dict()
                    assert snapshot_refs(repo) == before
                    _check_repo(repo, [r for r in _acks(ackdir) if r.get("event") == "ack"])
                for a in AGENTS:
                    recover.append(_next_writer(repo, a))
                    seed += 1
                    procs[a] = _spawn(repo, a, ackdir, seed)
    finally:
        for q in procs.values():
            if q.poll() is None:
                q.send_signal(signal.SIGCONT)
                q.kill()
                q.wait()
    acked = [r for r in _acks(ackdir) if r.get("event") == "ack"]
    with no_maintenance(repo):
        _check_repo(repo, acked)
    recover.sort()
    record(name, kills=done, acknowledged_writes_verified=len(acked), stale_ref_locks_seen=stale_locks,
           temp_files_seen=temp_files, doctor_repairs=doctor_fixes,
           next_writer_seconds_p50=round(recover[len(recover) // 2], 3), next_writer_seconds_max=round(recover[-1], 3))


def test_sigkill_writers(tmp_path):
    run_crashes(tmp_path, 300 if long_run() else 20, "crash (STORM_LONG)" if long_run() else "crash")


@pytest.mark.slow
def test_sigkill_writers_long(tmp_path):
    run_crashes(tmp_path, 300, "crash long")
