"""The server's own ``git update-ref`` killed mid-commit (strace, at the rename of one
ref's lock, tests/support/server_faults.py): the push's answer is what the refs hold
(a write the workspace took is landed, whatever was killed), no lock it left blocks a
later write from any clone, and a lock a dead update left is reported by ``git storm
server-hook check`` and by ``doctor`` in a clone of a server on this machine."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import server_faults
from helpers import git, make_repo, read_as, rev, show, storm
from servers import bare, ordered_site

WS = "refs/storm/workspace"
NOTES = "refs/notes/storm/agents/"

pytestmark = pytest.mark.skipif(not server_faults.available(), reason="needs strace")


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """(server that orders writes over file://, clone a, clone b, the environment of a
    push whose server-side update can be killed)."""
    srv, a, b = ordered_site(tmp_path)
    for c in (a, b):
        git(c, "config", "storm.remoteRetrySeconds", "5")  # a wedged server fails a write in 5 s, not 120
    return srv, a, b, server_faults.exec_path(tmp_path)


def locks(srv: Path) -> list[str]:
    return sorted(str(p.relative_to(srv)) for p in srv.rglob("*.lock"))


def write(c: Path, agent: str, path: str, text: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    read_as(c, agent, path)
    r = storm(c, "write", path, "--json", input=text, agent=agent, env=env)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr})


@pytest.mark.parametrize("killed_at", [WS, NOTES + "al"])
def test_a_killed_update_is_answered_for_what_it_did_and_blocks_nothing(site, tmp_path: Path, killed_at: str) -> None:
    """Killed at the workspace's rename: nothing moved, and the hook's next transaction
    lands the write. Killed at the notes ref's (one rename later): the workspace moved,
    the write is live, and the writer is told it landed; the notes ref follows. Either
    way the locks it left are gone, and the next writes of every clone (and of the same
    agent) land at once."""
    srv, a, b, env = site
    server_faults.arm(tmp_path, srv, killed_at)
    code, res = write(a, "al", "README.md", "# al\n", env)
    assert server_faults.fired(tmp_path)
    assert code == 0 and res["accepted"], res
    head = rev(srv, WS)
    assert res["commit"] == head and show(srv, head, "README.md") == b"# al\n"
    assert rev(srv, NOTES + "al") == rev(a, NOTES + "al")  # the notes went with the write
    assert locks(srv) == []
    # a lock left behind would fail these after the 5 s retry budget
    assert write(b, "bob", "src/util.py", "x = 1\n")[0] == 0  # another clone
    assert write(a, "al", "src/api.py", "y = 2\n")[0] == 0  # the same agent (its notes ref)
    assert show(srv, WS, "src/util.py") == b"x = 1\n" and show(srv, WS, "src/api.py") == b"y = 2\n"
    assert storm(srv, "server-hook", "check", str(srv)).returncode == 0


def stale_lock(srv: Path, ref: str, age: float = 60) -> Path:
    """``ref``'s lock as an update killed on the server by hand leaves it, ``age`` s old."""
    lock = srv / (ref + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(rev(srv, "refs/storm/ordering") + "\n")  # some value no write of storm's holds
    os.utime(lock, (time.time() - age, time.time() - age))
    return lock


def test_a_lock_left_by_a_dead_update_is_reported_and_cleared(site) -> None:
    """A lock no live process holds: ``server-hook check`` exits 3 naming it, ``doctor``
    in a clone says so too; the next write clears it and lands, and ``check --fix``
    removes one that no push came by to clear."""
    srv, a, _b, _env = site
    lock = stale_lock(srv, WS)
    r = storm(srv, "server-hook", "check", str(srv))
    assert r.returncode == 3 and "refs/storm/workspace.lock" in r.stderr and "died" in r.stderr, r.stderr
    r = storm(a, "doctor", "--json")
    assert r.returncode != 0, r.stdout
    found = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "server_stale_ref_lock"]
    assert found and "refs/storm/workspace.lock" in found[0]["detail"], r.stdout
    code, res = write(a, "al", "README.md", "# al\n")
    assert code == 0 and res["accepted"], res
    assert not lock.exists() and storm(srv, "server-hook", "check", str(srv)).returncode == 0
    lock = stale_lock(srv, NOTES + "nobody")
    r = storm(srv, "server-hook", "check", "--fix", str(srv))
    assert r.returncode == 0 and "removed" in r.stdout and not lock.exists(), r.stdout + r.stderr
    assert storm(a, "doctor").returncode == 0


def test_a_fresh_lock_held_by_a_live_update_is_waited_for_and_named(site) -> None:
    """A lock kept as young as a live update's is not taken for a dead one's: the
    write is answered busy, and fails after its retry budget naming the lock."""
    srv, a, _b, _env = site
    lock = stale_lock(srv, WS, age=0)
    done = threading.Event()

    def keep_fresh() -> None:
        while not done.wait(0.3):
            os.utime(lock)

    t = threading.Thread(target=keep_fresh)
    t.start()
    try:
        code, res = write(a, "al", "README.md", "# al\n")
    finally:
        done.set()
        t.join()
        lock.unlink()
    assert code == 3, res
    assert "refs/storm/workspace.lock" in json.dumps(res) and "kept moving" not in json.dumps(res), res


def test_a_stale_lock_on_a_server_without_ordering_is_cleared_by_the_guard(tmp_path: Path) -> None:
    """Clones push to the workspace with a lease (``install --no-order``): git itself
    would refuse every push for a lock nobody holds; the guard removes a stale one
    before git locks the ref."""
    srv = bare(tmp_path / "proj.git")
    assert storm(srv, "server-hook", "install", "--no-order", str(srv)).returncode == 0
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", f"file://{srv}")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    git(a, "config", "storm.remoteRetrySeconds", "5")
    lock = srv / "refs" / "storm" / "workspace.lock"
    lock.write_text(rev(srv, "main") + "\n")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    code, res = write(a, "al", "README.md", "# al\n")
    assert code == 0 and res["accepted"], res
    assert not lock.exists() and show(srv, WS, "README.md") == b"# al\n"
