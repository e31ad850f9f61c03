"""Through the real CLI: inputs storm must refuse cleanly (exit 2,
one line, nothing changed) and states that must never brick storm (a corrupt read
set, a reservation from a skewed clock, a ref lock dated in the future)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import pytest

from helpers import git, make_repo, rev, show, snapshot_refs, storm, storm_json
from storm_git.core.errors import UsageError


def _refused(r, code: int, *words: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _state(repo) -> tuple[str, str]:
    """Refs and the working tree (tracked, untracked and ignored files)."""
    return snapshot_refs(repo), git(repo, "status", "--porcelain", "--ignored", "-uall").stdout.decode()


def _storm_bytes(repo, *args: bytes, agent: str = "e1", input: bytes | None = None,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    """``git storm`` with raw bytes in argv (what a shell passes for non-UTF-8 text)."""
    e = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}
    e["STORM_AGENT"] = agent
    e.update(env or {})
    r = subprocess.run([sys.executable.encode(), b"-m", b"storm_git", *args], cwd=repo, input=input,
                       capture_output=True, env=e, timeout=60)
    r.stderr = r.stderr.decode("utf-8", "replace")
    r.stdout = r.stdout.decode("utf-8", "replace")
    return r


# -- agent ids: a full match ---------------------------------------------------------
@pytest.mark.parametrize("how", ["option", "environment"])
def test_agent_id_with_trailing_newline_is_refused(repo, how):
    before = _state(repo)
    if how == "option":
        r = storm(repo, "read", "README.md", "--agent", "e1\n")
    else:
        r = storm(repo, "read", "README.md", agent="e1\n")
    _refused(r, 2, "invalid agent id", "e1\\n")
    assert _state(repo) == before


def test_scope_globs_do_not_match_a_trailing_newline():
    from storm_git.coordination.assignments import matches

    assert matches("src/*.py", "src/a.py") and not matches("src/*.py", "src/a.py\n")


# -- names git refuses on Windows or macOS ------------------------------------------------
GIT_REFUSED = [
    ".git /x", ".git. /x", ".git .", "git~1/config", "GIT~1/config", "sub/Git~1 ./x",
    ".git::$INDEX_ALLOCATION/x", ".git:stream", "a/.GIT:x/y", "a\\.git\\config",
    ".g\u200cit/config", "src/.\u200dGIT/hooks/x", "\ufeff.git/x", ".git\u206f",
]


@pytest.mark.parametrize("path", GIT_REFUSED)
def test_names_git_refuses_anywhere_are_bad_paths(repo, path):
    # git itself refuses each of them (core.protectNTFS/protectHFS: Windows and macOS rules)
    blob = git(repo, "hash-object", "-w", "--stdin", input=b"x\n").stdout.decode().strip()
    g = git(repo, "-c", "core.protectNTFS=true", "-c", "core.protectHFS=true", "update-index", "--add",
            "--cacheinfo", f"100644,{blob},{path}", check=False)
    assert g.returncode != 0 and b"nvalid path" in g.stderr
    git(repo, "reset", "-q")
    before = _state(repo)
    _refused(storm(repo, "write", path, input="pwned\n", agent="e1"), 2, "refused")
    _refused(storm(repo, "read", path, agent="e1"), 2, "refused")
    assert _state(repo) == before


def test_ntfs_stream_names_are_refused_and_near_misses_accepted(repo):
    before = _state(repo)
    _refused(storm(repo, "write", "notes.txt::$DATA", input="x\n", agent="e1"), 2, "alternate data stream")
    assert _state(repo) == before
    for ok in ("git~2/x.txt", ".gitx/y.txt", "a.git/z.txt", ".github/w.txt"):
        r = storm(repo, "write", ok, input="fine\n", agent="e1")
        assert r.returncode == 0, (ok, r.stderr)
        assert show(repo, "refs/storm/workspace", ok) == b"fine\n"


# -- absolute paths -------------------------------------------------------------------------
def test_absolute_path_inside_the_tree_is_accepted(repo):
    target = str(repo / "src" / "api.py")
    r = storm(repo, "read", target, agent="e1")
    assert r.returncode == 0 and "src/api.py" in r.stderr
    r = storm(repo, "write", target, input="new api\n", agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"new api\n"
    # from a subdirectory, and with '..' that stays inside
    r = storm(repo / "src", "write", str(repo / "src" / ".." / "docs" / "n.md"), input="n\n", agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "docs/n.md") == b"n\n"


def test_absolute_path_through_a_symlinked_top_is_accepted(repo, tmp_path):
    link = tmp_path / "link-to-repo"
    os.symlink(repo, link)  # /tmp vs /private/tmp on macOS
    r = storm(repo, "write", str(link / "via_link.txt"), input="v\n", agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "via_link.txt") == b"v\n"
    r = storm(link, "write", str(repo / "via_real.txt"), input="r\n", agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "via_real.txt") == b"r\n"


@pytest.mark.parametrize("where", ["etc", "sibling", "dotdot", "prefix"])
def test_absolute_path_outside_the_tree_is_refused(repo, tmp_path, where):
    path = {"etc": "/etc/passwd", "sibling": str(tmp_path / "other.txt"),
            "dotdot": str(repo) + "/../escape.txt", "prefix": str(repo) + "-evil/x.txt"}[where]
    before = _state(repo)
    _refused(storm(repo, "write", path, input="x\n", agent="e1"), 2, "is outside the repository")
    assert _state(repo) == before and not (tmp_path / "other.txt").exists()
    assert not (tmp_path / "escape.txt").exists()


def test_absolute_path_inside_git_dir_is_refused(repo):
    before = _state(repo)
    _refused(storm(repo, "write", str(repo / ".git" / "config"), input="x", agent="e1"), 2, "inside .git")
    assert _state(repo) == before


# -- submodules -------------------------------------------------------------------------------
def _add_submodule(repo, tmp_path):
    sub = make_repo(tmp_path / "subsrc", {"lib.txt": "lib\n"}, init_storm=False)
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sm")
    git(repo, "commit", "--no-verify", "-qm", "add submodule")


def test_path_inside_a_submodule_on_disk(repo, tmp_path):
    _add_submodule(repo, tmp_path)  # on disk and in HEAD, not yet in the shared head
    before = _state(repo)
    for path in ("sm/x.txt", "sm/lib.txt"):
        line = _refused(storm(repo, "write", path, input="x\n", agent="e1"), 2)
        assert f"'{path}' is inside the submodule 'sm'; storm does not write inside submodules" in line
    for verb in ("write", "read"):  # the submodule itself: said so, not "a directory, not a file"
        line = _refused(storm(repo, verb, "sm", input="x\n", agent="e1"), 2)
        assert "'sm' is a submodule, not a file" in line, line
    assert _state(repo) == before and not (repo / "sm" / "x.txt").exists()


def test_path_inside_a_submodule_in_the_shared_tree(repo, tmp_path):
    _add_submodule(repo, tmp_path)
    git(repo, "update-ref", "refs/storm/workspace", "HEAD")
    git(repo, "submodule", "deinit", "-q", "-f", "sm")  # only the shared tree knows it now
    before = _state(repo)
    line = _refused(storm(repo, "write", "sm/x.txt", input="x\n", agent="e1"), 2)
    assert "'sm/x.txt' is inside the submodule 'sm'; storm does not write inside submodules" in line
    _refused(storm(repo, "read", "sm/lib.txt", agent="e1"), 2, "inside the submodule 'sm'")
    assert _state(repo) == before


# -- non-UTF-8 arguments -------------------------------------------------------------------------
@pytest.mark.parametrize("args,named", [
    ([b"write", b"README.md", b"-m", b"caf\xe9"], "-m"),
    ([b"write", b"README.md", b"--intent=caf\xe9"], "--intent"),
    ([b"edit", b"README.md", b"--old", b"# service", b"--new", b"\xff"], "--new"),
    ([b"edit", b"README.md", b"--old", b"\xfe", b"--new", b"x"], "--old"),
    ([b"write", b"caf\xe9.txt"], "argument"),
])
def test_non_utf8_arguments_are_refused_before_anything(repo, args, named):
    storm(repo, "read", "README.md", agent="e1")
    before = _state(repo)
    r = _storm_bytes(repo, *args, input=b"new\n")
    _refused(r, 2, "is not valid UTF-8", named, "nothing was run or changed")
    assert _state(repo) == before


def test_non_utf8_exec_argument_is_refused_before_the_command_runs(repo):
    before = _state(repo)
    r = _storm_bytes(repo, b"exec", b"--", b"sh", b"-c", b"touch ran; touch \"$0\"", b"caf\xe9")
    _refused(r, 2, "command argument", "is not valid UTF-8")
    assert not (repo / "ran").exists()
    assert _state(repo) == before


def test_non_utf8_file_name_for_file_option_is_allowed(repo, tmp_path):
    src = os.path.join(os.fsencode(tmp_path), b"in\xe9.txt")
    with open(src, "wb") as fh:
        fh.write(b"from a latin-1 named file\n")
    r = _storm_bytes(repo, b"write", b"new.txt", b"--file", src)
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "new.txt") == b"from a latin-1 named file\n"


# -- the size limit applies while reading -----------------------------------------------------------
def test_endless_stdin_is_refused_quickly(repo):
    git(repo, "config", "storm.maxFileBytes", "1k")
    before = _state(repo)
    env = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}
    env["STORM_AGENT"] = "e1"
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "storm_git", "write", "z"], cwd=repo, stdin=yes.stdout,
                           capture_output=True, env=env, timeout=60)
        took = time.monotonic() - started
    finally:
        yes.kill()
        yes.wait()
        yes.stdout.close()
    r.stderr = r.stderr.decode()
    _refused(r, 2, "stdin", "storm.maxFileBytes (1024 bytes)", "nothing was written")
    assert took < 20
    assert _state(repo) == before and not (repo / "z").exists()


def test_file_over_the_limit_is_refused(repo, tmp_path):
    git(repo, "config", "storm.maxFileBytes", "1k")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1025)
    before = _state(repo)
    _refused(storm(repo, "write", "z", "--file", str(big), agent="e1"), 2, "storm.maxFileBytes")
    with open(big, "rb") as fh:
        r = subprocess.run([sys.executable, "-m", "storm_git", "write", "z"], cwd=repo, stdin=fh,
                           capture_output=True, env={**os.environ, "STORM_AGENT": "e1"}, timeout=60)
    assert r.returncode == 2 and b"storm.maxFileBytes" in r.stderr
    assert _state(repo) == before
    big.write_bytes(b"x" * 1024)
    assert storm(repo, "write", "z", "--file", str(big), agent="e1").returncode == 0


# -- read --json is streamed, and unchanged ---------------------------------------------------------
def test_read_json_streams_the_same_document(repo, ws):
    files = {"t.txt": "héllo \"q\" \\ \t\x01 ✓\n".encode() * 50, "b.bin": bytes(range(256)) * 40,
             "z.txt": b"a\x00b", "bad.txt": b"\xff\xfe latin"}
    for name, data in files.items():
        assert storm(repo, "write", name, input=data, agent="e1").returncode == 0
    paths = list(files) + ["missing.txt"]
    r = storm(repo, "read", *paths, "--json", agent="e1")
    assert r.returncode == 0, r.stderr
    res = ws.read(paths, agent="e2")
    expected = json.dumps({"head": res[0].head, "files": [x.to_dict() for x in res]}, indent=2,
                          ensure_ascii=False) + "\n"
    assert r.stdout == expected


def test_large_file_round_trip_through_read_and_read_json(repo, tmp_path):
    from storm_git.core.store import BIG_BLOB_BYTES

    git(repo, "config", "storm.maxFileBytes", "64m")
    data = os.urandom(BIG_BLOB_BYTES + 12345)  # above the streamed-read threshold
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    assert storm(repo, "write", "big.bin", "--file", str(src), agent="e1").returncode == 0
    assert (repo / "big.bin").read_bytes() == data
    raw = subprocess.run([sys.executable, "-m", "storm_git", "read", "big.bin"], cwd=repo, capture_output=True,
                         env={**os.environ, "STORM_AGENT": "e1"}, timeout=120)
    assert raw.returncode == 0 and raw.stdout == data
    r = storm(repo, "read", "big.bin", "--json", agent="e1")
    doc = json.loads(r.stdout)
    assert base64.b64decode(doc["files"][0]["content_base64"]) == data and doc["files"][0]["content"] is None


# -- trailers cannot be forged -----------------------------------------------------------------------------
def test_intent_cannot_forge_storm_trailers(repo):
    storm(repo, "read", "README.md", agent="e1")
    intent = "fix\n\nStorm-Agent: spoof\nStorm-Op: rm\n---\nStorm-Agent: spoof2\n\nStorm-Agent: spoof3"
    r = storm(repo, "write", "README.md", "-m", intent, input="# x\n", agent="e1")
    assert r.returncode == 0, r.stderr
    code, log = storm_json(repo, "log")
    writes = [e for e in log if e.get("type") == "write"]
    assert writes[0]["agent"] == "e1" and writes[0]["op"] == "write" and writes[0]["paths"] == ["README.md"]
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout
    parsed = git(repo, "interpret-trailers", "--parse", input=msg).stdout.decode()
    assert "Storm-Agent: e1" in parsed and "spoof" not in parsed, parsed
    assert "Storm-Path: README.md" in parsed
    pretty = git(repo, "log", "-1", "--format=%(trailers:key=Storm-Agent,valueonly)", "refs/storm/workspace")
    assert pretty.stdout.decode().split() == ["e1"]


@pytest.mark.parametrize("field", ["agent", "op", "path"])
def test_format_message_refuses_control_characters(field):
    from storm_git.core.trailers import format_message

    args = {"agent": "e1", "op": "write", "path": "a.py"}
    args[field] += "\nStorm-Agent: spoof"
    with pytest.raises(UsageError, match="control character"):
        format_message("why", args["agent"], args["op"], [args["path"]])
    with pytest.raises(UsageError):
        format_message("why", "e1", "write", ["a\x1b[2Jb"])


# -- a corrupt read set bricks nothing ----------------------------------------------------------------------
def _plant_garbage_read_set(repo, agent: str) -> None:
    key = git(repo, "hash-object", "-w", "--stdin", input=f"storm read set: {agent}\n".encode()).stdout.decode().strip()
    git(repo, "notes", "--ref", f"refs/notes/storm/agents/{agent}", "add", "-f", "-F", "-", key,
        input=b"storm read set of x\nthis is not a read set\nzz yy README.md\n\xff\xfe\n")


def test_corrupt_read_set_is_named_reported_and_reset_by_forget(repo):
    storm(repo, "read", "README.md", agent="e1")
    storm(repo, "read", "src/api.py", agent="e2")
    _plant_garbage_read_set(repo, "e1")
    before = _state(repo)
    for args in (["read", "README.md"], ["write", "README.md"], ["rm", "README.md"],
                 ["edit", "README.md", "--old", "#", "--new", "##"], ["forget", "README.md"]):
        line = _refused(storm(repo, *args, input="x\n", agent="e1"), 3, "the read set of e1 is unreadable")
        assert "git storm forget --agent e1" in line and "git storm doctor --fix" in line
    assert _state(repo) == before
    # everyone else is unaffected, and status names the agent instead of failing
    assert storm(repo, "write", "src/api.py", input="e2\n", agent="e2").returncode == 0
    r = storm(repo, "status")
    assert r.returncode == 0 and "the read set of e1 is unreadable" in r.stdout
    code, st = storm_json(repo, "status")
    assert code == 0 and [a["agent"] for a in st["agents"]] == ["e2"]
    assert "e1" in st["corrupt_read_sets"][0]
    # the way out the message offers
    r = storm(repo, "forget", "--agent", "e1")
    assert r.returncode == 0, r.stderr
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
    assert storm(repo, "write", "README.md", input="# e1\n", agent="e1").returncode == 0
    assert "corrupt_read_sets" not in storm_json(repo, "status")[1]


def test_doctor_finds_and_fixes_a_corrupt_read_set(repo):
    storm(repo, "read", "README.md", agent="e1")
    assert storm(repo, "write", "README.md", input="# e1\n", agent="e1").returncode == 0
    assert storm(repo, "status").returncode == 0  # folds the journal the write's provenance points into
    folded = git(repo, "notes", "--ref", "refs/notes/storm/agents/e1", "list").stdout.decode()
    _plant_garbage_read_set(repo, "e1")
    code, rep = storm_json(repo, "doctor")
    found = [f for f in rep["findings"] if f["kind"] == "corrupt_read_set"]
    assert code == 3 and found and found[0]["what"] == "e1" and not found[0]["fixed"]
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and [f["fixed"] for f in rep["findings"] if f["kind"] == "corrupt_read_set"] == [True]
    assert storm_json(repo, "doctor")[1]["findings"] == []
    assert storm(repo, "read", "README.md", agent="e1").returncode == 0
    # the journal e1's write's provenance points into is history: kept, and it still resolves
    from storm_git.core import provenance
    from storm_git.core.store import Store

    journal_key = git(repo, "hash-object", "--stdin", input=b"storm journal: e1 none\n").stdout.decode().strip()
    assert journal_key in folded and journal_key in git(repo, "notes", "--ref", "refs/notes/storm/agents/e1",
                                                        "list").stdout.decode()
    commit = rev(repo, "refs/storm/workspace")
    header, entries = provenance.load(Store.discover(str(repo)), "e1", commit)
    assert header["validated-at"] == rev(repo, "refs/storm/workspace^") and [e.path for e in entries] == ["README.md"]


# -- a reservation from a skewed clock ----------------------------------------------------------------------
def test_reservation_from_a_skewed_clock_is_ignored_reported_and_removed(repo):
    storm(repo, "read", "src/api.py", agent="e1")
    storm(repo, "read", "src/api.py", agent="e2")
    assert storm(repo, "write", "src/api.py", input="e1\n", agent="e1").returncode == 0
    seventy_years = time.time() + 73 * 365 * 86400
    r = storm(repo, "write", "src/api.py", "--no-wait", input="e2\n", agent="e2",
              env={"STORM_TEST_NOW": str(seventy_years)})
    assert r.returncode == 1  # rejected; e2's reservation ends 73 years from now
    stored = git(repo, "ls-tree", "refs/storm/reservations").stdout
    assert stored
    code, rep = storm_json(repo, "doctor")
    skewed = [f for f in rep["findings"] if f["kind"] == "skewed_reservation"]
    assert code == 3 and skewed and skewed[0]["what"] == "src/api.py" and "e2" in skewed[0]["detail"]
    assert storm_json(repo, "status")[1]["reservations"] == []
    started = time.monotonic()
    r = storm(repo, "write", "src/api.py", "--no-wait", input="e1 again\n", agent="e1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - started < 10
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and all(f["fixed"] for f in rep["findings"] if f["kind"] == "skewed_reservation")
    assert git(repo, "ls-tree", "refs/storm/reservations").stdout == b""


# -- a ref lock dated in the future ------------------------------------------------------------------------------
def _future_lock(repo, ref: str = "refs/storm/workspace", ahead: float = 3600) -> str:
    lock = os.path.join(repo, ".git", *ref.split("/")) + ".lock"
    with open(lock, "w") as fh:
        fh.write("0" * 40 + "\n")
    t = time.time() + ahead
    os.utime(lock, (t, t))
    return lock


def test_future_dated_ref_lock_does_not_block_writers(repo):
    lock = _future_lock(repo)
    storm(repo, "read", "README.md", agent="e1")
    started = time.monotonic()
    r = storm(repo, "write", "README.md", input="# e1\n", agent="e1")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 8  # not the 10 s ref-lock patience, then Busy
    assert not os.path.exists(lock)
    assert show(repo, "refs/storm/workspace", "README.md") == b"# e1\n"


def test_doctor_reports_and_fixes_a_future_dated_ref_lock(repo):
    lock = _future_lock(repo)
    code, rep = storm_json(repo, "doctor")
    found = [f for f in rep["findings"] if f["kind"] == "stale_ref_lock"]
    assert code == 3 and found and "in the future" in found[0]["detail"] and os.path.exists(lock)
    code, rep = storm_json(repo, "doctor", "--fix")
    assert code == 0 and not os.path.exists(lock)


def test_a_lock_just_ahead_of_the_clock_is_left_alone(repo):
    lock = _future_lock(repo, ahead=2)  # within clock jitter: could be a live git's lock
    code, rep = storm_json(repo, "doctor", "--fix")
    assert not [f for f in rep["findings"] if f["kind"] == "stale_ref_lock"] and os.path.exists(lock)
    os.unlink(lock)


# -- a read of many paths checks each of them on disk (directories are looked at once) -----------
def test_a_batch_read_refuses_any_path_that_one_read_would_refuse(repo, tmp_path):
    from storm_git import open_workspace
    from storm_git.core.errors import BadPath

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.py").write_text("secret\n")
    os.symlink(tmp_path / "outside", repo / "link")
    ws = open_workspace(str(repo))
    before = _state(repo)
    cases = {  # each after paths that share its directory and passed
        "link/x.py": "symbolic link", "src/api.py/x": "is a file", "src": "is a directory",
    }
    for bad, why in cases.items():
        with pytest.raises(BadPath, match=why):
            ws.read(["src/util.py", "src/client.py", bad, "src/api.py"], agent="e1")
    assert _state(repo) == before and ws.read_set("e1") == {}
    # a directory missing on disk: every path below it is read from the shared tree
    res = ws.read(["gone/a.py", "gone/b.py", "src/api.py"], agent="e1")
    assert [(r.path, r.version is None) for r in res] == [("gone/a.py", True), ("gone/b.py", True),
                                                          ("src/api.py", False)]
