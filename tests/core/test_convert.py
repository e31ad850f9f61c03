"""git's content conversions at the boundary between the shared ref and the disk:
.gitattributes (text, eol, filter drivers) and core.autocrlf.

Storm stores what ``git add`` would store, writes what ``git checkout`` would write
and compares a file on disk with a version by the id ``git add`` would give it.
Before, a checked-out CRLF file was an "unmediated edit" that storm never brought
forward, and CRLF content written to a ``text`` file was stored as sent, so plain
git saw every such file modified."""
from __future__ import annotations

import os
import time
from pathlib import Path

from helpers import claude_event, decision, git, hook, make_repo, rev, show, snapshot_refs, storm, storm_json

CRLF_FILES = {
    ".gitattributes": "* text=auto\n*.bat text eol=crlf\n",
    "run.bat": b"echo 1\r\n",
    "notes.txt": "one\ntwo\nthree\n",
}


def _repo(tmp_path: Path, files: dict | None = None) -> Path:
    return make_repo(tmp_path / "repo", CRLF_FILES if files is None else files)


def _git_add_id(repo: Path, path: str, data: bytes) -> str:
    return git(repo, "hash-object", "--stdin", f"--path={path}", input=data).stdout.decode().strip()


def test_a_crlf_checkout_is_the_version_it_came_from_and_storm_brings_it_forward(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert (repo / "run.bat").read_bytes() == b"echo 1\r\n"  # git stored "echo 1\n"
    assert show(repo, "HEAD", "run.bat") == b"echo 1\n"
    code, st = storm_json(repo, "status")
    assert code == 0 and st["unmediated"] == []
    storm(repo, "read", "run.bat", agent="e1")
    code, out = storm_json(repo, "write", "run.bat", input="echo 2\n", agent="e1")
    assert code == 0 and out["accepted"]
    # before: {"run.bat": "kept-unmediated"}, and the disk kept "echo 1" for good
    assert out["disk"] == {"run.bat": "written"}
    assert (repo / "run.bat").read_bytes() == b"echo 2\r\n"  # as git checkout writes it
    assert show(repo, "refs/storm/workspace", "run.bat") == b"echo 2\n"
    code, st = storm_json(repo, "status")
    assert st["unmediated"] == []
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    assert git(repo, "status", "--porcelain").stdout == b""


def test_crlf_content_for_a_text_file_is_stored_as_git_add_would(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    storm(repo, "read", "notes.txt", agent="e1")
    sent = b"one\r\n2\r\nthree\r\n"
    code, out = storm_json(repo, "write", "notes.txt", input=sent, agent="e1")
    assert code == 0 and out["accepted"]
    assert show(repo, "refs/storm/workspace", "notes.txt") == b"one\n2\nthree\n"
    assert out["versions"]["notes.txt"] == _git_add_id(repo, "notes.txt", sent)
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    # before: " M notes.txt" for ever (the blob held CRLF, git add would store LF)
    assert git(repo, "status", "--porcelain").stdout == b""
    # the agent reads back the stored form, and its next write on it is valid
    code, got = storm_json(repo, "read", "notes.txt", agent="e1")
    assert got["files"][0]["content"] == "one\n2\nthree\n"
    assert storm(repo, "write", "notes.txt", input="one\n", agent="e1").returncode == 0


def test_a_persons_edit_of_a_crlf_file_is_unmediated_and_its_diff_is_the_edit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "run.bat").write_bytes(b"echo edited\r\n")
    code, st = storm_json(repo, "status", "-v")
    assert [u["path"] for u in st["unmediated"]] == ["run.bat"]
    diff = st["unmediated"][0]["diff"]
    assert "-echo 1\n" in diff and "+echo edited\n" in diff and "\r" not in diff
    # a storm write never overwrites it; adopting it stores what git add would
    code, out = storm_json(repo, "adopt", "run.bat", agent="e1")
    assert code == 0 and out["accepted"]
    assert show(repo, "refs/storm/workspace", "run.bat") == b"echo edited\n"
    assert (repo / "run.bat").read_bytes() == b"echo edited\r\n"
    assert storm_json(repo, "status")[1]["unmediated"] == []


def test_core_autocrlf_without_attributes(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.txt": "x\n"})
    git(repo, "config", "core.autocrlf", "true")
    storm(repo, "read", "a.txt", agent="e1")
    code, out = storm_json(repo, "write", "a.txt", input="y\r\nz\n", agent="e1")
    assert code == 0 and out["disk"] == {"a.txt": "written"}
    assert show(repo, "refs/storm/workspace", "a.txt") == b"y\nz\n"
    assert (repo / "a.txt").read_bytes() == b"y\r\nz\r\n"
    assert storm_json(repo, "status")[1]["unmediated"] == []
    # the LF file git left on disk before autocrlf was set is the same version too
    code, out = storm_json(repo, "write", "b.txt", input="new\n", agent="e1")
    assert out["disk"] == {"b.txt": "written"} and (repo / "b.txt").read_bytes() == b"new\r\n"


def test_a_gitattributes_written_through_storm_applies_to_the_next_write(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.cmd": "x\n"})
    storm(repo, "read", "a.cmd", agent="e1")
    assert storm(repo, "write", ".gitattributes", input="*.cmd text eol=crlf\n", agent="e1").returncode == 0
    code, out = storm_json(repo, "write", "a.cmd", input="y\n", agent="e1")
    assert code == 0 and out["disk"] == {"a.cmd": "written"}
    assert (repo / "a.cmd").read_bytes() == b"y\r\n"


ROT13 = "tr a-zA-Z n-za-mN-ZA-M"


def test_a_filter_driver_runs_as_git_runs_it(tmp_path: Path) -> None:
    """A driver from git config (git-lfs and git-crypt are such drivers): clean on the
    way in, smudge on the way out, as git add and git checkout run it."""
    repo = _repo(tmp_path, {".gitattributes": "*.sec filter=rot\n", "plain.txt": "p\n"})
    git(repo, "config", "filter.rot.clean", ROT13)
    git(repo, "config", "filter.rot.smudge", ROT13)
    code, out = storm_json(repo, "write", "s.sec", input="hello secret\n", agent="e1")
    assert code == 0 and out["disk"] == {"s.sec": "written"}
    assert show(repo, "refs/storm/workspace", "s.sec") == b"uryyb frperg\n"  # what git add stores
    assert (repo / "s.sec").read_bytes() == b"hello secret\n"  # what git checkout writes
    assert storm_json(repo, "status")[1]["unmediated"] == []
    (repo / "s.sec").write_bytes(b"hello edit\n")
    code, st = storm_json(repo, "status")
    assert [u["path"] for u in st["unmediated"]] == ["s.sec"]
    assert storm(repo, "adopt", "s.sec", agent="e1").returncode == 0
    assert show(repo, "refs/storm/workspace", "s.sec") == b"uryyb rqvg\n"
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    assert git(repo, "status", "--porcelain").stdout == b""


def test_a_required_filter_that_fails_refuses_the_write_and_changes_nothing(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {".gitattributes": "*.sec filter=broken\n", "plain.txt": "p\n"})
    git(repo, "config", "filter.broken.clean", "false")
    git(repo, "config", "filter.broken.required", "true")
    before = snapshot_refs(repo)
    r = storm(repo, "write", "s.sec", input="data\n", agent="e1")
    assert r.returncode == 3, r.stderr
    assert "filter" in r.stderr and "s.sec" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    code, out = storm_json(repo, "write", "s.sec", input="data\n", agent="e1")
    assert code == 3 and out["error"]["kind"] == "conversion_failed"
    assert snapshot_refs(repo) == before and not (repo / "s.sec").exists()


def test_a_repository_without_conversions_stores_and_writes_bytes_as_sent(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.txt": "x\n"})
    storm(repo, "read", "a.txt", agent="e1")
    sent = b"crlf stays\r\nbinary\x00too\r\n"
    assert storm(repo, "write", "a.txt", input=sent, agent="e1").returncode == 0
    assert show(repo, "refs/storm/workspace", "a.txt") == sent
    assert (repo / "a.txt").read_bytes() == sent
    assert rev(repo, "refs/storm/workspace") != rev(repo, "HEAD")


def test_an_agents_own_write_tool_on_a_crlf_file_is_recorded_as_git_add_would(tmp_path: Path) -> None:
    """Claude Code's Read and Write tools on a file git checks out with CRLF: the read
    is of the shared version (not of an "unmediated edit"), the write is stored with
    LF and the CRLF file the tool left on disk is that version."""
    repo = _repo(tmp_path)
    path = str(repo / "run.bat")
    w = {"file_path": path, "content": "echo 9\r\n"}
    assert decision(hook(repo, claude_event(repo, "A", "PostToolUse", "Read", {"file_path": path}, "r"))) is None
    assert decision(hook(repo, claude_event(repo, "A", "PreToolUse", "Write", w, "w1"))) is None
    (repo / "run.bat").write_bytes(b"echo 9\r\n")  # the tool's write
    assert decision(hook(repo, claude_event(repo, "A", "PostToolUse", "Write", w, "w1"))) is None
    assert show(repo, "refs/storm/workspace", "run.bat") == b"echo 9\n"
    assert (repo / "run.bat").read_bytes() == b"echo 9\r\n"
    assert storm_json(repo, "status")[1]["unmediated"] == []


def test_a_long_lived_process_sees_core_autocrlf_set_after_its_first_write(tmp_path: Path) -> None:
    """The Python API (and the MCP server) keep a Store open across writes: what storm
    learned about the repository's conversions is kept only while its config and
    info/attributes are unchanged."""
    from storm_git import open_workspace

    repo = _repo(tmp_path, {"a.txt": "x\n"})
    ws = open_workspace(str(repo))
    ws.read(["a.txt"], agent="e1")
    ws.write("a.txt", b"one\n", agent="e1")
    assert (repo / "a.txt").read_bytes() == b"one\n"
    git(repo, "config", "core.autocrlf", "true")
    ws.write("a.txt", b"two\n", agent="e1")
    assert (repo / "a.txt").read_bytes() == b"two\r\n"
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("*.txt -text\n")
    git(repo, "config", "core.autocrlf", "false")
    ws.checkout(["a.txt"])  # with -text the CRLF on disk is an edit (git status says so too): refused under it
    ws.write("a.txt", b"three\r\n", agent="e1")
    assert show(repo, "refs/storm/workspace", "a.txt") == b"three\r\n"  # -text: stored as sent


def test_a_working_tree_encoding_file_is_utf8_to_agents_and_utf16_on_disk(tmp_path: Path) -> None:
    """git stores a ``working-tree-encoding=UTF-16LE`` file as UTF-8 and checks it out
    as UTF-16: an agent reads and writes the UTF-8, the disk gets the UTF-16, and an
    edit made on disk by another tool is adopted as git add would store it."""
    repo = _repo(tmp_path, {".gitattributes": "*.u16 text working-tree-encoding=UTF-16LE\n",
                            "a.u16": "héllo\n".encode("utf-16-le")})
    assert show(repo, "HEAD", "a.u16") == "héllo\n".encode()
    assert storm_json(repo, "status")[1]["unmediated"] == []
    code, got = storm_json(repo, "read", "a.u16", agent="e1")
    assert got["files"][0]["content"] == "héllo\n"
    code, out = storm_json(repo, "write", "a.u16", input="wörld\n".encode(), agent="e1")
    assert code == 0 and out["disk"] == {"a.u16": "written"}
    assert show(repo, "refs/storm/workspace", "a.u16") == "wörld\n".encode()
    assert (repo / "a.u16").read_bytes() == "wörld\n".encode("utf-16-le")
    assert storm_json(repo, "status")[1]["unmediated"] == []
    (repo / "a.u16").write_bytes("xö\n".encode("utf-16-le"))
    assert storm(repo, "adopt", "a.u16", agent="e1").returncode == 0
    assert show(repo, "refs/storm/workspace", "a.u16") == "xö\n".encode()


# -- core.fileMode=false: a file system that keeps no exec bit ------------------------------
def _ls(repo: Path) -> dict[str, str]:
    out = git(repo, "ls-tree", "refs/storm/workspace").stdout.decode()
    return {line.split("\t")[1]: line.split()[0] for line in out.splitlines()}


def test_exec_bits_the_file_system_does_not_keep_are_not_edits(tmp_path: Path) -> None:
    """``git init`` sets core.fileMode=false on vfat, exFAT and some mounts, where every
    file may show as executable (or none): git then takes modes from the index.
    Before, storm took each flipped bit for an unmediated edit and never wrote the file."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "b.sh": "b\n"}, init_storm=False)
    git(repo, "update-index", "--chmod=+x", "b.sh")
    git(repo, "commit", "-qm", "b.sh is executable")
    assert storm(repo, "init").returncode == 0
    git(repo, "config", "core.fileMode", "false")
    (repo / "a.txt").chmod(0o755)
    (repo / "b.sh").chmod(0o644)
    assert git(repo, "status", "--porcelain").stdout == b""
    assert storm_json(repo, "status")[1]["unmediated"] == []
    storm(repo, "read", "a.txt", "b.sh", agent="e1")
    code, out = storm_json(repo, "write", "a.txt", input="new\n", agent="e1")
    assert code == 0 and out["disk"] == {"a.txt": "written"}  # before: kept-unmediated
    assert (repo / "a.txt").read_bytes() == b"new\n"
    # an edit of content is recorded with the mode the file had; a new file is not executable
    (repo / "b.sh").write_text("b2\n")
    (repo / "c.txt").write_text("c\n")
    (repo / "c.txt").chmod(0o755)
    assert storm(repo, "adopt", "b.sh", "c.txt", agent="e1").returncode == 0
    modes = _ls(repo)
    assert modes["b.sh"] == "100755" and modes["c.txt"] == "100644" and modes["a.txt"] == "100644"


def test_with_core_filemode_true_an_exec_bit_is_a_change(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.txt": "a\n"})
    (repo / "a.txt").chmod(0o755)
    code, st = storm_json(repo, "status")
    assert [(u["path"], u["state"]) for u in st["unmediated"]] == [("a.txt", "mode-changed")]
    assert storm(repo, "adopt", "a.txt", agent="e1").returncode == 0
    assert _ls(repo)["a.txt"] == "100755"


# -- core.ignoreCase=true: a file system that cannot tell README.md from readme.md ----------
def test_where_case_is_ignored_a_path_that_names_an_existing_file_in_another_case_is_refused(tmp_path: Path) -> None:
    """On macOS or Windows (``git init`` sets core.ignoreCase=true) README.md and
    readme.md are one file on disk: both in the shared tree would overwrite each other
    there. Such a write is refused (exit 2, nothing changed); the file system here is
    case-sensitive, so the setting is what the test changes."""
    repo = _repo(tmp_path, {"README.md": "a\n", "src/x.py": "x\n"})
    git(repo, "config", "core.ignoreCase", "true")
    before = snapshot_refs(repo)
    r = storm(repo, "write", "readme.md", input="b\n", agent="e1")
    assert r.returncode == 2 and "'readme.md' is 'README.md'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = storm(repo, "write", "Src/y.py", input="y\n", agent="e1")
    assert r.returncode == 2 and "'src/y.py'" in r.stderr, r.stderr
    code, out = storm_json(repo, "write", "SRC/x.py", input="y\n", agent="e1")
    assert code == 2 and out["error"]["kind"] == "bad_path"
    assert snapshot_refs(repo) == before and not (repo / "readme.md").exists()
    # a new name in another directory, and a rename that changes only the case, are fine
    assert storm(repo, "write", "src/X2.py", input="y\n", agent="e1").returncode == 0
    from storm_git import open_workspace

    ws = open_workspace(str(repo))
    ws.read(["README.md"], agent="e1")
    res = ws.apply("e1", {"README.md": None, "readme.md": b"a\n"}, intent="rename", deps=None, wait=True, op="write")
    assert res.accepted
    assert "readme.md" in _ls(repo) and "README.md" not in _ls(repo)


def test_where_case_matters_both_spellings_are_two_files(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"README.md": "a\n"})
    git(repo, "config", "core.ignoreCase", "false")
    assert storm(repo, "write", "readme.md", input="b\n", agent="e1").returncode == 0
    assert {"README.md", "readme.md"} <= set(_ls(repo))


# -- a sparse checkout: files git leaves off the disk ----------------------------------
def test_a_write_outside_the_sparse_checkout_says_so_and_leaves_the_disk_alone(tmp_path: Path) -> None:
    """A monorepo's sparse checkout keeps b/ off the disk. A write there lands in the
    shared tree; the disk stays sparse, and the answer says why (it said
    kept-unmediated, as if someone had edited the file). A file deleted inside the cone
    is still someone's edit."""
    repo = _repo(tmp_path, {"a/x": "1\n", "b/y": "2\n", "top.txt": "3\n"})
    git(repo, "sparse-checkout", "set", "a")
    assert not (repo / "b").exists()
    assert storm_json(repo, "status")[1]["unmediated"] == []
    storm(repo, "read", "b/y", "top.txt", agent="e1")
    code, out = storm_json(repo, "write", "b/y", input="22\n", agent="e1")
    assert code == 0 and out["disk"] == {"b/y": "outside-sparse-checkout"}
    assert show(repo, "refs/storm/workspace", "b/y") == b"22\n" and not (repo / "b").exists()
    (repo / "top.txt").unlink()
    code, out = storm(repo, "write", "top.txt", input="33\n", agent="e1").returncode, None
    assert code == 3  # a deletion made outside storm: refused, never written over
    assert storm(repo, "commit", "-m", "integrate", agent="manager").returncode == 0
    assert git(repo, "ls-files", "-t", "b/y").stdout.startswith(b"S ")  # still sparse for git


# -- core.symlinks=false: links checked out as plain files ---------------------------------
def test_where_links_are_plain_files_a_link_is_its_target_in_a_file(tmp_path: Path) -> None:
    """Where the file system takes no symbolic links (``git init`` sets core.symlinks=false)
    git checks a link out as a plain file holding its target and keeps it a link in the
    index. Before, storm took that file for an unmediated edit (mode-changed) and never
    wrote it; and it wrote links as links there."""
    from storm_git import open_workspace
    from storm_git.core.store import MODE_LINK

    repo = make_repo(tmp_path / "repo", {"target.txt": "t\n", "a.txt": "a\n"}, init_storm=False)
    (repo / "link").symlink_to("target.txt")
    git(repo, "add", "link")
    git(repo, "commit", "-qm", "a link")
    assert storm(repo, "init").returncode == 0
    git(repo, "config", "core.symlinks", "false")
    (repo / "link").unlink()
    (repo / "link").write_text("target.txt")  # as git checks it out there
    assert storm_json(repo, "status")[1]["unmediated"] == []
    ws = open_workspace(str(repo))
    ws.read(["link"], agent="e1")
    res = ws.apply("e1", {"link": (b"a.txt", MODE_LINK)}, intent="retarget", deps=None, wait=True, op="write")
    assert res.accepted and res.disk == {"link": "written"}
    assert not (repo / "link").is_symlink() and (repo / "link").read_text() == "a.txt"
    assert storm_json(repo, "status")[1]["unmediated"] == []
    # an edit of the stand-in file is a new target, recorded as a link (git add's rule)
    (repo / "link").write_text("elsewhere.txt")
    assert storm(repo, "adopt", "link", agent="e1").returncode == 0
    assert _ls(repo)["link"] == "120000"
    assert show(repo, "refs/storm/workspace", "link") == b"elsewhere.txt"


def test_where_links_are_links_a_plain_file_in_place_of_one_is_a_change(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"target.txt": "t\n"}, init_storm=False)
    (repo / "link").symlink_to("target.txt")
    git(repo, "add", "link")
    git(repo, "commit", "-qm", "a link")
    assert storm(repo, "init").returncode == 0
    (repo / "link").unlink()
    (repo / "link").write_text("target.txt")
    code, st = storm_json(repo, "status")
    assert [(u["path"], u["state"]) for u in st["unmediated"]] == [("link", "mode-changed")]


def test_adopting_a_file_whose_required_filter_fails_says_so(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {".gitattributes": "*.sec filter=broken\n", "plain.txt": "p\n"})
    git(repo, "config", "filter.broken.clean", "false")
    git(repo, "config", "filter.broken.required", "true")
    (repo / "s.sec").write_text("data\n")
    before = snapshot_refs(repo)
    code, out = storm_json(repo, "adopt", "s.sec", agent="e1")
    assert code == 3 and out["error"]["kind"] == "conversion_failed", out
    assert "s.sec" in out["error"]["message"] and "filter" in out["error"]["message"]
    assert snapshot_refs(repo) == before


def test_two_writers_creating_one_name_in_two_cases_at_once_land_one(tmp_path: Path) -> None:
    """The case check runs under the workspace lock, on the head the write lands on:
    two writers that both found neither spelling, held at the lock until both wait
    there, cannot both land (before the lock, each saw a tree without the other)."""
    from helpers import STORM_LOCKS, hold, release, start_write

    repo = _repo(tmp_path, {"a.txt": "a\n"})
    git(repo, "config", "core.ignoreCase", "true")
    holder = hold(repo, "workspace")
    try:
        procs = [start_write(repo, "e1", "Notes.md", "one\n", "--json"),
                 start_write(repo, "e2", "notes.md", "two\n", "--json")]
        lock = str(repo / STORM_LOCKS / "workspace")
        deadline = time.monotonic() + 60
        while not all(_has_open(p.pid, lock) for p in procs):  # both opened the lock: at flock
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
    finally:
        release(holder)
    codes = sorted(p.wait(timeout=120) for p in procs)
    assert codes == [0, 2], [p.communicate() for p in procs]
    names = {n for n in _ls(repo) if n.lower() == "notes.md"}
    assert len(names) == 1


def _has_open(pid: int, path: str) -> bool:
    """Whether process ``pid`` holds a descriptor on ``path`` (a writer about to flock it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            pass
    return False


def test_under_a_filter_driver_agents_get_the_file_that_write_takes_back(tmp_path: Path) -> None:
    """read gave the stored form (an LFS pointer, git-crypt ciphertext), while write
    runs the clean filter on what it is sent: an agent that wrote back what it read
    had it cleaned twice (the file changed), and edit applied its change to the
    stored form and cleaned that (the file destroyed)."""
    repo = _repo(tmp_path, {".gitattributes": "*.sec filter=rot\n", "plain.txt": "p\n"})
    git(repo, "config", "filter.rot.clean", ROT13)
    git(repo, "config", "filter.rot.smudge", ROT13)
    assert storm(repo, "write", "s.sec", input="hello secret\n", agent="e1").returncode == 0
    stored = show(repo, "refs/storm/workspace", "s.sec")
    assert stored == b"uryyb frperg\n"

    r = storm(repo, "read", "s.sec", agent="e2")
    assert r.returncode == 0 and r.stdout == "hello secret\n", r.stdout
    code, out = storm_json(repo, "write", "s.sec", input=r.stdout, agent="e2")  # back, unchanged
    assert code == 0 and show(repo, "refs/storm/workspace", "s.sec") == stored, out

    r = storm(repo, "edit", "s.sec", "--old", "hello", "--new", "goodbye", agent="e2")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "s.sec") == b"tbbqolr frperg\n"  # rot13 of the edit
    assert (repo / "s.sec").read_bytes() == b"goodbye secret\n"

    # e1 last read nothing of it since: its write is refused with the file as agents see it
    code, out = storm_json(repo, "write", "s.sec", input="hello again\n", agent="e1")
    assert code == 1 and out["rejection"]["current_content"] == "goodbye secret\n", out
    diff = out["rejection"]["diff"]
    assert "+goodbye secret" in diff and "-hello secret" in diff, diff
