"""Edits made outside storm's own writes: a shell's become writes (storm.shellEdits=adopt,
the drop-in's default), a person's are kept and never written over, a running command's
are left for its end, and an agent's write never lands while the disk says otherwise.
Windows are opened on purpose: a held worktree flock, a command SIGSTOPped between its
edit and its exit. After every scenario the disk equals refs/storm/workspace."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import claude_event, git, hold, release, rev, show, start_storm as spawn, storm, storm_json
from storm_git.integrations import harness
from storm_git.paper.manager import Manager


def run(coro):
    return asyncio.run(coro)


def disk_is_head(repo: Path) -> None:
    """Every file of the shared head is on disk with its content, and no other file is."""
    head = rev(repo, "refs/storm/workspace")
    listed = git(repo, "ls-tree", "-r", "-z", "--name-only", head).stdout.split(b"\0")
    shared = {p.decode() for p in listed if p}
    on_disk = {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert on_disk == shared
    for p in shared:
        assert (repo / p).read_bytes() == show(repo, head, p), p


def authors(repo: Path) -> list[str]:
    return git(repo, "log", "--format=%an", "refs/storm/workspace").stdout.decode().split()


# -- the drop-in: 46's defects 1 and 2 ------------------------------------------------------
def test_an_edit_over_a_sed_edit_it_never_read_is_rejected_with_the_diff_not_accepted_off_disk(repo):
    """sed -i changes src/util.py through the harness's own terminal (not the manager);
    an agent then edits the file from its earlier view. It was accepted on the shared
    ref while the disk kept sed's version (the disk writer's kept-unmediated was
    dropped); it is a conflict with sed's edit, which is shared as the shell's write."""
    m = Manager(repo)
    r = run(m.read_file("e1", "src/util.py"))
    subprocess.run(["sed", "-i", "s/lo, hi/low, high/", "src/util.py"], cwd=repo, check=True)
    res = run(m.write_file("e1", "src/util.py", r.content.replace("max(lo", "max(lo "), r.version))
    assert not res.success and "low, high" in (res.diff or "") and "low, high" in res.current_content
    assert res.current_version == r.version + 1 and res.changed_by == "shell"
    assert b"low, high" in show(repo, "refs/storm/workspace", "src/util.py")
    assert authors(repo)[0] == "shell"
    disk_is_head(repo)
    again = run(m.write_file("e1", "src/util.py", res.current_content + "# e1\n", res.current_version))
    assert again.success
    disk_is_head(repo)


def test_files_the_shell_made_exist_and_files_it_removed_are_gone(repo):
    m = Manager(repo)
    (repo / "src/new.py").write_text("made = 1\n")
    os.unlink(repo / "README.md")
    assert run(m.read_file("e1", "src/new.py")).content == "made = 1\n"  # was: no such file
    with pytest.raises(FileNotFoundError):
        run(m.read_file("e1", "README.md"))  # was: still served, as v1
    created = run(m.write_file("e2", "src/new.py", "other = 2\n", 0))  # was: "created v1", disk kept the shell's
    assert not created.success and created.current_content == "made = 1\n"
    assert "src/new.py" in run(m.list_dir("src")) and "README.md" not in run(m.list_dir("."))
    assert "README.md" not in m.files and "src/new.py" in m.files
    disk_is_head(repo)


# -- 46's defect 3: the paper harness's plain git commit -------------------------------------
def test_a_plain_git_add_and_commit_after_shell_edits(repo):
    (repo / "src/gen.py").write_text("generated = True\n")
    subprocess.run(["sed", "-i", "s/http_get/fetch_url/", "src/api.py"], cwd=repo, check=True)
    env = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}

    def commit() -> subprocess.CompletedProcess:
        git(repo, "add", "-A")
        return subprocess.run(["git", "commit", "-q", "--author=eng1 <eng1@x>", "-m", "eng1's work"], cwd=repo,
                              env=env, capture_output=True)

    r = commit()  # storm.shellEdits unset: a person's edits, refused, saying what to configure
    assert r.returncode != 0 and b"git config storm.shellEdits adopt" in r.stderr
    git(repo, "config", "storm.shellEdits", "adopt")
    r = commit()
    assert r.returncode == 0, r.stderr
    assert git(repo, "rev-parse", "HEAD^{tree}").stdout == git(repo, "rev-parse", "refs/storm/workspace^{tree}").stdout
    assert authors(repo)[0] == "shell" and b"eng1" in git(repo, "log", "-1", "--format=%an").stdout
    disk_is_head(repo)
    assert storm_json(repo, "status")[1]["unmediated"] == []


# -- the races, opened on purpose -------------------------------------------------------------
def test_a_shell_edit_saved_while_a_write_waits_for_the_disk_is_taken_in_and_the_writer_told(repo):
    """The writer has landed on the shared ref and waits for the worktree lock to write
    the disk; sed changes the file meanwhile. The disk keeps sed's edit (never written
    over); the writer hears in the same answer that it was displaced, and the shared
    file is what the disk holds (the shell's write on top of the agent's)."""
    git(repo, "config", "storm.shellEdits", "adopt")
    storm(repo, "read", "src/util.py", agent="e1")
    before = rev(repo, "refs/storm/workspace")
    holder = hold(repo, "worktree", seconds=60)
    try:
        w = spawn(repo, "write", "src/util.py", "--json", agent="e1", input=b"def clamp(x):\n    return x\n")
        deadline = time.monotonic() + 60
        while rev(repo, "refs/storm/workspace") == before:
            assert time.monotonic() < deadline and w.poll() is None
            time.sleep(0.01)
        (repo / "src/util.py").write_text("by sed\n")
    finally:
        release(holder)
    out, err = w.communicate(timeout=120)
    res = json.loads(out)
    assert w.returncode == 0 and res["displaced"] == ["src/util.py"], err
    assert any("replaced it there" in x for x in res["warnings"])
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"by sed\n" and authors(repo)[:2] == ["shell", "e1"]
    disk_is_head(repo)


def _stopped_command(repo: Path, agent: str, script: str, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """``git storm exec -- sh -c SCRIPT`` whose shell stops itself after its edit; returns
    (the exec, the stopped shell's pid) once it is stopped."""
    pidfile = tmp_path / f"{agent}.pid"
    proc = spawn(repo, "exec", "--json", "--", "sh", "-c", f"{script}; echo $$ > {pidfile}; kill -STOP $$",
                 agent=agent)
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline and proc.poll() is None
        try:
            pid = int(pidfile.read_text())
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                return proc, pid
        except (OSError, ValueError):
            pass
        time.sleep(0.01)


def test_a_write_that_meets_a_running_commands_edit_is_refused_and_the_command_keeps_it(repo, tmp_path):
    git(repo, "config", "storm.shellEdits", "adopt")
    proc, pid = _stopped_command(repo, "e1", "echo '# e1' >> src/util.py", tmp_path)
    storm(repo, "read", "src/util.py", agent="e2")
    r = storm(repo, "write", "src/util.py", input="e2's\n", agent="e2")
    assert r.returncode == 3 and "e1's command is running" in r.stderr  # never written over, never taken as shell's
    os.kill(pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    res = json.loads(out)
    assert proc.returncode == 0 and res["paths"] == ["src/util.py"] and res["write"]["accepted"], err
    assert authors(repo)[0] == "e1"
    disk_is_head(repo)


# -- 50's item 5: a person's save during an agent's command -----------------------------------
def test_a_persons_save_during_a_stopped_exec_is_not_credited_to_the_agent(repo, tmp_path):
    proc, pid = _stopped_command(repo, "e1", "echo built > out.txt", tmp_path)
    (repo / "src/api.py").write_text("def fetch(url):\n    return saved_by_a_person(url)\n")
    os.kill(pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    res = json.loads(out)
    assert proc.returncode == 0 and res["paths"] == ["out.txt"] and res["uncredited"] == ["src/api.py"], err
    assert b"saved_by_a_person" not in show(repo, "refs/storm/workspace", "src/api.py")
    un = {u["path"]: u["state"] for u in storm_json(repo, "status")[1]["unmediated"]}
    assert un == {"src/api.py": "modified"}  # still the person's, protected


def test_a_persons_save_during_a_harness_bash_command_is_not_credited_to_the_agent(repo, tmp_path):
    """Claude Code's Bash runs ``make``-like work; the person saves src/api.py while it
    runs. PostToolUse recorded it as the agent's exec write."""
    pidfile = tmp_path / "bash.pid"
    command = f"echo built > out.txt; echo $$ > {pidfile}; kill -STOP $$"
    pre = claude_event(repo, "s1", "PreToolUse", "Bash", {"command": command}, "b1")
    assert harness.hook(json.dumps(pre), agent="engineer_1").decision == harness.PASS
    sh = subprocess.Popen(["sh", "-c", command], cwd=repo)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip() and
               Path(f"/proc/{sh.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (repo / "src/api.py").write_text("def fetch(url):\n    return saved_by_a_person(url)\n")
    os.kill(sh.pid, signal.SIGCONT)
    assert sh.wait(timeout=30) == 0
    post = claude_event(repo, "s1", "PostToolUse", "Bash", {"command": command}, "b1",
                        {"stdout": "", "stderr": "", "interrupted": False})
    res = harness.hook(json.dumps(post), agent="engineer_1")
    assert res.paths == ["out.txt"] and "src/api.py changed while this command ran" in res.message
    assert b"saved_by_a_person" not in show(repo, "refs/storm/workspace", "src/api.py")
    assert show(repo, "refs/storm/workspace", "out.txt") == b"built\n"


def test_attribution_names():
    from storm_git.storm.attribution import named

    assert named("make test", ["src/api.py", "build/x.o"]) == set()
    assert named("sed -i s/a/b/ src/api.py && echo n > new.txt", ["src/api.py", "new.txt", "src/util.py"]) == \
        {"src/api.py", "new.txt"}
    assert named("cd src && sed -i x api.py", ["src/api.py", "lib/api.py"]) == {"src/api.py", "lib/api.py"}
    assert named("pytest tests/test_api.py", ["src/api.py"]) == set()
    assert named("black src", ["src/a.py", "srcx/b.py"]) == {"src/a.py"}
    assert named("for f in src/m*.py; do echo y >> $f; done", ["src/m1.py", "src/n.py"]) == {"src/m1.py"}
    assert named("git stash", ["a", "b/c"]) == {"a", "b/c"}
    assert named("python -c \"open('gen.txt','w')\"", ["gen.txt"]) == {"gen.txt"}
    assert named("touch x", ["sub/x"], cwd="sub") == {"sub/x"}


def test_an_edit_of_the_same_size_in_the_second_git_checked_the_file_out_is_seen(repo):
    """git compares stat data to the second here (no USE_NSEC) and trusts an entry
    taken before its index file's mtime second. storm's private index starts as a
    copy of git's: stamped with the copy's own time, it passed an edit made in the
    second of the checkout as unchanged. Each round: check the file out, edit it
    (same size) within that second, then let the first look come a second later."""
    missed, looked = [], 0
    for attempt in range(8):
        (repo / "src/api.py").unlink()
        git(repo, "checkout", "--", "src/api.py")
        checked_out = int(os.stat(repo / "src/api.py").st_mtime)
        before = (repo / "src/api.py").read_bytes()
        (repo / "src/api.py").write_bytes(before.replace(b"url", b"uri"))  # the same size
        if int(os.stat(repo / "src/api.py").st_ctime) != checked_out:
            continue  # the second ended between the two: not this window
        for name in ("exec-index", "exec-index.tree"):  # its first look: the copy of git's index
            (repo / ".git/storm" / name).unlink(missing_ok=True)
        time.sleep(1.05 - time.time() % 1)  # the look in a later second than the edit
        code, out = storm_json(repo, "status", agent="e1")
        assert code == 0, out
        looked += 1
        if "src/api.py" not in [u["path"] for u in out["unmediated"]]:
            missed.append(attempt)
        (repo / "src/api.py").write_bytes(before)
        storm(repo, "status", agent="e1")
    assert looked and not missed, (looked, missed)
