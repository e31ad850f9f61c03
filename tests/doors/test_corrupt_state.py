"""A sweep of corrupt state against the everyday commands: each answers (exit 0-3,
a refusal in one line plus its hint) and a refusal changes no ref. Every case here
that once failed (an internal error, exit 4; or a refusal after the write had
landed) says so in its id."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import forge
from helpers import git, make_repo, snapshot_refs, storm


def _commit_with(repo: Path, ref: str, entries: dict[str, bytes]) -> None:
    lines = "".join(f"100644 blob {forge.blob(repo, data)}\t{name}\n" for name, data in entries.items())
    tree = git(repo, "mktree", input=lines.encode()).stdout.decode().strip()
    git(repo, "update-ref", ref, git(repo, "commit-tree", tree, "-m", "hand-made").stdout.decode().strip())


def _log_entry(body: str):
    def corrupt(repo: Path) -> None:
        empty = git(repo, "hash-object", "-t", "tree", "-w", "--stdin", input=b"").stdout.decode().strip()
        git(repo, "update-ref", "refs/storm/log",
            git(repo, "commit-tree", empty, "-m", "hand-made", "-m", body).stdout.decode().strip())
    return corrupt


def _write_file(rel: str, data: bytes):
    def corrupt(repo: Path) -> None:
        p = repo / rel
        if p.is_dir():
            shutil.rmtree(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return corrupt


def _journals(data: bytes):
    def corrupt(repo: Path) -> None:
        d = repo / ".git" / "storm" / "journal"
        for name in os.listdir(d):
            (d / name).write_bytes(data)
    return corrupt


def _config(key: str, value: str):
    return lambda repo: git(repo, "config", key, value)


def _locks_are_directories(repo: Path) -> None:
    d = repo / ".git" / "storm" / "locks"
    for name in os.listdir(d):
        os.unlink(d / name)
        os.mkdir(d / name)


def _journal_dir_is_a_file(repo: Path) -> None:
    d = repo / ".git" / "storm" / "journal"
    shutil.rmtree(d)
    d.write_bytes(b"not a directory\n")


def _disk_record_is_a_directory(repo: Path) -> None:
    p = repo / ".git" / "storm" / "disk-record"
    p.unlink()
    (p / "inside").mkdir(parents=True)


# storm's own paths of the wrong type: refused naming the path, fixed by doctor --fix
def _fifo(rel: str):
    """Put a named pipe where storm keeps ``rel`` (a glob under .git/storm): a plain
    open of it would wait for a writer, and every storm command hang."""
    def corrupt(repo: Path) -> None:
        for p in (list((repo / ".git" / "storm").glob(rel)) or [repo / ".git" / "storm" / rel]):
            if p.exists():
                p.unlink()
            os.mkfifo(p)
    return corrupt


LAYOUT = {
    "lock-files-are-directories": _locks_are_directories,
    "journal-directory-is-a-file": _journal_dir_is_a_file,
    "disk-record-is-a-directory": _disk_record_is_a_directory,
    "disk-record-is-a-named-pipe-hung": _fifo("disk-record"),
    "journal-is-a-named-pipe-hung": _fifo("journal/*"),
}

CORRUPTIONS = {
    "workspace-ref-is-a-blob":
        lambda r: _write_file(".git/refs/storm/workspace", forge.blob(r, b"x").encode() + b"\n")(r),
    "workspace-ref-is-garbage": _write_file(".git/refs/storm/workspace", b"garbage\n"),
    "workspace-ref-names-a-missing-object": _write_file(".git/refs/storm/workspace", b"1" * 40 + b"\n"),
    "journal-garbage": _journals(b"\x00\xffgarbage\nr zz\n"),
    "journal-entry-escaping-the-tree-was-logged-as-a-rejection":
        _journals(b"storm journal 1 base none\nr " + b"a" * 40 + b" " + b"b" * 40 + b" ../../etc/passwd\n"),
    "disk-record-garbage-write-landed-then-exit-3": _write_file(".git/storm/disk-record", b"garbage\n"),
    **LAYOUT,
    "reservation-not-json-was-exit-4": lambda r: _commit_with(r, "refs/storm/reservations",
                                                              {"e" * 40: b"\x91not json\xff"}),
    "assignments-garbage": lambda r: _commit_with(r, "refs/storm/assignments", {"e1": b"{{{"}),
    "log-time-not-a-number-was-exit-4": _log_entry('{"type": "rejection", "agent": "e9", "time": "soon"}'),
    "log-types-wrong": _log_entry('{"type": 5, "agent": null, "time": [], "paths": 7}'),
    "max-file-bytes-negative-was-exit-4": _config("storm.maxFileBytes", "-5"),
    "reservation-seconds-not-a-number": _config("storm.reservationSeconds", "abc"),
    "auto-maintenance-not-a-number": _config("storm.autoMaintenance", "often"),
    "deps-setting-unknown": _config("storm.deps", "zzz"),
    "mode-unknown": _config("storm.mode", "sideways"),
}

def _refs(repo: Path) -> list[str]:
    """The refs, but the agents' read-set notes: status folds journals into them before
    it looks at the rest (moving recorded reads from one store to the other)."""
    return [ln for ln in snapshot_refs(repo).splitlines() if not ln.startswith("refs/notes/storm/agents/")]


COMMANDS = [("status",), ("read", "src/api.py"), ("write", "src/api.py"), ("log",), ("doctor",)]


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_every_command_answers_corrupt_state(tmp_path, corruption):
    base = make_repo(tmp_path / "base")
    assert storm(base, "read", "src/api.py", "src/util.py", agent="e1").returncode == 0
    assert storm(base, "write", "src/api.py", input="v1\n", agent="e1").returncode == 0
    for argv in COMMANDS:
        repo = tmp_path / "-".join(argv).replace("--", "")
        shutil.copytree(base, repo, symlinks=True)
        CORRUPTIONS[corruption](repo)
        before = _refs(repo)
        r = storm(repo, *argv, input="changed\n", agent="e1")
        assert r.returncode in (0, 1, 2, 3), (argv, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, (argv, r.stderr)
        if r.returncode in (2, 3):
            if argv != ("doctor",):  # doctor's exit 3 means findings, reported on stdout
                said = [ln for ln in r.stderr.strip().splitlines() if not ln.lstrip().startswith("hint")]
                assert len(said) == 1, (argv, r.stderr)
            assert _refs(repo) == before, argv


@pytest.mark.parametrize("corruption", sorted(LAYOUT))
def test_storm_paths_of_the_wrong_type_are_named_and_moved_aside_by_doctor(tmp_path, corruption):
    """Once answered 'IsADirectoryError … (run git storm doctor)' while doctor said all is well."""
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="v1\n", agent="e1").returncode == 0
    LAYOUT[corruption](repo)
    before = _refs(repo)
    r = storm(repo, "write", "src/api.py", "--json", input="v2\n", agent="e1")
    assert r.returncode == 3, r.stdout + r.stderr
    err = __import__("json").loads(r.stdout)["error"]
    assert err["kind"] == "corrupt_state" and "doctor --fix" in err["hint"], err
    assert _refs(repo) == before
    d = storm(repo, "doctor")
    assert d.returncode == 3 and "storm_path_wrong_type" in d.stdout, d.stdout + d.stderr
    f = storm(repo, "doctor", "--fix")
    assert f.returncode == 0 and "moved to storm-moved-aside/" in f.stdout, f.stdout + f.stderr
    assert os.listdir(repo / ".git" / "storm-moved-aside")  # kept, not deleted
    assert storm(repo, "doctor").returncode == 0
    assert storm(repo, "status").returncode == 0
    assert storm(repo, "read", "src/api.py", agent="e1").returncode == 0
    w = storm(repo, "write", "src/api.py", input="v2\n", agent="e1")
    assert w.returncode == 0, w.stdout + w.stderr
    assert (repo / "src" / "api.py").read_text() == "v2\n"


def test_the_agents_seen_record_of_the_wrong_type_is_an_error_doctor_moves_aside(tmp_path):
    """.git/storm/agents-seen (the ids of writers a remote clone fetched) replaced by a
    directory: intents says so in one line, doctor names it and --fix moves it aside."""
    repo = make_repo(tmp_path / "r")
    (repo / ".git" / "storm" / "agents-seen").mkdir(parents=True)
    r = storm(repo, "intents", "--json")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = __import__("json").loads(r.stdout)["error"]
    assert err["kind"] == "corrupt_state" and "doctor --fix" in err["hint"], err
    d = storm(repo, "doctor")
    assert d.returncode == 3 and "storm/agents-seen" in d.stdout, d.stdout + d.stderr
    f = storm(repo, "doctor", "--fix")
    assert f.returncode == 0 and "moved to storm-moved-aside/" in f.stdout, f.stdout + f.stderr
    assert storm(repo, "intents").returncode == 0


@pytest.mark.parametrize("name", ["remote-gate", "remote-rebased", "remote-queue"])
def test_a_remote_clones_state_file_of_the_wrong_type_is_named_and_moved_aside_by_doctor(tmp_path, name):
    """A remote clone's own files under .git/storm (the back-off record, the map of
    moved writes, the queue's record) replaced by a directory: doctor names it and
    --fix moves it aside, then says all is well. (doctor, in the admin package, finds
    their names in the shared core: it may not import the remote package.)"""
    repo = make_repo(tmp_path / "r")
    (repo / ".git" / "storm" / name).mkdir(parents=True)
    d = storm(repo, "doctor", "--json")
    found = __import__("json").loads(d.stdout)["findings"]
    assert d.returncode == 3 and [f["what"] for f in found if f["kind"] == "storm_path_wrong_type"] == [
        f"storm/{name}"], d.stdout + d.stderr
    f = storm(repo, "doctor", "--fix")
    assert f.returncode == 0 and "moved to storm-moved-aside/" in f.stdout, f.stdout + f.stderr
    assert not (repo / ".git" / "storm" / name).exists()
    assert storm(repo, "doctor").returncode == 0
