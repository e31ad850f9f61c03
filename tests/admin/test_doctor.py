"""``git storm doctor``: reports and repairs what crashes leave, changes nothing when all is well."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import git, make_repo, rev, snapshot_refs, storm, storm_json
from storm_git.core import provenance
from storm_git.core.readsets import agent_ref as reads_ref


def _files(repo) -> list[str]:
    """Every file under the repository (including .git), to prove doctor wrote nothing."""
    out = []
    for d, _dirs, files in os.walk(repo):
        for f in files:
            full = os.path.join(d, f)
            out.append(f"{full} {os.lstat(full).st_size} {os.lstat(full).st_mtime_ns}")
    return sorted(out)


def _age(path, seconds: float = 60) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_healthy_repository_is_left_untouched(repo):
    ws_writes = [("e1", "src/api.py"), ("e2", "src/util.py")]
    for agent, path in ws_writes:
        storm(repo, "read", path, agent=agent)
        assert storm(repo, "write", path, agent=agent, input=b"w\n").returncode == 0
    before_refs, before_files = snapshot_refs(repo), _files(repo)
    for args in (["doctor"], ["doctor", "--fix"], ["doctor", "--json"], ["doctor", "--fix", "--json"]):
        r = storm(repo, *args)
        assert r.returncode == 0, r.stderr
        if "--json" in args:
            rep = json.loads(r.stdout)
            assert rep["ok"] and rep["findings"] == []
        else:
            assert "all is well" in r.stdout
    assert snapshot_refs(repo) == before_refs
    assert _files(repo) == before_files


def test_stale_ref_locks_reported_then_cleared_and_writers_recover(repo):
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    ws.read(["src/api.py"], agent="e1")
    ws.status()  # the read set reaches e1's notes ref
    # what a writer killed between lock and rename leaves behind
    locks = [repo / ".git/refs/storm/workspace.lock", repo / ".git" / (reads_ref("e1") + ".lock")]
    for lk in locks:
        lk.write_text("0" * 40 + "\n")
        _age(lk)
    before = snapshot_refs(repo)
    code, rep = storm_json(repo, "doctor")
    assert code == 3 and not rep["ok"]
    assert sorted(f["what"] for f in rep["findings"] if f["kind"] == "stale_ref_lock") == [
        reads_ref("e1"), "refs/storm/workspace"]
    assert all(lk.exists() for lk in locks) and snapshot_refs(repo) == before  # report only
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["ok"] and rep["fixed"] == 2
    assert not any(lk.exists() for lk in locks)
    assert ws.write("src/api.py", b"after\n", agent="e1").accepted


def test_writer_clears_a_dead_writers_lock_itself(repo):
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    ws.read(["src/api.py"], agent="e1")
    lk = repo / ".git/refs/storm/workspace.lock"
    lk.write_text("0" * 40 + "\n")
    _age(lk)
    assert ws.write("src/api.py", b"x\n", agent="e1").accepted
    assert not lk.exists()


def test_lock_in_use_or_young_is_left_alone(repo):
    lk = repo / ".git/refs/storm/workspace.lock"
    lk.write_text("0" * 40 + "\n")
    # young: may be git's own pack-refs at work
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["findings"] == [] and lk.exists()
    _age(lk)
    # old, but a live storm process holds the workspace flock: its lock, in use
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from storm_git.core.locks import flocked\n"
        f"with flocked({str(repo / '.git')!r}, 'workspace'):\n"
        "    print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        code, rep = storm_json(repo, "doctor", "--fix")
        assert code == 0 and rep["findings"] == [] and lk.exists()
    finally:
        holder.kill()
        holder.wait()
    code, rep = storm_json(repo, "doctor", "--fix")
    assert rep["fixed"] == 1 and not lk.exists()


def test_read_sets_of_gone_agents(repo):
    for a in ("e1", "e2", "e3"):
        storm(repo, "read", "src/api.py", agent=a)
    storm(repo, "forget", "--all", agent="e3")
    storm(repo, "read", "src/api.py", agent="e1")
    assert storm(repo, "write", "src/api.py", agent="e1", input=b"z\n").returncode == 0
    before = snapshot_refs(repo)
    code, rep = storm_json(repo, "doctor")
    # storm mode has no registry of agents: nobody is judged gone unless named
    assert code == 0 and rep["findings"] == [] and snapshot_refs(repo) == before
    code, rep = storm_json(repo, "doctor", "--forget-agent", "e1", "--forget-agent", "e3")
    assert code == 3 and [f["what"] for f in rep["findings"]] == ["e1"]  # e3's read set is already empty
    assert snapshot_refs(repo) == before
    code, rep = storm_json(repo, "doctor", "--fix", "--forget-agent", "e1")
    assert code == 0 and [f["what"] for f in rep["findings"] if f["fixed"]] == ["e1"]
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    assert ws.read_set("e1") == {} and list(ws.read_set("e2")) == ["src/api.py"]
    head = rev(repo, "refs/storm/workspace")
    # history kept: e1's write's provenance still resolves (its journal stays in the notes)
    header, entries = provenance.load(ws.store, "e1", head)
    assert header["validated-at"] == rev(repo, "refs/storm/workspace^") and [e.path for e in entries] == ["src/api.py"]
    code, rep = storm_json(repo, "doctor", "--forget-agent", "no..pe")
    assert code == 2 and rep["error"]["kind"] == "bad_agent"


def test_expired_reservations_and_temp_files(repo):
    git(repo, "config", "storm.reservationSeconds", "0.2")
    storm(repo, "read", "src/api.py", agent="e1")
    storm(repo, "read", "src/api.py", agent="e2")
    storm(repo, "write", "src/api.py", agent="e1", input=b"1\n")
    assert storm(repo, "write", "src/api.py", "--no-wait", agent="e2", input=b"2\n").returncode == 1
    time.sleep(0.3)
    dead = subprocess.Popen(["true"])
    dead.wait()
    tmp = repo / "src" / f".storm-tmp-{dead.pid}"
    tmp.write_text("half")
    code, rep = storm_json(repo, "doctor")
    kinds = {f["kind"]: f for f in rep["findings"]}
    assert kinds["expired_reservations"]["harmless"] and not kinds["stale_temp_file"]["harmless"]
    assert code == 3 and tmp.exists()
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and not tmp.exists()
    assert git(repo, "ls-tree", "refs/storm/reservations").stdout == b""
    before = snapshot_refs(repo)
    code, rep = storm_json(repo, "doctor", "--fix")
    assert rep["findings"] == [] and snapshot_refs(repo) == before


def test_unreadable_reservation_is_refused_then_fixed(repo):
    """A reservations entry that is not storm's JSON was an internal error in status
    (a UnicodeDecodeError); now every command that meets it refuses with one line
    and exit 3, changing nothing, and doctor --fix removes it."""
    from storm_git.core.readsets import path_key

    bad = git(repo, "hash-object", "-w", "--stdin", input=b"\x91not json\xff").stdout.decode().strip()
    tree = git(repo, "mktree", input=f"100644 blob {bad}\t{path_key('src/api.py')}\n".encode()).stdout.decode().strip()
    commit = git(repo, "commit-tree", tree, "-m", "hand-made").stdout.decode().strip()
    git(repo, "update-ref", "refs/storm/reservations", commit)
    before = snapshot_refs(repo)
    for argv, kw in ((("status",), {}), (("write", "src/api.py"), {"agent": "e1", "input": b"x\n"})):
        r = storm(repo, *argv, **kw)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
        assert "unreadable entry" in lines[0] and "doctor --fix" in r.stderr
        assert snapshot_refs(repo) == before
    code, rep = storm_json(repo, "doctor")
    assert code == 3 and [f["kind"] for f in rep["findings"]] == ["unreadable_reservation"]
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and git(repo, "ls-tree", "refs/storm/reservations").stdout == b""
    assert storm(repo, "status").returncode == 0
    storm(repo, "read", "src/api.py", agent="e1")
    assert storm(repo, "write", "src/api.py", agent="e1", input=b"x\n").returncode == 0


def test_broken_ref_is_reported_not_guessed(repo):
    (repo / ".git/refs/storm/log").parent.mkdir(parents=True, exist_ok=True)
    (repo / ".git/refs/storm/log").write_text("1" * 40 + "\n")  # a missing object
    before = snapshot_refs(repo)
    r = storm(repo, "doctor", "--fix")
    assert r.returncode == 3 and "broken_ref: refs/storm/log" in r.stdout and "needs you" in r.stdout
    assert snapshot_refs(repo) == before


def test_orphaned_worktree_records_are_pruned(repo, tmp_path):
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "--detach", str(wt))
    keep = tmp_path / "wt-alive"
    git(repo, "worktree", "add", "-q", "--detach", str(keep))
    shutil.rmtree(wt)
    code, rep = storm_json(repo, "doctor")
    assert code == 3 and [f["kind"] for f in rep["findings"]] == ["orphaned_worktree"]
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["fixed"] == 1
    listed = git(repo, "worktree", "list", "--porcelain").stdout.decode()
    assert f"worktree {wt}\n" not in listed and f"worktree {keep}\n" in listed and keep.is_dir()


def test_worktree_mode_agent_whose_worktree_and_branch_are_gone(tmp_path):
    repo = make_repo(tmp_path / "repo")
    r = storm(repo, "mode", "worktree")
    assert r.returncode == 0, r.stderr
    for a in ("e1", "e2"):
        assert storm(repo, "spawn", a).returncode == 0
        assert storm(repo, "read", "README.md", agent=a).returncode == 0
    assert storm_json(repo, "doctor")[1]["findings"] == []
    path = git(repo, "worktree", "list", "--porcelain").stdout.decode()
    wt = [ln.split(" ", 1)[1] for ln in path.splitlines() if ln.startswith("worktree ") and ln.endswith("/e2")][0]
    git(repo, "worktree", "remove", "--force", wt)
    git(repo, "branch", "-D", "storm/e2")
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and [(f["kind"], f["what"], f["fixed"]) for f in rep["findings"]] == [
        ("orphan_read_set", "e2", True)]
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    assert list(ws.read_set("e1")) == ["README.md"] and ws.read_set("e2") == {}


def _corrupt_index(how: str, good: bytes) -> bytes:
    return {"truncated": good[:10], "garbage": b"garbage\n", "empty": b"",
            "signature": b"XIRC" + good[4:]}[how]


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "signature"])
def test_a_corrupt_private_index_is_named_found_and_rebuilt(repo, how):
    """Once: status exit 3 ("index file smaller than expected (run git storm doctor…)")
    while doctor and doctor --fix both said all is well."""
    storm(repo, "read", "src/api.py", agent="e1")
    assert storm(repo, "write", "src/api.py", agent="e1", input=b"w\n").returncode == 0
    (repo / "src/util.py").write_text("a person's edit\n")  # unmediated: the index must still find it
    healthy = storm_json(repo, "status")
    index = repo / ".git/storm/exec-index"
    index.write_bytes(_corrupt_index(how, index.read_bytes()))
    before = snapshot_refs(repo)
    for argv in (["status"], ["exec", "--agent", "e1", "--", "true"]):
        r = storm(repo, *argv)
        assert r.returncode == 3, (argv, r.stdout, r.stderr)
        said = [ln for ln in r.stderr.strip().splitlines() if not ln.lstrip().startswith("hint")]
        assert len(said) == 1 and "storm's private index .git/storm/exec-index is corrupt" in said[0], r.stderr
        assert "git storm doctor --fix" in r.stderr, r.stderr
    d = storm(repo, "doctor", "--json")
    assert d.returncode == 3, d.stdout + d.stderr
    kinds = [f["kind"] for f in json.loads(d.stdout)["findings"]]
    assert kinds == ["corrupt_private_index"], d.stdout
    f = storm(repo, "doctor", "--fix")
    assert f.returncode == 0 and "corrupt_private_index" in f.stdout and "[fixed]" in f.stdout, f.stdout
    assert snapshot_refs(repo) == before
    assert storm_json(repo, "status") == healthy  # rebuilt: the person's edit still listed
    assert "all is well" in storm(repo, "doctor").stdout


def test_a_resident_process_without_its_watch_is_reported(repo):
    """The state a resident process left without a watch (what it writes when the
    user's inotify watches are all taken) is reported while that process runs,
    and never once it is gone."""
    from storm_git.storm import tree_watch

    common = str(repo / ".git")
    code, rep = storm_json(repo, "doctor")
    assert code == 0 and not [f for f in rep["findings"] if f["kind"] == "tree_watch_unavailable"]
    live = subprocess.Popen([sys.executable, "-c", "import sys; from storm_git.storm import tree_watch; "
                             "tree_watch.write_state(sys.argv[1], None, 'the inotify watch limit is reached'); "
                             "print('ok', flush=True); sys.stdin.read()", common],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert live.stdout is not None and live.stdout.readline() == b"ok\n"
        code, rep = storm_json(repo, "doctor")
        [f] = [f for f in rep["findings"] if f["kind"] == "tree_watch_unavailable"]
        assert f"pid {live.pid}" in f["detail"] and "watch limit" in f["detail"] and not f["fixable"]
        assert tree_watch.read_state(common) is not None
    finally:
        live.communicate(b"", timeout=30)
    code, rep = storm_json(repo, "doctor")
    assert not [f for f in rep["findings"] if f["kind"] == "tree_watch_unavailable"]  # its process is gone
