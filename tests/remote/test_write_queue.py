"""Group commit on a remote: the writers of one clone queue their validated
commits on the local ref and one push lands them all. Each window is held open
deterministically: the test holds the clone's ``remote`` and ``remote-landing`` flocks
(what every push and fetch holds) while writers queue and wait, then changes the
world and lets go."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import helpers
from helpers import git, release, rev, snapshot_refs, start_write, storm, storm_json
from servers import WS, bare, clone, seed, server_log, server_provenance

LOCKS = Path(".git/storm/locks")
TRACKED = "refs/storm-remote/origin/storm/workspace"


def hold_push(repo: Path) -> subprocess.Popen:
    """Hold the clone's remote and landing flocks, as a push in progress does."""
    return helpers.hold(repo, "remote", "remote-landing")


def waiters(repo: Path) -> int:
    """Writers asleep on the clone's landing lock, waiting for the push in progress
    (from /proc/locks)."""
    return helpers.flock_waiters(repo / LOCKS / "remote-landing")


def wait_queued(repo: Path, n: int) -> None:
    """Until ``n`` writers wait for the push in progress, each with its commit queued."""
    deadline = time.monotonic() + 60
    while True:  # (a writer's wait on the lock and its commit on the ref are seen one after the other)
        waiting = waiters(repo)
        ahead = git(repo, "rev-list", "--count", f"{TRACKED}..{WS}").stdout.decode().strip()
        if waiting >= n and ahead == str(n):
            return
        assert time.monotonic() < deadline, f"{waiting} writer(s) waiting, {ahead} commit(s) queued, not {n}"
        time.sleep(0.02)


def finish(p: subprocess.Popen) -> tuple[int, dict]:
    import json

    out, err = p.communicate(timeout=120)
    return p.returncode, json.loads(out) if out.strip() else {"stderr": err.decode()}


def queue_and_kill(repo: Path, agent: str, path: str, content: str) -> str:
    """A writer SIGKILLed while its write is queued (a push in progress holds the
    locks); returns the queued commit, left on the local ref."""
    holder = hold_push(repo)
    try:
        p = start_write(repo, agent, path, content, "--json")
        wait_queued(repo, 1)
        p.kill()
        p.wait()
        return rev(repo, WS)
    finally:
        release(holder)


def push_counter(srv: Path) -> Path:
    """A post-receive hook that writes a line per push that moved the shared ref."""
    log = srv / "pushes.log"
    hook = srv / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\ngrep -q ' {WS}$' && echo push >> '{log}'\nexit 0\n")
    hook.chmod(0o755)
    return log


def test_writers_of_one_clone_land_in_one_push(tmp_path, daemon):  # noqa: F811
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    h0 = rev(srv, WS)
    log = push_counter(srv)
    for agent, path in (("eng_x", "src/api.py"), ("eng_y", "src/util.py")):
        assert storm(a, "read", path, agent=agent).returncode == 0
    holder = hold_push(a)
    try:
        px = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        py = start_write(a, "eng_y", "src/util.py", "Y\n", "--json")
        wait_queued(a, 2)
        assert rev(srv, WS) == h0  # queued here, nothing on the server yet
    finally:
        release(holder)
    (cx, rx), (cy, ry) = finish(px), finish(py)
    assert cx == 0 and cy == 0 and rx["accepted"] and ry["accepted"], (rx, ry)
    assert sorted(server_log(srv, h0)) == sorted([rx["commit"], ry["commit"]])
    assert log.read_text().count("push") == 1  # one push carried both writes
    for agent, res, path in (("eng_x", rx, "src/api.py"), ("eng_y", ry, "src/util.py")):  # each with its provenance
        _prov, entries = server_provenance(srv, agent, res["commit"])
        assert path in {e.path for e in entries}, agent
    assert (a / "src/api.py").read_text() == "X\n" and (a / "src/util.py").read_text() == "Y\n"
    assert rev(a, WS) == rev(a, TRACKED) == rev(srv, WS)


@pytest.mark.parametrize("order", ["lease", "server"])
def test_a_stale_lease_moves_the_queue_onto_the_new_head_or_drops_what_it_changed(tmp_path, order):
    """While three writes wait in clone a's queue, clone b lands a write of src/util.py.
    With the lease, a's push is refused (stale lease) and after the fetch the queue is
    moved onto the new head; on a server that orders writes, the server moves it. The
    same rule either way: x (its read set and target untouched by b) is rebuilt there
    without being validated again; y (it read src/util.py) and w (it writes
    src/util.py) are not applied, and their writers get the usual rejections, given at
    a head that is on the server."""
    srv = bare(tmp_path / "proj.git")
    install = ["server-hook", "install", str(srv)] + (["--no-order"] if order == "lease" else [])
    assert storm(srv, *install).returncode == 0  # it checks the moved write too
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    reads = {"eng_x": ["src/api.py"], "eng_y": ["README.md", "src/util.py"], "eng_w": ["src/util.py"]}
    for agent, paths in reads.items():
        assert storm(a, "read", *paths, agent=agent).returncode == 0
    assert storm(b, "read", "src/util.py", agent="eng_z").returncode == 0
    holder = hold_push(a)
    try:  # queued in this order: none of them depends on another's write
        px = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        py = start_write(a, "eng_y", "README.md", "# Y\n", "--json")
        wait_queued(a, 2)
        pw = start_write(a, "eng_w", "src/util.py", "W\n", "--json")
        wait_queued(a, 3)
        code, rz = storm_json(b, "write", "src/util.py", input="Z\n", agent="eng_z")
        assert code == 0 and rz["accepted"]
    finally:
        release(holder)
    (cx, rx), (cy, ry), (cw, rw) = finish(px), finish(py), finish(pw)
    assert cx == 0 and rx["accepted"] and rx["cas_retries"] == 1, rx
    assert git(srv, "rev-parse", f"{rx['commit']}^").stdout.decode().strip() == rz["commit"]
    msg = git(srv, "log", "-1", "--format=%B", rx["commit"]).stdout.decode()
    assert f"Storm-Validated-At: {rz['commit']}" in msg  # moved: validated at its new parent
    assert cy == 1 and ry["rejection"]["reason"] == "stale_dependency", ry
    assert [s["path"] for s in ry["rejection"]["stale"]] == ["src/util.py"]
    assert cw == 1 and rw["rejection"]["reason"] == "direct_conflict", rw
    assert rw["rejection"]["current_content"] == "Z\n" and rw["rejection"]["changed_by"] == ["eng_z"]
    for r in (ry, rw):
        assert r["rejection"]["head"] in server_log(srv)
    assert server_log(srv)[:2] == [rx["commit"], rz["commit"]]
    assert rev(a, WS) == rev(srv, WS) and (a / "src/util.py").read_text() == "Z\n"
    assert (a / "src/api.py").read_text() == "X\n"
    if order == "lease":  # the stale lease opened the clone's back-off window; the push that landed closed it
        assert (a / ".git/storm/remote-gate").read_text().split()[0] == "0"
    else:  # the server ordered it: no lease was lost, nothing to back off from
        assert not (a / ".git/storm/remote-gate").exists() or \
            (a / ".git/storm/remote-gate").read_text().split()[0] == "0"


def blocked_on(repo: Path, lock: str, pid: int) -> bool:
    """Whether process ``pid`` waits for the flock on ``storm/locks/<lock>`` (/proc/locks)."""
    try:
        return helpers.flock_waiters(repo / LOCKS / lock, pid) > 0
    except FileNotFoundError:
        return False


def wait_blocked(repo: Path, lock: str, p: subprocess.Popen, what: str) -> None:
    """Until process ``p`` sleeps on the flock ``lock`` (it must not end first)."""
    deadline = time.monotonic() + 60
    while not blocked_on(repo, lock, p.pid):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_two_writes_of_one_agent_on_one_clone_take_turns(tmp_path):
    """Two processes of one agent write at once on one clone. The second waits for the
    first to end (the write-<agent> lock), so the first, dropped after a stale lease,
    cannot come back through the second: each puts the agent's journal back to what it
    was before its own write, and the second's snapshot would hold the first's version
    of src/api.py as read, a version no head ever had."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    assert storm(a, "read", "src/api.py", "src/util.py", agent="eng_x").returncode == 0
    assert storm(b, "read", "src/api.py", agent="eng_z").returncode == 0
    ghost = git(a, "hash-object", "--stdin", input=b"X1\n").stdout.decode().strip()
    holder = hold_push(a)
    try:
        p1 = start_write(a, "eng_x", "src/api.py", "X1\n", "--json")
        wait_queued(a, 1)
        p2 = start_write(a, "eng_x", "src/util.py", "U2\n", "--deps", "src/util.py", "--json")
        wait_blocked(a, "write-eng_x", p2, "the second write of eng_x never waited for the first")
        assert git(a, "rev-list", "--count", f"{TRACKED}..{WS}").stdout.decode().strip() == "1"
        code, rz = storm_json(b, "write", "src/api.py", input="Z\n", agent="eng_z")
        assert code == 0 and rz["accepted"]
    finally:
        release(holder)
    (c1, r1), (c2, r2) = finish(p1), finish(p2)
    assert c1 == 1 and r1["rejection"]["reason"] == "direct_conflict", r1
    # before the lock, the first write's put-back took the second's version of src/util.py
    # out of the read set, and the first was told its own agent's write was stale
    assert r1["rejection"]["stale"] == [], r1["rejection"]["stale"]
    assert c2 == 0 and r2["accepted"], r2  # its scope is src/util.py, which nobody else wrote
    assert server_log(srv)[:2] == [r2["commit"], rz["commit"]]
    # the dropped write's version is nowhere in eng_x's read set, and the landed one is
    # (put back after it, the first write's snapshot would have taken it out)
    from storm_git.core import readsets
    from storm_git.core.store import Store

    u2 = git(a, "hash-object", "--stdin", input=b"U2\n").stdout.decode().strip()
    read = {p: e.blob for p, e in readsets.load_view(Store.discover(str(a)), "eng_x").entries.items()}
    assert ghost not in read.values() and read["src/util.py"] == u2, read


def test_an_unreachable_server_lands_no_queued_write(tmp_path, daemon):  # noqa: F811
    """The server goes away while two writes are queued: both writers fail (exit 3), the
    local ref goes back to the server's head, and no queued write can land afterwards."""
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    h0 = rev(srv, WS)
    for agent, path in (("eng_x", "src/api.py"), ("eng_y", "src/util.py")):
        assert storm(a, "read", path, agent=agent).returncode == 0
    before = (snapshot_refs(a), (a / ".git/storm/journal/eng_x").read_bytes(),
              (a / ".git/storm/journal/eng_y").read_bytes())
    holder = hold_push(a)
    try:
        px = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        py = start_write(a, "eng_y", "src/util.py", "Y\n", "--json")
        wait_queued(a, 2)
        daemon.stop()
    finally:
        release(holder)
    (cx, rx), (cy, ry) = finish(px), finish(py)
    assert (cx, cy) == (3, 3), (rx, ry)
    assert rev(a, WS) == rev(a, TRACKED) == h0 == rev(srv, WS)
    assert (snapshot_refs(a), (a / ".git/storm/journal/eng_x").read_bytes(),
            (a / ".git/storm/journal/eng_y").read_bytes()) == before


def test_a_killed_writers_queued_commit_lands_and_no_rejection_rests_on_it(tmp_path):
    """A writer killed while queued leaves its commit on the local ref, as a local write
    killed after its compare-and-swap is applied. Another agent of the clone whose write
    conflicts with it is not rejected on a commit the server does not have: storm pushes
    the queue first, and the rejection names the head that landed."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    h0 = rev(srv, WS)
    for agent in ("eng_x", "eng_y"):
        assert storm(a, "read", "src/util.py", agent=agent).returncode == 0
    queued = queue_and_kill(a, "eng_x", "src/util.py", "X\n")
    assert rev(srv, WS) == h0
    code, ry = storm_json(a, "write", "src/util.py", input="Y\n", agent="eng_y")
    assert code == 1 and ry["rejection"]["reason"] == "direct_conflict", ry
    assert ry["rejection"]["head"] == queued == rev(srv, WS)  # it landed first
    assert ry["rejection"]["changed_by"] == ["eng_x"]
    assert "src/util.py" in {e.path for e in server_provenance(srv, "eng_x", queued)[1]}  # its journal landed too


def test_sync_pushes_what_a_stopped_writer_queued(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    queued = queue_and_kill(a, "eng_x", "src/api.py", "X\n")
    r = storm(a, "sync")
    assert r.returncode == 0, r.stderr
    assert rev(srv, WS) == queued == rev(a, TRACKED)
    assert storm(b, "sync").returncode == 0 and (b / "src/api.py").read_text() == "X\n"


def test_a_killed_fetchs_ref_lock_is_reported_and_cleared(tmp_path):
    """A ``git fetch`` killed mid-update leaves ``<tracking ref>.lock``: every later fetch
    of that ref would fail. Under storm's remote flock an old one is the dead's and
    the next fetch clears it; doctor reports it; a young one (git's own gc or
    pack-refs for a moment) is left alone, and the fetch fails with exit 3."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    lock = a / ".git" / "refs" / "storm-remote" / "origin" / "storm" / "workspace.lock"
    for content in ("B1\n", "B2\n"):
        assert storm(b, "read", "src/api.py", agent="eng_b").returncode == 0
        assert storm_json(b, "write", "src/api.py", input=content, agent="eng_b")[0] == 0
        lock.write_text("0" * 40 + "\n")
        if content == "B1\n":  # a young lock: left alone, the fetch cannot update the ref
            soon = time.time() + 4.5  # young (< 2 s old) for 6.5 s, however slow the machine is
            os.utime(lock, (soon, soon))
            code, err = storm_json(a, "sync")
            assert code == 3 and "cannot update the local copies" in err["error"]["message"], err
            assert lock.exists() and rev(a, TRACKED) != rev(srv, WS)
            continue
        old = time.time() - 3600
        os.utime(lock, (old, old))
        code, rep = storm_json(a, "doctor")
        assert code == 3 and [f["what"] for f in rep["findings"] if f["kind"] == "stale_ref_lock"] == [
            "refs/storm-remote/origin/storm/workspace"], rep
        assert storm(a, "sync").returncode == 0  # the fetch clears it itself
        assert not lock.exists() and rev(a, TRACKED) == rev(srv, WS) == rev(a, WS)
        assert (a / "src/api.py").read_text() == "B2\n"


def test_a_queued_write_is_not_dropped_while_a_fetch_is_halfway(tmp_path):
    """A fetch moves the tracking ref first and the queue onto the new head after (under
    the workspace lock). A writer that looks in between must see its write still
    queued: had it seen it dropped, it would write it again and the moved queue would
    land it a second time (a duplicate seen once in the 8-clone benchmark)."""
    from storm_git.core.store import Store
    from storm_git.remote.write_queue import QUEUED, write_state as _state

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    queued = queue_and_kill(a, "eng_x", "src/api.py", "X\n")  # on a's local ref, not pushed
    assert storm(b, "read", "src/util.py", agent="eng_z").returncode == 0
    assert storm_json(b, "write", "src/util.py", input="Z\n", agent="eng_z")[0] == 0
    # the fetch's first half: the tracking ref moves to the server's new head
    git(a, "fetch", "-q", "origin", f"+{WS}:{TRACKED}")
    assert rev(a, TRACKED) == rev(srv, WS) != rev(a, WS)
    state, commit = _state(Store.discover(str(a)), "origin", git_oid(queued))
    assert (state, str(commit)) == (QUEUED, queued)
    # the second half moves it onto the new head; then it lands, once
    assert storm(a, "sync").returncode == 0
    assert rev(a, WS) == rev(srv, WS) and git(srv, "show", f"{WS}:src/api.py").stdout == b"X\n"
    writers = git(srv, "log", "--format=%(trailers:key=Storm-Agent,valueonly)", WS).stdout.decode().split()
    assert writers.count("eng_x") == 1


def git_oid(hexsha: str):
    import pygit2

    return pygit2.Oid(hex=hexsha)


def test_a_write_right_after_a_fold_lands_past_the_guard_without_a_new_fold(tmp_path):
    """A write validated right after its agent's journal was folded names no journal
    read (Storm-Read-Set: <note> 0): the push folds nothing more, but still carries
    the agent's notes (the read-set note is only here), and the guard resolves it."""
    srv = bare(tmp_path / "proj.git")
    assert storm(srv, "server-hook", "install", str(srv)).returncode == 0
    a = seed(tmp_path, f"file://{srv}")
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    assert storm(a, "status").returncode == 0  # status folds every journal
    notes_before = rev(a, "refs/notes/storm/agents/eng_x")
    code, res = storm_json(a, "write", "src/api.py", input="X\n", agent="eng_x")
    assert code == 0 and res["accepted"], res
    read_set = git(srv, "log", "-1", "--format=%(trailers:key=Storm-Read-Set,valueonly)", WS).stdout.decode().split()
    assert len(read_set) == 2 and read_set[1] == "0", read_set
    assert rev(a, "refs/notes/storm/agents/eng_x") == notes_before  # no fold for this push
    assert rev(srv, "refs/notes/storm/agents/eng_x") == notes_before  # ... but the notes went with it


def test_a_queued_writer_waits_in_the_kernel_when_the_remote_lock_is_held_alone(tmp_path):
    """The remote lock held without the landing lock: the moment between the two (its
    holder took one and not yet the other, or let one go and not yet the other), which
    on a busy machine lasts milliseconds. A queued writer used to look again every
    2 ms while it lasted; sixteen or thirty-two writers of a busy clone doing so cost
    more CPU than the pushes. It now sleeps on the remote lock itself (seen in
    /proc/locks) and lands its write once the lock is let go."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    holder = helpers.hold(a, "remote")
    try:
        p = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_blocked(a, "remote", p, "the queued writer never waited on the remote lock")
        assert git(a, "rev-list", "--count", f"{TRACKED}..{WS}").stdout.decode().strip() == "1"
        assert rev(srv, WS) == h0  # nothing pushed while the lock is held
    finally:
        release(holder)
    code, r = finish(p)
    assert code == 0 and r["accepted"], r
    assert server_log(srv)[0] == r["commit"]


def test_the_map_of_moved_writes_is_read_incrementally_and_survives_a_torn_row_and_a_compaction(tmp_path, monkeypatch):
    """Every writer of a clone looks up its moved commit in ``storm/remote-rebased`` each
    time it wakes. Read whole each time, that file (every move of the last minutes)
    tripled a busy clone's Python after a few minutes; each process now parses only
    what was appended since its last look. What must still hold: rows appended by
    another process are seen, a row cut short by a killed mover is never taken (nor
    glued to the next one), and a compaction (a new file without the oldest rows) is
    read from its start, so no dropped row survives in a reader's copy."""
    import sys

    from storm_git.core.store import Store
    from storm_git.remote import write_queue as queue

    repo = helpers.make_repo(tmp_path / "r")
    store = Store.discover(str(repo))
    path = Path(queue.rebased_path(store))
    oid = [git_oid(f"{i:040x}") for i in range(1, 9)]
    queue.record_rebased(store, [(oid[0], oid[1])])
    assert queue.rebased(store) == {oid[0]: oid[1]}
    # another process appends: this one's copy grows by what was added
    code = ("from storm_git.core.store import Store; from storm_git.remote import write_queue as queue; "
            "import pygit2; "
            f"queue.record_rebased(Store.discover({str(repo)!r}), [(pygit2.Oid(hex='{oid[1]}'), "
            f"pygit2.Oid(hex='{oid[2]}'))])")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert queue.rebased(store) == {oid[0]: oid[1], oid[1]: oid[2]}
    # a mover killed in the middle of a row: the fragment is not read, and the next
    # append starts on a line of its own
    with open(path, "ab") as fh:
        fh.write(f"{oid[3]} {str(oid[4])[:20]}".encode())
    assert queue.rebased(store) == {oid[0]: oid[1], oid[1]: oid[2]}
    queue.record_rebased(store, [(oid[5], oid[6])])
    assert queue.rebased(store) == {oid[0]: oid[1], oid[1]: oid[2], oid[5]: oid[6]}
    assert path.read_bytes().count(b"\n") == 4  # three rows and the fragment's own line
    # a compaction: rows older than any write waits are dropped from a new file, and a
    # reader that parsed the old one reads the new one from its start
    old = "".join(f"{oid[3]} {oid[7]} 1.0\n" for _ in range(50))
    path.write_bytes(old.encode() + path.read_bytes())
    monkeypatch.setattr(queue, "REBASED_COMPACT_BYTES", 1024)
    assert queue.rebased(store)[oid[3]] == oid[7]  # this process's copy now holds the old rows
    queue.record_rebased(store, [(oid[6], oid[7])])
    assert b" 1.0\n" not in path.read_bytes()
    assert queue.rebased(store) == {oid[0]: oid[1], oid[1]: oid[2], oid[5]: oid[6], oid[6]: oid[7]}


def test_a_move_recorded_by_a_mover_killed_before_it_moved_the_ref_drops_nothing(tmp_path):
    """A queue's move writes the new commits, records "old -> new" in the map of moved
    writes, then moves the local ref. A mover killed between the last two leaves a
    row naming a commit no ref has while the write is still queued as it was: its
    writer must find it queued (it used to follow the row, find the new commit
    nowhere, take its write for dropped and write it again while the old commit was
    still queued: two commits for one write)."""
    from storm_git.core.store import Store
    from storm_git.remote import write_queue as queue

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    holder = hold_push(a)
    try:
        p = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        queued = rev(a, WS)
        tree = rev(a, f"{queued}^{{tree}}")
        orphan = git(a, "-c", "user.name=s", "-c", "user.email=s@x", "commit-tree", "-p", h0, "-m", "moved",
                     tree).stdout.decode().strip()
        queue.record_rebased(Store.discover(str(a)), [(git_oid(queued), git_oid(orphan))])
    finally:
        release(holder)
    code, r = finish(p)
    assert code == 0 and r["accepted"], r
    assert server_log(srv)[:2] == [queued, h0]  # the queued commit landed, once, on h0


def test_after_a_stale_lease_the_clone_backs_off_before_its_fetch_not_between_fetch_and_push(tmp_path, monkeypatch):
    """A clone whose push finds the server's head moved waits (its back-off window)
    and only then fetches the new head and pushes its moved queue, at once. Waiting
    between the fetch and the push, as before, gave other clones the whole window to
    make the fetched head stale again (8 clones x 32 writers: 50.7 against 81.7
    accepted writes/s on an aged workspace). The server's side of every fetch and push
    is logged (``remote.origin.uploadpack``/``receivepack`` wrappers), and the window
    is made 2 s wide and waited out whole, so that the order shows in the times even
    on a loaded machine."""
    import sys

    from storm_git import open_workspace
    from storm_git.remote import backoff

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    log = tmp_path / "wire.log"
    for kind, cmd in (("fetch", "upload-pack"), ("push", "receive-pack")):
        wrapper = tmp_path / f"log-{cmd}"
        wrapper.write_text(f"#!{sys.executable}\nimport os, sys, time\n"
                           f"open({str(log)!r}, 'a').write(f'{kind} {{time.monotonic()}}\\n')\n"
                           f"os.execvp('git', ['git', {cmd!r}, *sys.argv[1:]])\n")
        wrapper.chmod(0o755)
        git(a, "config", f"remote.origin.{cmd.replace('-', '')}", str(wrapper))
    ws = open_workspace(str(a))
    ws.read(["src/api.py"], agent="eng_a")
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    code, rb = storm_json(b, "write", "src/util.py", input="B\n", agent="eng_b")
    assert code == 0 and rb["accepted"]  # a's copy of the server's head is now old
    monkeypatch.setattr(backoff.random, "uniform", lambda lo, hi: hi)
    monkeypatch.setattr(backoff, "BACKOFF_BASE", 1.0)
    log.unlink()  # the read's fetch
    res = ws.write("src/api.py", b"A\n", agent="eng_a")
    assert res.accepted and res.cas_retries == 1, res
    events = [(k, float(t)) for k, t in (ln.split() for ln in log.read_text().splitlines())]
    assert [k for k, _ in events] == ["push", "fetch", "push"], events  # stale, learn the head, land
    (_, stale), (_, fetched), (_, landed) = events
    window = 2.0  # the first stale lease in a row: BACKOFF_BASE x 2, all of it
    assert fetched - stale >= window, events  # the back-off came before the fetch ...
    assert landed - fetched < window, events  # ... not between the fetch and the push
    assert server_log(srv)[:2] == [res.commit, rb["commit"]]


def test_a_moved_write_keeps_its_read_set_and_a_later_move_drops_it_on_that_read_set(tmp_path, monkeypatch):
    """A queued write's scope (its whole read set) is resolved from the notes and
    journal once and kept for the commit each move makes: the second move below finds
    the moved commit's scope without resolving it, and drops the write because the
    server's new head changed a file it read (README.md), not one it wrote."""
    from storm_git.core import provenance
    from storm_git.core.store import Store
    from storm_git.remote import workspace as client

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    assert storm(a, "read", "src/api.py", "README.md", agent="eng_x").returncode == 0
    assert storm(b, "read", "src/util.py", "README.md", agent="eng_z").returncode == 0
    resolved: list[str] = []
    real = provenance.load
    monkeypatch.setattr(provenance, "load", lambda s, ag, c: (resolved.append(c), real(s, ag, c))[1])
    store = Store.discover(str(a))

    ws = client.RemoteWorkspace(store, "origin")

    def fetch_and_move() -> int:  # what a push's stale lease does (the test holds the remote lock)
        before = ws.rebased
        ws.fetch_adopt()
        return ws.rebased - before

    holder = hold_push(a)
    try:
        px = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        queued = rev(a, WS)
        code, r1 = storm_json(b, "write", "src/util.py", input="Z1\n", agent="eng_z")
        assert code == 0 and r1["accepted"]
        assert fetch_and_move() == 1 and resolved == [queued]  # moved onto b's write
        moved = rev(a, WS)
        assert moved != queued and git(a, "rev-parse", f"{moved}^").stdout.decode().strip() == r1["commit"]
        code, r2 = storm_json(b, "write", "README.md", input="# Z2\n", agent="eng_z")
        assert code == 0 and r2["accepted"]
        assert fetch_and_move() == 0 and resolved == [queued]  # its scope came from the move
        assert rev(a, WS) == r2["commit"]  # dropped: its writer validates it again
    finally:
        release(holder)
    cx, rx = finish(px)
    assert cx == 1 and rx["rejection"]["reason"] == "stale_dependency", rx
    assert [s["path"] for s in rx["rejection"]["stale"]] == ["README.md"]
    assert server_log(srv)[:2] == [r2["commit"], r1["commit"]]


QUEUE_RECORD = Path(".git/storm/remote-queue")


def queue_record(repo: Path) -> tuple[list[str], list[str], list[str]]:
    """The clone's queue record: its header (tracked head, local ref), the commits it
    says are queued (oldest first) and those it says the last push landed."""
    head, *rows = (repo / QUEUE_RECORD).read_text().splitlines()
    return head.split(), [r[2:] for r in rows if r[:2] == "q "], [r[2:] for r in rows if r[:2] == "l "]


def test_the_queue_is_recorded_by_whoever_moves_the_refs_and_a_record_of_other_values_is_not_believed(tmp_path):
    """Each waiting writer asks whether its write is queued, landed or dropped; the
    processes that move the refs record the answer (queued by each write, moved by the
    fetch after a stale lease, landed by the push). A record that names other values
    of the refs than they have is not believed: the question is answered from the
    history."""
    from storm_git.core.locks import flocked
    from storm_git.core.store import Store
    from storm_git.remote import write_queue as queue

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    for agent, path in (("eng_x", "src/api.py"), ("eng_y", "README.md")):
        assert storm(a, "read", path, agent=agent).returncode == 0
    assert storm(b, "read", "src/util.py", agent="eng_z").returncode == 0
    holder = hold_push(a)
    try:
        px = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        py = start_write(a, "eng_y", "README.md", "# Y\n", "--json")
        wait_queued(a, 2)
        queued = git(a, "rev-list", "--reverse", f"{TRACKED}..{WS}").stdout.decode().split()
        assert queue_record(a) == ([rev(a, TRACKED), rev(a, WS)], queued, [])
        code, rz = storm_json(b, "write", "src/util.py", input="Z\n", agent="eng_z")
        assert code == 0 and rz["accepted"]
    finally:
        release(holder)
    (cx, rx), (cy, ry) = finish(px), finish(py)
    assert cx == 0 and cy == 0 and rx["cas_retries"] == ry["cas_retries"] == 1  # moved onto b's write, landed
    landed = [rx["commit"], ry["commit"]]
    assert server_log(srv)[:3] == landed[::-1] + [rz["commit"]]
    assert queue_record(a) == ([rev(srv, WS)] * 2, [], landed)

    store = Store.discover(str(a))
    with flocked(store.commondir, "workspace"):  # as every asker holds it
        # a record naming the tracked head as it was before the last push, saying both are queued
        (a / QUEUE_RECORD).write_text(f"{rz['commit']} {rev(a, WS)}\n" + "".join(f"q {c}\n" for c in landed))
        assert queue.write_state(store, "origin", git_oid(rx["commit"])) == (queue.LANDED, git_oid(rx["commit"]))
        # one naming the refs as they are, torn by hand: not believed either
        (a / QUEUE_RECORD).write_text(f"{rev(a, TRACKED)} {rev(a, WS)}\nq {rx['commit'][:20]}\n")
        assert queue.write_state(store, "origin", git_oid(rx["commit"]))[0] == queue.LANDED
        # a commit on the tracked head that is on neither ref: dropped
        other = git(a, "commit-tree", "-p", TRACKED, "-m", "elsewhere", f"{TRACKED}^{{tree}}").stdout.decode().strip()
        assert queue.write_state(store, "origin", git_oid(other))[0] == queue.DROPPED


def test_a_queue_record_lost_with_a_killed_writer_is_rebuilt_and_a_directory_in_its_place_stops_nothing(tmp_path):
    """A writer killed after its commit was queued and before it recorded it leaves the
    record behind the local ref (removed here, as that kill leaves it); the next write
    queued rebuilds it from the history and both land. A directory where the record
    goes makes every question go to the history, and the writes still land."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    for agent, path in (("eng_x", "src/api.py"), ("eng_y", "README.md"), ("eng_w", "src/util.py")):
        assert storm(a, "read", path, agent=agent).returncode == 0
    holder = hold_push(a)
    try:
        p1 = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        (a / QUEUE_RECORD).unlink()
        p2 = start_write(a, "eng_y", "README.md", "# Y\n", "--json")
        wait_queued(a, 2)
        queued = git(a, "rev-list", "--reverse", f"{TRACKED}..{WS}").stdout.decode().split()
        assert queue_record(a) == ([rev(a, TRACKED), rev(a, WS)], queued, [])
    finally:
        release(holder)
    (c1, r1), (c2, r2) = finish(p1), finish(p2)
    assert c1 == c2 == 0 and r1["accepted"] and r2["accepted"]
    assert server_log(srv)[:2] == [r2["commit"], r1["commit"]] == queued[::-1]

    (a / QUEUE_RECORD).unlink()
    (a / QUEUE_RECORD).mkdir()
    code, rw = storm_json(a, "write", "src/util.py", input="W\n", agent="eng_w")
    assert code == 0 and rw["accepted"] and rev(srv, WS) == rw["commit"], rw
    assert (a / QUEUE_RECORD).is_dir()
    # a FIFO in its place is neither waited on (a plain open blocks for a writer) nor kept
    (a / QUEUE_RECORD).rmdir()
    os.mkfifo(a / QUEUE_RECORD)
    code, rw = storm_json(a, "write", "src/util.py", input="W2\n", agent="eng_w")
    assert code == 0 and rw["accepted"] and rev(srv, WS) == rw["commit"], rw
    assert queue_record(a) == ([rw["commit"]] * 2, [], [rw["commit"]])


def test_the_back_off_window_doubles_with_each_stale_lease_in_a_row_up_to_its_cap_and_a_landing_resets_it(
        tmp_path, monkeypatch):
    """The window a clone waits in after a stale lease: 0.2, 0.4, 0.8, 1.6 s, then the
    cap (2 s) however long it keeps losing (a clone that lost four in a row is facing
    one that lands back to back: polling it faster only burns the CPU that clone
    needs); a push that lands starts over. The random draw is pinned to the window's
    top."""
    from storm_git.core.store import Store
    from storm_git.remote import backoff

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    store = Store.discover(str(a))
    monkeypatch.setattr(backoff.random, "uniform", lambda lo, hi: hi)

    def window() -> float:  # the one the stale lease just opened, read from the clone's record
        before = time.monotonic()
        backoff.write(store, backoff.after_push(backoff.read(store), stale=True))
        after = time.monotonic()
        until = backoff.read(store).until
        for w in (0.2, 0.4, 0.8, 1.6, 2.0):
            if before + w <= until <= after + w:
                return w
        raise AssertionError(f"window of {until - before:.3f}-{until - after:.3f} s")

    assert [window() for _ in range(6)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0] and backoff.read(store).streak == 6
    backoff.write(store, backoff.after_push(backoff.read(store), stale=False))
    assert (backoff.read(store).streak, backoff.read(store).until) == (0, 0.0)
    assert window() == 0.2


def test_a_write_waiting_behind_its_clones_losing_pushes_gives_up_with_exit_3(tmp_path):
    """A writer that never pushes itself (another process of its clone holds the remote
    lock, and the clone keeps losing leases) is bounded by storm.remoteRetrySeconds too:
    past it, with its clone in a losing streak, it stops with exit 3, its commit taken
    off the queue and nothing landed. It used to count only the stale leases of its own
    pushes, and waited without bound behind a clone that kept landing back to back."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    journal = (a / ".git/storm/journal/eng_x").read_bytes() if (a / ".git/storm/journal/eng_x").exists() else None
    git(a, "config", "storm.remoteRetrySeconds", "1")
    holder = hold_push(a)
    try:
        p = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        (a / ".git/storm/remote-gate").write_text("3 0.0\n")  # the pushing process lost three in a row
        time.sleep(1.5)  # past the budget, asleep on the landing lock
    finally:
        release(holder)
    code, out = finish(p)
    assert code == 3 and out["error"]["kind"] == "busy", out
    assert "lost 3 leases in a row" in out["error"]["message"], out
    assert rev(srv, WS) == h0 and rev(a, WS) == rev(a, TRACKED) == h0
    after = (a / ".git/storm/journal/eng_x").read_bytes() if (a / ".git/storm/journal/eng_x").exists() else None
    assert after == journal  # the lost attempt does not count as read
    (a / ".git/storm/remote-gate").write_text("0 0.0\n")  # the clone's next push landed
    code, out = storm_json(a, "write", "src/api.py", input="X\n", agent="eng_x")
    assert code == 0 and out["accepted"] and rev(srv, WS) == out["commit"], out


def test_a_write_past_its_budget_is_not_given_up_while_a_push_of_its_clone_is_in_flight(tmp_path):
    """A writer past storm.remoteRetrySeconds, its clone losing, wakes while another
    process of the clone holds the remote lock -- a push that may be carrying its
    write. Taking the write off the queue then would let that push land a write whose
    writer was told it failed. The remote and landing locks are held by two processes
    here; the landing lock is let go first (the writer wakes, the remote lock still
    held): the writer waits, its commit still queued, and gives up only once the remote
    lock is free."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/api.py", agent="eng_x").returncode == 0
    git(a, "config", "storm.remoteRetrySeconds", "1")
    remote = helpers.hold(a, "remote")
    landing = helpers.hold(a, "remote-landing")
    try:
        p = start_write(a, "eng_x", "src/api.py", "X\n", "--json")
        wait_queued(a, 1)
        (a / ".git/storm/remote-gate").write_text("3 0.0\n")  # the pushing process lost three in a row
        time.sleep(1.5)  # past the budget, asleep on the landing lock
        release(landing)
        wait_blocked(a, "remote", p, "the writer did not wait for the push in flight")
        assert p.poll() is None  # not given up under a push that may carry it
        assert git(a, "rev-list", "--count", f"{TRACKED}..{WS}").stdout.decode().strip() == "1"
    finally:
        release(landing)
        release(remote)
    code, out = finish(p)
    assert code == 3 and out["error"]["kind"] == "busy", out
    assert rev(srv, WS) == h0 and rev(a, WS) == h0
