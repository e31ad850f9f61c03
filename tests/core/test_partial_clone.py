"""Partial clones (``git clone --filter=blob:none``): the blobs git leaves on the
server until a command needs them (storm_git.core.promisor, storm_git.core.packs).

Every repository here is real: a served repository with ``uploadpack.allowFilter``,
blobless clones of it over ``file://``, and ``git storm`` processes. Git's own
trace (GIT_TRACE2) counts the fetches a command ran."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from helpers import fsck, git, make_repo, rev, storm, storm_json

FILES = {"a/keep.py": "keep = 1\n", "b/x.py": "x = 1\n", "b/y.py": "y = 1\n", "b/z.py": "z = 1\n",
         "b/w.py": "w = 1\n", "README.md": "# p\n"}


def served(tmp_path: Path, files: dict[str, str] = FILES) -> Path:
    src = make_repo(tmp_path / "served", files, init_storm=False)
    git(src, "config", "uploadpack.allowFilter", "true")
    return src


def blobless(tmp_path: Path, url: str, name: str, *extra: str) -> Path:
    git(tmp_path, "clone", "-q", "--filter=blob:none", *extra, url, name)
    return tmp_path / name


def missing_blobs(repo: Path) -> set[str]:
    """The blobs the clone lacks, listed without fetching them."""
    out = git(repo, "rev-list", "--objects", "--missing=print", "--all").stdout.decode()
    return {ln[1:] for ln in out.split() if ln.startswith("?")}


def fetches(trace: Path) -> int:
    """``git fetch`` processes GIT_TRACE2 saw start (storm's own and git's lazy ones)."""
    return len(re.findall(r"cmd_name fetch \(", trace.read_text())) if trace.exists() else 0


def blob_of(repo: Path, path: str) -> str:
    return git(repo, "rev-parse", f"HEAD:{path}").stdout.decode().strip()


def test_a_blobless_sparse_clone_reads_and_writes_files_outside_its_checkout(tmp_path):
    src = served(tmp_path)
    c = blobless(tmp_path, f"file://{src}", "c", "--sparse")
    git(c, "sparse-checkout", "set", "a")
    assert storm(c, "init").returncode == 0
    outside = {blob_of(c, f"b/{n}.py") for n in "xyzw"}
    assert outside <= missing_blobs(c)  # the premise: git left them on the server

    trace = tmp_path / "trace"
    r = storm(c, "read", "b/x.py", "b/y.py", "b/z.py", agent="a1", env={"GIT_TRACE2": str(trace)})
    assert r.returncode == 0, r.stderr  # was exit 3: "blob … is missing (run git fsck)"
    assert all(t in r.stdout for t in ("x = 1", "y = 1", "z = 1"))
    assert fetches(trace) == 1  # one fetch for the three, not one each
    trace.unlink()
    assert storm(c, "read", "b/x.py", agent="a1", env={"GIT_TRACE2": str(trace)}).returncode == 0
    assert fetches(trace) == 0  # fetched for good

    code, out = storm_json(c, "write", "b/x.py", input="x = 2  # a1: more\n", agent="a1")
    assert code == 0 and out["disk"] == {"b/x.py": "outside-sparse-checkout"}, out
    assert not (c / "b").exists()


def test_a_blob_the_server_cannot_send_is_a_one_line_error_that_changes_nothing(tmp_path):
    src = served(tmp_path)
    c = blobless(tmp_path, f"file://{src}", "c", "--sparse")
    git(c, "sparse-checkout", "set", "a")
    assert storm(c, "init").returncode == 0
    assert storm(c, "read", "a/keep.py", agent="a1").returncode == 0
    shutil.move(src, tmp_path / "gone")  # the server is away
    before = storm_json(c, "status", agent="a1")[1]

    r = storm(c, "read", "b/w.py", agent="a1")
    assert r.returncode == 3, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "could not be fetched from origin" in r.stderr and "fsck" not in r.stderr, r.stderr
    code, out = storm_json(c, "read", "b/w.py", agent="a1")
    assert code == 3 and out["error"]["kind"] == "remote_unreachable", out
    assert storm_json(c, "status", agent="a1")[1] == before  # the read set did not take b/w.py


def test_a_blobless_clone_works_in_a_shared_workspace_on_a_remote(tmp_path):
    """The storm refs' fetch inherited the clone's blob:none filter: the first file
    another machine wrote was a missing blob, and every command in the blobless
    clone failed (exit 3) from then on."""
    server = tmp_path / "server.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(server))
    git(server, "config", "uploadpack.allowFilter", "true")
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", f"file://{server}")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    b = blobless(tmp_path, f"file://{server}", "b")
    assert storm(b, "join", "origin").returncode == 0

    assert storm(a, "write", "notes/new.txt", input="from a\n", agent="a1").returncode == 0
    assert storm(a, "read", "README.md", agent="a1").returncode == 0
    assert storm(a, "write", "README.md", input="# service, by a\n", agent="a1").returncode == 0
    r = storm(b, "sync", agent="b1")
    assert r.returncode == 0, r.stderr
    assert (b / "notes/new.txt").read_text() == "from a\n"
    assert (b / "README.md").read_text() == "# service, by a\n"
    r = storm(b, "read", "notes/new.txt", "README.md", agent="b1")
    assert r.returncode == 0 and "from a" in r.stdout, r.stderr
    assert storm(b, "write", "notes/new.txt", input="from b\n", agent="b1").returncode == 0
    assert storm(a, "sync", agent="a1").returncode == 0
    assert (a / "notes/new.txt").read_text() == "from b\n"
    code, out = storm_json(b, "status", agent="b1")
    assert code == 0 and out["head"] == rev(a, "refs/storm/workspace"), out


def test_a_treeless_clone_looks_for_reverted_edits_only_in_the_trees_it_has(tmp_path):
    """``--filter=tree:0`` leaves the history's trees on the server; looking for an
    older version an edit might restore read them all, and ``status``, ``adopt``
    and ``exec`` failed ("Unable to read tree", exit 3) at the first edit on disk."""
    src = served(tmp_path)
    for i in range(3):  # a history whose trees the clone will not have
        (src / "b/x.py").write_text(f"x = {i + 2}\n")
        git(src, "commit", "-q", "-am", f"x {i}")
    c = tmp_path / "c"
    git(tmp_path, "clone", "-q", "--filter=tree:0", f"file://{src}", "c")
    old_tree = git(c, "log", "-1", "--format=%T", "HEAD~1").stdout.decode().strip()  # reads no tree
    assert old_tree in missing_blobs(c)  # the premise (rev-list prints missing trees too)
    assert storm(c, "init").returncode == 0
    (c / "b/y.py").write_text("y = 2\n")
    code, out = storm_json(c, "status", agent="a1")
    assert code == 0 and [u["path"] for u in out["unmediated"]] == ["b/y.py"], out
    r = storm(c, "adopt", "b/y.py", agent="a1")
    assert r.returncode == 0, r.stderr
    r = storm(c, "exec", "--", "sh", "-c", "echo z = 3 > b/z.py", agent="a1")
    assert r.returncode == 0, r.stderr
    assert storm(c, "commit", "-m", "y and z").returncode == 0
    assert git(c, "show", "HEAD:b/z.py").stdout == b"z = 3\n"


def _packs(repo: Path) -> dict[str, set[str]]:
    d = repo / ".git" / "objects" / "pack"
    out: dict[str, set[str]] = {}
    for p in d.iterdir():
        stem, _, ext = p.name.partition(".")
        out.setdefault(stem, set()).add(ext)
    return {k: v for k, v in out.items() if "pack" in v}


def test_maintenance_rolls_up_a_partial_clones_own_packs_and_keeps_the_fetched_ones(tmp_path):
    src = served(tmp_path)
    c = blobless(tmp_path, f"file://{src}", "c")
    assert storm(c, "init").returncode == 0
    git(c, "config", "storm.autoMaintenance", "0")  # this test starts every run itself
    fetched = {k: v for k, v in _packs(c).items() if "promisor" in v}
    assert fetched, "the premise: a partial clone's packs carry .promisor"
    for i in range(6):  # six packs of the clone's own: six rounds of writes, each packed by git
        for n in range(3):
            assert storm(c, "write", f"notes/n{n}.txt", input=f"v{i}{n}\n", agent="a1").returncode == 0
        git(c, "maintenance", "run", "--task=loose-objects")
    own = [k for k, v in _packs(c).items() if "promisor" not in v]
    assert len(own) >= 6

    trace = tmp_path / "trace"
    r = storm(c, "maintenance", env={"GIT_TRACE2": str(trace)})
    assert r.returncode == 0, r.stderr  # was exit 3: git repack --geometric cannot run here
    after = _packs(c)
    assert {k: v for k, v in after.items() if "promisor" in v} == fetched  # untouched
    assert len([k for k, v in after.items() if "promisor" not in v]) <= 2
    assert fetches(trace) == 0  # rolling packs fetched nothing from the server
    assert fsck(c).returncode == 0
    r = storm(c, "read", "notes/n0.txt", "notes/n1.txt", "notes/n2.txt", agent="a1")
    assert r.returncode == 0 and "v50" in r.stdout and "v52" in r.stdout, r.stderr
    assert storm(c, "doctor").returncode == 0


@pytest.mark.parametrize("sizes", [[1, 1, 1, 1, 1], [1, 2, 4, 8, 100], [3, 1, 1, 9], [2, 3, 5, 40, 41],
                                   [10, 1, 1, 1, 2, 60]])
def test_the_roll_up_chooses_the_packs_git_geometric_repack_rolls(tmp_path, sizes):
    """storm_git.core.packs.split against git's own ``repack --geometric=2`` on the
    same packs (a full clone, where git can run it)."""
    from storm_git.core import packs

    repo = make_repo(tmp_path / "r", {"f": "f\n"}, init_storm=False)
    git(repo, "repack", "-a", "-d", "-q")
    n = 0
    for size in sizes:
        oids = []
        for _ in range(size):
            n += 1
            oids.append(git(repo, "hash-object", "-w", "--stdin", input=f"blob {n}\n".encode()).stdout.decode().strip())
        git(repo, "pack-objects", "-q", str(repo / ".git/objects/pack/pack"), input="\n".join(oids).encode() + b"\n")
    git(repo, "prune-packed")
    listed = packs.listing(str(repo / ".git"))
    assert sorted(p.objects for p in listed) == sorted([*sizes, 3])  # the commit's pack: 3 objects
    chosen = {p.name for p in packs.split(listed)}
    git(repo, "repack", "-d", "-q", "--geometric=2")
    left = {p.name for p in packs.listing(str(repo / ".git"))}
    assert {p.name for p in listed} - left == chosen, (sizes, chosen, left)
