"""The shared working tree: disk converges to the shared ref, unmediated edits
are reported and kept, and adopt records them."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import git, rev, show, snapshot_refs, storm, storm_json
from storm_git.core.errors import UnmediatedEdit

WORKER = r"""
import sys
from storm_git import open_workspace

agent, rounds = sys.argv[1], int(sys.argv[2])
paths = sys.argv[3:]
ws = open_workspace(".")
done = 0
for i in range(rounds):
    p = paths[i % len(paths)]
    for _attempt in range(200):
        ws.forget(None, agent=agent)
        [r] = ws.read([p], agent=agent)
        res = ws.write(p, f"{agent} round {i}\n".encode() + (r.content or b"")[:200], agent=agent)
        if res.accepted:
            done += 1
            break
print(done)
"""


def test_disk_converges_to_shared_head_after_concurrent_overlapping_writers(repo, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    paths = ["src/api.py", "src/util.py", "shared/new file é.txt"]
    procs = [subprocess.Popen([sys.executable, str(worker), f"w{n}", "12", *paths[n % 3:], *paths[:n % 3]],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode()[-400:] for o in outs]
    assert sum(int(o[0]) for o in outs) == 48  # every write eventually accepted
    head = rev(repo, "refs/storm/workspace")
    for p in paths:  # every path on disk equals the shared head
        assert (repo / p).read_bytes() == show(repo, head, p), p
    _, st = storm_json(repo, "status")
    assert st["unmediated"] == []


def test_unmediated_edit_is_reported_with_diff_and_never_overwritten_silently(repo, ws):
    (repo / "src/api.py").write_text("def fetch(url):\n    return edited_in_editor(url)\n")
    (repo / "notes.txt").write_text("scratch\n")
    os.unlink(repo / "README.md")
    un = {u["path"]: u for u in ws.unmediated()}
    assert set(un) == {"src/api.py", "notes.txt", "README.md"}
    assert (un["src/api.py"]["state"], un["notes.txt"]["state"], un["README.md"]["state"]) == \
        ("modified", "added", "deleted")
    assert "+    return edited_in_editor(url)" in un["src/api.py"]["diff"]
    assert "-    return http_get(url)" in un["src/api.py"]["diff"]
    # another agent writes the same file: refused before it lands, since storm never
    # writes over the editor's version and the disk must not disagree with the answer
    ws.read(["src/api.py"], agent="e2")
    head = rev(repo, "refs/storm/workspace")
    with pytest.raises(UnmediatedEdit, match="src/api.py: a person's edit"):
        ws.write("src/api.py", b"def fetch(url, t):\n    pass\n", agent="e2")
    assert rev(repo, "refs/storm/workspace") == head
    assert (repo / "src/api.py").read_text().endswith("edited_in_editor(url)\n")
    r = storm(repo, "status")
    assert "(on disk, not recorded by storm): 3" in r.stdout
    assert re.search(r"modified: +src/api.py\n", r.stdout)  # made on the shared version: the write never landed
    assert "edited_in_editor" not in r.stdout  # diffs only with -v
    r = storm(repo, "status", "-v")
    assert "+    return edited_in_editor(url)" in r.stdout
    r = storm(repo, "write", "src/api.py", input="again\n", agent="e2")
    assert r.returncode == 3 and "edit made outside storm" in r.stderr and rev(repo, "refs/storm/workspace") == head


def test_adopt_records_an_editor_change_validated_against_its_base(repo):
    (repo / "src/util.py").write_text("def clamp(x, lo, hi):\n    return min(max(x, lo), hi)\n")
    # the edit was made on the version storm put on disk, which is still the
    # shared version: adopting it needs no earlier read (like exec)
    code, res = storm_json(repo, "adopt", "src/util.py", "-m", "e1: simpler clamp", agent="e1")
    assert code == 0 and res["accepted"], res
    head = rev(repo, "refs/storm/workspace")
    msg = git(repo, "log", "-1", "--format=%B", head).stdout.decode()
    assert msg.startswith("e1: simpler clamp\n") and "Storm-Op: adopt" in msg
    assert show(repo, head, "src/util.py") == (repo / "src/util.py").read_bytes()
    _, st = storm_json(repo, "status")
    assert st["unmediated"] == []


def test_adopt_of_new_and_deleted_files_and_stale_reads(repo):
    storm(repo, "read", "src/api.py", "README.md", agent="e1")
    (repo / "docs").mkdir()
    (repo / "docs/ü guide.md").write_text("hello\n")
    os.unlink(repo / "README.md")
    code, res = storm_json(repo, "adopt", "docs/ü guide.md", "README.md", agent="e1")
    assert code == 0, res
    head = rev(repo, "refs/storm/workspace")
    assert show(repo, head, "docs/ü guide.md") == b"hello\n"
    assert git(repo, "cat-file", "-e", f"{head}:README.md", check=False).returncode != 0
    # e2 changes src/api.py which e1 had read: e1's next adopt is stale
    storm(repo, "read", "src/api.py", agent="e2")
    storm(repo, "write", "src/api.py", input="changed\n", agent="e2")
    (repo / "src/util.py").write_text("edited\n")
    storm(repo, "read", "src/util.py", agent="e1")
    code, res = storm_json(repo, "adopt", "src/util.py", agent="e1")
    assert code == 1 and res["rejection"]["reason"] == "stale_dependency"


def test_adopt_bad_input(repo):
    before = snapshot_refs(repo)
    r = storm(repo, "adopt", "src/api.py", agent="e1")
    assert r.returncode == 2 and "not modified" in r.stderr
    r = storm(repo, "adopt", "nope.txt", agent="e1")
    assert r.returncode == 2 and "nope.txt: no such file on disk or in the shared workspace" in r.stderr
    r = storm(repo, "adopt", "../outside", agent="e1")
    assert r.returncode == 2 and "outside the repository" in r.stderr
    r = storm(repo, "adopt", "src", agent="e1")
    assert r.returncode == 2 and "directory" in r.stderr
    assert snapshot_refs(repo) == before
