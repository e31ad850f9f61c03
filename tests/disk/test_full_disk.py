"""A disk that refuses more data, at every step of a write.

A full file system, a quota and a file size limit all make ``write()`` store
part of what it was given, or nothing. The tests use the one of the three an
unprivileged process can set deterministically: ``RLIMIT_FSIZE`` (``ulimit -f``)
on the ``git storm`` process, set just above the size of the one file the test
wants the disk to refuse to grow (EFBIG, as ENOSPC would), so the window is
opened exactly where each test says.

What must hold: an answer says what happened (a write that landed is accepted,
one that did not changed nothing), storm's append-only files hold whole entries
only, no temporary file stays behind, and once the disk takes data again the
next command brings everything into step — with no write of storm's mistaken
for an edit made outside it.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import git, make_repo, storm

FILES = {f"src/m{i:02d}.py": f"x = {i}\n" for i in range(30)} | {"a.txt": "one\n"}


def storm_limited(cwd: Path, limit: int, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """``git storm ARGS`` with files capped at ``limit`` bytes (writes past it fail: EFBIG)."""
    env = dict(os.environ)
    env.pop("STORM_AGENT", None)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, capture_output=True, env=env,
                       input=input.encode() if input is not None else None, preexec_fn=cap, timeout=120)
    r.stdout, r.stderr = r.stdout.decode(), r.stderr.decode()
    return r


def repo_at(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "r", FILES)
    git(repo, "config", "storm.autoMaintenance", "0")  # no background repack under the cap
    return repo


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "refs/storm/workspace").stdout.decode().strip()


def temp_files(repo: Path) -> list[str]:
    return [str(p.relative_to(repo)) for p in repo.rglob("*storm-tmp*")] + \
        [str(p.relative_to(repo)) for p in (repo / ".git" / "storm").rglob("*") if ".tmp" in p.name]


def record_entries(repo: Path) -> list[bytes]:
    data = (repo / ".git" / "storm" / "disk-record").read_bytes()
    body = data.split(b"\n", 2)[2]
    assert body == b"" or body.endswith(b"\0"), f"torn entry in the disk record: {body[-80:]!r}"
    return body.split(b"\0")[:-1]


def grow_disk_record(repo: Path) -> None:
    """Thirty files changed by one command: the disk record grows by an entry each
    (~60 bytes), well past any one agent's journal."""
    r = storm(repo, "exec", "--agent", "e0", "--", "sh", "-c", "for f in src/m*.py; do echo y >> $f; done")
    assert r.returncode == 0, r.stderr


def test_a_file_the_disk_refuses_leaves_no_temp_file_and_the_write_stands(tmp_path):
    repo = repo_at(tmp_path)
    assert storm(repo, "read", "a.txt", agent="e1").returncode == 0
    content = "a" * 200_000 + "\n"  # compresses to a small object: only the file on disk is refused
    r = storm_limited(repo, 64 * 1024, "write", "a.txt", "--agent", "e1", "--json", input=content)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["accepted"] and out["disk"] == {"a.txt": "failed"}
    assert "File too large" in out["disk_errors"]["a.txt"]
    assert temp_files(repo) == []  # the temporary file that took part of it is gone
    assert (repo / "a.txt").read_text() == "one\n"  # the old file, whole
    assert git(repo, "show", "refs/storm/workspace:a.txt").stdout.decode() == content  # the write landed
    # the plain answer says it landed and what brings the disk forward
    again = storm_limited(repo, 64 * 1024, "write", "a.txt", "--agent", "e1", input=content + "b\n")
    assert again.returncode == 0, again.stderr
    assert "[disk: failed (File too large)]" in again.stdout and "git storm status" in again.stdout
    doctor = storm(repo, "doctor")
    assert doctor.returncode == 3 and "disk_behind: a.txt" in doctor.stdout
    assert storm(repo, "status").returncode == 0  # no cap: the disk takes it now
    assert (repo / "a.txt").read_text() == content + "b\n"
    assert storm(repo, "doctor").returncode == 0


def test_a_journal_append_cut_short_is_rolled_back_and_the_write_refused(tmp_path):
    repo = repo_at(tmp_path)
    assert storm(repo, "read", *FILES, agent="e1").returncode == 0
    journal = repo / ".git" / "storm" / "journal" / "e1"
    before_journal, before_head = journal.read_bytes(), head(repo)
    # the write's journal line (~100 bytes) fits only in part: the append comes up short
    r = storm_limited(repo, len(before_journal) + 20, "write", "a.txt", "--agent", "e1", input="two\n")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "File too large" in r.stderr and "free space" in r.stderr
    assert journal.read_bytes() == before_journal  # whole lines only: cut back to where it was
    assert head(repo) == before_head  # nothing landed
    assert (repo / "a.txt").read_text() == "one\n"
    ok = storm(repo, "write", "a.txt", agent="e1", input="two\n")  # the journal still parses
    assert ok.returncode == 0, ok.stderr
    assert storm(repo, "status").returncode == 0


def test_a_disk_record_that_takes_the_pending_entry_but_not_the_final_one(tmp_path):
    """The file is written, its entry is refused: the pending entry written before the
    file keeps it storm's, so when the head moves on before any sync, the next write
    brings the file forward instead of keeping it as someone's edit (and a manager's
    commit --adopt would then have committed the old version over an accepted write)."""
    repo = repo_at(tmp_path)
    grow_disk_record(repo)
    assert storm(repo, "read", "a.txt", agent="e1").returncode == 0
    size = (repo / ".git" / "storm" / "disk-record").stat().st_size
    assert size > (repo / ".git" / "storm" / "journal" / "e1").stat().st_size + 300
    # room for the pending entry (56 bytes for a.txt), not for the final entry and synced head after it
    r = storm_limited(repo, size + 60, "write", "a.txt", "--agent", "e1", "--json", input="two\n")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["accepted"] and out["disk"] == {"a.txt": "written"}
    assert any("recording the disk write failed" in w for w in out["warnings"])
    assert (repo / "a.txt").read_text() == "two\n"
    kinds = [e.split(b" ", 1)[0] for e in record_entries(repo)]  # whole entries, the last one pending
    assert kinds[-1] == b"w"
    # the head moves on before any command looks at the disk
    assert storm(repo, "read", "a.txt", agent="e2").returncode == 0
    w = storm(repo, "write", "a.txt", agent="e2", input="three\n")
    assert w.returncode == 0 and "[disk" not in w.stdout, w.stdout + w.stderr
    assert (repo / "a.txt").read_text() == "three\n"  # brought forward, not kept as an edit
    st = storm(repo, "status")
    assert "unmediated edits: none" in st.stdout, st.stdout
    assert storm(repo, "doctor").returncode == 0
    assert temp_files(repo) == []


def test_a_pending_entry_the_disk_refuses_leaves_the_file_alone(tmp_path):
    """Not even the pending entry fits: the file is not touched (storm writes no file
    it could not record), the answer says so, and the record holds whole entries."""
    repo = repo_at(tmp_path)
    grow_disk_record(repo)
    assert storm(repo, "read", "a.txt", agent="e1").returncode == 0
    size = (repo / ".git" / "storm" / "disk-record").stat().st_size
    r = storm_limited(repo, size + 10, "write", "a.txt", "--agent", "e1", "--json", input="two\n")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["accepted"] and out["disk"] == {"a.txt": "failed"}
    assert (repo / "a.txt").read_text() == "one\n"
    assert (repo / ".git" / "storm" / "disk-record").stat().st_size == size
    record_entries(repo)
    assert storm(repo, "status").returncode == 0
    assert (repo / "a.txt").read_text() == "two\n"


def test_objects_the_disk_refuses_are_a_clear_refusal_that_changes_nothing(tmp_path):
    repo = repo_at(tmp_path)
    assert storm(repo, "read", "a.txt", agent="e1").returncode == 0
    before = head(repo)
    noise = os.urandom(150_000).hex()  # incompressible: its loose object is over the cap
    r = storm_limited(repo, 64 * 1024, "write", "a.txt", "--agent", "e1", "--json", input=noise)
    assert r.returncode == 3
    err = json.loads(r.stdout)["error"]
    assert err["kind"] == "no_space" and "object" in err["message"], err
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert head(repo) == before
    assert (repo / "a.txt").read_text() == "one\n"
    assert storm(repo, "doctor").returncode == 0


def test_a_fetch_this_disk_cannot_store_is_no_space_not_an_unreachable_server(tmp_path):
    server = tmp_path / "server.git"
    git(tmp_path, "init", "-q", "--bare", str(server))
    seed = make_repo(tmp_path / "seed", {"a.txt": "one\n"}, init_storm=False)
    git(seed, "remote", "add", "origin", str(server))
    git(seed, "push", "-q", "origin", "main")
    assert storm(seed, "init", "--remote", "origin").returncode == 0
    git(tmp_path, "clone", "-q", str(server), "c2")
    c2 = tmp_path / "c2"
    assert storm(c2, "join", "origin").returncode == 0
    git(c2, "config", "storm.autoMaintenance", "0")
    assert storm(seed, "read", "a.txt", agent="e1").returncode == 0
    noise = os.urandom(150_000).hex()
    assert storm(seed, "write", "a.txt", agent="e1", input=noise).returncode == 0
    before = git(c2, "for-each-ref").stdout
    r = storm_limited(c2, 50 * 1024, "sync", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["kind"] == "no_space" and "this disk refused" in err["message"], err
    assert git(c2, "for-each-ref").stdout == before  # nothing moved
    assert storm(c2, "sync").returncode == 0
    assert (c2 / "a.txt").read_text() == noise


def test_an_mcp_tool_on_a_full_disk_is_a_no_space_tool_error(tmp_path):
    """The MCP server turns every failure into a tool error through error_outcome: a full
    disk is named as such there too (run in a process of its own, under the cap)."""
    repo = repo_at(tmp_path)
    script = (
        "import json, resource, sys\n"
        "from storm_git.integrations.tools import StormTools, error_outcome\n"
        "t = StormTools.open(sys.argv[1], 'e1')\n"
        "t.read(['a.txt'])\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))\n"
        "try:\n"
        "    out = t.write('a.txt', open('/dev/urandom', 'rb').read(150_000).hex())\n"
        "except Exception as exc:\n"
        "    out = error_outcome(exc)\n"
        "print(json.dumps({'error': out.is_error, 'data': out.data, 'text': out.text}))\n")
    before = head(repo)
    r = subprocess.run([sys.executable, "-c", script, str(repo)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["error"] and out["data"]["error"]["kind"] == "no_space", out
    assert "free space" in out["text"]
    assert head(repo) == before


def test_a_read_only_mount_is_named_not_blamed_on_storm(tmp_path):
    """A repository on a read-only mount (a container volume, a remounted disk): every
    storm command that records anything said "OSError: [Errno 30] … (run git storm
    doctor)". It is now one line naming the read-only file system, exit 3 `read_only`."""
    repo = make_repo(tmp_path / "mnt" / "repo")
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
    mnt = tmp_path / "mnt"
    if subprocess.run(["mount", "--bind", str(mnt), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("needs mount (root in a container that allows it)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        for args, data in ((("read", "README.md"), None), (("write", "README.md"), "x\n"), (("status",), None)):
            r = storm(repo, *args, input=data, agent="e1")
            assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
            assert "read-only" in r.stderr and "doctor" not in r.stderr and "Errno" not in r.stderr, r.stderr
        r = storm(repo, "read", "README.md", "--json", agent="e1")
        assert json.loads(r.stdout)["error"]["kind"] == "read_only"
        assert storm(repo, "log").returncode == 0  # reading the history needs no write
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
