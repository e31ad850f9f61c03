"""Storm mode through the library: reads, validated writes, rejections, reservations."""
from __future__ import annotations

import time

import pytest
from unidiff import PatchSet

from helpers import git, rev, show
from storm_git.core import provenance
from storm_git.core.errors import NotFound, UsageError


def test_read_returns_blob_oid_and_records_read_set(repo, ws):
    [r] = ws.read(["src/api.py"], agent="e1")
    assert r.version == git(repo, "rev-parse", "HEAD:src/api.py").stdout.decode().strip()
    assert r.head == rev(repo, "refs/storm/workspace")
    entry = ws.read_set("e1")["src/api.py"]
    assert (entry.blob, entry.head) == (r.version, r.head)
    # recorded at once in the agent's journal (one append), not yet in git
    assert (repo / ".git/storm/journal/e1").read_bytes().count(b"src/api.py") == 1
    assert git(repo, "rev-parse", "-q", "--verify", "refs/notes/storm/agents/e1", check=False).returncode != 0
    # a re-read at an unchanged head records nothing new
    ws.read(["src/api.py"], agent="e1")
    assert (repo / ".git/storm/journal/e1").read_bytes().count(b"src/api.py") == 1
    # status folds it into the agent's own notes ref: an ordinary git note
    ws.status()
    key = git(repo, "hash-object", "--stdin", input=b"storm read set: e1\n").stdout.decode().strip()
    note = git(repo, "notes", "--ref=storm/agents/e1", "show", key).stdout.decode()
    assert f"{r.version} {r.head} src/api.py" in note
    assert ws.read_set("e1")["src/api.py"] == entry


def test_missing_path_is_recorded_as_absent(ws):
    [r] = ws.read(["nope.py"], agent="e1")
    assert r.version is None and r.content is None
    assert ws.read_set("e1")["nope.py"].blob is None


def test_write_commits_on_shared_ref_with_trailers_and_disk(repo, ws):
    ws.read(["src/api.py"], agent="e1")
    res = ws.write("src/api.py", b"def fetch(url, t):\n    pass\n", agent="e1", intent="e1: add t")
    assert res.accepted and res.commit == rev(repo, "refs/storm/workspace")
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert msg.startswith("e1: add t\n") and "Storm-Agent: e1" in msg and "Storm-Path: src/api.py" in msg
    assert git(repo, "log", "-1", "--format=%an", "refs/storm/workspace").stdout.decode().strip() == "e1"
    assert (repo / "src/api.py").read_bytes() == b"def fetch(url, t):\n    pass\n"
    assert ws.read_set("e1")["src/api.py"].blob == res.versions["src/api.py"]
    assert rev(repo, "HEAD") != res.commit  # the branch is the manager's business


def test_direct_conflict_payload_and_reservation(repo, ws):
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/api.py"], agent="e2")
    assert ws.write("src/api.py", b"def fetch(url, timeout):\n    pass\n", agent="e1").accepted
    before = rev(repo, "refs/storm/workspace")
    res = ws.write("src/api.py", b"def fetch(url, retries):\n    pass\n", agent="e2", wait=False)
    assert not res.accepted
    r = res.rejection
    assert r.reason == "direct_conflict" and r.target.changed_by == ["e1"] and r.target.versions_behind == 1
    assert r.current_content == b"def fetch(url, timeout):\n    pass\n"
    patch = PatchSet(r.target.diff)
    assert patch[0].added == 2 and patch[0].removed == 2
    assert rev(repo, "refs/storm/workspace") == before  # nothing changed
    assert r.reservation.holder == "e2"
    # e1 is now held off the file; e2's retry (its view was refreshed) succeeds
    blocked = ws.write("src/api.py", b"x\n", agent="e1", wait=False)
    assert blocked.rejection.reason == "reserved" and blocked.rejection.reservation.holder == "e2"
    assert ws.write("src/api.py", b"def fetch(url, timeout, retries):\n    pass\n", agent="e2").accepted
    assert ws.status().reservations == []


def test_stale_dependency_lists_every_changed_read(repo, ws):
    ws.read(["src/api.py", "src/util.py", "src/client.py"], agent="e3")
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/util.py"], agent="e2")
    assert ws.write("src/api.py", b"def fetch_url(url):\n    pass\n", agent="e1").accepted
    assert ws.write("src/util.py", b"# gone\n", agent="e2").accepted
    res = ws.write("src/client.py", b"from api import fetch\n", agent="e3", wait=False)
    assert res.rejection.reason == "stale_dependency"
    assert sorted(s.path for s in res.rejection.stale) == ["src/api.py", "src/util.py"]
    api = next(s for s in res.rejection.stale if s.path == "src/api.py")
    assert api.changed_by == ["e1"] and "+def fetch_url(url):" in api.diff
    # the stale files were shown as diffs only: they stay stale until e3 reads them again
    again = ws.write("src/client.py", b"from api import fetch_url\n", agent="e3", wait=False)
    assert again.rejection.reason == "stale_dependency"
    ws.read(["src/api.py", "src/util.py"], agent="e3")
    assert ws.write("src/client.py", b"from api import fetch_url\n", agent="e3").accepted


def test_unrelated_concurrent_write_does_not_reject(ws):
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/util.py"], agent="e2")
    assert ws.write("src/util.py", b"u\n", agent="e2").accepted
    assert ws.write("src/api.py", b"a\n", agent="e1").accepted


def test_deps_limits_validation_scope(ws):
    ws.read(["src/api.py", "src/util.py", "src/client.py"], agent="e3")
    ws.read(["src/util.py"], agent="e2")
    assert ws.write("src/util.py", b"changed\n", agent="e2").accepted
    # util.py is stale but the write only depends on api.py
    res = ws.write("src/client.py", b"c\n", agent="e3", deps=["src/api.py"])
    assert res.accepted
    with pytest.raises(UsageError):
        ws.write("src/client.py", b"d\n", agent="e3", deps=["README.md"])


def test_unread_target_rejection_counts_as_read(ws):
    res = ws.write("src/util.py", b"blind\n", agent="e4", wait=False)
    assert res.rejection.reason == "unread_target"
    assert res.rejection.current_content.startswith(b"def clamp")
    assert ws.write("src/util.py", b"informed\n", agent="e4").accepted


def test_unread_target_with_stale_dependencies_reserves(ws):
    """A blind write that also built on stale reads must be re-planned: it reserves
    its target, as a stale dependency alone does; a plain unread target does not."""
    ws.read(["src/api.py"], agent="e3")
    ws.read(["src/api.py"], agent="e1")
    assert ws.write("src/api.py", b"def fetch_url(url):\n    pass\n", agent="e1").accepted
    res = ws.write("src/util.py", b"blind\n", agent="e3", wait=False)
    assert res.rejection.reason == "unread_target"
    assert [s.path for s in res.rejection.stale] == ["src/api.py"]
    assert res.rejection.reservation is not None and res.rejection.reservation.holder == "e3"
    assert [(r.path, r.holder) for r in ws.status().reservations] == [("src/util.py", "e3")]
    held = ws.write("src/util.py", b"x\n", agent="e1", wait=False)
    assert held.rejection.reason == "reserved"
    plain = ws.write("src/client.py", b"blind\n", agent="e2", wait=False)
    assert plain.rejection.reason == "unread_target" and plain.rejection.reservation is None


def test_new_file_needs_no_read_but_second_creator_is_rejected(ws):
    assert ws.write("new.py", b"one\n", agent="e1").accepted
    res = ws.write("new.py", b"two\n", agent="e2", wait=False)
    assert res.rejection.reason == "unread_target"


def test_aba_content_is_still_consistent(ws):
    [orig] = ws.read(["src/util.py"], agent="e1")
    ws.read(["src/util.py"], agent="e2")
    assert ws.write("src/util.py", b"B\n", agent="e2").accepted
    assert ws.write("src/util.py", orig.content, agent="e2").accepted
    # e1 read A; it is A again: no false conflict with content-addressed versions
    assert ws.write("src/util.py", b"C\n", agent="e1").accepted


def test_edit_applies_to_read_version_and_conflicts_surface_as_rejection(ws):
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/api.py"], agent="e2")
    assert ws.edit("src/api.py", "def fetch(url):", "def fetch(url, timeout=1):", agent="e1").accepted
    res = ws.edit("src/api.py", "def fetch(url):", "def fetch(url, retries=2):", agent="e2", wait=False)
    assert not res.accepted and res.rejection.reason == "direct_conflict"
    # now the old text really is gone from the version e2 has seen
    with pytest.raises(UsageError, match="not found"):
        ws.edit("src/api.py", "def fetch(url):", "x", agent="e2")
    res = ws.edit("src/api.py", "timeout=1)", "timeout=1, retries=2)", agent="e2")
    assert res.accepted


def test_edit_ambiguous_and_unread(ws):
    ws.write("dup.txt", b"a a\n", agent="e1")
    with pytest.raises(UsageError, match="2 times"):
        ws.edit("dup.txt", "a", "b", agent="e1")
    res = ws.edit("src/util.py", "lo", "low", agent="e9", wait=False)
    assert res.rejection.reason == "unread_target"
    with pytest.raises(NotFound):
        ws.edit("missing.txt", "a", "b", agent="e1")


def test_rm_is_validated(repo, ws):
    ws.read(["src/util.py"], agent="e1")
    ws.read(["src/util.py"], agent="e2")
    assert ws.rm("src/util.py", agent="e1").accepted
    assert not (repo / "src/util.py").exists()
    assert git(repo, "cat-file", "-e", "refs/storm/workspace:src/util.py", check=False).returncode != 0
    with pytest.raises(NotFound):
        ws.rm("src/util.py", agent="e2")


def test_release_only_by_holder_and_expiry(repo, ws):
    git(repo, "config", "storm.reservationSeconds", "1")
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/api.py"], agent="e2")
    ws.write("src/api.py", b"1\n", agent="e1")
    assert not ws.write("src/api.py", b"2\n", agent="e2").accepted
    with pytest.raises(UsageError, match="reserved by e2"):
        ws.release("src/api.py", agent="e1")
    assert ws.release("src/api.py", agent="e2").holder == "e2"
    assert ws.release("src/api.py", agent="e2") is None
    # a reservation that expires lets a waiting writer through
    assert ws.write("src/api.py", b"2\n", agent="e2").accepted
    ws.read(["src/api.py"], agent="e3")
    assert not ws.write("src/api.py", b"3\n", agent="e1").accepted  # e1's view is stale -> e1 holds it
    t0 = time.monotonic()
    res = ws.write("src/api.py", b"4\n", agent="e3")  # waits for e1's 1 s reservation
    assert res.accepted and 0.5 < time.monotonic() - t0 < 5 and res.waited > 0.5


def test_forget_resets_read_set(ws):
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    assert ws.forget(["src/api.py"], agent="e1") == ["src/api.py"]
    assert list(ws.read_set("e1")) == ["src/util.py"]
    ws.forget(None, agent="e1")
    assert ws.read_set("e1") == {}


def test_provenance_trailers_name_validated_read_set(repo, ws):
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    res = ws.write("src/api.py", b"p\n", agent="e1")
    ws.status()  # folds the journal the provenance points into
    message = git(repo, "log", "-1", "--format=%B", res.commit).stdout.decode()
    assert f"\nStorm-Validated-At: {rev(repo, 'refs/storm/workspace^')}\n" in message
    assert "\nStorm-Scope: all\nStorm-Read-Set: none 2\n" in message
    header, entries = provenance.load(ws.store, "e1", res.commit)
    assert header["scope"] == "all"
    assert sorted(e.path for e in entries) == ["src/api.py", "src/util.py"]
    assert all(e.blob == git(repo, "rev-parse", f"HEAD:{e.path}").stdout.decode().strip() for e in entries)


def test_binary_content_and_diff(ws):
    ws.write("bin.dat", b"\x00\x01\x02", agent="e1")
    ws.read(["bin.dat"], agent="e2")
    ws.write("bin.dat", b"\x00\x09", agent="e1")
    res = ws.write("bin.dat", b"\x00\x03", agent="e2", wait=False)
    assert res.rejection.target.binary and res.rejection.target.diff.startswith("Binary files")
    assert "current_content_base64" in res.rejection.to_dict()


def test_status_and_log(repo, ws):
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/api.py"], agent="e2")
    ws.write("src/api.py", b"1\n", agent="e1", intent="why one")
    ws.write("src/api.py", b"2\n", agent="e2", wait=False)
    st = ws.status()
    assert st.mode == "storm" and st.head == rev(repo, "refs/storm/workspace")
    agents = {a.agent: a for a in st.agents}
    assert agents["e2"].stale == [] and agents["e1"].reads == 1
    assert [r.holder for r in st.reservations] == ["e2"]
    log = ws.log()
    kinds = [(e["type"], e["agent"]) for e in log]
    assert ("write", "e1") in kinds and ("rejection", "e2") in kinds
    assert next(e for e in log if e["type"] == "write")["intent"] == "why one"


def test_exec_bit_is_kept(repo, ws):
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    git(repo, "add", "run.sh")
    git(repo, "commit", "-qm", "script", "--no-verify")  # content not in the shared workspace: the guard would refuse
    git(repo, "update-ref", "refs/storm/workspace", "HEAD")
    ws.read(["run.sh"], agent="e1")
    ws.write("run.sh", b"#!/bin/sh\necho hi\n", agent="e1")
    assert git(repo, "ls-tree", "refs/storm/workspace", "run.sh").stdout.decode().startswith("100755")
    assert show(repo, "refs/storm/workspace", "run.sh") == b"#!/bin/sh\necho hi\n"
