"""``git storm exec``: real commands in the shared working tree, recorded as writes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import git, make_repo, rev, show, snapshot_refs, storm, storm_json

FORMATTER = r"""
import sys
for path in sys.argv[1:]:
    with open(path) as fh:
        text = fh.read()
    # a tiny formatter: four-space indents become two, trailing blank line added
    out = "\n".join(line.replace("    ", "  ") for line in text.splitlines()) + "\n\n"
    with open(path, "w") as fh:
        fh.write(out)
"""


@pytest.fixture(params=["clock", "two-snapshots"])
def repo(request, repo):
    """Every exec test runs with the file-system clock (one snapshot after the
    command) and with storm.execClock=false (snapshots before and after)."""
    if request.param == "two-snapshots":
        git(repo, "config", "storm.execClock", "false")
    return repo


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_exec_records_created_changed_deleted_with_passthrough(repo):
    cmd = ("printf 'out\\n'; printf 'err\\n' >&2; echo hi >> src/util.py; mkdir -p new/deep; "
           "echo n > 'new/deep/a file é.txt'; rm src/api.py; exit 3")
    r = storm(repo, "exec", "--json", "--", "sh", "-c", cmd, agent="e1")
    assert r.returncode == 3  # the command's exit status passes through
    assert r.stdout.startswith("out\n") and "err\n" in r.stderr
    res = _last_json(r.stdout)
    assert sorted(res["paths"]) == ["new/deep/a file é.txt", "src/api.py", "src/util.py"]
    assert res["write"]["accepted"] and res["returncode"] == 3
    head = rev(repo, "refs/storm/workspace")
    assert res["write"]["commit"] == head
    msg = git(repo, "log", "-1", "--format=%B", head).stdout.decode()
    assert "Storm-Op: exec" in msg and "Storm-Agent: e1" in msg and "sh -c" in msg
    assert show(repo, head, "new/deep/a file é.txt") == b"n\n"
    assert git(repo, "cat-file", "-e", f"{head}:src/api.py", check=False).returncode != 0
    assert show(repo, head, "src/util.py").endswith(b"hi\n")
    # recorded in the agent's read set at the new versions, and nothing is left unmediated
    code, st = storm_json(repo, "status")
    assert st["unmediated"] == []


def test_exec_ignores_gitignored_files_and_earlier_unmediated_edits(repo):
    (repo / ".gitignore").write_text("build/\n*.log\n")
    storm(repo, "adopt", ".gitignore", agent="e1")
    (repo / "README.md").write_text("# edited in an editor\n")  # unmediated, before the command
    before = rev(repo, "refs/storm/workspace")
    r = storm(repo, "exec", "--json", "--", "sh", "-c",
              "mkdir -p build; echo o > build/x.o; echo l > run.log; echo c > src/new.py", agent="e1")
    assert r.returncode == 0, r.stderr
    res = _last_json(r.stdout)
    assert res["paths"] == ["src/new.py"]
    assert rev(repo, "refs/storm/workspace") != before
    _, st = storm_json(repo, "status")
    assert [u["path"] for u in st["unmediated"]] == ["README.md"]  # still the editor's, not exec's


def test_exec_never_credits_an_agent_with_an_edit_already_on_disk(repo):
    """A person's tweak, on disk (unmediated) before the command, in a file the
    command changes too: refused (exit 3, kind unmediated_edit), nothing recorded,
    the file as the command left it (tweak and change), still listed as unmediated.
    A command that only touches such a file (rewrites the same bytes) leaves it the
    person's and records the rest."""
    util = repo / "src" / "util.py"
    util.write_text(util.read_text() + "# local tweak\n")
    before = snapshot_refs(repo)
    r = storm(repo, "exec", "--json", "--", "sed", "-i", "s/clamp/bound/", "src/util.py", agent="engineer_2")
    out = json.loads(r.stdout)
    assert r.returncode == 3 and out["error"]["kind"] == "unmediated_edit", out
    assert "src/util.py" in out["error"]["message"] and "adopt" in out["error"]["hint"]
    assert snapshot_refs(repo) == before
    assert util.read_text() == "def bound(x, lo, hi):\n    return max(lo, min(x, hi))\n# local tweak\n"
    _, st = storm_json(repo, "status")
    assert [u["path"] for u in st["unmediated"]] == ["src/util.py"]
    r = storm(repo, "exec", "--json", "--", "sh", "-c", "sed -i s/nomatch/x/ src/util.py; echo n > new.txt",
              agent="engineer_2")
    assert r.returncode == 0, r.stderr
    assert _last_json(r.stdout)["paths"] == ["new.txt"]
    assert b"local tweak" not in show(repo, "refs/storm/workspace", "src/util.py")


def test_formatter_via_exec_makes_other_agents_write_stale_with_its_diff(repo):
    (repo / "fmt.py").write_text(FORMATTER)
    assert storm(repo, "adopt", "fmt.py", agent="e2").returncode == 0
    assert storm(repo, "read", "src/api.py", "src/util.py", agent="e1").returncode == 0
    r = storm(repo, "exec", "--", sys.executable, "fmt.py", "src/api.py", agent="e2")
    assert r.returncode == 0, r.stderr
    assert (repo / "src/api.py").read_text() == "def fetch(url):\n  return http_get(url)\n\n"
    # e1 read src/api.py before the formatter: its next write elsewhere is stale
    code, res = storm_json(repo, "write", "src/util.py", input="x = 1\n", agent="e1")
    assert code == 1
    rej = res["rejection"]
    assert rej["reason"] == "stale_dependency"
    [stale] = rej["stale"]
    assert stale["path"] == "src/api.py" and stale["changed_by"] == ["e2"]
    assert "-    return http_get(url)" in stale["diff"] and "+  return http_get(url)" in stale["diff"]


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_exec_conflicts_with_a_write_that_landed_while_it_ran(repo, tmp_path):
    go, started = tmp_path / "go", tmp_path / "started"
    script = (f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; "
              "echo 'formatted by exec' > src/api.py; echo mine > src/util.py")
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "exec", "--json", "--no-wait", "--",
                             "sh", "-c", script], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, STORM_AGENT="e2"))
    _wait_for(started)
    storm(repo, "read", "src/api.py", agent="e1")
    w = storm(repo, "write", "src/api.py", input="e1's version\n", agent="e1")
    assert w.returncode == 0, w.stderr
    after_e1 = rev(repo, "refs/storm/workspace")
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    res = _last_json(out.decode())
    rej = res["write"]["rejection"]
    assert rej["reason"] == "direct_conflict" and rej["path"] == "src/api.py"
    assert rej["changed_by"] == ["e1"] and rej["current_content"] == "e1's version\n"
    # nothing of the command's was applied over e1's write; the command's version
    # stays on disk, visible as an unmediated edit
    assert rev(repo, "refs/storm/workspace") == after_e1
    assert show(repo, after_e1, "src/api.py") == b"e1's version\n"
    _, st = storm_json(repo, "status")
    assert {u["path"] for u in st["unmediated"]} == {"src/api.py", "src/util.py"}


def test_other_agents_write_during_exec_is_not_attributed_to_the_command(repo, tmp_path):
    go, started = tmp_path / "go", tmp_path / "started"
    script = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; echo mine > src/util.py"
    proc = subprocess.Popen([sys.executable, "-m", "storm_git", "exec", "--json", "--", "sh", "-c", script],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, STORM_AGENT="e2"))
    _wait_for(started)
    storm(repo, "read", "src/api.py", agent="e1")
    assert storm(repo, "write", "src/api.py", input="by e1\n", agent="e1").returncode == 0
    assert (repo / "src/api.py").read_text() == "by e1\n"  # materialised while the command ran
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    res = _last_json(out.decode())
    assert res["paths"] == ["src/util.py"] and res["write"]["accepted"]
    head = rev(repo, "refs/storm/workspace")
    assert git(repo, "log", "-1", "--format=%an", head).stdout.decode().strip() == "e2"
    assert show(repo, head, "src/api.py") == b"by e1\n"


def test_exec_runs_in_the_callers_subdirectory(repo):
    r = storm(repo / "src", "exec", "--json", "--", "sh", "-c", "echo sub > here.txt", agent="e1")
    assert r.returncode == 0, r.stderr
    assert _last_json(r.stdout)["paths"] == ["src/here.txt"]


def test_exec_with_no_change_records_nothing(repo):
    before = snapshot_refs(repo)
    r = storm(repo, "exec", "--", "true", agent="e1")
    assert r.returncode == 0 and "changed no file" in r.stderr
    assert snapshot_refs(repo) == before


def test_exec_bad_input(repo):
    before = snapshot_refs(repo)
    r = storm(repo, "exec", agent="e1")
    assert r.returncode == 2 and "no command given" in r.stderr
    r = storm(repo, "exec", "--", "no-such-command-xyz", agent="e1")
    assert r.returncode == 127 and "command not found: no-such-command-xyz" in r.stderr
    (repo / "notexec.sh").write_text("echo\n")
    r = storm(repo, "exec", "--", "./notexec.sh", agent="e1")
    assert r.returncode == 126 and "not executable" in r.stderr
    r = storm(repo, "exec", "--", "true")  # no agent
    assert r.returncode == 2 and "no agent id" in r.stderr
    r = storm(repo, "exec", "--timeout", "0", "--", "true", agent="e1")
    assert r.returncode == 2
    assert snapshot_refs(repo) == before


def test_exec_killed_by_signal_records_nothing(repo):
    before = snapshot_refs(repo)
    r = storm(repo, "exec", "--", "sh", "-c", "echo half > src/util.py; kill -KILL $$", agent="e1")
    assert r.returncode == 128 + 9
    assert "killed by SIGKILL" in r.stderr and "nothing recorded" in r.stderr and "src/util.py" in r.stderr
    assert snapshot_refs(repo) == before
    _, st = storm_json(repo, "status")
    assert [u["path"] for u in st["unmediated"]] == ["src/util.py"]


def test_exec_timeout_stops_the_command_and_records_nothing(repo):
    before = snapshot_refs(repo)
    t0 = time.monotonic()
    r = storm(repo, "exec", "--timeout", "1", "--", "sh", "-c", "echo half > src/util.py; sleep 60; echo late > x",
              agent="e1")
    assert time.monotonic() - t0 < 30  # not the command's 60 s (a generous bound, not a benchmark)
    assert r.returncode == 124 and "timed out" in r.stderr and "nothing recorded" in r.stderr
    assert snapshot_refs(repo) == before
    assert not (repo / "x").exists()


def test_exec_detects_changes_when_head_moved_since_last_snapshot(repo):
    # the private index follows the shared head incrementally: a write by e1
    # between two execs must not be seen as e2's change, and e2's edit of the
    # same file afterwards must be.
    assert storm(repo, "exec", "--", "true", agent="e2").returncode == 0
    storm(repo, "read", "src/util.py", agent="e1")
    assert storm(repo, "write", "src/util.py", input="v1\n", agent="e1").returncode == 0
    r = storm(repo, "exec", "--json", "--", "sh", "-c", "echo v2 >> src/util.py", agent="e2")
    assert r.returncode == 0, r.stderr
    res = _last_json(r.stdout)
    assert res["paths"] == ["src/util.py"]
    assert show(repo, "refs/storm/workspace", "src/util.py") == b"v1\nv2\n"


def test_exec_on_a_fresh_clone_sized_tree(tmp_path):
    files = {f"pkg{i % 7}/m{i}.py": f"x = {i}\n" for i in range(300)}
    repo = make_repo(tmp_path / "big", files)
    r = storm(repo, "exec", "--json", "--", "sh", "-c", "echo y >> pkg3/m3.py; rm pkg0/m0.py", agent="e1")
    assert r.returncode == 0, r.stderr
    assert sorted(_last_json(r.stdout)["paths"]) == ["pkg0/m0.py", "pkg3/m3.py"]


def test_unmediated_deletion_seen_by_status_is_not_the_commands(repo):
    os.unlink(repo / "README.md")  # deleted outside storm
    assert re.search(r"deleted: +README.md", storm(repo, "status").stdout)
    r = storm(repo, "exec", "--json", "--", "sh", "-c", "echo new > top-level.txt", agent="e1")
    assert r.returncode == 0, r.stderr
    assert _last_json(r.stdout)["paths"] == ["top-level.txt"]
    assert show(repo, "refs/storm/workspace", "README.md") == b"# service\n"


def test_exec_replacing_a_file_by_a_directory_is_recorded_as_one_write(repo):
    # the file's deletion and the new directory's files are one write
    r = storm(repo, "exec", "--", "sh", "-c", "rm README.md; mkdir README.md; echo x > README.md/inner",
              agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "README.md/inner") == b"x\n"
    assert (repo / "README.md/inner").read_text() == "x\n"
    assert storm_json(repo, "status")[1]["unmediated"] == []


def test_exec_replacing_a_directory_by_a_file_keeps_storm_working(repo):
    # a file where a tracked directory was must not break every later exec (NotADirectoryError)
    r = storm(repo, "exec", "--", "sh", "-c", "rm -rf src; echo f > src", agent="e1")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "src") == b"f\n"
    assert git(repo, "ls-tree", "-r", "--name-only", "refs/storm/workspace").stdout.split() == [b"README.md", b"src"]
    r = storm(repo, "exec", "--", "sh", "-c", "echo more >> README.md", agent="e2")
    assert r.returncode == 0, r.stderr
    assert storm(repo, "status").returncode == 0
    r = storm(repo, "commit", "-m", "integrate", agent="manager")
    assert r.returncode == 0, r.stderr
    assert show(repo, "HEAD", "src") == b"f\n"


def test_a_command_that_makes_a_git_repository_of_its_own_records_the_rest(repo):
    """``git init``, ``git clone``, ``cargo new`` run by an agent leave a directory
    with its own ``.git``. git lists it as one entry (``nested/``); storm took it for
    a deleted file, refused the whole exec (exit 2, nothing recorded, the other files
    the command wrote left unrecorded) and ``status`` then showed ``deleted: nested/``."""
    r = storm(repo, "exec", "--agent", "e1", "--json", "--", "sh", "-c",
              "git init -q nested && echo hi > nested/x.txt && echo new > top.txt")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["paths"] == ["top.txt"] and out["write"]["accepted"], out
    assert out["nested_repositories"] == ["nested"]
    tree = git(repo, "ls-tree", "-r", "--name-only", "refs/storm/workspace").stdout.decode().split()
    assert "top.txt" in tree and not any(p.startswith("nested") for p in tree)
    code, status = storm_json(repo, "status", agent="e1")
    assert code == 0 and status["unmediated"] == [] and status["nested_repositories"] == ["nested"], status
    assert "not recorded, git repositories of their own: nested/" in storm(repo, "status").stdout
    r = storm(repo, "exec", "--agent", "e1", "--", "sh", "-c", "echo more >> top.txt")
    assert r.returncode == 0 and "not recorded: nested/" in r.stderr, r.stderr


def test_a_command_that_puts_back_an_older_version_must_have_seen_what_it_undoes(repo):
    """An agent's ``git checkout -- .`` (or stash, reset --hard) restores files from git's
    history, not from the file it replaces: recorded as the agent's write, it would
    revert engineer_1's accepted write of api.py by engineer_2, who never read it. Such
    a target is validated as write's are (the read set): the
    write is rejected with engineer_1's version attached, nothing is lost, and the
    revert, once seen, can be recorded on purpose."""
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, timeout=10):\n    return http_get(url)\n",
                 agent="engineer_1").returncode == 0
    mine = show(repo, "refs/storm/workspace", "src/api.py")
    head = rev(repo, "refs/storm/workspace")
    cmd = "git checkout -- . && echo 'x = 1' > src/new.py"
    r = storm(repo, "exec", "--json", "--agent", "engineer_2", "--", "sh", "-c", cmd)
    res = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 1 and not res["write"]["accepted"], res
    rej = res["write"]["rejection"]
    assert rej["reason"] == "unread_target" and rej["path"] == "src/api.py"
    assert "timeout=10" in rej["current_content"]
    assert res["reverted"] == ["src/api.py"]
    assert rev(repo, "refs/storm/workspace") == head and show(repo, "refs/storm/workspace", "src/api.py") == mine
    st = {u["path"]: u["state"] for u in json.loads(storm(repo, "status", "--json").stdout)["unmediated"]}
    assert st == {"src/api.py": "reverted", "src/new.py": "added"}  # left on disk, named
    # the human form (another agent, same revert) says what happened and both ways on
    assert storm(repo, "checkout", "src/api.py").returncode == 0
    r = storm(repo, "exec", "--agent", "engineer_3", "--", "git", "checkout", "--", "src/api.py")
    assert r.returncode == 1 and "put back an older shared version of src/api.py" in r.stderr, r.stderr
    assert "git storm checkout src/api.py" in r.stderr and "--allow-revert" in r.stderr
    # the rejection showed engineer_1's version to engineer_2: counted as read, the revert is now deliberate
    assert storm(repo, "checkout", "src/api.py").returncode == 0
    r = storm(repo, "exec", "--agent", "engineer_2", "--", "git", "checkout", "--", "src/api.py")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "src/api.py") == show(repo, "HEAD", "src/api.py")


def test_a_command_reverting_the_agents_own_write_is_recorded(repo):
    """The agent undoing its own accepted write is no lost update: recorded as before."""
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="CLAMP = 1\n", agent="engineer_1").returncode == 0
    r = storm(repo, "exec", "--agent", "engineer_1", "--", "git", "checkout", "--", "src/util.py")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "src/util.py") == show(repo, "HEAD", "src/util.py")


def test_undoing_only_its_own_writes_needs_no_read_set(repo):
    """A new session of the agent starts with an empty read set (here: forget), yet a
    command setting a file back past writes that were all its own loses no one's
    work: recorded. Past another agent's write in between, it must have read it."""
    assert storm(repo, "read", "src/util.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="CLAMP = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/util.py", input="CLAMP = 2\n", agent="engineer_1").returncode == 0
    assert storm(repo, "forget", "--agent", "engineer_1").returncode == 0
    r = storm(repo, "exec", "--agent", "engineer_1", "--", "git", "checkout", "--", "src/util.py")
    assert r.returncode == 0, r.stderr
    assert show(repo, "refs/storm/workspace", "src/util.py") == show(repo, "HEAD", "src/util.py")
    # engineer_1, then engineer_2 on top: setting it back to the original undoes engineer_2's write too
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="A = 1\n", agent="engineer_1").returncode == 0
    assert storm(repo, "read", "src/api.py", agent="engineer_2").returncode == 0
    assert storm(repo, "write", "src/api.py", input="A = 2\n", agent="engineer_2").returncode == 0
    assert storm(repo, "forget", "--agent", "engineer_1").returncode == 0
    head = rev(repo, "refs/storm/workspace")
    r = storm(repo, "exec", "--json", "--agent", "engineer_1", "--", "git", "checkout", "--", "src/api.py")
    res = _last_json(r.stdout)
    assert r.returncode == 1 and res["write"]["rejection"]["reason"] == "unread_target", res
    assert rev(repo, "refs/storm/workspace") == head


def test_a_revert_among_many_changed_files_is_still_found(repo):
    """With many targets the search for older versions looks only at paths the shared
    history changed (one pass over it): the revert of api.py among 40 new files is
    found, and the new files are not taken for reverts."""
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    assert storm(repo, "write", "src/api.py", input="def fetch(url, timeout=10):\n    pass\n",
                 agent="engineer_1").returncode == 0
    for i in range(3):  # some history for the pass to walk
        assert storm(repo, "write", f"notes/n{i}.txt", input=f"{i}\n", agent="engineer_1").returncode == 0
    cmd = "git checkout -- src/api.py && mkdir gen && for i in $(seq 40); do echo $i > gen/f$i.txt; done"
    r = storm(repo, "exec", "--json", "--agent", "engineer_2", "--", "sh", "-c", cmd)
    res = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 1 and res["reverted"] == ["src/api.py"], res
    assert len(res["paths"]) == 41


def test_the_harness_bash_door_never_credits_an_edit_already_on_disk(repo):
    """What exec promises, through a harness's Bash tool: the PostToolUse of a command
    that changed a file already holding a person's edit records nothing of it."""
    util = repo / "src" / "util.py"
    util.write_text(util.read_text() + "# local tweak\n")
    event = {"session_id": "s1", "cwd": str(repo), "tool_name": "Bash", "tool_use_id": "u1",
             "tool_input": {"command": "sed -i s/clamp/bound/ src/util.py && gen > src/api.py"}}
    pre = storm(repo, "harness", "hook", input=json.dumps({**event, "hook_event_name": "PreToolUse"}))
    assert pre.returncode == 0, pre.stderr
    subprocess.run(["sed", "-i", "s/clamp/bound/", "src/util.py"], cwd=repo, check=True)
    (repo / "src" / "api.py").write_text("def fetch(url):\n    return None\n")  # the command's own change
    post = storm(repo, "harness", "hook", input=json.dumps({**event, "hook_event_name": "PostToolUse",
                                                            "tool_response": {"stdout": "", "interrupted": False}}))
    assert post.returncode == 0, post.stderr
    assert b"local tweak" not in show(repo, "refs/storm/workspace", "src/util.py")
    assert show(repo, "refs/storm/workspace", "src/api.py") == b"def fetch(url):\n    return None\n"
    told = json.loads(post.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "src/util.py held an edit made outside storm before this command" in told, told
    assert "src/util.py" in storm(repo, "status").stdout  # still the person's, listed
