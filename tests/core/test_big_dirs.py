"""Large directories and large batches: the shortcuts that make
them cheap answer exactly as the full checks do.

* tree lookups are memoised by (tree, path) and walk directories without libgit2's
  ``filemode`` where the object type tells (Store.entry);
* a pair of large directories is diffed by libgit2 (tree_diff.tree_changes);
* disk reads of a batch share directory descriptors (safe_fs.DirFds);
* an ordinary path skips normalize's full checks, and a batch read checks only the
  file itself once its directory passed (paths.normalize, paths.check_on_disk);
* flag_write reads a small loose object without its header first;
* the disk record is started afresh at the head when it equals it;
* a write of many paths looks the reservations up once.
"""
from __future__ import annotations

import json
import os
import random

import pygit2
import pytest

from helpers import git, make_repo, storm, storm_json
from storm_git.core import paths, tree_diff
from storm_git.core.errors import BadPath
from storm_git.core.store import MODE_BLOB, MODE_EXEC, MODE_LINK, Store
from storm_git.disk import record, safe_fs, sync as disk_sync


def _store(path) -> Store:
    return Store(pygit2.Repository(str(path)))


# -- trees ---------------------------------------------------------------------------
def _rand_tree(st: Store, rnd: random.Random, names: list[str]) -> pygit2.Tree:
    r = st.repo
    files = {n: rnd.choice([b"1", b"2", b"3", b"4"]) for n in names if rnd.random() < 0.7}
    if rnd.random() < 0.3 and not any(n.startswith("c/") for n in files):
        files["c"] = b"a file where a directory was"
    if rnd.random() < 0.3 and not any(n.startswith("big/sub/") for n in files):
        files["big/sub"] = b"a file where a directory was"
    changes = {p: (r.create_blob(c), rnd.choice([MODE_BLOB, MODE_EXEC, MODE_LINK])) for p, c in files.items()}
    if rnd.random() < 0.5:  # a submodule entry (a gitlink)
        changes["sm"] = (r.create_blob(rnd.choice([b"x", b"y"])), pygit2.GIT_FILEMODE_COMMIT)
    return r[st.tree_with(r[st.empty_tree()], changes)]


def test_big_directories_diffed_by_libgit2_agree_with_the_walk(tmp_path, monkeypatch):
    """tree_changes through libgit2 (large pairs) gives the same (path, entry) list as
    the Python walk, with modes, links, gitlinks and file<->directory swaps."""
    st = _store(pygit2.init_repository(str(tmp_path / "r")).workdir)
    rnd = random.Random(11)
    names = ["a", "b", "c/d", "c/e", "c/f/g", "h/i", "big/x", "big/y", "big/sub/z", "big/sub/w", "l"]

    def norm(out):
        return sorted((p, None if v is None else (v[0], int(v[1]))) for p, v in out)

    for _ in range(200):
        a, b = _rand_tree(st, rnd, names), _rand_tree(st, rnd, names)
        monkeypatch.setattr(tree_diff, "BIG_DIR_ENTRIES", 10 ** 9)
        monkeypatch.setattr(tree_diff, "FLAT_DIR_ENTRIES", 10 ** 9)
        walked = norm(tree_diff.tree_changes(st, a, b))
        monkeypatch.setattr(tree_diff, "BIG_DIR_ENTRIES", 0)
        diffed = norm(tree_diff.tree_changes(st, a, b))
        assert diffed == walked, (a.id, b.id)
        assert len({p for p, _ in diffed}) == len(diffed)  # one answer a path


def test_memoised_entry_answers_as_a_fresh_lookup(tmp_path):
    """Store.entry gives the same entry, or the same refusal, the first time and
    every later time, as a store with nothing memoised."""
    repo = make_repo(tmp_path / "repo", {"a.py": "1\n", "src/b.py": "2\n", "src/deep/c.py": "3\n"},
                     init_storm=False)
    os.symlink("src", repo / "ln")
    os.chmod(repo / "src/b.py", 0o755)
    git(repo, "add", "-A")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},sm")
    git(repo, "commit", "-qm", "links, modes, a submodule")
    queries = ["a.py", "src/b.py", "src/deep/c.py", "src", "src/deep", "ln", "ln/b.py", "a.py/x",
               "sm", "sm/x", "src/missing.py", "missing/x.py", "src/deep/c.py/y", "src/b.py"]

    def answer(st: Store, tree, p):
        try:
            e = st.entry(tree, p)
            return None if e is None else (str(e.oid), int(e.mode))
        except BadPath as exc:
            return ("refused", exc.message, exc.hint)

    memo = _store(repo)
    tree = memo.repo.head.peel(pygit2.Commit).tree
    for _ in range(3):
        for p in queries:
            fresh = _store(repo)
            assert answer(memo, tree, p) == answer(fresh, fresh.repo[tree.id], p), p
    assert answer(memo, tree, "src/b.py")[1] == MODE_EXEC
    assert answer(memo, tree, "ln")[1] == MODE_LINK
    assert "submodule" in answer(memo, tree, "sm/x")[1]


# -- paths ---------------------------------------------------------------------------
def test_ordinary_paths_skip_the_full_checks_with_the_same_answer():
    """normalize's shortcut returns what the full checks return, for random names
    built from the pieces the checks look for."""
    rnd = random.Random(3)
    pieces = ["a", "b", "G", "i", "t", ".", "/", "//", "..", ":", "$", "\\", "~", "1", " ", "\n", "\r",
              "\x00", "\t", "é", "git", ".git", "GIT~1", "::$DATA", ".git.", "x" * 130, "\u200c"]

    def answer(f, raw, prefix):
        try:
            return f(raw, prefix, None)
        except BadPath as exc:
            return ("refused", exc.message)

    shortcut = 0
    for _ in range(20000):
        raw = "".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 8)))
        for prefix in ("", "src", "a/b", ".x", "x" * 200):
            shortcut += paths._plain(raw) and (not prefix or paths._plain(prefix))
            assert answer(paths.normalize, raw, prefix) == answer(paths._checked, raw, prefix), (raw, prefix)
    assert shortcut > 1000  # the shortcut was taken often enough to be tested


def test_a_batch_read_checks_each_file_as_one_read_does(repo, tmp_path):
    """After paths of the same directory passed, each file is still refused (or
    allowed) exactly as a read of it alone: a link out, a link in, a directory,
    a fifo, a file replaced by a directory."""
    from storm_git import open_workspace

    (tmp_path / "outside.py").write_text("secret\n")
    os.symlink(tmp_path / "outside.py", repo / "src/out.py")
    os.symlink("api.py", repo / "src/in.py")
    (repo / "src/dir.py").mkdir()
    os.mkfifo(repo / "src/fifo.py")
    ws = open_workspace(str(repo))
    for p in ["src/out.py", "src/in.py", "src/dir.py", "src/fifo.py", "src/gone.py"]:
        try:
            alone = ("ok", [(r.path, r.version) for r in ws.read([p], agent="solo")])
        except BadPath as exc:
            alone = ("refused", exc.message)
        try:
            batch = ("ok", [(r.path, r.version) for r in ws.read(["src/util.py", "src/client.py", p],
                                                                 agent="batch")][2:])
        except BadPath as exc:
            batch = ("refused", exc.message)
        assert batch == alone, p
    assert ws.read_set("batch").keys() - {"src/util.py", "src/client.py"} == ws.read_set("solo").keys()


# -- the disk ------------------------------------------------------------------------
def test_batched_disk_reads_see_what_single_reads_see(tmp_path):
    """disk_state and read_disk with shared directory descriptors answer as without,
    for links (in a directory and as a directory), modes, fifos, files as directories."""
    top = tmp_path / "w"
    (top / "d/sub").mkdir(parents=True)
    (top / "d/a.py").write_text("a\n")
    (top / "d/x.sh").write_text("#!/bin/sh\n")
    os.chmod(top / "d/x.sh", 0o755)
    os.symlink("a.py", top / "d/l.py")
    os.symlink(str(tmp_path), top / "dl")
    os.mkfifo(top / "d/fifo")
    (top / "f").write_text("file\n")
    names = ["d/a.py", "d/x.sh", "d/l.py", "d/sub", "d/fifo", "d/none", "dl/w/d/a.py", "dl/x", "f/x",
             "f", "none/x", "d/sub/x", "d/a.py/y"]
    with safe_fs.DirFds(str(top)) as dirs:
        for _ in range(2):
            for p in names:
                assert safe_fs.disk_state(str(top), p, dirs) == safe_fs.disk_state(str(top), p), p
                for how in (None, dirs):
                    try:
                        got = safe_fs.read_disk(str(top), p, dirs=how) if p not in ("d/fifo", "d/sub") else "skip"
                    except (BadPath, OSError) as exc:
                        got = type(exc).__name__
                    if how is None:
                        alone = got
                assert got == alone, p


def test_the_disk_record_restarts_at_the_head_only_when_it_equals_it(repo, ws):
    """A sync that brings many paths forward (here 70 files another writer committed
    without writing them to disk) and leaves the disk in step restarts the record
    at the head's tree (nothing to fold later); a single write only appends (a
    rewrite of the record per write would cost more than the fold it saves); with an
    unmediated edit kept on disk the record keeps a journal, and the edit stays reported."""
    import pygit2

    store = ws.store
    head = ws.head()
    new_files = {f"gen/g{i:03d}.py": (store.write_blob(b"g = %d\n" % i), pygit2.GIT_FILEMODE_BLOB)
                 for i in range(70)}
    sig = pygit2.Signature("other", "other@example.invalid")
    other = store.repo.create_commit(None, sig, sig, "other writer\n",
                                     store.tree_with(store.commit(head).tree, new_files), [head])
    git(repo, "update-ref", "refs/storm/workspace", str(other), str(head))
    res = disk_sync.sync(store)
    assert set(res.outcomes.values()) == {disk_sync.WRITTEN} and len(res.outcomes) == 70
    rec = record.load(store)
    assert rec.base == store.commit(other).tree.id and rec.overlay == {} and rec.synced == other
    ws.read(["src/api.py", "src/util.py"], agent="e1")
    assert ws.write("src/api.py", b"x = 1\n", agent="e1").accepted
    rec = record.load(store)
    assert rec.base == store.commit(other).tree.id and list(rec.overlay) == ["src/api.py"]
    (repo / "README.md").write_text("edited by a person\n")
    storm(repo, "status")  # the edit is seen
    ws.read(["src/util.py"], agent="e1")
    (repo / "src/util.py").write_text("an editor's buffer\n")
    storm(repo, "status")
    # a write of another file: the disk edit of util.py is kept and stays reported
    assert ws.write("src/api.py", b"y = 2\n", agent="e1").accepted
    rec = record.load(ws.store)
    assert rec.base != ws.store.commit(ws.head()).tree.id or rec.overlay
    code, st = storm_json(repo, "status")
    assert sorted(u["path"] for u in st["unmediated"]) == ["README.md", "src/util.py"]
    assert (repo / "src/util.py").read_text() == "an editor's buffer\n"


# -- exec of many files ----------------------------------------------------------------
@pytest.fixture
def big_repo(tmp_path):
    files = {f"d/f{i:04d}.py": f"v = {i}\n" for i in range(1100)}  # past tree_diff.BIG_DIR_ENTRIES
    files["src/keep.py"] = "k = 1\n"
    return make_repo(tmp_path / "repo", files)


def test_exec_deleting_many_files_flags_each_annotated_one_packed_or_loose(big_repo):
    """Among 1,100 deleted files, the two another agent annotated are flagged: one
    stored in a pack, one a fresh loose object (read without its header first)."""
    annotated = "x = 1  # engineer_1: keep this in step with the parser\n"
    for p in ("d/f0007.py", "d/f0900.py"):
        assert storm(big_repo, "read", p, agent="engineer_1").returncode == 0
    assert storm(big_repo, "write", "d/f0007.py", input=annotated, agent="engineer_1").returncode == 0
    git(big_repo, "repack", "-a", "-d", "-q")  # d/f0007.py's blob is packed now
    assert storm(big_repo, "write", "d/f0900.py", input="y = 2\n" + annotated, agent="engineer_1").returncode == 0
    loose = git(big_repo, "rev-parse", "refs/storm/workspace:d/f0900.py").stdout.decode().strip()
    assert (big_repo / ".git/objects" / loose[:2] / loose[2:]).exists()
    r = storm(big_repo, "exec", "--json", "--", "sh", "-c", "rm d/*.py", agent="engineer_2")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res["paths"]) == 1100 and res["write"]["accepted"]
    assert res["write"]["flags"] == ["intent_overwritten"]
    log = json.loads(storm(big_repo, "log", "--json").stdout)
    ev = next(e for e in log if e["type"] == "intent_overwritten")
    assert ev["owners"] == ["engineer_1"] and sorted(ev["paths"]) == ["d/f0007.py", "d/f0900.py"]
    code, st = storm_json(big_repo, "status")
    assert code == 0 and st["unmediated"] == []


def test_exec_deleting_many_files_no_annotation_no_flag_and_recreating_them(big_repo):
    """The same deletion without annotations is not flagged; recreating the files
    is recorded, and the shared tree ends as the disk."""
    r = storm(big_repo, "exec", "--json", "--", "sh", "-c", "rm d/*.py", agent="engineer_2")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and res["write"]["flags"] == [] and len(res["paths"]) == 1100
    r = storm(big_repo, "exec", "--json", "--", "sh", "-c",
              "for i in $(seq 1 1200); do echo $i > d/n$i.py; done", agent="engineer_2")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and len(res["paths"]) == 1200 and res["write"]["accepted"]
    listed = git(big_repo, "ls-tree", "--name-only", "refs/storm/workspace", "d/").stdout.decode().split()
    assert sorted(listed) == sorted(f"d/n{i}.py" for i in range(1, 1201))
    code, st = storm_json(big_repo, "status")
    assert code == 0 and st["unmediated"] == []


def test_a_write_of_many_paths_waits_for_a_reservation_on_any_of_them(repo, ws):
    """Reservations are looked up once for a batch: a reservation on the last of
    the paths an exec changed still refuses it (--no-wait)."""
    ws.read(["src/util.py"], agent="e1")
    ws.read(["src/util.py"], agent="e2")
    assert ws.write("src/util.py", b"a\n", agent="e2").accepted
    rej = ws.write("src/util.py", b"b\n", agent="e1")  # stale: e1 holds src/util.py now
    assert not rej.accepted and rej.rejection.reservation.holder == "e1"
    res = ws.exec(["sh", "-c", "echo 1 > src/a_new.py; echo 2 > src/util.py"], agent="e2", wait=False)
    assert res.write is not None and not res.write.accepted
    rejection = res.write.rejection
    assert rejection.reason == "reserved" and rejection.reservation.path == "src/util.py"
    assert rejection.reservation.holder == "e1"


def test_flat_directories_diffed_by_libgit2_agree_with_the_walk(tmp_path, monkeypatch):
    """A pair of directories without subdirectories, from FLAT_DIR_ENTRIES entries, goes
    to libgit2 (a flat root of a few hundred files is synced after every write): the
    same (path, entry) list as the walk, with modes, links, gitlinks, additions and
    deletions; a pair where one side holds a subdirectory is walked."""
    st = _store(pygit2.init_repository(str(tmp_path / "r")).workdir)
    r = st.repo
    rnd = random.Random(5)

    def norm(out):
        return sorted((p, None if v is None else (v[0], int(v[1]))) for p, v in out)

    def flat_tree(n: int, sub: bool) -> pygit2.Tree:
        changes = {f"f{i:03d}": (r.create_blob(rnd.choice([b"a", b"b", b"c"])),
                                 rnd.choice([MODE_BLOB, MODE_BLOB, MODE_EXEC, MODE_LINK]))
                   for i in range(n) if rnd.random() < 0.9}
        changes["sm"] = (r.create_blob(rnd.choice([b"x", b"y"])), pygit2.GIT_FILEMODE_COMMIT)
        if sub:
            changes["f050/inner"] = (r.create_blob(b"in"), MODE_BLOB)
            changes.pop("f050", None)
        return r[st.tree_with(r[st.empty_tree()], changes)]

    routed = []
    real = tree_diff._big_changes
    monkeypatch.setattr(tree_diff, "_big_changes", lambda *a: (routed.append(1), real(*a))[1])
    for i in range(60):
        sub_a, sub_b = i % 3 == 1, i % 3 == 2
        a, b = flat_tree(rnd.randrange(60, 200), sub_a), flat_tree(rnd.randrange(60, 200), sub_b)
        monkeypatch.setattr(tree_diff, "FLAT_DIR_ENTRIES", 10 ** 9)
        walked = norm(tree_diff.tree_changes(st, a, b))
        monkeypatch.setattr(tree_diff, "FLAT_DIR_ENTRIES", 128)
        routed.clear()
        diffed = norm(tree_diff.tree_changes(st, a, b))
        assert diffed == walked, (i, a.id, b.id)
        assert bool(routed) == (not sub_a and not sub_b and len(a) + len(b) >= 128), i
