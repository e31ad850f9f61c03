"""The drop-in manager's integer versions when the shared ref moves off the history
they were numbered on: a number names exactly one state (storm_git.paper.versions).

Two windows, opened on purpose: refs/storm/workspace reset by hand to a commit above
the versions table's last written head (the table is written every few commits; the
commits between are numbered by walking them), and a remote clone whose queued write,
already read by an agent, is dropped by the server and whose ref is put back on the
server's head."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import helpers
from helpers import git, release, rev, start_write, storm, storm_json
from manager_agent import Agent
from servers import WS, bare, clone, seed
from storm_git.paper.manager import Manager, ReadResponse

UTIL = "src/util.py"
TRACKED = "refs/storm-remote/origin/storm/workspace"


def run(coro):
    return asyncio.run(coro)


def shared(repo: Path, path: str) -> str:
    return git(repo, "show", f"refs/storm/workspace:{path}").stdout.decode()


def test_a_hand_reset_above_the_written_table_gives_no_number_to_a_second_state(repo: Path) -> None:
    from storm_git.paper.versions import PERSIST_EVERY, VERSIONS_REF

    m = Manager(repo, reservation_wait=1)
    assert run(m.read_file("engineer_1", UTIL)).version == 1  # the table is written here
    written = rev(repo, VERSIONS_REF)
    assert run(m.write_file("engineer_1", UTIL, "c1\n", 1)).new_version == 2
    c1 = rev(repo, WS)
    assert run(m.write_file("engineer_1", UTIL, "c2\n", 2)).new_version == 3
    assert rev(repo, VERSIONS_REF) == written, "the window needs the table to lag the shared head"
    assert PERSIST_EVERY > 2
    e3 = Agent(m, "engineer_3")
    assert run(e3.view(UTIL)) == ReadResponse("c2\n", 3)
    git(repo, "update-ref", "refs/storm/workspace", c1)  # by hand, above the table's written head

    async def go() -> None:
        e2 = Agent(m, "engineer_2")
        seen = await e2.view(UTIL)
        assert seen.content == "c1\n" and seen.version not in (1, 3), seen
        res = await e2.str_replace(UTIL, "c1", "x")
        assert res.success
        assert res.new_version > 3, res  # 3 was handed out for c2: never for another state
        # engineer_3's edit was made on c2 (its version 3): the file holds x, a conflict
        late = await e3.str_replace(UTIL, "c2", "mine")
        assert not late.success and late.reason == "direct_conflict", late
        assert late.current_content == "x\n" and late.changed_by == "engineer_2"
        assert late.current_version == res.new_version
        assert "-c2" in late.diff and "+x" in late.diff

    run(go())
    assert shared(repo, UTIL) == "x\n"
    # another process agrees on every number
    other = Manager(repo)
    assert run(other.read_file("engineer_4", UTIL)).version == run(m.read_file("engineer_4", UTIL)).version


def test_a_reset_to_an_ancestor_of_handed_out_numbers_is_seen_by_a_fresh_process(repo: Path) -> None:
    m = Manager(repo)
    assert run(m.read_file("engineer_1", UTIL)).version == 1
    assert run(m.write_file("engineer_1", UTIL, "c1\n", 1)).new_version == 2
    c1 = rev(repo, WS)
    assert run(m.write_file("engineer_1", UTIL, "c2\n", 2)).new_version == 3
    git(repo, "update-ref", "refs/storm/workspace", c1)
    # a plain storm write (another door) moves the ref on the reset history, and a process
    # that never saw c2 numbers the file: 3 still names c2, not the CLI's content
    assert storm(repo, "read", UTIL, agent="engineer_2").returncode == 0
    assert storm(repo, "write", UTIL, agent="engineer_2", input="y\n").returncode == 0
    fresh = Manager(repo)
    r = run(fresh.read_file("engineer_2", UTIL))
    assert r.content == "y\n" and r.version > 3, r
    res = run(fresh.write_file("engineer_5", UTIL, "z\n", 3))
    assert not res.success and res.reason == "direct_conflict" and res.current_content == "y\n", res
    assert shared(repo, UTIL) == "y\n"


@pytest.mark.slow
def test_a_dropped_queued_write_keeps_its_number_in_the_remote_clone(tmp_path: Path) -> None:
    """In clone a an agent reads another agent's queued write (version 2); clone b writes
    the file first, the server drops a's write at a's next push and a's ref is put back
    on the server's head. The content there must not be version 2 too: the reader's
    write made on version 2 is a conflict, not accepted over clone b's write. The queued
    write's writer is killed while a push holds the clone's locks (its commit stays
    queued on the local ref); the next write of the clone pushes it."""
    srv = bare(tmp_path / "proj.git")
    assert storm(srv, "server-hook", "install", str(srv)).returncode == 0
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    m = Manager(a, reservation_wait=1)
    assert run(m.read_file("eng_x", UTIL)).version == 1
    assert storm(b, "read", UTIL, agent="eng_z").returncode == 0
    holder = helpers.hold(a, "remote", "remote-landing", seconds=300)
    try:
        px = start_write(a, "eng_x", UTIL, "queued\n", "--json")
        deadline = time.monotonic() + 120
        while git(a, "rev-list", "--count", f"{TRACKED}..{WS}").stdout.decode().strip() != "1":
            assert time.monotonic() < deadline and px.poll() is None, "the write never queued"
            time.sleep(0.02)
        px.kill()
        px.wait()
    finally:
        release(holder)
    queued = rev(a, WS)
    reader = Agent(m, "eng_y")
    assert run(reader.view(UTIL)) == ReadResponse("queued\n", 2)  # another's queued write, read
    assert rev(a, WS) == queued and rev(srv, WS) != queued  # still only queued
    code, rz = storm_json(b, "write", UTIL, input="Z\n", agent="eng_z")
    assert code == 0 and rz["accepted"], rz.get("rejection")
    # the clone's next write pushes the queue: the server drops the queued write (clone b
    # wrote the file first) and a's ref goes back onto the server's head
    assert storm(a, "read", "README.md", agent="eng_q").returncode == 0
    code, rq = storm_json(a, "write", "README.md", input="# q\n", agent="eng_q")
    assert code == 0 and rq["accepted"], rq.get("rejection")
    assert rev(a, WS) == rev(srv, WS) and shared(a, UTIL) == "Z\n"
    assert git(a, "merge-base", "--is-ancestor", queued, WS, check=False).returncode != 0  # dropped

    async def go() -> None:
        now = await m.read_file("eng_w", UTIL)
        assert now.content == "Z\n" and now.version != 2, now
        late = await reader.str_replace(UTIL, "queued", "mine")
        assert not late.success and late.reason == "direct_conflict", late
        assert late.current_content == "Z\n"

    run(go())
    assert rev(a, WS) == rev(srv, WS) and shared(a, UTIL) == "Z\n"
    assert (a / UTIL).read_text() == "Z\n"
