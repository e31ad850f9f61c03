"""The turn on a remote (storm_git.remote.gate): a clone that keeps losing leases takes
``refs/storm/turn`` on the server, and while it holds it every other clone's push is
refused, so that one clone landing back to back cannot starve the others. Real
servers and clones; another clone's turn is put on the server with the same functions
a clone uses, and freed (or left, as by a holder that died) by the test."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import helpers
import pygit2
import pytest
from helpers import git, start_write, storm, storm_json
from test_remote import WS, bare, clone, seed, server_log

TURN = "refs/storm/turn"


def _store(repo: Path):
    from storm_git.core.store import Store

    return Store.discover(str(repo))


def server_ref(srv: Path, ref: str) -> str | None:
    r = git(srv, "rev-parse", "--verify", "-q", ref, check=False)
    return r.stdout.decode().strip() or None


def free_value(repo: Path) -> str:
    from storm_git.remote import gate

    return str(gate.free_value(_store(repo)))


def take_turn(repo: Path, srv: Path) -> str:
    """Put a turn of ``repo`` on the server, as a clone that lost twice does (a lease
    that the turn is free, or absent); returns its commit."""
    from storm_git.remote import gate, transport

    store = _store(repo)
    oid = str(gate.turn_value(store))
    now = server_ref(srv, TURN)
    out = transport.push(store, "origin", [(oid, TURN, now or "")])
    assert out.ok, out
    assert now in (None, free_value(repo))
    return oid


def free_turn(repo: Path, held: str) -> None:
    from storm_git.remote import transport

    out = transport.push(_store(repo), "origin", [(free_value(repo), TURN, held)])
    assert out.ok, out


def write(repo: Path, agent: str, path: str, content: str) -> dict:
    """Read ``path`` then write it (a write of an unread file is refused)."""
    assert storm(repo, "read", path, agent=agent).returncode == 0
    code, r = storm_json(repo, "write", path, input=content, agent=agent)
    assert code == 0 and r["accepted"], r
    return r


def landing_log(srv: Path) -> Path:
    """A pre-receive hook on the server that records every ref update it is asked for."""
    log = srv / "updates.log"
    hook = srv / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ncat >> {log}\necho -- >> {log}\n")  # one push, then a separator
    hook.chmod(0o755)
    return log


def pushes(log: Path) -> list[list[tuple[str, str, str]]]:
    """The updates of each push the server was asked for, in order."""
    out: list[list[tuple[str, str, str]]] = [[]]
    for ln in log.read_text().splitlines() if log.exists() else []:
        if ln == "--":
            out.append([])
        else:
            old, new, ref = ln.split()
            out[-1].append((old, new, ref))
    return [p for p in out if p]


def turn_updates(log: Path) -> list[tuple[str, str]]:
    return [(old, new) for push in pushes(log) for old, new, ref in push if ref == TURN]


def test_a_write_leaves_the_turn_free_on_a_server_that_never_had_one(tmp_path):
    """A server made before the turn existed has no refs/storm/turn: the first push
    creates it, free; every clone computes the same free value without a fetch."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    assert server_ref(srv, TURN) is None
    r = write(a, "eng_a", "src/api.py", "A\n")
    assert server_ref(srv, TURN) == free_value(a) == free_value(b)
    r = write(b, "eng_b", "src/util.py", "B\n")
    assert server_ref(srv, TURN) == free_value(a)
    assert git(srv, "fsck", "--no-dangling").returncode == 0


def test_while_another_clone_holds_the_turn_a_write_waits_and_lands_once_it_is_freed(tmp_path):
    """Clone b holds the turn: clone a's write is refused by the server (a lease that
    the turn is free) and does not take the turn over (its own take has the same
    lease), nor free it (storm.remoteTurnIdle is raised so that b, which lands nothing
    here, is not taken for idle); it lands once b frees the turn."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    r = write(a, "eng_a", "src/api.py", "A1\n")  # the turn now exists, free
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    git(a, "config", "storm.remoteTurnIdle", "60")  # b's idle turn is not freed by a within the test
    held = take_turn(b, srv)
    before = server_log(srv)
    p = start_write(a, "eng_a", "src/api.py", "A2\n", "--json")
    time.sleep(1.5)  # four rounds at least (the back-off windows are 0.2, 0.4, 0.8 s)
    assert p.poll() is None, p.communicate()
    assert server_log(srv) == before  # nothing of a landed
    assert server_ref(srv, TURN) == held  # and b's turn is still b's
    free_turn(b, held)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert len(server_log(srv)) == len(before) + 1
    # a, blocked for several rounds, took the turn once it was free (and keeps it for its slice)
    from storm_git.remote import gate

    assert server_ref(srv, TURN) == (gate.read_gate(_store(a)).held or free_value(a)) != held


def test_a_turn_whose_holder_died_is_freed_by_another_clone_once_idle(tmp_path):
    """A holder that died leaves its turn on the server: another clone that has seen the
    same turn with the server's head unchanged for TURN_IDLE (on its own clock) frees
    it with its push. (storm.remoteTurnSeconds bounds a holder that keeps landing past
    its slice: test_what_a_push_does_to_the_turn.)"""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    r = write(a, "eng_a", "src/api.py", "A1\n")
    take_turn(b, srv)  # and b is never heard of again
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    t0 = time.monotonic()
    code, r = storm_json(a, "write", "src/util.py", input="A2\n", agent="eng_a")
    waited = time.monotonic() - t0
    assert code == 0 and r["accepted"], r
    assert waited >= gate.TURN_IDLE, waited  # it did wait for the turn: it is not ignored
    assert server_ref(srv, TURN) == free_value(a)


def test_a_clone_that_loses_twice_in_a_row_takes_the_turn_and_frees_it_as_its_process_ends(tmp_path):
    """The clone's record says it lost one lease; its next push is stale too (another
    clone wrote): it takes the turn (free -> its commit, on the server) and lands its
    write in a push that keeps the turn (it took it to write: a burst may follow).
    The write's process then ends with no other writer of the clone under way: it
    frees the turn (its commit -> free) in a push of its own, rather than leave the
    other clones to wait until they see it idle. The gate file of the older
    two-field format is read."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    log = landing_log(srv)
    r = write(b, "eng_b", "src/util.py", "B\n")  # a's copy is now old
    (a / ".git/storm/remote-gate").write_text("1 0.0\n")  # one stale lease already, in the old format
    # read before b wrote; a process of its own (the test's forked children skip exit handlers)
    code, r = storm_json(a, "write", "src/api.py", input="A\n", agent="eng_a", fresh=True)
    assert code == 0 and r["accepted"] and r["cas_retries"] >= 1, r
    free = free_value(a)
    seq = pushes(log)
    updates = turn_updates(log)
    assert updates[0] == ("0" * 40, free), updates  # b's write created it, free
    assert len(updates) == 3 and updates[1][0] == free, updates  # a took it ...
    taken = updates[1][1]
    assert seq[-1] == [(taken, free, TURN)]  # ... and freed it as its process ended, alone
    assert any(WS in {ref for _o, _n, ref in p} and TURN not in {ref for _o, _n, ref in p} for p in seq[2:-1])
    assert git(a, "cat-file", "-t", taken).stdout.decode().strip() == "blob"
    assert "Storm-Turn: " in git(a, "cat-file", "blob", taken).stdout.decode()
    assert server_ref(srv, TURN) == free and server_log(srv)[0] == r["commit"]
    assert gate.read_gate(_store(a)).held == ""


def test_a_lone_writer_after_a_pause_frees_the_turn_with_its_landing(tmp_path):
    """A holder whose one writer writes after a pause (not back to back) frees the turn
    in the push that lands that write: it leaves nothing behind it."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    write(a, "eng_a", "src/api.py", "A1\n")
    mine = take_turn(a, srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic(), landed=time.monotonic() - 5))
    log = landing_log(srv)
    write(a, "eng_a", "src/util.py", "A2\n")
    [push] = pushes(log)
    assert (mine, free_value(a), TURN) in push and WS in {ref for _o, _n, ref in push}
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


def test_a_clone_whose_writes_the_move_dropped_does_not_take_the_turn(tmp_path):
    """Two stale leases in a row, but the second fetch shows another clone changed
    the file the write read: the write is dropped and judged again (rejected here),
    and no turn is taken for it (it would only hold the other clones up)."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    write(a, "eng_a", "README.md", "A0\n")  # the turn ref exists, free
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    assert storm(b, "read", "src/api.py", agent="eng_b").returncode == 0
    log = landing_log(srv)
    write(b, "eng_b", "src/api.py", "B\n")  # what a read has changed
    (a / ".git/storm/remote-gate").write_text("1 0.0\n")  # one stale lease already
    code, r = storm_json(a, "write", "src/api.py", input="A\n", agent="eng_a")
    assert code == 1 and not r["accepted"], r  # the usual rejection
    assert turn_updates(log) == [] and server_ref(srv, TURN) == free_value(a)


def test_a_holder_keeps_its_turn_while_another_write_of_its_clone_is_under_way(tmp_path):
    """Within its slice, a holder's landing push keeps the turn while another writer
    of the clone holds its write lock (validating, or queued behind this push): the
    clone still has writes to land. With none, after a pause (one writer, not writing
    back to back), the next landing frees it."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    write(a, "eng_a", "src/api.py", "A1\n")  # the turn ref exists, free
    mine = take_turn(a, srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic()))
    other = helpers.hold(a, "write-eng_z")  # another agent's write of this clone, under way
    try:
        write(a, "eng_a", "src/util.py", "A2\n")
        assert server_ref(srv, TURN) == mine and gate.read_gate(_store(a)).held == mine
    finally:
        helpers.release(other)
    time.sleep(gate.TURN_BURST)  # a pause: one writer alone, not writing back to back
    write(a, "eng_a", "src/util.py", "A3\n")
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


def test_a_holder_whose_turn_was_taken_over_stops_and_waits_for_the_new_holder(tmp_path):
    """Clone a believes it holds the turn (its record), but b took it over after it
    expired: a's push keeps its turn with a lease on it, the server's advertisement
    shows b's, the push is refused; a learns it lost the turn, waits, and lands once b
    frees it."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    r = write(a, "eng_a", "src/api.py", "A1\n")
    mine = take_turn(a, srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic()))
    from storm_git.remote import transport

    theirs = str(gate.turn_value(_store(b)))
    assert transport.push(_store(b), "origin", [(theirs, TURN, mine)]).ok  # b takes it over
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    git(a, "config", "storm.remoteTurnIdle", "60")
    before = server_log(srv)
    p = start_write(a, "eng_a", "src/api.py", "A2\n", "--json")
    time.sleep(1.5)
    assert p.poll() is None, p.communicate()
    assert server_log(srv) == before and server_ref(srv, TURN) == theirs
    free_turn(b, theirs)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    now = gate.read_gate(_store(a)).held
    assert now != mine  # it knows it lost that one (it may have taken a new turn since b freed it)
    assert server_ref(srv, TURN) == (now or free_value(a))


def test_a_holder_whose_other_writers_stop_as_its_push_lands_frees_its_turn_at_once(tmp_path):
    """The push kept the turn (another writer of the clone was under way when it
    started); that writer is gone when it lands (the server's post-receive hook ends
    it, deterministically): TURN_GRACE later the pushing process sees no writer under
    way and frees the turn, rather than leave it idle for the other clones to wait out."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    write(a, "eng_a", "src/api.py", "A1\n")
    mine = take_turn(a, srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic()))
    other = helpers.hold(a, "write-eng_z")
    log = landing_log(srv)
    hook = srv / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\nkill -9 -{other.pid} 2>/dev/null\nexit 0\n")  # the other writer stops
    hook.chmod(0o755)
    try:
        write(a, "eng_a", "src/util.py", "A2\n")
    finally:
        helpers.release(other)
    landing, freeing = pushes(log)
    assert WS in {ref for _o, _n, ref in landing} and TURN not in {ref for _o, _n, ref in landing}  # kept
    assert freeing == [(mine, free_value(a), TURN)]  # freed right after, by a push of its own
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


def test_a_holder_frees_its_turn_with_its_first_landing_after_its_slice_and_then_pauses(tmp_path):
    """A busy clone that took the turn TURN_SLICE ago frees it in the push that lands
    its next write (its own value -> free, leased on its own), and that push's process
    waits TURN_PAUSE before its clone pushes again (the next taker's fetch is not
    overtaken by it). A clone that frees its turn because nothing else is under way
    does not pause (test above: its one writer would be the one waiting)."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    r = write(a, "eng_a", "src/api.py", "A1\n")  # the turn ref exists, free
    mine = take_turn(a, srv)
    log = landing_log(srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic() - gate.TURN_SLICE))
    landed = srv / "landed.log"
    hook = srv / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\ndate +%s.%N >> {landed}\n")  # when the refs moved
    hook.chmod(0o755)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    other = helpers.hold(a, "write-eng_z")  # the clone has more writes under way: busy, not idle
    try:
        code, r = storm_json(a, "write", "src/util.py", input="A2\n", agent="eng_a")
    finally:
        helpers.release(other)
    assert code == 0 and r["accepted"], r
    assert time.time() - float(landed.read_text().split()[0]) >= gate.TURN_PAUSE
    assert turn_updates(log) == [(mine, free_value(a))]  # in the landing push itself
    [push] = pushes(log)
    assert {WS, TURN} < {ref for _o, _n, ref in push}  # in the landing push itself
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


def test_a_turn_is_kept_while_its_clone_is_busy(monkeypatch):
    """Other writers under way, or one writer writing back to back: kept. One writer
    alone after a pause, or no turn: not."""
    from storm_git.remote import gate

    now = [100.0]
    monkeypatch.setattr(gate.time, "monotonic", lambda: now[0])
    held = gate.Gate(held="3" * 40, taken=99.0, landed=99.9)
    assert gate.clone_busy(held, 2) and gate.clone_busy(held, 1)  # back to back: landed 0.1 s ago
    now[0] = 99.9 + gate.TURN_BURST
    assert gate.clone_busy(held, 2) and not gate.clone_busy(held, 1) and not gate.clone_busy(held, 0)
    assert not gate.clone_busy(gate.Gate(), 5)
    assert gate.after_push(held, stale=False, kept=True).landed == now[0]


def test_the_age_of_a_turn_is_read_from_its_commit_within_its_slice():
    """A clone that sees another clone's turn late counts its slice from when it was
    taken (the holder's clock, in the turn commit), bounded by 0 and the slice."""
    from storm_git.remote import gate

    msg = "storm turn\n\nStorm-Turn: host 12 1700000000500000000 abcd\n"
    assert gate.turn_age(msg, 1700000001.0) == pytest.approx(0.5)
    assert gate.turn_age(msg, 1700000100.0) == gate.TURN_SLICE  # a clock far ahead: at most a slice
    assert gate.turn_age(msg, 1600000000.0) == 0.0  # far behind: none
    assert gate.turn_age("storm turn: free\n", 1700000001.0) == 0.0
    g = gate.after_fetch(gate.Gate(), pygit2.Oid(hex="2" * 40), True, None, age=0.5)
    assert g.since == pytest.approx(time.monotonic() - 0.5, abs=0.1)


def test_a_clone_blocked_by_a_turn_looks_again_as_its_slice_ends(monkeypatch):
    """Blocked (another clone's turn seen), the clone's next look is just after that
    turn's slice would end, counted from its first sight, when that comes before its
    back-off window; past the slice's end (the handover is due at the holder's next
    landing) it looks again within TURN_POLL, not a whole window later."""
    from storm_git.remote import gate

    now = [100.0]
    monkeypatch.setattr(gate.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gate.random, "uniform", lambda lo, hi: hi)
    seen = gate.Gate(streak=5, seen="2" * 40, since=99.5, head="4" * 40, still=99.5)
    g = gate.after_push(seen, stale=True)  # window 2 s; the slice ends at 101.5 (+ 0.05 / streak)
    assert g.until == 99.5 + gate.TURN_SLICE + 0.05 / 6 and g.streak == 6
    longer = gate.after_push(replace(seen, streak=11), stale=True)  # losing longer: it looks sooner
    assert longer.until == 99.5 + gate.TURN_SLICE + 0.05 / 12 < g.until
    now[0] = 101.8  # past that: soon, not the 2 s window
    assert gate.after_push(seen, stale=True).until == 101.8 + gate.TURN_POLL[1] < 101.8 + gate.BACKOFF_CAP
    fresh = gate.Gate(streak=1, seen="2" * 40, since=101.7)  # window 0.4 s: earlier than the slice's end
    assert gate.after_push(fresh, stale=True).until == 101.8 + 0.4


def test_a_clone_with_turns_off_neither_waits_for_nor_touches_the_turn(tmp_path):
    """storm.remoteTurns false: the clone's pushes leave refs/storm/turn alone, so
    another clone's turn neither holds it up nor is freed by it."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    write(a, "eng_a", "src/api.py", "A1\n")  # the turn ref exists, free
    git(a, "config", "storm.remoteTurns", "false")
    held = take_turn(b, srv)
    log = landing_log(srv)
    t0 = time.monotonic()
    write(a, "eng_a", "src/util.py", "A2\n")
    assert time.monotonic() - t0 < 5  # did not wait for the idle rule or the expiry
    [push] = pushes(log)
    assert TURN not in {ref for _o, _n, ref in push} and server_ref(srv, TURN) == held


def test_status_says_who_holds_the_turn(tmp_path):
    """status (text and --json) names the turn's state as the fetch it makes shows it."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    write(a, "eng_a", "src/api.py", "A1\n")
    code, st = storm_json(a, "status")
    assert code == 0 and st["turn"] == "free", st
    held = take_turn(b, srv)
    assert "turn: held by another clone" in storm(a, "status").stdout
    from storm_git.remote import gate

    gate.write_gate(_store(b), gate.Gate(held=held, taken=time.monotonic()))
    assert storm_json(b, "status")[1]["turn"] == "held by this clone"
    git(a, "config", "storm.remoteTurns", "false")
    assert storm_json(a, "status")[1]["turn"] == "not taken here (storm.remoteTurns false)"


def test_a_fifo_in_place_of_the_gate_file_stops_no_write(tmp_path):
    """The gate is read without blocking (a FIFO there is what doctor moves aside)."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    os.mkfifo(a / ".git/storm/remote-gate")
    p = start_write(a, "eng_a", "src/api.py", "A\n", "--json")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()


@pytest.mark.parametrize("raw, expect", [
    (b"3 12.5\n", (3, 12.5, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),  # the format before the turn
    (b"2 1.0 abc 5.0 - 0.0 - 0.0 7.0\n", (2, 1.0, "abc", 5.0, "", 0.0, "", 0.0, 7.0, False, 0.0)),
    (b"1 2.0 - 0.0 def 3.0 h 4.0 0.0\n", (1, 2.0, "", 0.0, "def", 3.0, "h", 4.0, 0.0, False, 0.0)),  # before next
    (b"1 2.0 - 0.0 def 3.0 h 4.0 0.0 1 8.5\n", (1, 2.0, "", 0.0, "def", 3.0, "h", 4.0, 0.0, True, 8.5)),
    (b"", (0, 0.0, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),
    (b"x y\n", (0, 0.0, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),
    (b"1 2.0 - 0.0 def\n", (0, 0.0, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),  # torn
    (b"1 2.0 - 0.0 def 3.0 h 4.0 0.0 1\n", (0, 0.0, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),  # torn
    (b"\xff\xfe", (0, 0.0, "", 0.0, "", 0.0, "", 0.0, 0.0, False, 0.0)),
])
def test_the_gate_record_reads_old_new_and_torn_forms(raw, expect):
    from dataclasses import astuple

    from storm_git.remote.gate import Gate

    g = Gate.decode(raw)
    assert astuple(g) == expect
    assert Gate.decode(g.encode()) == g


def test_what_a_push_does_to_the_turn(monkeypatch):
    """Free: stays free, leased on free (absent: created free). Held here: kept within
    the slice (same value, leased), freed after. Another clone's: no push, until it
    has been seen unchanged for the expiry, or with the server's head unchanged for
    TURN_IDLE (its holder lands nothing); then freed."""
    import pygit2

    from storm_git.remote import gate

    free, other = pygit2.Oid(hex="1" * 40), pygit2.Oid(hex="2" * 40)
    h1, h2 = pygit2.Oid(hex="4" * 40), pygit2.Oid(hex="5" * 40)
    now = [100.0]
    monkeypatch.setattr(gate.time, "monotonic", lambda: now[0])
    g = gate.Gate()
    assert gate.turn_update(g, None, free, 5.0) == (str(free), TURN, "")
    assert gate.turn_update(g, free, free, 5.0) == (str(free), TURN, str(free))
    held = gate.Gate(held="3" * 40, taken=99.0)
    assert gate.turn_update(held, None, free, 5.0) == ("3" * 40, TURN, "3" * 40)
    now[0] = 99.0 + gate.TURN_SLICE
    assert gate.turn_update(held, None, free, 5.0) == (str(free), TURN, "3" * 40)
    seen = gate.after_fetch(gate.Gate(), other, True, h1)
    assert (seen.seen, seen.since, seen.still) == (str(other), now[0], now[0])
    assert gate.turn_update(seen, other, free, 5.0) is None
    for _ in range(10):  # its holder keeps landing: the head moves at every look
        now[0] += 0.5
        seen = gate.after_fetch(seen, other, True, h2 if seen.head == str(h1) else h1)
        assert gate.turn_update(seen, other, free, 5.0) is None or now[0] - seen.since >= 5.0
    assert gate.turn_update(seen, other, free, 5.0) == (str(free), TURN, str(other))  # seen 5 s: expired
    idle = gate.after_fetch(gate.Gate(), other, True, h1)
    now[0] += gate.TURN_IDLE - 0.01
    idle = gate.after_fetch(idle, other, True, h1)
    assert gate.turn_update(idle, other, free, 5.0) is None
    now[0] += 0.01
    assert gate.turn_update(idle, other, free, 5.0) == (str(free), TURN, str(other))  # its holder is idle
    assert gate.after_fetch(gate.Gate(held="3" * 40), other, True, h1).held == ""  # taken over: lost
    assert gate.after_fetch(gate.Gate(held="3" * 40), pygit2.Oid(hex="3" * 40), False, h1).held == "3" * 40


def test_the_clone_next_in_line_knows_its_name_without_a_fetch_and_looks_early(monkeypatch):
    """refs/storm/next holds fixed bytes per clone id: a clone recognises its own value
    from ls-remote's oid without fetching or writing it. Named, it looks DECK_LEAD
    before the holder's slice ends (to fetch the slice's writes ahead)."""
    import pygit2

    from storm_git.remote import gate

    me, other = "0123456789abcdef", "fedcba9876543210"
    mine = str(pygit2.hash(gate.deck_bytes(me)))
    assert gate.on_deck(mine, me) and not gate.on_deck(mine, other)
    assert not gate.on_deck(None, me) and not gate.on_deck(mine, None)
    assert not gate.on_deck(str(pygit2.hash(gate.deck_bytes(None))), me)  # nobody next
    # the back-off window at its widest (BACKOFF_CAP), the slice's jitter none
    monkeypatch.setattr(gate.random, "uniform", lambda lo, hi: hi if hi >= gate.BACKOFF_CAP else lo)
    monkeypatch.setattr(gate.time, "monotonic", lambda: 100.0)
    seen = gate.Gate(streak=5, seen="2" * 40, since=99.0, head="4" * 40, still=99.0)
    assert gate.after_push(seen, stale=True).until == 99.0 + gate.TURN_SLICE
    assert gate.after_push(replace(seen, deck=True), stale=True).until == 99.0 + gate.TURN_SLICE - gate.DECK_LEAD
    # named for one turn only: a new turn (seen by a fetch or a look) or a turn handed here forgets it
    on = replace(seen, deck=True)
    turn, other = pygit2.Oid(hex="2" * 40), pygit2.Oid(hex="6" * 40)
    assert gate.after_fetch(on, turn, True, pygit2.Oid(hex="4" * 40)).deck
    assert not gate.after_fetch(on, other, True, pygit2.Oid(hex="4" * 40)).deck
    assert not gate.after_fetch(on, None, False, None).deck
    assert not gate.after_fetch(on, other, False, None, handed=True).deck
    assert not gate.seen_now(on, "6" * 40, "4" * 40).deck
