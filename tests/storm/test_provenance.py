"""Provenance travels in the write commit: ``Storm-Validated-At``,
``Storm-Scope``, ``Storm-Read-Set: <base> <n>`` and ``Storm-Dep`` trailers, the read
set named by reference (a read-set note blob plus the first reads of the journal that
extends it, kept in the agent's notes under that blob's key for good).

Each write here is made through the command line by a real process; its provenance
is then resolved from the commit alone, by a fresh process's view of the repository,
and compared with the read set the agent had just before the write.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

from helpers import PY_PROJECT, git, hold, journal, release, rev, start_write, storm, storm_json
from storm_git import open_workspace
from storm_git.core import provenance as provenance_mod, trailers
from storm_git.core.readsets import FOLD_BYTES, ReadEntry
from storm_git.core.store import Store

FILES = PY_PROJECT
REPO_FILES = FILES  # the conftest's `repo`


def read_set(repo: Path, agent: str) -> dict[str, ReadEntry]:
    """The agent's read set as a fresh process sees it."""
    return open_workspace(str(repo)).read_set(agent)


def provenance(repo: Path, commit: str) -> tuple[dict[str, str], dict[str, ReadEntry]]:
    """A write's provenance resolved from its commit alone (the agent from its trailers),
    by a fresh Store: nothing of the writing process is reused."""
    got = provenance_mod.load(Store.discover(str(repo)), None, commit)
    assert got is not None, commit
    header, entries = got
    return header, {e.path: e for e in entries}


def message(repo: Path, commit: str) -> str:
    return git(repo, "log", "-1", "--format=%B", commit).stdout.decode()


def write(repo: Path, agent: str, path: str, content: str, *args: str) -> str:
    code, out = storm_json(repo, "write", path, *args, input=content, agent=agent)
    assert code == 0 and out["accepted"], out
    return out["commit"]


def test_provenance_resolves_from_the_commit_after_folds(repo):
    """The whole read set, --deps and --deps auto: each write's provenance, resolved from
    its commit after later reads, folds, a forget and more writes, is the read set (or
    the part of it the scope took) the agent had when it wrote."""
    assert storm(repo, "read", "app.py", "notes.py", "README.md", "pkg/models.py", agent="a").returncode == 0
    before_all = read_set(repo, "a")
    c_all = write(repo, "a", "notes.py", "X = 2\n")
    assert storm(repo, "status").returncode == 0  # a fold
    assert storm(repo, "read", "pkg/core.py", "pkg/__init__.py", agent="a").returncode == 0
    before_deps = read_set(repo, "a")
    c_deps = write(repo, "a", "README.md", "# demo 2\n", "--deps", "pkg/core.py")
    # --deps auto (agent u: the files a wrote in this task would be in a's computed scope)
    assert storm(repo, "read", "app.py", "notes.py", "README.md", agent="u").returncode == 0
    assert storm(repo, "status").returncode == 0
    assert storm(repo, "read", "pkg/models.py", "pkg/__init__.py", "pkg/core.py", agent="u").returncode == 0
    before_auto = read_set(repo, "u")
    c_auto = write(repo, "u", "app.py", FILES["app.py"] + "\n\ndef twice():\n    return run(), run()\n",
                   "--deps", "auto")
    # later history of the agent: more reads, folds, a forget, more writes
    assert storm(repo, "forget", "README.md", agent="a").returncode == 0  # folds
    assert storm(repo, "read", "README.md", agent="a").returncode == 0
    write(repo, "a", "README.md", "# demo 3\n", "--deps", "README.md")  # app.py moved (u)
    assert storm(repo, "status").returncode == 0
    assert storm(repo, "forget", "--all", agent="a").returncode == 0
    assert storm(repo, "forget", "--all", agent="u").returncode == 0

    header, got = provenance(repo, c_all)
    assert header["validated-at"] == rev(repo, f"{c_all}^") and header["scope"] == "all"
    assert got == before_all and len(got) == 4
    msg = message(repo, c_all)
    assert "\nStorm-Scope: all\nStorm-Read-Set: none 4\n" in msg and "Storm-Dep" not in msg

    header, got = provenance(repo, c_deps)
    assert header["validated-at"] == rev(repo, f"{c_deps}^") and header["scope"] == "deps"
    assert got == {p: before_deps[p] for p in ("README.md", "pkg/core.py")}
    assert "\nStorm-Dep: README.md\nStorm-Dep: pkg/core.py\n" in message(repo, c_deps)

    header, got = provenance(repo, c_auto)
    assert header["scope"] == "auto" and header["validated-at"] == rev(repo, f"{c_auto}^")
    deps = trailers.provenance(trailers.parse(message(repo, c_auto))).deps
    assert {"app.py", "pkg/models.py", "pkg/__init__.py"} <= set(deps), deps
    assert "notes.py" not in deps and "README.md" not in deps, deps
    assert got == {p: before_auto[p] for p in deps}
    # every read set resolved agrees with its parent: what the server's guard checks
    for c in (c_all, c_deps, c_auto):
        for e in provenance(repo, c)[1].values():
            blob = git(repo, "rev-parse", f"{c}^:{e.path}", check=False).stdout.decode().strip() or None
            assert blob == e.blob, (c, e)


def test_provenance_resolves_before_the_fold_from_the_live_journal(repo):
    assert storm(repo, "read", "app.py", "notes.py", agent="a").returncode == 0
    before = read_set(repo, "a")
    c = write(repo, "a", "app.py", "x = 1\n")
    assert git(repo, "rev-parse", "-q", "--verify", "refs/notes/storm/agents/a", check=False).returncode != 0
    assert journal(repo, "a").read_bytes().startswith(b"storm journal 1 base none\n")  # not folded
    header, got = provenance(repo, c)
    assert got == before and header["read-set"] == "none" and header["journal-reads"] == "2"
    [entry] = [e for e in storm_json(repo, "log")[1] if e.get("commit") == c]  # git storm log shows it too
    assert entry["validated"] == {"at": rev(repo, f"{c}^"), "scope": "all", "read_set": "none 2", "deps": None}
    # a second write on a folded base, its journal not folded yet
    assert storm(repo, "status").returncode == 0
    assert storm(repo, "read", "README.md", agent="a").returncode == 0
    before2 = read_set(repo, "a")
    c2 = write(repo, "a", "notes.py", "X = 5\n")
    header, got = provenance(repo, c2)
    assert got == before2 and header["read-set"] != "none" and header["journal-reads"] == "1"
    assert storm(repo, "status").returncode == 0  # folded: the same answer from the note
    assert provenance(repo, c2)[1] == before2 and provenance(repo, c)[1] == before


def test_a_writer_killed_between_its_journal_append_and_its_fold(repo):
    """The write's commit is on the shared ref and its journal is past FOLD_BYTES (the
    write would fold it next), but the writer is SIGKILLed before: held on the working
    tree's lock (the file is written after the CAS, the fold after the file). Its
    provenance resolves from the journal left behind, and after the fold from the notes."""
    absent = [f"gen/f{i:04d}.py" for i in range(600)]
    assert storm(repo, "read", "app.py", *absent, agent="a").returncode == 0
    assert journal(repo, "a").stat().st_size >= FOLD_BYTES
    before = read_set(repo, "a")
    h0 = rev(repo, "refs/storm/workspace")
    holder = hold(repo, "worktree", seconds=60)
    try:
        p = start_write(repo, "a", "app.py", "killed = 1\n")
        deadline = time.monotonic() + 60
        while rev(repo, "refs/storm/workspace") == h0:  # its CAS
            assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() else "no CAS"
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        release(holder)
    c = rev(repo, "refs/storm/workspace")
    assert f"\nStorm-Read-Set: none {len(before)}\n" in message(repo, c)
    assert journal(repo, "a").read_bytes().startswith(b"storm journal 1 base none\n")  # never folded
    assert git(repo, "rev-parse", "-q", "--verify", "refs/notes/storm/agents/a", check=False).returncode != 0
    header, got = provenance(repo, c)
    assert got == before and header["validated-at"] == h0
    assert storm_json(repo, "status")[0] == 0  # folds what the killed writer left
    assert provenance(repo, c)[1] == before
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0, rep
    assert storm(repo, "write", "app.py", input="after = 1\n", agent="a").returncode == 0


def test_no_note_per_write(repo):
    """A fold writes the read set and the journal, never a note per write: the agent's
    notes are on its key blobs only, however many writes it made."""
    assert storm(repo, "read", "notes.py", agent="a").returncode == 0
    ws = open_workspace(str(repo))
    commits = [ws.write("notes.py", f"X = {i}\n".encode(), agent="a").commit for i in range(5)]
    assert storm(repo, "status").returncode == 0
    listed = git(repo, "notes", "--ref=storm/agents/a", "list").stdout.decode()
    annotated = {ln.split()[1] for ln in listed.splitlines()}
    assert not annotated & set(commits)
    keys = {git(repo, "hash-object", "--stdin", input=k).stdout.decode().strip()
            for k in (b"storm read set: a\n", b"storm journal: a none\n")}
    assert annotated == keys
    for c in commits:
        assert [e.path for e in provenance(repo, c)[1].values()] == ["notes.py"]


def test_forget_everything_never_brings_a_base_back(repo):
    """A journal's key names the read-set note it extends, so no base may come twice:
    an emptied read set is a new (empty) note, not "none" again."""
    assert storm(repo, "read", "notes.py", agent="a").returncode == 0
    c1 = write(repo, "a", "notes.py", "X = 2\n")
    assert storm(repo, "forget", "--all", agent="a").returncode == 0
    assert storm(repo, "forget", "--all", agent="u").returncode == 0
    assert storm(repo, "read", "README.md", "app.py", agent="a").returncode == 0
    c2 = write(repo, "a", "README.md", "# again\n")
    assert storm(repo, "status").returncode == 0
    assert "Storm-Read-Set: none 1\n" in message(repo, c1) and "Storm-Read-Set: none" not in message(repo, c2)
    assert list(provenance(repo, c1)[1]) == ["notes.py"]
    assert sorted(provenance(repo, c2)[1]) == ["README.md", "app.py"]
