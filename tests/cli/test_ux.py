"""A new user's first hour: the log, help, reservations, rejection text,
exit codes and write's handling of stdin, through the real command line."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, git, ok as _ok, snapshot_refs, storm, storm_json

DATED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S")


def _run(cwd: Path, *args: str, stdin, agent: str = "e1", timeout: float = 60) -> subprocess.CompletedProcess:
    """``git storm ARGS`` with a given stdin (a file descriptor, DEVNULL...)."""
    env = dict(os.environ, STORM_AGENT=agent)
    return subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, stdin=stdin,
                          capture_output=True, text=True, env=env, timeout=timeout)


# -- the log --------------------------------------------------------------------------
def test_log_works_after_a_worktree_mode_commit_and_back_in_storm_mode(repo):
    _ok(storm(repo, "mode", "worktree"))
    _ok(storm(repo, "spawn", "e1"))
    _ok(storm(repo, "write", "src/util.py", input="def clamp(x):\n    return x\n", agent="e1"))
    c = _ok(storm(repo, "commit", "--agent", "e1", "-m", "e1: simpler clamp"))
    r = _ok(storm(repo, "log"))
    assert "on storm/e1: 1 write(s), paths src/util.py" in r.stdout
    assert "src/util.py  in its worktree" in r.stdout
    _ok(storm(repo, "merge"))
    _ok(storm(repo, "mode", "storm"))
    r = _ok(storm(repo, "log"))
    lines = r.stdout.splitlines()
    assert lines and all(DATED.match(ln) for ln in lines), r.stdout
    assert "{'" not in r.stdout and "{\"" not in r.stdout  # no raw dicts
    assert any(" mode " in ln and "worktree -> storm" in ln for ln in lines)
    assert any(" commit " in ln and "on storm/e1" in ln for ln in lines), c.stdout


def test_log_lists_a_rejection_before_the_retry_that_fixed_it(repo):
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    _ok(storm(repo, "read", "src/api.py", agent="e2"))
    _ok(storm(repo, "write", "src/api.py", input="one\n", agent="e2"))
    assert storm(repo, "write", "src/api.py", input="two\n", agent="e1").returncode == 1
    _ok(storm(repo, "write", "src/api.py", input="one\ntwo\n", agent="e1"))
    _, entries = storm_json(repo, "log")
    got = [(e["type"], e["agent"]) for e in entries[:3]]
    assert got == [("write", "e1"), ("rejection", "e1"), ("write", "e2")], entries[:3]
    times = [e["time"] for e in entries]
    assert times == sorted(times, reverse=True)
    # writes carry their exact time (a Storm-Time trailer), not git's whole seconds
    msg = git(repo, "log", "-1", "--format=%B", "refs/storm/workspace").stdout.decode()
    assert re.search(r"^Storm-Time: \d+\.\d{6}$", msg, re.M), msg
    lines = _ok(storm(repo, "log")).stdout.splitlines()
    assert "write" in lines[0] and "e1" in lines[0]
    assert "reject" in lines[1] and "direct_conflict: src/api.py" in lines[1]


def test_log_merge_keeps_each_chains_order_and_is_stable():
    from storm_git.core.events import merge_newest_first

    writes = [{"n": "w3", "time": 5.0}, {"n": "w2", "time": 6.0}, {"n": "w1", "time": 2.0}]  # clock stepped back
    events = [{"n": "e2", "time": 5.0}, {"n": "e1", "time": 3.0}]
    got = [e["n"] for e in merge_newest_first(writes, events, limit=10)]
    assert got.index("w3") < got.index("w2") < got.index("w1")  # a chain's own order is kept
    assert got.index("e2") < got.index("e1")
    assert got.index("w3") < got.index("e2")  # equal times: writes first, every time
    assert [e["n"] for e in merge_newest_first(writes, events, limit=2)] == got[:2]


def test_log_renders_every_event_type_on_one_dated_line(repo):
    _ok(storm(repo, "assign", "e1", "-f", "src/api.py"))
    _ok(storm(repo, "read", "src/api.py", "src/util.py", agent="e1"))
    _ok(storm(repo, "read", "src/util.py", agent="e2"))
    _ok(storm(repo, "write", "src/util.py", input="u\n", agent="e1"))  # outside e1's set: boundary
    assert storm(repo, "write", "src/util.py", input="v\n", agent="e2").returncode == 1  # rejection
    _ok(storm(repo, "release", "src/util.py", agent="e2"))
    _ok(storm(repo, "commit", "-m", "integrate", agent="manager"))
    _ok(storm(repo, "mode", "worktree"))
    _ok(storm(repo, "spawn", "e3"))
    _ok(storm(repo, "write", "README.md", input="# e3\n", agent="e3"))
    _ok(storm(repo, "commit", "--agent", "e3", "-m", "e3: readme"))
    _ok(storm(repo, "merge"))
    _ok(storm(repo, "cleanup", "--merged"))
    _ok(storm(repo, "mode", "storm"))
    _, entries = storm_json(repo, "log", "-n", "100")
    kinds = {e["type"] for e in entries}
    assert {"assign", "boundary", "rejection", "release", "commit", "mode", "spawn", "write", "merge",
            "cleanup"} <= kinds, kinds
    text = _ok(storm(repo, "log", "-n", "100")).stdout
    lines = text.splitlines()
    assert len(lines) == len(entries)
    assert all(DATED.match(ln) for ln in lines), text
    assert "{" not in text
    expect = {
        "assign": "e1: src/api.py",
        "boundary": "wrote outside its assignment: src/util.py",
        "release": "src/util.py",
        "mode": "storm -> worktree (target main)",
        "spawn": "storm/e3 at",
        "merge": "storm/e3 into main: merged",
        "cleanup": "removed 1 (e3)",
    }
    for kind, fragment in expect.items():
        assert any(f" {kind} " in ln and fragment in ln for ln in lines), (kind, text)
    assert any(" commit " in ln and "1 write(s) by e1" in ln for ln in lines), text  # the manager's
    assert any(" commit " in ln and "on storm/e3" in ln for ln in lines), text  # an engineer's


def test_log_shows_an_entry_storm_did_not_write_instead_of_failing(repo):
    """refs/storm/log is a ref anyone can move: an entry with a non-numeric time was an
    internal error of 'log' (float('soon')); one with other types crashed the renderers."""
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    _ok(storm(repo, "write", "src/api.py", input="u\n", agent="e1"))
    assert storm(repo, "write", "src/util.py", input="v\n", agent="e2").returncode == 1  # a real rejection
    empty = git(repo, "hash-object", "-t", "tree", "-w", "--stdin", input=b"").stdout.decode().strip()
    parent = git(repo, "rev-parse", "refs/storm/log").stdout.decode().strip()
    for body in ('{"type": "rejection", "agent": "e9", "time": "soon"}', '{"type": 5, "agent": null}',
                 '{"type": "rejection", "agent": "e9", "time": NaN}', "[1, 2]", "{not json"):
        c = git(repo, "commit-tree", empty, "-p", parent, "-m", "hand-made", "-m", body).stdout.decode().strip()
        git(repo, "update-ref", "refs/storm/log", c)
        parent = c
        r = storm(repo, "log", "-n", "20")
        assert r.returncode == 0 and "Traceback" not in r.stderr, (body, r.stderr)
        assert all(DATED.match(ln) for ln in r.stdout.splitlines()), r.stdout
        code, entries = storm_json(repo, "log", "-n", "20")
        assert code == 0 and any(e["type"] == "rejection" and e["agent"] == "e2" for e in entries)
        assert all(isinstance(e["time"], (int, float)) for e in entries)
    assert sum(e["type"] == "unreadable" for e in entries) == 3, entries


# -- help and exit codes -----------------------------------------------------------------
def test_git_storm_alone_prints_the_normal_help_and_exits_0(repo):
    """Chosen: `git storm` with no command is a request for help (exit 0, stdout),
    like `git storm -h`, not a usage error."""
    r = storm(repo)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == storm(repo, "-h").stdout
    assert r.stdout.startswith("Usage: git storm") and len(r.stdout.splitlines()) > 20
    assert "\nAgent verbs (" in r.stdout  # the command list, in sections


def test_exit_codes_agree_in_help_readme_and_man_page(repo):
    help_text = storm(repo, "-h").stdout
    codes = dict(re.findall(r"^\s+([0-4])\s+(.+)$", help_text.split("Exit codes:")[1], re.M))
    assert sorted(codes) == ["0", "1", "2", "3", "4"] and "internal error" in codes["4"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    for n, word in [("0", "ok"), ("1", "write rejected"), ("2", "bad input"), ("3", "repository state"),
                    ("4", "internal error")]:
        assert f"`{n}` {word}" in readme, n
        assert word in codes[n]
    man = (ROOT / "man" / "git-storm.1").read_text()
    assert "4 internal error" in man.split(".SH EXIT STATUS")[1]


def test_every_command_takes_json_as_the_readme_says(repo):
    sections = _help_sections(storm(repo, "-h").stdout)
    commands = [name for s in HELP_SECTIONS for name in sections[s]]
    assert "hook" in commands
    for cmd in commands:
        help_ = storm(repo, cmd, "-h").stdout
        if "Commands:" in help_:  # a group: each subcommand, except the harness's hook (its
            # stdout is the harness's own JSON protocol, it has no other output)
            subs = [ln.split()[0] for ln in help_.split("Commands:")[1].splitlines() if ln.strip()]
            for sub in subs:
                if (cmd, sub) != ("harness", "hook"):
                    assert "--json" in storm(repo, cmd, sub, "-h").stdout, (cmd, sub)
            continue
        assert "--json" in help_, cmd
    code, out = storm_json(repo, "hook", "pre-commit")
    assert code == 0 and out == {"hook": "pre-commit", "allowed": True, "exit_code": 0, "message": ""}
    code, out = storm_json(repo, "hook", "pre-commit", agent="e1")  # an engineer may not git commit
    assert code == 1 and out["allowed"] is False and "engineer" in out["message"]


# -- reservations ----------------------------------------------------------------------
def test_unread_target_gives_no_reservation_so_a_proper_reader_is_not_held_up(repo):
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = storm(repo, "write", "src/api.py", input="blind\n", agent="e2")
    assert r.returncode == 1 and "unread_target" in r.stdout and "holds" not in r.stdout
    _, st = storm_json(repo, "status")
    assert st["reservations"] == []
    t0 = time.monotonic()
    code, res = storm_json(repo, "write", "src/api.py", "--no-wait", input="read first\n", agent="e1")
    assert code == 0 and res["accepted"] and res["reservation_wait"] is None
    assert time.monotonic() - t0 < 10


def test_conflicts_still_reserve(repo):
    _ok(storm(repo, "read", "src/api.py", "src/util.py", agent="e1"))
    _ok(storm(repo, "read", "src/api.py", "src/util.py", agent="e2"))
    _ok(storm(repo, "write", "src/api.py", input="a\n", agent="e2"))
    code, res = storm_json(repo, "write", "src/api.py", input="b\n", agent="e1")
    assert code == 1 and res["rejection"]["reason"] == "direct_conflict"
    assert res["rejection"]["reservation"]["holder"] == "e1"
    code, res = storm_json(repo, "write", "src/client.py", input="c\n", agent="e2")
    assert code == 1 and res["rejection"]["reason"] == "unread_target" and res["rejection"]["reservation"] is None
    _ok(storm(repo, "write", "src/util.py", input="u\n", agent="e2"))
    code, res = storm_json(repo, "write", "src/new.py", input="n\n", agent="e1")  # e1's util.py is stale
    assert code == 1 and res["rejection"]["reason"] == "stale_dependency"
    assert res["rejection"]["reservation"] is None  # a path absent at the head holds nobody's work
    _, st = storm_json(repo, "status")
    assert {(r["path"], r["holder"]) for r in st["reservations"]} == {("src/api.py", "e1")}


def test_a_writer_waiting_for_a_reservation_says_whose_on_what_and_reports_it(repo):
    git(repo, "config", "storm.reservationSeconds", "4")
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    _ok(storm(repo, "read", "src/api.py", agent="e2"))
    _ok(storm(repo, "write", "src/api.py", input="e1\n", agent="e1"))
    assert storm(repo, "write", "src/api.py", input="e2\n", agent="e2").returncode == 1  # e2 holds it now
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = storm(repo, "write", "src/api.py", "--json", input="e1 again\n", agent="e1")
    assert r.returncode == 0, r.stderr
    waits = [ln for ln in r.stderr.splitlines() if "reserved" in ln]
    assert len(waits) == 1, r.stderr  # once per wait, not once per poll
    assert "src/api.py is reserved by e2" in waits[0] and re.search(r"at most \d+s", waits[0])
    import json

    rw = json.loads(r.stdout)["reservation_wait"]
    assert rw["holder"] == "e2" and rw["path"] == "src/api.py" and 0.05 < rw["seconds"] < 5.5
    # the human line names it too
    assert storm(repo, "write", "src/api.py", input="e2 retry\n", agent="e2").returncode == 1
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = _ok(storm(repo, "write", "src/api.py", input="e1 third\n", agent="e1"))
    assert re.search(r"waited \d+\.\ds for e2's reservation on src/api.py", r.stdout), r.stdout


def test_library_on_wait_is_called_once_per_wait_and_never_prints(repo, ws, capfd):
    git(repo, "config", "storm.reservationSeconds", "1")
    ws.read(["src/api.py"], agent="e1")
    ws.read(["src/api.py"], agent="e2")
    assert ws.write("src/api.py", b"1\n", agent="e1").accepted
    assert not ws.write("src/api.py", b"2\n", agent="e2").accepted  # e2 holds it for 1 s
    ws.read(["src/api.py"], agent="e1")
    seen = []
    res = ws.write("src/api.py", b"3\n", agent="e1", on_wait=seen.append)
    assert res.accepted and [(r.holder, r.path) for r in seen] == [("e2", "src/api.py")]
    assert res.reservation_wait.holder == "e2" and 0.2 < res.reservation_wait.seconds <= res.waited
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def _hold_lock(lock: Path, ready: Path, seconds: float) -> subprocess.Popen:
    """Another process holds storm's workspace lock for ``seconds`` (a writer mid-write)."""
    p = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, time, pathlib\n"
        f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep({seconds})\n")])
    for _ in range(3000):
        if ready.exists():
            return p
        time.sleep(0.01)
    raise AssertionError("the lock holder did not start")


def test_waiting_for_storms_lock_is_not_called_a_reservation(repo, tmp_path):
    import json

    lock = repo / ".git" / "storm" / "locks" / "workspace"
    assert lock.exists()
    holder = _hold_lock(lock, tmp_path / "one", 3)
    try:
        r = storm(repo, "write", "new.txt", "--json", input="x\n", agent="e1")
    finally:
        holder.wait(timeout=30)
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["waited"] >= 0.3, res  # it did wait, for the lock
    assert res["reservation_wait"] is None and "reserved" not in r.stderr
    holder = _hold_lock(lock, tmp_path / "two", 3)
    try:
        r = _ok(storm(repo, "write", "new2.txt", input="y\n", agent="e1"))
    finally:
        holder.wait(timeout=30)
    assert "reservation" not in r.stdout, r.stdout


# -- rejection text --------------------------------------------------------------------
def test_rejection_for_a_file_never_read_gives_it_plainly_without_a_fake_diff(repo):
    r = storm(repo, "write", "src/api.py", input="blind\n", agent="e2")
    assert r.returncode == 1
    assert "you never read src/api.py; here it is" in r.stdout
    assert "def fetch(url):" in r.stdout
    assert ": read " not in r.stdout and "+++ " not in r.stdout
    assert "/dev/null" not in r.stdout and "version(s) behind" not in r.stdout
    _, res = storm_json(repo, "write", "src/util.py", input="blind\n", agent="e3")
    rej = res["rejection"]
    assert rej["never_read"] is True and rej["diff"] == "" and rej["current_content"].startswith("def clamp")


def test_stale_dependency_does_not_show_the_unchanged_target_as_a_change(repo):
    _ok(storm(repo, "read", "src/api.py", "src/util.py", agent="e1"))
    _ok(storm(repo, "read", "src/util.py", agent="e2"))
    _ok(storm(repo, "write", "src/util.py", input="changed\n", agent="e2"))
    r = storm(repo, "write", "src/api.py", input="mine\n", agent="e1")
    assert r.returncode == 1 and "stale_dependency" in r.stdout
    assert "target src/api.py" not in r.stdout and "changed by unknown" not in r.stdout
    assert "stale dependency src/util.py" in r.stdout and "+changed" in r.stdout


def test_exec_conflict_on_a_file_never_read_shows_its_content_not_a_diff_from_nothing(repo, tmp_path):
    go, started = tmp_path / "go", tmp_path / "started"
    script = (f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; echo 'by exec' > src/api.py")
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "exec", "--no-wait", "--", "sh", "-c", script],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, STORM_AGENT="e2"))
    for _ in range(3000):
        if started.exists():
            break
        time.sleep(0.01)
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    _ok(storm(repo, "write", "src/api.py", input="e1's version\n", agent="e1"))
    go.touch()
    out, err = proc.communicate(timeout=120)
    text = out + err
    assert proc.returncode == 1, text
    # the command's edit started from the version on disk: the diff is from that version
    assert "direct_conflict" in text and "src/api.py was changed by e1 while e2's command ran" in text
    assert "+e1's version" in text and "-    return http_get(url)" in text
    assert "/dev/null" not in text and "read absent" not in text


# -- read and write at the terminal ------------------------------------------------------
def test_read_of_a_missing_file_says_not_found_on_stderr(repo):
    r = storm(repo, "read", "nope.txt", agent="e1")
    assert r.returncode == 0 and r.stdout == ""
    assert "nope.txt: not found in the shared workspace" in r.stderr
    # why the absence is recorded: creating it is validated against it
    assert "recorded as absent: creating it is validated against its absence" in r.stderr


def test_forget_for_an_agent_storm_never_saw_says_so_and_creates_nothing(repo):
    locks = repo / ".git" / "storm" / "locks"
    before = sorted(os.listdir(locks)) if locks.exists() else []
    r = storm(repo, "forget", agent="nobody")
    assert r.returncode == 0 and "nobody has no read set: storm has not seen this agent" in r.stdout, r.stdout
    assert (sorted(os.listdir(locks)) if locks.exists() else []) == before
    code, out = storm_json(repo, "forget", agent="nobody")
    assert code == 0 and out == {"forgotten": [], "known_agent": False}
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = storm(repo, "forget", agent="e1")
    assert r.returncode == 0 and r.stdout.startswith("forgot 1 path(s): src/api.py"), r.stdout


def test_write_refuses_an_interactive_terminal_on_stdin(repo):
    before = snapshot_refs(repo)
    master, slave = os.openpty()
    try:
        r = _run(repo, "write", "src/api.py", stdin=slave, timeout=30)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "give the content on stdin or with --file" in r.stderr and len(r.stderr.splitlines()) == 1
    assert snapshot_refs(repo) == before


@pytest.mark.parametrize("stdin", ["/dev/null", "a pipe closed at once"])
@pytest.mark.parametrize("mode", ["storm", "worktree"])
def test_an_empty_stdin_never_empties_a_file_that_holds_content(repo, stdin, mode):
    """``git storm write F < /dev/null`` (or ``true | git storm write F``) on a file
    the agent read: refused, exit 2, one line, nothing changed."""
    if mode == "worktree":
        _ok(storm(repo, "mode", "worktree"))
        _ok(storm(repo, "spawn", "e1"))
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    target = repo / "src/api.py" if mode == "storm" else Path(
        json.loads(_ok(storm(repo, "status", "--json")).stdout)["worktrees"][0]["path"]) / "src/api.py"
    before, content = snapshot_refs(repo), target.read_bytes()
    if stdin == "/dev/null":
        r = _run(repo, "write", "src/api.py", stdin=subprocess.DEVNULL)
    else:
        r = subprocess.run(f"true | {shlex.quote(sys.executable)} -m storm_git write src/api.py", shell=True, cwd=repo,
                           capture_output=True, text=True, env=dict(os.environ, STORM_AGENT="e1"), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and f"src/api.py holds {len(content)} bytes" in r.stderr, r.stderr
    assert "--allow-empty" in r.stderr
    assert snapshot_refs(repo) == before and target.read_bytes() == content and content


def test_an_empty_stdin_creates_an_empty_new_file_and_an_empty_file_by_name_is_written(repo, tmp_path):
    r = _ok(_run(repo, "write", "src/new.py", stdin=subprocess.DEVNULL))  # nothing to lose
    assert (repo / "src/new.py").read_bytes() == b"" and "now empty" in r.stderr
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    (tmp_path / "empty").write_bytes(b"")
    _ok(_run(repo, "write", "src/api.py", "--file", str(tmp_path / "empty"), stdin=subprocess.DEVNULL))
    assert (repo / "src/api.py").read_bytes() == b""


def test_write_of_empty_stdin_says_the_file_is_now_empty(repo):
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = _ok(_run(repo, "write", "src/api.py", "--allow-empty", stdin=subprocess.DEVNULL))
    assert "wrote 0 bytes to src/api.py (the file is now empty)" in r.stderr
    assert "0 bytes" in r.stdout
    assert (repo / "src" / "api.py").read_bytes() == b""


def test_accepted_write_and_edit_say_the_byte_count(repo):
    _ok(storm(repo, "read", "src/api.py", agent="e1"))
    r = _ok(storm(repo, "write", "src/api.py", input="hello\n", agent="e1"))
    assert "src/api.py -> " in r.stdout and ", 6 bytes" in r.stdout
    r = _ok(storm(repo, "edit", "src/api.py", "--old", "hello", "--new", "hi", agent="e1"))
    assert ", 3 bytes" in r.stdout


def test_a_lock_held_too_long_is_named_and_given_up_on(repo, tmp_path):
    """Another process sits on storm's workspace lock (a hook waiting for input, a
    stopped job). A command must not wait silently forever: it says who holds it,
    gives up after storm.lockTimeout (exit 3, busy), and changes nothing; with
    time left it goes on once the lock is free."""
    from helpers import hold

    git(repo, "config", "storm.lockTimeout", "1.5")
    holder = hold(repo, "workspace", seconds=60)
    try:
        before = snapshot_refs(repo)
        t = time.monotonic()
        r = storm(repo, "write", "new.txt", "--json", input="x\n", agent="e1")
        took = time.monotonic() - t
        assert r.returncode == 3, (r.stdout, r.stderr)
        err = json.loads(r.stdout)["error"]
        assert err["kind"] == "busy" and f"pid {holder.pid}" in err["message"] and "flock" in err["message"]
        assert "storm.lockTimeout" in err["hint"]
        assert 1.5 <= took < 15 and snapshot_refs(repo) == before and not (repo / "new.txt").exists()
        r = storm(repo, "write", "new.txt", input="x\n", agent="e1")
        assert r.returncode == 3 and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    # time left: the command says who it waits for, then goes on
    git(repo, "config", "storm.lockTimeout", "60")
    holder = hold(repo, "workspace", seconds=4.5)
    try:
        r = storm(repo, "write", "new.txt", input="x\n", agent="e1")
    finally:
        holder.wait()
    assert r.returncode == 0, r.stderr
    assert f"waiting for storm's workspace lock, held by pid {holder.pid}" in r.stderr


def test_a_harness_edit_storm_cannot_check_in_time_is_denied_not_let_through(repo):
    """A pre-edit hook that cannot take storm's lock in time denies the edit (the model
    retries) instead of exiting 1, which the harness treats as 'go on unchecked'."""
    from helpers import hold

    git(repo, "config", "storm.lockTimeout", "1")
    path = str(repo / "src/api.py")
    event = {"session_id": "s", "transcript_path": "/t", "cwd": str(repo), "permission_mode": "default",
             "hook_event_name": "PreToolUse", "tool_name": "Edit", "tool_use_id": "u1",
             "tool_input": {"file_path": path, "old_string": "url", "new_string": "uri", "replace_all": False}}
    holder = hold(repo, "workspace", seconds=60)
    try:
        r = storm(repo, "harness", "hook", "-a", "e1", input=json.dumps(event))
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "could not check this Edit" in spec["permissionDecisionReason"]


# -- the command list, grouped ------------------------------------------------------------
HELP_SECTIONS = ["Agent verbs", "Manager", "Worktree mode", "Remote", "Setup", "Diagnostics"]


def _help_sections(text: str) -> dict[str, list[str]]:
    """{section title: [command names]} of `git storm` help (sections end with ':')."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            cur = line[:-1].split(" (")[0]
            out[cur] = []
        elif cur is not None and line.startswith("  ") and not line.startswith("   "):
            out[cur].append(line.split()[0])
    return out


@pytest.mark.parametrize("argv", [["git", "storm"], ["git-storm", "--help"], ["git-storm", "-h"]])
def test_the_command_list_is_grouped_by_who_uses_it(tmp_path, argv):
    from storm_git.cli.main import cli

    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sections = _help_sections(r.stdout)
    assert "Commands" not in sections  # not one alphabetical list
    assert [s for s in sections if s in HELP_SECTIONS] == HELP_SECTIONS, list(sections)
    listed = [name for s in HELP_SECTIONS for name in sections[s]]
    assert sorted(listed) == sorted(cli.list_commands(None))  # each command once
    for name, section in {"read": "Agent verbs", "edit": "Agent verbs", "commit": "Manager",
                          "spawn": "Worktree mode", "join": "Remote", "init": "Setup",
                          "doctor": "Diagnostics"}.items():
        assert name in sections[section], (name, section)
    # one column for the short help across the sections, as in one list
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("  ") and ln.split()[0] in listed]
    starts = {len(ln) - len(ln[2:].split(None, 1)[1]) for ln in rows if len(ln.split()) > 1}
    assert len(starts) == 1, starts


def test_the_man_page_groups_the_commands_the_same_way():
    page = (ROOT / "man" / "git-storm.1").read_text()
    heads = [ln[4:].strip('"') for ln in page.splitlines() if ln.startswith(".SH ")]
    assert [h for h in heads if h.title() in [s.title() for s in HELP_SECTIONS]] == \
        [s.upper() for s in HELP_SECTIONS], heads


def test_adopt_of_a_name_that_is_nowhere_says_so(repo):
    """'adopt nothere/' said it names a directory, not a file; 'adopt nothere' that the disk
    holds what storm put there. Neither exists anywhere: exit 2, one line saying that."""
    before = snapshot_refs(repo)
    r = storm(repo, "adopt", "nothere/", agent="e1")
    assert r.returncode == 2 and "nothere/: no such directory on disk or in the shared workspace" in r.stderr, r.stderr
    r = storm(repo, "adopt", "nothere", agent="e1")
    assert r.returncode == 2 and "nothere: no such file on disk or in the shared workspace" in r.stderr, r.stderr
    assert snapshot_refs(repo) == before
