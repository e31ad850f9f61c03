"""The line for the turn on a remote (storm_git.remote.gate, "The line"): a clone
blocked by another clone's turn puts its id in ``refs/storm/waiting/``; a holder
that lets its turn go hands it to the next clone in the line after its own id
(round robin), which adopts it at its next fetch. Real servers and clones; the
server's pre-receive hook logs every update it is asked for."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import git, start_write, storm, storm_json
from test_remote import bare, clone, remote, seed, server_log  # noqa: F401 (remote: a fixture)
from test_remote_turn import (TURN, _store, free_turn, free_value, landing_log, pushes, server_ref, take_turn,
                              turn_updates, write)

WAITING = "refs/storm/waiting/"


def cid(repo: Path) -> str:
    from storm_git.remote import gate

    out = gate.clone_id(_store(repo))
    assert out is not None
    return out


def message(repo: Path, oid: str) -> str:
    """A commit's text, or a turn value's (a blob)."""
    return git(repo, "cat-file", "-p", oid).stdout.decode()


def handed_to(repo: Path, oid: str) -> str | None:
    from storm_git.remote import gate

    return gate.turn_for(message(repo, oid))


def two_clones(tmp_path: Path, served: tuple[Path, str] | None = None) -> tuple[Path, Path, Path]:
    """A server and clones a and b of it, after a first write of a's (the turn exists,
    free); ``served``: (server, URL) from test_remote's ``remote`` fixture, else file://."""
    srv, url = served or (bare(tmp_path / "proj.git"), "")
    url = url or f"file://{srv}"
    a = seed(tmp_path, url)
    b = clone(tmp_path, url, "b")
    write(a, "eng_a", "README.md", "A0\n")
    return srv, a, b


def wait_for(predicate, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_round_robin_after_the_holders_own_id():
    """The next in line is the first waiting id after the holder's, cyclically; the
    holder itself and ids that are not clone ids are never handed a turn."""
    from storm_git.remote.gate import next_in_line

    a, b, c, d = "1" * 16, "5" * 16, "9" * 16, "d" * 16
    assert next_in_line([c, a, d], b) == c
    assert next_in_line([a, c], d) == a  # past the last id: round to the first
    assert next_in_line([b, a], b) == a  # its own entry is not a waiter
    assert next_in_line([b], b) is None and next_in_line([], b) is None
    assert next_in_line(["../x", "ABC", c], a) == c
    # served in turn: every waiting clone before any twice
    order, holder, line = [], a, {b, c, d}
    for _ in range(6):
        holder = next_in_line(sorted(line | {a}), holder)
        order.append(holder)
    assert order == [b, c, d, a, b, c]


def test_turn_values_name_whom_they_were_handed_to(tmp_path):
    """A taken turn names nobody, a handed one its clone; the line's value for a clone
    is the same commit in every clone (a dead clone is taken out by lease on it)."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    sa, sb = _store(a), _store(b)
    assert gate.turn_for(gate.turn_text(sa, gate.turn_value(sa))) is None
    handed = gate.turn_value(sa, "0123456789abcdef")
    assert gate.turn_for(gate.turn_text(sa, handed)) == "0123456789abcdef"
    assert gate.turn_age(gate.turn_text(sa, handed), time.time()) < 1.0  # its time still reads
    assert gate.turn_for("storm turn\n\nStorm-Turn-For: ../../x\n") is None
    assert gate.waiting_value(sa, "0123456789abcdef") == gate.waiting_value(sb, "0123456789abcdef")
    assert gate.waiting_value(sa, "0123456789abcdef") != gate.waiting_value(sa, "fedcba9876543210")


def test_a_clone_id_is_made_once_and_agreed_on_by_concurrent_processes(tmp_path):
    """Eight processes of a new clone ask for its id at once: one id, written whole.
    An id edited into something else is replaced; a directory at its path leaves the
    clone out of the line (None), and doctor moves it aside (test_corrupt_state)."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    path = a / ".git" / "storm" / "remote-clone"
    path.unlink(missing_ok=True)
    code = ("import sys; from storm_git.core.store import Store; from storm_git.remote import gate; "
            "print(gate.clone_id(Store.discover(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(a)], stdout=subprocess.PIPE) for _ in range(8)]
    ids = {p.communicate(timeout=60)[0].decode().strip() for p in procs}
    assert len(ids) == 1 and ids == {path.read_text().strip()}, ids
    [first] = ids
    assert len(first) == 16 and int(first, 16) >= 0
    assert gate.clone_id(_store(a)) == first  # stable
    path.write_text("not an id\n")
    new = gate.clone_id(_store(a))
    assert new and new != first and path.read_text().strip() == new
    path.unlink()
    path.mkdir()
    assert gate.clone_id(_store(a)) is None


def test_a_holder_hands_its_turn_along_the_line_and_the_last_frees_it(tmp_path):
    """b holds the turn; a's and c's writes are blocked and both join the line (status
    counts them). b's next landing lets the turn go: it hands it to the next clone
    in the line after b's id (a turn commit naming it), which adopts it at its next
    look, lands, leaves the line and, as its process ends, hands the turn to the
    other; that one lands and, nobody left in the line, frees it. Each write lands
    once; the line is empty at the end."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    c = clone(tmp_path, f"file://{srv}", "c")
    write(a, "eng_a", "README.md", "A0\n")  # the turn exists, free
    for repo, agent, path in ((a, "eng_a", "src/api.py"), (c, "eng_c", "src/util.py")):
        git(repo, "config", "storm.remoteTurnIdle", "60")  # b's turn is not freed as idle here
        assert storm(repo, "read", path, agent=agent).returncode == 0
    mine = take_turn(b, srv)
    gate.write_gate(_store(b), gate.Gate(held=mine, taken=time.monotonic(), landed=time.monotonic() - 5))
    log = landing_log(srv)
    before = len(server_log(srv))
    pa = start_write(a, "eng_a", "src/api.py", "A1\n", "--json")
    pc = start_write(c, "eng_c", "src/util.py", "C1\n", "--json")
    ids = {cid(a): "a", cid(c): "c"}
    wait_for(lambda: all(server_ref(srv, WAITING + i) for i in ids))
    assert pa.poll() is None and pc.poll() is None  # both blocked: nothing of theirs landed
    assert len(server_log(srv)) == before
    assert "held by this clone; 2 clones waiting" in storm(b, "status").stdout
    write(b, "eng_b", "docs/b.md", "B1\n")  # a lone writer after a pause: its landing lets go
    first = gate.next_in_line(list(ids), cid(b))
    second = next(i for i in ids if i != first)
    for p in (pa, pc):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    updates = turn_updates(log)
    assert updates[0] == (mine, updates[0][1]) and handed_to(srv, updates[0][1]) == first, updates
    assert updates[1][0] == updates[0][1] and handed_to(srv, updates[1][1]) == second, updates
    assert updates[2] == (updates[1][1], free_value(b)) and len(updates) == 3, updates
    # each handing push names the clone next in line after the new holder: it fetches ahead
    nexts = [new for push in pushes(log) for _old, new, ref in push if ref == gate.NEXT_REF]
    sb = _store(b)
    assert nexts == [str(gate.deck_value(sb, second)), str(gate.deck_value(sb, None))], nexts
    assert len(server_log(srv)) == before + 3  # b's, then the first's, then the second's write
    subjects = [message(srv, x) for x in server_log(srv)[:3]]
    order = {"a": "eng_a", "c": "eng_c"}
    assert [order[ids[second]] in subjects[0], order[ids[first]] in subjects[1], "eng_b" in subjects[2]] == [True] * 3
    # each clone left the line with its landing push
    waits = [(old, new, ref) for push in pushes(log) for old, new, ref in push if ref.startswith(WAITING)]
    assert sorted(ref for old, _n, ref in waits if old == "0" * 40) == sorted(WAITING + i for i in ids)
    assert sorted(ref for _o, new, ref in waits if new == "0" * 40) == sorted(WAITING + i for i in ids)
    assert not any(server_ref(srv, WAITING + i) for i in ids)
    assert gate.read_gate(_store(a)).held == gate.read_gate(_store(c)).held == ""


def test_a_turn_handed_to_a_clone_that_never_uses_it_is_freed_and_that_clone_leaves_the_line(tmp_path):
    """The turn handed to a clone that died waiting: another clone that sees it with the
    server's head unchanged for storm.remoteTurnIdle frees it in its landing push, and
    takes the dead clone out of the line in the same push (else every holder would
    hand it the turn again)."""
    from storm_git.remote import gate, transport

    srv, a, b = two_clones(tmp_path)
    dead = "0123456789abcdef"
    sb = _store(b)
    handed = str(gate.turn_value(sb, dead))
    out = transport.push(sb, "origin", [(handed, TURN, free_value(b)),
                                        (str(gate.waiting_value(sb, dead)), WAITING + dead, "")])
    assert out.ok, out
    git(a, "config", "storm.remoteTurnIdle", "0.5")
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    log = landing_log(srv)
    t0 = time.monotonic()
    write(a, "eng_a", "src/api.py", "A1\n")
    assert time.monotonic() - t0 >= 0.5  # it waited: a handed turn holds other clones up
    [landing] = [p for p in pushes(log) if any(ref == "refs/storm/workspace" for _o, _n, ref in p)]
    assert (handed, free_value(a), TURN) in landing
    assert (str(gate.waiting_value(sb, dead)), "0" * 40, WAITING + dead) in landing
    assert server_ref(srv, WAITING + dead) is None


def test_a_clone_handed_a_turn_with_nothing_to_write_passes_it_on_at_its_next_fetch(tmp_path, remote):
    """A clone in the line whose writes were given up or landed meanwhile is handed the
    turn: the next fetch of any of its commands (here a read) adopts it and, nothing
    queued, lets it go at once -- free, nobody else waiting -- and leaves the line.
    Over a git daemon, file:// and a plain path: the line is read with ls-remote."""
    from storm_git.remote import gate, transport

    srv, a, b = two_clones(tmp_path, remote)
    sb, ida = _store(b), cid(a)
    handed = str(gate.turn_value(sb, ida))
    out = transport.push(sb, "origin", [(handed, TURN, free_value(b)),
                                        (str(gate.waiting_value(sb, ida)), WAITING + ida, "")])
    assert out.ok, out
    line = transport.list_refs(_store(a), "origin", WAITING + "*", TURN)
    assert line == {WAITING + ida: str(gate.waiting_value(sb, ida)), TURN: handed}, line
    log = landing_log(srv)
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    assert pushes(log) == [[(handed, free_value(a), TURN), (str(gate.waiting_value(sb, ida)), "0" * 40, WAITING + ida)]]
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


@pytest.mark.parametrize("edit", ["turns-off", "no-id"])
def test_a_clone_out_of_the_line_is_never_handed_a_turn(tmp_path, edit):
    """With storm.remoteTurns false, or without a clone id (a directory in its place),
    a blocked clone does not join the line (it takes turns as they come, or ignores
    them), so a holder letting go frees the turn instead of handing it over."""
    from storm_git.remote import gate

    srv, a, b = two_clones(tmp_path)
    if edit == "turns-off":
        git(a, "config", "storm.remoteTurns", "false")
    else:
        path = a / ".git" / "storm" / "remote-clone"
        path.unlink(missing_ok=True)
        path.mkdir()
    git(a, "config", "storm.remoteTurnIdle", "60")
    mine = take_turn(b, srv)
    gate.write_gate(_store(b), gate.Gate(held=mine, taken=time.monotonic(), landed=time.monotonic() - 5))
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    p = start_write(a, "eng_a", "src/api.py", "A1\n", "--json")
    if edit == "no-id":
        time.sleep(1.0)  # blocked: rounds of looking, none of them joins the line
        assert p.poll() is None
    assert git(srv, "for-each-ref", WAITING).stdout.decode() == ""
    write(b, "eng_b", "docs/b.md", "B1\n")
    assert server_ref(srv, TURN) in (free_value(b), gate.read_gate(_store(a)).held or None)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert git(srv, "for-each-ref", WAITING).stdout.decode() == ""


def test_a_server_left_with_the_free_commit_of_older_clones_is_free(tmp_path):
    """Older clones left the turn free as a fixed root commit (gate.legacy_free): to
    this version it is free too -- a write neither waits for it nor joins a line --
    and its landing push replaces it with the free blob. Turn values are blobs: a
    fetch does not negotiate a root commit's history for them."""
    from storm_git.remote import gate, transport

    srv, a, b = two_clones(tmp_path)
    assert git(srv, "cat-file", "-t", TURN).stdout.decode().strip() == "blob"
    sb = _store(b)
    legacy = str(gate.legacy_free(sb))
    assert git(b, "cat-file", "-t", legacy).stdout.decode().strip() == "commit"
    assert transport.push(sb, "origin", [(legacy, TURN, free_value(b))]).ok
    git(a, "config", "storm.remoteTurnIdle", "60")  # were it a turn held, it would be waited for
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    assert "turn: free" in storm(a, "status").stdout
    log = landing_log(srv)
    write(a, "eng_a", "src/api.py", "A1\n")
    [landing] = pushes(log)
    assert (legacy, free_value(a), TURN) in landing
    assert not any(ref.startswith(WAITING) for _o, _n, ref in landing)
    assert server_ref(srv, TURN) == free_value(a)


def _move_server_head(repo: Path, srv: Path, n: int) -> None:
    """Another clone's landing, as the server sees it: a commit on the shared head
    (docs/b<n>.md added), pushed with a lease."""
    ws = "refs/storm/workspace"
    head = server_ref(srv, ws)
    git(repo, "fetch", "-q", "origin", f"+{ws}:refs/test/ws")
    blob = git(repo, "hash-object", "-w", "--stdin", input=f"b {n}\n".encode()).stdout.decode().strip()
    index = str(repo / ".git" / "test-index")
    env = dict(os.environ, GIT_INDEX_FILE=index)
    subprocess.run(["git", "read-tree", head], cwd=repo, env=env, check=True)
    subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},docs/b{n}.md"], cwd=repo, env=env,
                   check=True)
    tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, check=True, capture_output=True).stdout.decode()
    new = git(repo, "-c", "user.name=b", "-c", "user.email=b@x", "commit-tree", "-p", head, "-m", f"b {n}",
              tree.strip()).stdout.decode().strip()
    git(repo, "push", "-q", f"--force-with-lease={ws}:{head}", "origin", f"{new}:{ws}")


def test_a_blocked_clone_looks_without_fetching_until_it_is_served(tmp_path, monkeypatch):
    """While another clone holds the turn and lands writes, a blocked clone looks at the
    server's refs (ls-remote) without fetching their objects or moving its queue onto
    a head it may not push to yet; the fetch comes once the turn is free (or handed to
    it). The server's upload-pack runs a logging hook in place of pack-objects for
    every fetch of the blocked clone's process that sends objects."""
    srv, a, b = two_clones(tmp_path)
    git(a, "config", "storm.remoteTurnIdle", "60")  # b's turn is neither idle ...
    git(a, "config", "storm.remoteTurnSeconds", "60")  # ... nor expired within the test
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    log = tmp_path / "packs.log"
    hook = tmp_path / "pack-hook"
    hook.write_text(f'#!/bin/sh\necho fetch >> "{log}"\nexec "$@"\n')
    hook.chmod(0o755)
    held = take_turn(b, srv)
    t0 = time.monotonic()
    # upload-pack honours the hook from protected (global) config only, and a local
    # transport hands the server side no config of the client's command line
    user = os.environ.get("GIT_CONFIG_GLOBAL") or os.path.expanduser("~/.gitconfig")
    glob = tmp_path / "global.gitconfig"
    glob.write_text(f'[include]\n\tpath = "{user}"\n[uploadpack]\n\tpackObjectsHook = "{hook}"\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(glob))
    p = start_write(a, "eng_a", "src/api.py", "A1\n", "--json")
    monkeypatch.delenv("GIT_CONFIG_GLOBAL")
    if user != os.path.expanduser("~/.gitconfig"):
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", user)
    wait_for(lambda: server_ref(srv, WAITING + cid(a)) is not None)  # blocked, in the line
    fetched = len(log.read_text().splitlines()) if log.exists() else 0
    for n in range(2):  # b lands writes during its slice
        _move_server_head(b, srv, n)
    time.sleep(max(0.0, t0 + 3.5 - time.monotonic()))  # a's looks: from the slice's end (~2 s), every 40-80 ms
    assert p.poll() is None
    assert (len(log.read_text().splitlines()) if log.exists() else 0) == fetched  # looked, fetched nothing
    from storm_git.remote import gate

    assert gate.read_gate(_store(a)).head == server_ref(srv, "refs/storm/workspace")  # it did look
    free_turn(b, held)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert len(log.read_text().splitlines()) > fetched  # served: one fetch brought b's writes
    assert git(srv, "show", "refs/storm/workspace:src/api.py").stdout == b"A1\n"


def test_a_push_whose_line_entry_was_taken_out_meanwhile_is_retried_not_failed(tmp_path):
    """A clone's landing push takes its own entry out of the line, leased on what its
    last fetch showed. Another clone took it out meanwhile (as the idle rule does for
    a clone it took for dead): the lease is stale, the push is refused whole, and the
    write is not failed for it -- the clone fetches (the entry is gone there too) and
    lands the write once."""
    from storm_git.remote import gate, transport

    srv, a, b = two_clones(tmp_path)
    ida, sa = cid(a), _store(a)
    entry = str(gate.waiting_value(sa, ida))
    assert transport.push(sa, "origin", [(entry, WAITING + ida, "")]).ok  # a in the line
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0  # its fetch shows the entry
    assert git(a, "rev-parse", "--verify", "-q", "refs/storm-remote/origin/storm/waiting/" + ida).returncode == 0
    assert transport.push(_store(b), "origin", [("", WAITING + ida, entry)]).ok  # taken out by b
    before = len(server_log(srv))
    code, r = storm_json(a, "write", "src/util.py", input="A1\n", agent="eng_a")
    assert code == 0 and r["accepted"], r
    assert len(server_log(srv)) == before + 1 and server_ref(srv, WAITING + ida) is None
    assert git(a, "rev-parse", "--verify", "-q", "refs/storm-remote/origin/storm/waiting/" + ida,
               check=False).returncode != 0


def test_a_process_whose_write_did_not_keep_the_turn_still_frees_it_at_exit_when_the_clone_is_idle(tmp_path):
    """The clone holds the turn; the process whose push kept it may end while another
    writer of the clone is still under way, and leave the turn to it. That writer's
    write did not keep the turn (it landed in the other's push, or, here, pushed
    nothing: it wrote what the file already held). Ending with no writer of the clone
    under way, it frees the turn, so that the other clones do not wait for the idle
    rule (nobody else of this clone is left to free it)."""
    from storm_git.remote import gate

    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    write(a, "eng_a", "README.md", "A0\n")
    mine = take_turn(a, srv)
    gate.write_gate(_store(a), gate.Gate(held=mine, taken=time.monotonic(), landed=time.monotonic()))
    assert storm(a, "read", "README.md", agent="eng_a").returncode == 0
    log = landing_log(srv)
    code, r = storm_json(a, "write", "README.md", input="A0\n", agent="eng_a", fresh=True)  # a process of its own
    assert code == 0 and r["commit"] is None, r  # nothing to push
    assert [p for p in pushes(log) if any(ref == "refs/storm/workspace" for _o, _n, ref in p)] == []
    assert turn_updates(log) == [(mine, free_value(a))]  # freed as the process ended
    assert server_ref(srv, TURN) == free_value(a) and gate.read_gate(_store(a)).held == ""


@pytest.mark.parametrize("named", ["this clone", "this clone, a killed fetch's lock left", "another clone"])
def test_the_clone_named_next_in_line_fetches_ahead_while_blocked(tmp_path, named):
    """A handing push names the clone next in line after the new holder
    (refs/storm/next). That clone, blocked, fetches the server's head at its looks
    into its ``ahead`` ref -- objects only: its copy of the server's head and its
    queue stay where they were until it is served -- so that the fetch after the
    handover carries only the last writes (a fetch ahead killed before it renamed
    its ref lock leaves ``ahead.lock``: the next one clears it as stale). A clone
    the ref does not name fetches nothing while blocked."""
    from storm_git.remote import gate, transport

    srv, a, b = two_clones(tmp_path)
    git(a, "config", "storm.remoteTurnIdle", "60")  # b's turn is neither idle ...
    git(a, "config", "storm.remoteTurnSeconds", "60")  # ... nor expired within the test
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    held = take_turn(b, srv)
    sb = _store(b)
    on_deck = cid(a) if named.startswith("this clone") else "0123456789abcdef"
    lock = a / ".git" / "refs" / "storm-remote" / "origin" / "ahead.lock"
    if "killed" in named:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("0" * 40 + "\n")
        os.utime(lock, (time.time() - 3600, time.time() - 3600))
    out = transport.push(sb, "origin", [(str(gate.deck_value(sb, on_deck)), gate.NEXT_REF, transport.FORCE)])
    assert out.ok, out  # forced: whatever the ref held
    tracked = git(a, "rev-parse", "refs/storm-remote/origin/storm/workspace").stdout.decode().strip()
    local = git(a, "rev-parse", "refs/storm/workspace").stdout.decode().strip()
    p = start_write(a, "eng_a", "src/api.py", "A1\n", "--json")
    wait_for(lambda: server_ref(srv, WAITING + cid(a)) is not None)  # blocked, in the line
    for n in range(2):  # b lands writes during its slice
        _move_server_head(b, srv, n)
    head = server_ref(srv, "refs/storm/workspace")
    ahead = ["git", "rev-parse", "-q", "--verify", "refs/storm-remote/origin/ahead"]
    if named.startswith("this clone"):
        wait_for(lambda: subprocess.run(ahead, cwd=a, capture_output=True).stdout.decode().strip() == head)
        assert not lock.exists()
    else:
        # it looked at the moved head: a look records the head only after any fetch ahead
        # it made is over, so no wait past this one is needed for the check below
        wait_for(lambda: gate.read_gate(_store(a)).head == head)
        assert subprocess.run(ahead, cwd=a, capture_output=True).returncode != 0  # fetched nothing ahead
    assert p.poll() is None  # still blocked
    # objects only: what it adopts and its queue move only once it is served
    assert git(a, "rev-parse", "refs/storm-remote/origin/storm/workspace").stdout.decode().strip() == tracked
    assert git(a, "rev-parse", "refs/storm/workspace^").stdout.decode().strip() == local
    assert gate.read_gate(_store(a)).deck is named.startswith("this clone")
    code, st = storm_json(a, "status")  # (its fetch adopts b's head: after the checks above)
    assert code == 0, st
    turn = st["turn"]
    assert turn.startswith("held by another clone; 1 clone waiting")
    assert turn.endswith("; this clone is next") is named.startswith("this clone"), turn
    free_turn(b, held)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert git(srv, "show", "refs/storm/workspace:src/api.py").stdout == b"A1\n"
    assert git(srv, "show", "refs/storm/workspace^:docs/b1.md").stdout == b"b 1\n"  # on b's writes
