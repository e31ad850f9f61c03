"""The working tree as a recorded state: every case that could lose
accepted work or escape the repository, through the real CLI with real
processes. Windows are held open with ``flock`` on storm's own lock files."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pygit2
import pytest

from helpers import (
    DEFAULT_FILES,
    accepted_write,
    git,
    hold,
    make_repo,
    release,
    rev,
    show,
    snapshot_refs,
    start_storm as spawn,
    storm,
    storm_json,
)


def wait_ref_moves(repo: Path, old: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while rev(repo, "refs/storm/workspace") == old:
        assert time.monotonic() < deadline, "the write never reached the shared ref"
        time.sleep(0.01)


def kill_after_cas(repo: Path, agent: str, path: str, text: str) -> str:
    """A writer SIGKILLed between its CAS and its disk write (the worktree lock is held
    so it cannot get further); returns the shared head it made."""
    storm(repo, "read", path, agent=agent)
    before = rev(repo, "refs/storm/workspace")
    holder = hold(repo, "worktree", seconds=30)
    try:
        w = spawn(repo, "write", path, agent=agent, input=text.encode())
        wait_ref_moves(repo, before)
        w.kill()
        w.wait()
    finally:
        release(holder)
    return rev(repo, "refs/storm/workspace")


# -- accepted writes are never reverted ------------------------------------------------
def test_commit_adopt_racing_a_writers_disk_write_keeps_the_write(repo):
    holder = hold(repo, "worktree", seconds=2.5)
    manager = spawn(repo, "commit", "--adopt", "-m", "integrate", agent="manager")
    time.sleep(0.3)
    storm(repo, "read", "src/api.py", agent="e1")
    r = storm(repo, "write", "src/api.py", input="new api\n", agent="e1")
    assert r.returncode == 0, r.stderr
    out, err = manager.communicate(timeout=60)
    holder.wait()
    assert manager.returncode == 0, err
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"new api\n"
    assert (repo / "src/api.py").read_text() == "new api\n"
    # whichever ran first, the branch never holds the old content with e1's credit
    r = storm(repo, "commit", "-m", "again", agent="manager")
    assert r.returncode == 0, r.stderr
    assert show(repo, "HEAD", "src/api.py") == b"new api\n"


def test_writer_killed_between_cas_and_disk_write_is_repaired_by_the_next_command(repo):
    head = kill_after_cas(repo, "e1", "src/api.py", "accepted\n")
    assert show(repo, head, "src/api.py") == b"accepted\n"
    assert (repo / "src/api.py").read_text() != "accepted\n"  # the disk was left behind
    accepted_write(repo, "e2", "README.md", "# other\n")  # any later write brings it forward
    assert (repo / "src/api.py").read_text() == "accepted\n"
    _, st = storm_json(repo, "status")
    assert st["unmediated"] == []


def test_more_than_64_writes_after_a_lost_disk_write_do_not_make_it_an_edit(repo):
    head = kill_after_cas(repo, "e1", "src/api.py", "accepted\n")
    # 70 further commits on the shared ref whose disk writes never happen (writers
    # outside storm's lock): no look-back limit can matter any more
    r = pygit2.Repository(str(repo))
    ref = r.lookup_reference("refs/storm/workspace")
    for i in range(70):
        c = r[ref.target]
        tb = r.TreeBuilder(c.tree)
        tb.insert("counter.txt", r.create_blob(f"{i}\n".encode()), pygit2.GIT_FILEMODE_BLOB)
        sig = pygit2.Signature("e9", "e9@storm.invalid")
        new = r.create_commit(None, sig, sig, f"w{i}\n\nStorm-Agent: e9\nStorm-Op: write\nStorm-Path: counter.txt\n",
                              tb.write(), [c.id])
        ref.set_target(new)
    assert rev(repo, "refs/storm/workspace") != head
    code, res = storm_json(repo, "commit", "-m", "integrate", "--adopt", agent="manager")
    assert code == 0, res
    assert res["adopted"] == [] and res["unmediated"] == []
    assert show(repo, "HEAD", "src/api.py") == b"accepted\n"
    assert (repo / "src/api.py").read_text() == "accepted\n"
    assert (repo / "counter.txt").read_text() == "69\n"


@pytest.mark.parametrize("how", ["stash", "reset"])
def test_stash_or_reset_is_shown_as_reverted_and_never_adopted(repo, how):
    accepted_write(repo, "e1", "src/api.py", "accepted\n")
    shared = rev(repo, "refs/storm/workspace")
    if how == "stash":
        git(repo, "stash")
    else:
        git(repo, "reset", "--hard")
    assert (repo / "src/api.py").read_text() != "accepted\n"
    _, st = storm_json(repo, "status")
    assert [(u["path"], u["state"]) for u in st["unmediated"]] == [("src/api.py", "reverted")]
    r = storm(repo, "adopt", "src/api.py", agent="e1")
    assert r.returncode == 2 and "older shared version" in r.stderr and "checkout" in r.stderr
    code, res = storm_json(repo, "commit", "-m", "integrate", "--adopt", agent="manager")
    assert code == 0, res
    assert res["adopted"] == [] and res["unmediated"] == [{"path": "src/api.py", "state": "reverted",
                                                                "likely_secret": False}]
    assert rev(repo, "refs/storm/workspace") == shared
    assert show(repo, "HEAD", "src/api.py") == b"accepted\n"
    r = storm(repo, "checkout", "src/api.py")
    assert r.returncode == 0 and "restored" in r.stdout
    assert (repo / "src/api.py").read_text() == "accepted\n"
    assert storm_json(repo, "status")[1]["unmediated"] == []


def test_an_edit_made_on_an_older_version_is_a_conflict_not_a_revert(repo):
    from helpers import hold, read_as, release, rev, start_storm

    read_as(repo, "e2", "src/util.py")
    before = rev(repo, "refs/storm/workspace")
    holder = hold(repo, "worktree", seconds=60)  # e2's write lands, then waits to write the disk...
    try:
        w = start_storm(repo, "write", "src/util.py", agent="e2", input=b"e2's accepted version\n")
        while rev(repo, "refs/storm/workspace") == before:
            assert w.poll() is None
            time.sleep(0.01)
        (repo / "src/util.py").write_text("edited in an editor\n")  # ...made on the initial version
    finally:
        release(holder)
    assert w.wait(timeout=120) == 0
    assert (repo / "src/util.py").read_text() == "edited in an editor\n"  # disk kept (unmediated)
    for _ in range(2):  # a blind retry does not overwrite either
        code, res = storm_json(repo, "adopt", "src/util.py", agent="e1")
        assert code == 1 and res["rejection"]["reason"] == "direct_conflict"
        assert "-edited in an editor" not in res["rejection"]["diff"]  # diffed from the edit's base
        assert "+e2's accepted version" in res["rejection"]["diff"]
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"e2's accepted version\n"
    # e1 gives up its reservation (else the manager waits it out: 30 s), so the manager's
    # adopt is validated, and refused for the same reason
    assert storm(repo, "release", "src/util.py", agent="e1").returncode == 0
    code, res = storm_json(repo, "commit", "-m", "i", "--adopt", agent="manager")
    assert code == 1 and "src/util.py was changed by e2 while manager's edit of it on disk was made" \
        in res["error"]["message"], res
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"e2's accepted version\n"


# -- no write outside the repository by a race --------------------------------------------
def _swap_for_link(repo: Path, d: str, outside: Path) -> None:
    os.rename(repo / d, repo / (d + ".moved"))
    os.symlink(outside, repo / d)


def test_directory_swapped_for_a_symlink_while_waiting_for_the_lock(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    storm(repo, "read", "src/new.py", agent="e1")
    holder = hold(repo, "workspace", seconds=1.5)
    w = spawn(repo, "write", "src/new.py", agent="e1", input=b"escaped?\n")
    time.sleep(0.4)
    _swap_for_link(repo, "src", outside)
    out, err = w.communicate(timeout=60)
    holder.wait()
    assert w.returncode == 2 and b"symbolic link" in err, err
    assert list(outside.iterdir()) == []
    assert git(repo, "cat-file", "-e", "refs/storm/workspace:src/new.py", check=False).returncode != 0


def test_directory_swapped_after_the_cas_is_never_written_through(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "api.py").write_text("outside file\n")
    storm(repo, "read", "src/api.py", agent="e1")
    holder = hold(repo, "worktree", seconds=30)
    before = rev(repo, "refs/storm/workspace")
    w = spawn(repo, "write", "src/api.py", agent="e1", input=b"accepted\n")
    wait_ref_moves(repo, before)
    _swap_for_link(repo, "src", outside)
    release(holder)
    out, err = w.communicate(timeout=60)
    assert w.returncode == 0, err
    assert b"[disk: " in out  # accepted in the shared ref; the disk write did not happen
    assert (outside / "api.py").read_text() == "outside file\n"
    assert sorted(p.name for p in outside.iterdir()) == ["api.py"]


def test_directory_swapped_while_waiting_for_a_reservation(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "util.py").write_text("outside file\n")
    git(repo, "config", "storm.reservationSeconds", "3")
    storm(repo, "read", "src/util.py", agent="e1")
    storm(repo, "read", "src/util.py", agent="e2")
    accepted_write(repo, "e3", "src/util.py", "e3\n")
    assert storm(repo, "write", "src/util.py", input="e2\n", agent="e2").returncode == 1  # e2 reserves it
    storm(repo, "read", "src/util.py", agent="e1")
    w = spawn(repo, "write", "src/util.py", agent="e1", input=b"escaped?\n")
    time.sleep(0.5)
    _swap_for_link(repo, "src", outside)
    out, err = w.communicate(timeout=60)
    assert w.returncode == 2 and b"symbolic link" in err, err
    assert (outside / "util.py").read_text() == "outside file\n"


# -- exec records only paths that write would accept ------------------------------------------
@pytest.mark.parametrize("name", ["a\nStorm-Agent: spoof", ".GIT/config", "git~1/x"])
def test_exec_creating_a_refused_name_records_nothing_and_bricks_nothing(repo, name):
    before = snapshot_refs(repo)
    script = "mkdir -p \"$(dirname \"$1\")\"; echo x > \"$1\"; echo y >> README.md"
    r = storm(repo, "exec", "--", "sh", "-c", script, "sh", name, agent="e1")
    assert r.returncode == 2, r.stderr
    assert "cannot record" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert snapshot_refs(repo) == before
    assert storm(repo, "forget", agent="e1").returncode == 0
    assert storm(repo, "status").returncode == 0
    os.unlink(repo / name)
    r = storm(repo, "exec", "--", "sh", "-c", "echo z >> src/util.py", agent="e1")
    assert r.returncode == 0, r.stderr
    log = storm_json(repo, "log")[1]
    assert all(e.get("agent") != "spoof" for e in log)
    assert storm(repo, "commit", "-m", "i", agent="manager").returncode == 0


def test_exec_creating_a_non_utf8_name_is_refused(repo):
    before = snapshot_refs(repo)
    r = subprocess.run([sys.executable, "-m", "storm_git", "exec", "--", "sh", "-c", b"echo x > '\xff\xfe'"],
                       cwd=repo, capture_output=True, env=dict(os.environ, STORM_AGENT="e1"))
    assert r.returncode == 2 and b"UTF-8" in r.stderr, r.stderr
    assert snapshot_refs(repo) == before


def test_exec_records_the_exec_bit_and_links_inside_and_refuses_links_out(repo, tmp_path):
    r = storm(repo, "exec", "--", "sh", "-c", "chmod +x src/util.py; ln -s api.py src/alias.py", agent="e1")
    assert r.returncode == 0, r.stderr
    tree = git(repo, "ls-tree", "-r", "refs/storm/workspace").stdout.decode()
    assert "100755 blob" in next(ln for ln in tree.splitlines() if ln.endswith("src/util.py"))
    assert "120000 blob" in next(ln for ln in tree.splitlines() if ln.endswith("src/alias.py"))
    assert show(repo, "refs/storm/workspace", "src/alias.py") == b"api.py"
    assert storm_json(repo, "status")[1]["unmediated"] == []
    before = snapshot_refs(repo)
    r = storm(repo, "exec", "--", "ln", "-s", str(tmp_path), "out", agent="e1")
    assert r.returncode == 2 and "leading out" in r.stderr
    assert snapshot_refs(repo) == before
    # the manager's commit leaves git status clean (the exec bit included)
    os.unlink(repo / "out")
    assert storm(repo, "commit", "-m", "i", agent="manager").returncode == 0
    assert git(repo, "status", "--porcelain").stdout == b""


def test_adopt_records_chmod(repo):
    os.chmod(repo / "src/api.py", 0o755)
    code, res = storm_json(repo, "adopt", "src/api.py", agent="e1")
    assert code == 0, res
    assert git(repo, "ls-tree", "refs/storm/workspace", "src/api.py").stdout.startswith(b"100755")


# -- a stale private-index lock ----------------------------------------------------------
def test_stale_private_index_lock_is_cleared(repo):
    storm(repo, "status")
    lock = repo / ".git/storm/exec-index.lock"
    lock.write_text("")
    assert storm(repo, "status").returncode == 0
    assert not lock.exists()
    lock.write_text("")
    r = storm(repo, "exec", "--", "sh", "-c", "echo x >> README.md", agent="e1")
    assert r.returncode == 0, r.stderr
    lock.write_text("")
    assert storm(repo, "commit", "-m", "i", agent="manager").returncode == 0


# -- exec on a terminal ----------------------------------------------------------------
def _on_pty(repo: Path, argv: list[str]) -> tuple[int, int]:
    """Run ``git storm`` as the session leader of a new pseudo-terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal, it is in the foreground
        # as an interactive shell starts a foreground job: default dispositions, even when
        # this test runs in a background job that ignores SIGINT and SIGQUIT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        os.chdir(repo)
        os.environ["STORM_AGENT"] = "e1"
        os.execv(sys.executable, [sys.executable, "-m", "storm_git", *argv])
    return pid, fd


def _read_until(fd: int, needle: bytes, timeout: float = 30) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        assert time.monotonic() < deadline, buf
        try:
            buf += os.read(fd, 1024)
        except OSError:
            break
    return buf


def test_exec_command_reads_the_terminal(repo):
    pid, fd = _on_pty(repo, ["exec", "--", "sh", "-c", "echo ready; read line; echo \"$line\" > typed.txt"])
    _read_until(fd, b"ready")
    os.write(fd, b"hello\n")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert show(repo, "refs/storm/workspace", "typed.txt") == b"hello\n"


def test_ctrl_c_reaches_the_command_and_nothing_is_recorded(repo):
    before = snapshot_refs(repo)
    # "ready" is printed by the very process that then waits (exec'd by sh): a Ctrl-C
    # sent once it shows cannot fall in a window of the shell's own (fork, exec)
    waiter = "import sys, time; print('ready', flush=True); time.sleep(30)"
    pid, fd = _on_pty(repo, ["exec", "--", "sh", "-c", f'echo x > half.txt; exec "{sys.executable}" -c "{waiter}"'])
    _read_until(fd, b"ready")
    os.write(fd, b"\x03")  # Ctrl-C on the terminal
    # what storm printed after it, so a failure (seen once under CI load) says why
    out, status, deadline = b"", None, time.monotonic() + 25
    while status is None and time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif select.select([fd], [], [], 0.2)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                pass
    if status is None:  # say who was still there and what each ignored or caught
        out += subprocess.run(["ps", "-o", "pid,ppid,pgid,tpgid,stat,ignored,caught,args", "-g", str(pid)],
                              capture_output=True).stdout
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT, out
    assert snapshot_refs(repo) == before
    assert (repo / "half.txt").exists()  # left on disk, shown as unmediated


# -- storm's own temporary files ------------------------------------------------------------
def test_a_killed_writers_temp_file_is_never_committed(repo):
    (repo / "src/.storm-tmp-999999").write_text("half a file")
    code, res = storm_json(repo, "commit", "-m", "i", "--adopt", agent="manager")
    assert code == 0, res
    assert git(repo, "cat-file", "-e", "refs/storm/workspace:src/.storm-tmp-999999", check=False).returncode != 0
    assert all(".storm-tmp" not in u["path"] for u in storm_json(repo, "status")[1]["unmediated"])


def test_init_records_the_checkout_and_a_base_elsewhere_brings_clean_files_forward(tmp_path):

    repo = make_repo(tmp_path / "r", {"a.txt": "one\n", "b.txt": "b\n"}, init_storm=False)
    git(repo, "tag", "v1")
    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-qam", "two")
    (repo / "b.txt").write_text("my own edit\n")
    assert storm(repo, "init", "--base", "v1").returncode == 0
    _, st = storm_json(repo, "status")
    assert (repo / "a.txt").read_text() == "one\n"  # clean: brought to the shared head
    assert [(u["path"], u["state"]) for u in st["unmediated"]] == [("b.txt", "modified")]


# -- doctor sees what a killed writer left ------------------------------------------------------
def test_doctor_reports_and_fixes_a_disk_left_behind(repo):
    kill_after_cas(repo, "e1", "src/api.py", "accepted\n")
    code, rep = storm_json(repo, "doctor")
    assert code == 3 and [f["kind"] for f in rep["findings"]] == ["disk_behind"], rep
    assert (repo / "src/api.py").read_text() != "accepted\n"  # doctor without --fix changes nothing
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0, rep
    assert (repo / "src/api.py").read_text() == "accepted\n"
    assert storm_json(repo, "doctor")[1]["findings"] == []


def test_doctor_rebuilds_a_corrupt_disk_record(repo):
    (repo / ".git/storm/disk-record").write_bytes(b"garbage")
    r = storm(repo, "status")
    assert r.returncode == 3 and "disk record" in r.stderr and "doctor --fix" in r.stderr
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and rep["findings"][0]["kind"] == "corrupt_disk_record", rep
    assert storm(repo, "status").returncode == 0


# -- a large read set is validated before the lock, re-checked under it ---------------------------
def _foreign_write(repo: Path, path: str, content: bytes) -> None:
    """Move the shared ref as a writer outside storm's lock would (raw CAS)."""
    r = pygit2.Repository(str(repo))
    ref = r.lookup_reference("refs/storm/workspace")
    c = r[ref.target]
    tb = r.TreeBuilder(c.tree)
    tb.insert(path, r.create_blob(content), pygit2.GIT_FILEMODE_BLOB)
    sig = pygit2.Signature("e9", "e9@storm.invalid")
    ref.set_target(r.create_commit(None, sig, sig, f"w\n\nStorm-Agent: e9\nStorm-Op: write\nStorm-Path: {path}\n",
                                   tb.write(), [c.id]))


@pytest.mark.parametrize("touch, accepted", [("dep050.txt", False), ("other.txt", True)])
def test_large_read_set_revalidated_under_the_lock(tmp_path, touch, accepted):

    files = {f"dep{i:03d}.txt": f"{i}\n" for i in range(100)} | {"other.txt": "o\n", "target.txt": "t\n"}
    repo = make_repo(tmp_path / "r", files)
    assert storm(repo, "read", *[f"dep{i:03d}.txt" for i in range(100)], "target.txt", agent="big").returncode == 0
    holder = hold(repo, "workspace", seconds=30)
    w = spawn(repo, "write", "target.txt", "--json", agent="big", input=b"new\n")
    time.sleep(1.0)  # the writer has validated its 101 entries and waits for the lock
    _foreign_write(repo, touch, b"changed meanwhile\n")
    release(holder)
    out, err = w.communicate(timeout=60)
    assert w.returncode == (0 if accepted else 1), err
    if not accepted:
        assert b'"stale_dependency"' in out and b"dep050.txt" in out
    assert (show(repo, "refs/storm/workspace", "target.txt") == b"new\n") == accepted


def test_changed_paths_agrees_with_libgit2s_diff(tmp_path):
    """storm's own tree diff (it skips equal subtrees; libgit2 walks every entry) names
    exactly the files libgit2's diff names, on random pairs with modes and file↔dir swaps."""
    import random

    import pygit2

    from storm_git.core.store import Store
    from storm_git.core.tree_diff import changed_paths

    r = pygit2.init_repository(str(tmp_path / "r"))
    st = Store(r)
    rnd = random.Random(7)
    names = ["a", "b", "c/d", "c/e", "c/f/g", "h/i", "h/j/k", "l"]

    def rand_tree():
        files = {n: rnd.choice([b"1", b"2", b"3"]) for n in names if rnd.random() < 0.6}
        if rnd.random() < 0.3 and not any(n.startswith("c/") for n in files):
            files["c"] = b"a file where a directory was"
        changes = {p: (r.create_blob(c), rnd.choice([0o100644, 0o100755])) for p, c in files.items()}
        return r[st.tree_with(r[st.empty_tree()], changes)]

    for _ in range(300):
        a, b = rand_tree(), rand_tree()
        expected = set()
        for d in a.diff_to_tree(b).deltas:
            expected |= {d.old_file.path, d.new_file.path}
        got = changed_paths(st, a, b)
        assert len(got) == len(set(got)) and set(got) == expected


_READER = r"""
import os, sys
path, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]
seen = bad = 0
while not os.path.exists(stop):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        bad += 1
        continue
    seen += 1
    # every version is 4,000 copies of one line: a torn or empty read has another shape
    if len(data) != 4000 * 9 or data != data[:9] * 4000:
        bad += 1
open(out, "w").write(f"{seen} {bad}")
"""


def test_a_reader_never_sees_a_written_file_missing_or_partial(repo, tmp_path):
    """The disk write swaps the new file in (an atomic exchange on Linux, a rename
    elsewhere): a reader in another process sees the old content or the new one,
    never nothing and never a mix, and no temporary file is left. Unlinking the old
    file before renaming (as a checkout does) fails the ENOENT count here."""
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    target = repo / "big.txt"
    ws.write("big.txt", b"line 000\n" * 4000, agent="w1")
    inode = target.stat().st_ino
    assert ws.write("big.txt", b"line 001\n" * 4000, agent="w1").accepted
    # a new file swapped in, not the old one rewritten in place (compared over one write:
    # the file system reuses the numbers of deleted files)
    assert target.stat().st_ino != inode
    stop, out = tmp_path / "stop", tmp_path / "out"
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(target), str(stop), str(out)])
    try:
        for i in range(2, 301):
            res = ws.write("big.txt", b"line %03d\n" % i * 4000, agent="w1")
            assert res.accepted and res.disk == {"big.txt": "written"}
    finally:
        stop.touch()
        assert reader.wait(timeout=30) == 0
    seen, bad = map(int, out.read_text().split())
    assert seen > 0 and bad == 0
    assert target.read_bytes() == b"line 300\n" * 4000
    assert not [n for n in os.listdir(repo) if n.startswith(".storm-tmp-")]


def test_the_disk_write_over_a_link_replaces_the_link_and_refuses_a_directory(repo, tmp_path):
    """The exchange swaps in only over a regular file or a link: a link at the target
    is replaced (never followed: the file it points to is untouched), and a directory
    put where a file was is refused with nothing swapped."""
    from storm_git.disk.safe_fs import write_file

    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep\n")
    (repo / "ln").symlink_to(outside)
    write_file(str(repo), "ln", b"new\n")
    assert not (repo / "ln").is_symlink() and (repo / "ln").read_bytes() == b"new\n"
    assert outside.read_bytes() == b"keep\n"
    (repo / "dir").mkdir()
    (repo / "dir" / "inner").write_bytes(b"inner\n")
    with pytest.raises(OSError):
        write_file(str(repo), "dir", b"file\n")
    assert (repo / "dir" / "inner").read_bytes() == b"inner\n"
    assert not [n for n in os.listdir(repo) if n.startswith(".storm-tmp-")]


def test_checkout_of_a_directory_restores_the_shared_files_under_it(repo):
    """`git storm checkout src/` (and `.`) as `git checkout -- src/`: every edited or
    deleted file of the shared state under it comes back; a file the shared state
    does not have stays."""
    (repo / "src/api.py").write_text("edited\n")
    (repo / "src/util.py").unlink()
    (repo / "src/new.py").write_text("mine\n")
    (repo / "README.md").write_text("edited too\n")
    r = storm(repo, "checkout", "src/")
    assert r.returncode == 0, r.stderr
    assert "src/api.py: restored from the shared head" in r.stdout and "src/util.py" in r.stdout
    assert (repo / "src/api.py").read_text() == DEFAULT_FILES["src/api.py"]
    assert (repo / "src/util.py").read_text() == DEFAULT_FILES["src/util.py"]
    assert (repo / "src/new.py").read_text() == "mine\n"  # not the shared state's: left
    assert (repo / "README.md").read_text() == "edited too\n"  # outside src/
    r = subprocess.run([sys.executable, "-m", "storm_git", "checkout", ".."], cwd=repo / "src",
                       capture_output=True, text=True)
    assert r.returncode == 0 and "README.md: restored" in r.stdout, r.stderr
    assert storm(repo, "checkout", ".").stdout.strip() == "nothing to restore: the disk holds the shared state there"
    st = {u["path"]: u["state"] for u in json.loads(storm(repo, "status", "--json").stdout)["unmediated"]}
    assert st == {"src/new.py": "added"}


def test_adopt_of_a_directory_records_the_edits_under_it(repo):
    """`git storm adopt gen/ --agent A` as `git add gen/`: every edit under it, new
    files included, in one validated write; a reverted file under it is left out
    (unless --allow-revert); nothing there: exit 2."""
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, t=1):\n    pass\n",
                 agent="engineer_1").returncode == 0
    git(repo, "checkout", "--", "src/api.py")  # reverted on disk
    (repo / "gen").mkdir()
    for i in range(3):
        (repo / f"gen/{i}.txt").write_text(f"{i}\n")
    (repo / "src/util.py").write_text("x = 1\n")
    code, res = storm_json(repo, "adopt", "gen", "src/", "--agent", "engineer_2")
    assert code == 0 and sorted(res["paths"]) == ["gen/0.txt", "gen/1.txt", "gen/2.txt", "src/util.py"], res
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"def fetch(url, t=1):\n    pass\n"
    st = {u["path"]: u["state"] for u in json.loads(storm(repo, "status", "--json").stdout)["unmediated"]}
    assert st == {"src/api.py": "reverted"}
    r = storm(repo, "adopt", "gen/", "--agent", "engineer_2")
    assert r.returncode == 2 and "nothing to adopt under that directory" in r.stderr


def test_commit_points_an_untracked_secret_at_gitignore_and_never_adopts_it(repo):
    """An untracked .env is not part of the shared state; the commit's warning says to
    ignore it (never to --adopt it, which would commit the secret), --adopt leaves it
    out while recording the other edits, and git storm adopt PATH still records one
    on purpose."""
    (repo / ".env").write_text("API_KEY=s3cr3t\n")
    (repo / "keys").mkdir()
    (repo / "keys" / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (repo / ".env.example").write_text("API_KEY=\n")  # a template: an ordinary file
    r = storm(repo, "commit", "-m", "integrate", agent="manager")
    assert r.returncode == 0, r.stderr
    warnings = r.stderr.splitlines()
    [secrets] = [w for w in warnings if ".env," in w or ".env:" in w]
    assert "/.env /keys/deploy.pem" in secrets and ".gitignore" in secrets and "--adopt" not in secrets, secrets
    [others] = [w for w in warnings if w is not secrets and w.startswith("warning:")]
    assert ".env.example (added)" in others and "--adopt records them" in others and ".pem" not in others
    code, res = storm_json(repo, "commit", "-m", "integrate", "--adopt", agent="manager")
    assert code == 0, res
    assert res["adopted"] == [".env.example"]
    assert res["unmediated"] == [{"path": ".env", "state": "added", "likely_secret": True},
                                 {"path": "keys/deploy.pem", "state": "added", "likely_secret": True}]
    tree = git(repo, "ls-tree", "-r", "--name-only", "HEAD").stdout.decode().split()
    assert ".env.example" in tree and ".env" not in tree and "keys/deploy.pem" not in tree
    st = storm(repo, "status")
    assert "added:        .env  (looks like a secret: add /.env to .gitignore)" in st.stdout, st.stdout
    # the way the warning points: ignored, it is no longer anyone's unmediated edit
    (repo / ".gitignore").write_text("/.env\n/keys/deploy.pem\n")
    assert storm(repo, "adopt", ".gitignore", agent="manager").returncode == 0
    assert storm_json(repo, "status")[1]["unmediated"] == []
    # on purpose, by name: recorded
    (repo / "keys" / "ci.key").write_text("not really a secret\n")
    assert storm(repo, "adopt", "keys/ci.key", agent="manager").returncode == 0


@pytest.mark.parametrize("path,secret", [
    (".env", True), ("app/.env.local", True), (".env.example", False), ("config/.env.sample", False),
    ("config/secrets.yml", True), ("home/.ssh/id_ed25519", True), ("certs/server.KEY", True),
    ("src/key.py", False), ("keys/x.key.sample", False), ("README.md", False), ("env.py", False),
])
def test_which_names_count_as_secrets(path, secret):
    from storm_git.core.secret_files import likely_secret

    assert likely_secret(path) is secret
