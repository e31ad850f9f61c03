"""The read-set journal (storm_git.core.readsets): reads are one append, folds reach git
notes, and a kill at any point loses no recorded read and admits no invalid write.

Windows are opened deterministically: a ``<ref>.lock`` file held on the shared ref
keeps a writer between its journal append and its CAS; a copy of the journal taken
before a fold and put back after it is exactly what a fold killed after its notes
commit leaves; a torn line is what a reader killed inside ``write()`` could leave.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from helpers import git, hold, journal, make_repo, release, rev, start_write, storm, storm_json
from storm_git import open_workspace
from storm_git.core import provenance, readsets, trailers
from storm_git.core.readsets import FOLD_BYTES


def test_a_read_is_one_append_and_status_folds_it(repo):
    ws = open_workspace(str(repo))
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    data = journal(repo, "e1").read_bytes()
    assert data.startswith(b"storm journal 1 base none\n") and data.count(b"\nr ") == 2
    assert ws.status().agents[0].reads == 2
    # folded: the journal restarts on the note it was folded into, nothing lost
    folded = journal(repo, "e1").read_bytes()
    assert folded.count(b"\n") == 1 and b"base none" not in folded
    assert sorted(open_workspace(str(repo)).read_set("e1")) == ["src/api.py", "src/util.py"]


def test_a_fresh_process_sees_the_journal(repo):
    assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
    # another process: the journal is the read set until folded
    r = storm(repo, "write", "src/api.py", input="x = 1\n", agent="e1")
    assert r.returncode == 0, r.stderr + r.stdout
    r = storm(repo, "write", "src/util.py", input="y = 1\n", agent="e1")
    assert r.returncode == 1 and "never read" in r.stdout


def test_a_torn_line_is_ignored_and_cut(repo):
    ws = open_workspace(str(repo))
    ws.read(["src/api.py"], agent="e1")
    with open(journal(repo, "e1"), "ab") as f:
        f.write(b"r 0123456789abcdef0123456789abcdef01234567 0123")  # a reader killed inside write()
    ws2 = open_workspace(str(repo))
    assert list(ws2.read_set("e1")) == ["src/api.py"]
    ws2.read(["src/util.py"], agent="e1")
    data = journal(repo, "e1").read_bytes()
    assert b"0123\n" not in data and data.endswith(b"src/util.py\n")
    assert sorted(open_workspace(str(repo)).read_set("e1")) == ["src/api.py", "src/util.py"]


def test_a_fold_killed_after_its_notes_commit_changes_nothing(repo):
    ws = open_workspace(str(repo))
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    assert ws.write("src/api.py", b"one\n", agent="e1").accepted
    before = ws.read_set("e1")
    left = journal(repo, "e1").read_bytes()
    assert readsets.fold(ws.store, "e1")
    journal(repo, "e1").write_bytes(left)  # what a kill before the journal restart leaves
    ws2 = open_workspace(str(repo))
    assert ws2.read_set("e1") == before
    # the left journal no longer matches the note: ignored, then restarted by the next fold
    assert not readsets.fold(ws2.store, "e1")
    assert journal(repo, "e1").read_bytes().count(b"\n") == 1
    assert ws2.write("src/api.py", b"two\n", agent="e1").accepted


def test_forget_then_a_replayed_journal_cannot_resurrect_paths(repo):
    ws = open_workspace(str(repo))
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    ws.status()
    ws.read(["README.md"], agent="e1")
    left = journal(repo, "e1").read_bytes()
    assert ws.forget(["README.md"], agent="e1") == ["README.md"]
    journal(repo, "e1").write_bytes(left)  # forget killed after its notes commit
    assert sorted(open_workspace(str(repo)).read_set("e1")) == ["src/api.py", "src/util.py"]


def test_a_writer_killed_between_its_journal_and_its_cas(repo):
    """The write's entries are journaled before the CAS: killed there, nothing is
    published, the agent's own view errs on the side of a rejection."""
    open_workspace(str(repo))
    head = rev(repo, "refs/storm/workspace")
    assert storm(repo, "read", "src/api.py", "src/util.py", agent="e1").returncode == 0
    lock = repo / ".git/refs/storm/workspace.lock"
    lock.write_text("held by a test\n")  # libgit2's CAS waits on it
    p = start_write(repo, "e1", "src/api.py", "lost = 1\n")
    deadline = time.monotonic() + 30
    while journal(repo, "e1").read_bytes().count(b"\n") < 4:  # header, 2 reads, the write's entry
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() else "no append"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    lock.unlink()
    assert rev(repo, "refs/storm/workspace") == head  # nothing published
    # the next commands work; the read set still holds util.py as read
    code, st = storm_json(repo, "status")
    assert code == 0 and {a["agent"]: a["reads"] for a in st["agents"]} == {"e1": 2}
    assert storm_json(repo, "doctor")[0] == 0
    # e1's view of api.py names the version it was about to write: its next write is
    # refused with the diff (never accepted over something it did not see), then works
    r = storm(repo, "write", "src/api.py", input="kept = 1\n", agent="e1")
    assert r.returncode == 1 and "direct_conflict" in r.stdout
    r = storm(repo, "write", "src/api.py", input="kept = 1\n", agent="e1")
    assert r.returncode == 0, r.stdout
    assert git(repo, "show", "refs/storm/workspace:src/api.py").stdout == b"kept = 1\n"
    assert git(repo, "fsck", "--no-dangling", check=False).returncode == 0


def test_a_corrupt_journal_is_named_found_and_reset(repo):
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
    assert storm(repo, "read", "README.md", agent="e2").returncode == 0
    with open(journal(repo, "e1"), "ab") as f:
        f.write(b"garbage line\n")
    r = storm(repo, "write", "README.md", input="x\n", agent="e1")
    assert r.returncode == 3 and "read set of e1 is unreadable" in r.stderr and "forget" in r.stderr
    assert storm(repo, "write", "README.md", input="y\n", agent="e2").returncode == 0  # others unaffected
    code, rep = storm_json(repo, "doctor")
    assert code == 3 and [f["what"] for f in rep["findings"] if f["kind"] == "corrupt_read_set"] == ["e1"]
    assert storm_json(repo, "doctor", "--fix")[0] == 0
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
    assert storm(repo, "write", "README.md", input="z\n", agent="e1").returncode == 0


def test_a_write_folds_a_long_journal(repo):
    ws = open_workspace(str(repo))
    paths = [f"gen/f{i:04d}.py" for i in range(600)]
    ws.read(paths, agent="e1")  # absent paths: ~60 bytes a line
    assert journal(repo, "e1").stat().st_size >= FOLD_BYTES
    assert not git(repo, "rev-parse", "-q", "--verify", "refs/notes/storm/agents/e1", check=False).stdout
    res = ws.write("gen/f0000.py", b"x\n", agent="e1")
    assert res.accepted
    assert journal(repo, "e1").read_bytes().count(b"\n") == 1  # folded by the write
    assert len(open_workspace(str(repo)).read_set("e1")) == 600
    header, entries = provenance.load(ws.store, "e1", res.commit)
    assert header["validated-at"] == rev(repo, "refs/storm/workspace^") and len(entries) == 600


def test_provenance_of_deps_and_after_a_concurrent_fold(repo):
    ws = open_workspace(str(repo))
    ws.read(["src/api.py", "src/util.py", "README.md"], agent="e1")
    res = ws.write("src/api.py", b"d\n", agent="e1", deps=["src/util.py"])
    ws.status()
    header, entries = provenance.load(ws.store, "e1", res.commit)
    assert header["scope"] == "deps" and sorted(e.path for e in entries) == ["src/api.py", "src/util.py"]
    # another process of the same agent folds between this write's load of its read set
    # and its commit: the commit names the read set it loaded, which the fold kept
    ws.read(["src/client.py"], agent="e1")
    view = readsets.load_view(ws.store, "e1")
    assert view.counted == 1 and "src/client.py" in view.entries
    same_agent = open_workspace(str(repo))  # its own Store: another process's view
    same_agent.read(["docs/new.md"], agent="e1")
    assert readsets.fold(same_agent.store, "e1")
    head = ws.head()
    prov = trailers.Provenance(str(head), "all", view.base, view.counted)
    commit = ws.store.make_commit(ws.store.commit(head).tree_id, [head], "e1",
                                  trailers.format_message("by hand", "e1", "write", ["x"], prov))
    readsets.record_write(ws.store, "e1", [])
    header, entries = provenance.load(open_workspace(str(repo)).store, "e1", str(commit))
    assert header["read-set"] == view.base != readsets.load_view(ws.store, "e1").base
    assert {e.path: e.blob for e in entries} == {p: e.blob for p, e in view.entries.items()}
    assert "docs/new.md" not in {e.path for e in entries}


def test_status_does_not_wait_for_an_agent_holding_its_lock(repo):
    """An agent stopped while holding its read-set lock (Ctrl-Z, SIGSTOP) must not hang
    everyone's status: the fold skips it and its read set is shown unlocked."""

    assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
    assert storm(repo, "read", "README.md", agent="e2").returncode == 0
    holder = hold(repo, "agent-e1", seconds=60)
    try:
        code, st = storm_json(repo, "status", timeout=20)
        assert code == 0 and {a["agent"]: a["reads"] for a in st["agents"]} == {"e1": 1, "e2": 1}
        assert journal(repo, "e1").read_bytes().count(b"\n") == 2  # e1's journal left for later
        assert journal(repo, "e2").read_bytes().count(b"\n") == 1  # e2's folded
    finally:
        release(holder)
    assert storm(repo, "status").returncode == 0
    assert journal(repo, "e1").read_bytes().count(b"\n") == 1


def _foreign_commit(repo: Path, path: str, content: bytes) -> None:
    """Move the shared ref by one commit changing ``path``, the way another writer's
    accepted write would, without storm's lock (git's own ref lock and CAS)."""
    import pygit2

    r = pygit2.Repository(str(repo))
    head = r.lookup_reference("refs/storm/workspace").target
    parts = path.split("/")
    trees = [r[head].tree]
    for part in parts[:-1]:
        trees.append(r[trees[-1][part].id])
    oid, mode = r.create_blob(content), pygit2.GIT_FILEMODE_BLOB
    for i in range(len(parts) - 1, -1, -1):
        tb = r.TreeBuilder(trees[i])
        tb.insert(parts[i], oid, mode)
        oid, mode = tb.write(), pygit2.GIT_FILEMODE_TREE
    sig = pygit2.Signature("other", "other@example.invalid")
    new = r.create_commit(None, sig, sig, f"other writes {path}\n", oid, [head])
    git(repo, "update-ref", "refs/storm/workspace", str(new), str(head))


@pytest.mark.parametrize("moved, accepted", [("deps/d050.txt", False), ("elsewhere.txt", True)])
def test_a_large_read_set_found_valid_before_is_still_checked_for_what_moved(tmp_path, moved, accepted):
    """An agent whose whole read set (over 64 paths) was valid at its last write is
    re-checked only where the head moved since: before the lock up to the head it
    sees then, and under the lock for what moved while it waited. A dependency that
    moved while the writer waited for the lock (held here by flock) is still a
    stale_dependency; a file outside the read set moving is not."""
    import threading


    files = {f"deps/d{i:03d}.txt": f"{i}\n" for i in range(100)}
    files.update({"target.txt": "t\n", "elsewhere.txt": "e\n"})
    repo = make_repo(tmp_path / "repo", files)
    ws = open_workspace(str(repo))
    ws.read([*sorted(p for p in files if p.startswith("deps/")), "target.txt"], agent="big")
    assert ws.write("target.txt", b"t1\n", agent="big").accepted  # now known valid at this head
    holder = hold(repo, "workspace", seconds=60)
    out: dict = {}
    try:
        th = threading.Thread(target=lambda: out.update(res=ws.write("target.txt", b"t2\n", agent="big")))
        th.start()
        time.sleep(0.3)  # the writer is past its pre-lock check and waits for the lock (either order is checked)
        _foreign_commit(repo, moved, b"changed\n")
    finally:
        release(holder)
    th.join(30)
    res = out["res"]
    assert res.accepted is accepted
    if not accepted:
        assert res.rejection.reason == "stale_dependency"
        assert [s.path for s in res.rejection.stale] == [moved]
