"""The shared workspace on a git remote: real servers only — a ``git
daemon`` on loopback started and stopped by the fixture, ``file://`` URLs and
plain paths — real clones, real ``git storm`` processes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import SUPPORT, git, make_repo, rev, snapshot_refs, storm, storm_json
from servers import (
    WS,
    Daemon,
    bare,
    clone,
    free_port as _free_port,
    install_guard as _install_guard,
    seed,
    server_log,
    server_provenance,
)


# -- the basic story, on every kind of remote -------------------------------------------------
def test_init_join_write_sync(remote, tmp_path):
    srv, url = remote
    _install_guard(srv)
    a = seed(tmp_path, url)
    h0 = rev(srv, WS)
    assert rev(a, WS) == h0 and git(a, "config", "storm.remote").stdout.decode().strip() == "origin"
    b = clone(tmp_path, url, "b")
    assert rev(b, WS) == h0
    assert storm(b, "read", "src/api.py", agent="eng_b").returncode == 0
    new = "def fetch(url):\n    return http_get(url, retries=3)\n"
    code, res = storm_json(b, "write", "src/api.py", "-m", "eng_b: retries", input=new, agent="eng_b")
    assert code == 0 and res["accepted"], res
    assert server_log(srv, h0) == [res["commit"]]  # the server's shared ref took it
    assert (b / "src/api.py").read_text() == new
    msg = git(srv, "log", "-1", "--format=%B", WS).stdout.decode()
    assert "Storm-Agent: eng_b" in msg and "Storm-Path: src/api.py" in msg
    # its provenance is in the commit, and the journal it points into travelled in the same push
    prov, entries = server_provenance(srv, "eng_b", res["commit"])
    assert prov.validated_at == h0 and [e.path for e in entries] == ["src/api.py"]
    # the other clone converges with sync
    assert (a / "src/api.py").read_text() != new
    r = storm(a, "sync")
    assert r.returncode == 0, r.stderr
    assert (a / "src/api.py").read_text() == new and rev(a, WS) == res["commit"]
    assert git(srv, "fsck", "--no-progress").returncode == 0


def test_conflict_across_clones_is_a_normal_rejection(tmp_path, daemon):
    srv = bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    b = clone(tmp_path, url, "b")
    for c, agent in ((a, "eng_a"), (b, "eng_b")):
        assert storm(c, "read", "src/util.py", agent=agent).returncode == 0
    code, ra = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 0 and ra["accepted"]
    code, rb = storm_json(b, "write", "src/util.py", input="B\n", agent="eng_b")
    assert code == 1 and not rb["accepted"]
    rej = rb["rejection"]
    assert rej["reason"] == "direct_conflict" and rej["current_content"] == "A\n" and rej["head"] == ra["commit"]
    assert rej["changed_by"] == ["eng_a"]
    assert rev(srv, WS) == ra["commit"]
    # the rejection counts as the read: the retry on the new content is accepted
    code, rb = storm_json(b, "write", "src/util.py", input="A\nB\n", agent="eng_b")
    assert code == 0 and rb["accepted"] and rev(srv, WS) == rb["commit"]


def _git_env_without_quarantine() -> str:
    return "env -u GIT_QUARANTINE_PATH -u GIT_OBJECT_DIRECTORY -u GIT_ALTERNATE_OBJECT_DIRECTORIES"


def _window_hook(srv: Path, target: str, expect_old: str) -> Path:
    """A pre-receive hook that, on its first run only, moves the shared ref to ``target``
    itself: another machine's push landing between this client's fetch and its push."""
    marker = srv / "window-used"
    hook = srv / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\ncat >/dev/null\n"
                    f"if [ ! -e '{marker}' ]; then touch '{marker}'; "
                    f"{_git_env_without_quarantine()} git update-ref {WS} {target} {expect_old} || exit 1; fi\n"
                    "exit 0\n")
    hook.chmod(0o755)
    return marker


@pytest.mark.parametrize("shared", [False, True], ids=["disjoint", "same-file"])
def test_stale_lease_refetches_and_revalidates(tmp_path, daemon, shared):
    """Deterministic race: b fetched H0, then (in b's push) the server moves to a's
    write. b's lease fails; b fetches, re-validates: a disjoint write is retried and
    accepted on top, a write of the same file becomes the usual rejection."""
    srv = bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    b = clone(tmp_path, url, "b")
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    code, ra = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 0
    git(srv, "update-ref", WS, h0, ra["commit"])  # a's write waits, done, in the server's object store
    marker = _window_hook(srv, ra["commit"], h0)
    target = "src/util.py" if shared else "src/api.py"
    assert storm(b, "read", target, agent="eng_b").returncode == 0
    assert rev(b, WS) == h0
    code, rb = storm_json(b, "write", target, input="B\n", agent="eng_b")
    assert marker.exists()
    if not shared:
        assert code == 0 and rb["accepted"] and rb["cas_retries"] >= 1, rb
        assert server_log(srv, h0) == [rb["commit"], ra["commit"]]
        assert git(srv, "rev-parse", f"{rb['commit']}^").stdout.decode().strip() == ra["commit"]
    else:
        assert code == 1 and rb["rejection"]["reason"] == "direct_conflict", rb
        assert rb["rejection"]["current_content"] == "A\n" and rev(srv, WS) == ra["commit"]
    assert rev(b, WS) == rev(srv, WS)


# -- failures ----------------------------------------------------------------------------------
def _journal(repo: Path, agent: str) -> bytes | None:
    p = repo / ".git" / "storm" / "journal" / agent
    return p.read_bytes() if p.exists() else None


@pytest.mark.parametrize("how", ["core.sshCommand", "GIT_SSH", "GIT_SSH_COMMAND"])
def test_the_users_ssh_command_reaches_the_server(tmp_path, monkeypatch, how):
    """How the user's git reaches an ssh server (a deploy key, a jump host: core.sshCommand,
    GIT_SSH, GIT_SSH_COMMAND) is how storm's fetches and pushes reach it; storm's own
    default (ssh in batch mode) only when none is set."""
    called = tmp_path / "ssh-called"
    fake = tmp_path / "my-ssh"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> '{called}'\nexit 255\n")
    fake.chmod(0o755)
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", "ssh://git@server.example.invalid/proj.git")
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    monkeypatch.delenv("GIT_SSH", raising=False)
    env = {}
    if how == "core.sshCommand":
        git(a, "config", "core.sshCommand", str(fake))
    else:
        env[how] = str(fake)
    r = storm(a, "init", "--remote", "origin", env=env)
    assert r.returncode == 3, r.stderr
    assert "server.example.invalid" in called.read_text(), r.stderr


def test_unreachable_server_changes_nothing(tmp_path, daemon):
    bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    before = (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes())
    daemon.stop()
    r = storm(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert r.returncode == 3, r.stderr
    # the write validated against the local copy; its push was the first contact with the server
    assert r.stderr.count("\n") == 1 and "cannot push the write to origin" in r.stderr, r.stderr
    assert (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes()) == before
    code, err = storm_json(a, "sync")
    assert code == 3 and err["error"]["kind"] == "remote_unreachable"


def test_push_failure_after_fetch_puts_everything_back(tmp_path):
    """Fetch works, the push cannot connect: exit 3, and the agent's journal, notes
    and every ref are as before — the retry is not refused over a write that never landed."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    before = (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes())
    git(a, "config", "remote.origin.pushurl", f"git://127.0.0.1:{_free_port()}/nothing.git")
    r = storm(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert r.returncode == 3 and "cannot push" in r.stderr, r.stderr
    assert (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes()) == before
    git(a, "config", "--unset", "remote.origin.pushurl")
    code, res = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 0 and res["accepted"] and rev(srv, WS) == res["commit"]


KILLER = r'''#!{python}
"""post-receive: the server has taken the push; kill the storm client that sent it
before it hears the answer (a lost answer, deterministically)."""
import os, signal, sys
sys.stdin.read()
marker = {marker!r}
if not os.path.exists(marker):
    open(marker, "w").close()
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{{pid}}/cmdline", "rb") as fh:
            if b"storm_git" in fh.read():
                os.kill(pid, signal.SIGKILL)
                break
        with open(f"/proc/{{pid}}/stat") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
'''


def test_lost_push_answer_is_not_applied_twice(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    b = clone(tmp_path, f"file://{srv}", "b")
    h0 = rev(srv, WS)
    marker = tmp_path / "killed"
    hook = srv / "hooks" / "post-receive"
    hook.write_text(KILLER.format(python=sys.executable, marker=str(marker)))
    hook.chmod(0o755)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    # fresh: the hook finds the client by "storm_git" in its command line
    r = storm(a, "write", "src/util.py", input="A\n", agent="eng_a", fresh=True)
    assert r.returncode == -9 and marker.exists(), (r.returncode, r.stderr)
    landed = server_log(srv, h0)
    assert len(landed) == 1  # the server took it
    # ... and the client never heard: its copy of the server's head is the old one (its
    # local ref holds the write as queued, the state a push starts from)
    assert rev(a, "refs/storm-remote/origin/storm/workspace") == h0 and rev(a, WS) == landed[0]
    assert server_provenance(srv, "eng_a", landed[0])[0].validated_at == rev(srv, f"{landed[0]}^")
    # the agent runs the same write again: the next fetch shows it there; nothing new lands
    code, res = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 0 and res["accepted"] and res["commit"] is None, res
    assert server_log(srv, h0) == landed and rev(a, WS) == landed[0]
    assert (a / "src/util.py").read_text() == "A\n"
    assert storm(b, "sync").returncode == 0 and (b / "src/util.py").read_text() == "A\n"


CUT_OFF = r"""#!{python}
# pre-receive: the server has the push; kill the client's `git push` (its answer is lost)
# and hold the update until the test says go: the server takes it after the client died.
import os, signal, sys, time
sys.stdin.read()
marker, go, clone = {marker!r}, {go!r}, {clone!r}
if os.path.exists(marker):
    sys.exit(0)  # a later push: let it through
open(marker, "w").close()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        if argv[:2] == [b"git", b"push"] and os.readlink(f"/proc/{{pid}}/cwd") == clone:
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def test_a_push_cut_off_before_the_server_decided_is_not_reported_failed(tmp_path, daemon):
    """The writer's `git push` dies after the server received the pack and before its
    pre-receive finished (the server takes the write a moment later). The writer must
    not say the write failed: it pushes the same queue again on the same lease and
    reports the server's verdict; the write lands exactly once. (Over git://: the
    server's processes are not the client's children and hold none of its pipes.)"""
    srv = bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    b = clone(tmp_path, url, "b")
    h0 = rev(srv, WS)
    marker, go = tmp_path / "cut", tmp_path / "go"
    hook = srv / "hooks" / "pre-receive"
    hook.write_text(CUT_OFF.format(python=sys.executable, marker=str(marker), go=str(go), clone=str(a.resolve())))
    hook.chmod(0o755)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    code, res = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert marker.exists()  # the first push was cut off
    go.touch()  # the first copy's update may now run: its lease is stale if the second landed
    assert code == 0 and res["accepted"], res
    deadline = time.monotonic() + 30
    while (time.monotonic() < deadline
           and subprocess.run(["pgrep", "-f", str(hook)], capture_output=True).returncode == 0):
        time.sleep(0.05)
    landed = server_log(srv, h0)
    assert landed == [res["commit"]], landed  # once, and the one the writer reported
    assert storm(b, "sync").returncode == 0 and (b / "src/util.py").read_text() == "A\n"


def test_diverged_local_copy_is_repaired_by_fetch(tmp_path):
    """A clone whose local refs/storm/workspace points elsewhere (a crash, a hand edit):
    the next command takes the server's value; the write lands on the server's head."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    code, ra = storm_json(a, "write", "src/api.py", input="A\n", agent="eng_a")
    assert code == 0
    # b's local copy: a commit the server never saw
    stray = git(b, "commit-tree", "-p", rev(b, WS), "-m", "stray", f"{WS}^{{tree}}").stdout.decode().strip()
    git(b, "update-ref", WS, stray)
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    assert rev(b, WS) == ra["commit"]
    code, rb = storm_json(b, "write", "src/util.py", input="B\n", agent="eng_b")
    assert code == 0 and rb["accepted"]
    assert server_log(srv)[:2] == [rb["commit"], ra["commit"]] and stray not in server_log(srv)
    assert (b / "src/api.py").read_text() == "A\n"


def test_join_refuses_a_remote_without_workspace_and_unknown_names(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", str(srv))
    git(a, "push", "-q", "origin", "main")
    code, err = storm_json(a, "join", "origin")
    assert code == 3 and err["error"]["kind"] == "not_initialised"
    code, err = storm_json(a, "join", "nowhere")
    assert code == 2 and "no git remote named 'nowhere'" in err["error"]["message"]
    assert git(a, "config", "storm.remote", check=False).returncode == 1


def test_join_keeps_a_local_edit(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    assert storm(a, "write", "src/api.py", input="A\n", agent="eng_a").returncode == 0
    git(tmp_path, "clone", "-q", str(srv), "b")
    b = tmp_path / "b"
    (b / "src/api.py").write_text("mine\n")
    (b / "README.md").write_text("also mine, longer\n")
    code, res = storm_json(b, "join", "origin")
    assert code == 0 and res["kept"] == ["src/api.py"], res  # README.md: not changed by the shared head
    assert (b / "src/api.py").read_text() == "mine\n" and (b / "README.md").read_text() == "also mine, longer\n"
    code, st = storm_json(b, "status")
    assert code == 0 and st["remote"] == "origin"
    assert {u["path"] for u in st["unmediated"]} >= {"src/api.py", "README.md"}, st["unmediated"]


def test_push_reads_sends_the_notes_alone(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/api.py", agent="eng_a").returncode == 0
    code, res = storm_json(a, "push-reads", agent="eng_a")
    assert code == 0 and res["pushed"], res
    assert rev(srv, "refs/notes/storm/agents/eng_a") == res["notes"] and rev(srv, WS) == h0
    code, res = storm_json(a, "push-reads", agent="eng_a")
    assert code == 0 and not res["pushed"]


def _has_ref(repo: Path, ref: str) -> bool:
    return git(repo, "rev-parse", "--verify", "--quiet", ref, check=False).returncode == 0


TRACKED_NOTES = "refs/storm-remote/origin/notes/storm/agents/"


def _one_write_on_a(tmp_path: Path, agent: str, content: str) -> tuple[Path, Path, Path, dict]:
    """A server, its seed clone a and a second clone b; ``agent`` reads and writes
    src/api.py on a (accepted). Returns (server, a, b, the write's result)."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    assert storm(a, "read", "src/api.py", agent=agent).returncode == 0
    code, res = storm_json(a, "write", "src/api.py", input=content, agent=agent)
    assert code == 0 and res["accepted"], res
    return srv, a, b, res


def test_reads_and_writes_do_not_fetch_other_agents_notes_status_and_log_do(tmp_path):
    """A clone that held every agent's notes ref made each of its fetches and pushes
    walk them all (docs/remote.md, "Cost"): reads and writes fetch only their agent's."""
    srv, a, b, ra = _one_write_on_a(tmp_path, "eng_a", "A\n")
    assert _has_ref(srv, "refs/notes/storm/agents/eng_a")
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    code, rb = storm_json(b, "write", "src/util.py", input="B\n", agent="eng_b")
    assert code == 0 and rb["accepted"], rb
    assert server_log(srv)[:2] == [rb["commit"], ra["commit"]]
    assert _has_ref(b, TRACKED_NOTES + "eng_b")  # its own, as its push left it
    assert not _has_ref(b, TRACKED_NOTES + "eng_a") and not _has_ref(b, "refs/notes/storm/agents/eng_a")
    # the writer of what b fetched is recorded, by id
    assert "eng_a" in (b / ".git/storm/agents-seen").read_text().split()
    code, log = storm_json(b, "log")
    assert code == 0 and _has_ref(b, TRACKED_NOTES + "eng_a")
    notes = "refs/notes/storm/agents/eng_a"
    assert git(b, "rev-parse", notes).stdout == git(srv, "rev-parse", notes).stdout
    mine = next(e for e in log if e.get("commit") == ra["commit"])
    assert mine["agent"] == "eng_a", mine


def test_an_intent_of_another_clones_agent_is_recognised_without_its_notes(tmp_path):
    annotated = "# eng_a: three retries, the upstream drops one call in ten\nRETRIES = 3\n"
    _srv, _a, b, _ra = _one_write_on_a(tmp_path, "eng_a", annotated)
    code, rd = storm_json(b, "read", "src/api.py", agent="eng_b")
    assert code == 0 and rd["files"][0]["content"] == annotated
    code, rb = storm_json(b, "write", "src/api.py", input="RETRIES = 1\n", agent="eng_b")
    assert code == 0 and rb["accepted"] and rb["flags"] == ["intent_overwritten"], rb
    assert not _has_ref(b, TRACKED_NOTES + "eng_a")  # recognised by id, not by its notes


def test_an_agent_that_moves_to_another_clone_extends_its_notes_there(tmp_path):
    """Its reads on the new clone fetch its notes ref first: its journal there extends
    what it pushed from the old one, and its next push is a fast-forward."""
    srv, a, b, _r1 = _one_write_on_a(tmp_path, "eng_x", "one\n")
    before = rev(srv, "refs/notes/storm/agents/eng_x")
    # b never fetched since eng_x wrote: its first read there is that of a new agent
    assert storm(b, "read", "src/util.py", agent="eng_x").returncode == 0
    code, r2 = storm_json(b, "write", "src/util.py", input="two\n", agent="eng_x")
    assert code == 0 and r2["accepted"], r2
    after = rev(srv, "refs/notes/storm/agents/eng_x")
    assert after != before and git(srv, "merge-base", "--is-ancestor", before, after, check=False).returncode == 0
    # and back on a, which has seen it write from b: its read there fetches the notes b pushed
    assert storm(a, "read", "src/util.py", agent="eng_x").returncode == 0
    code, r3 = storm_json(a, "write", "src/util.py", input="three\n", agent="eng_x")
    assert code == 0 and r3["accepted"], r3
    notes = rev(srv, "refs/notes/storm/agents/eng_x")
    assert git(srv, "merge-base", "--is-ancestor", after, notes, check=False).returncode == 0
    assert git(srv, "fsck", "--no-progress").returncode == 0


def test_a_read_of_a_new_agent_fetches_once_its_notes_are_on_no_server(tmp_path):
    """A new agent's read asks for its notes ref, which the server lacks: the fetch
    goes on without it (not an error), and its later reads do not ask again."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    calls = tmp_path / "uploads.log"
    wrapper = tmp_path / "upload-pack"
    wrapper.write_text(f"#!/bin/sh\necho x >> '{calls}'\nexec git-upload-pack \"$@\"\n")
    wrapper.chmod(0o755)
    git(a, "config", "remote.origin.uploadpack", str(wrapper))
    assert storm(a, "read", "src/api.py", agent="eng_new").returncode == 0
    assert len(calls.read_text().split()) == 2  # asked with its notes ref, then without
    assert storm(a, "read", "src/util.py", agent="eng_new").returncode == 0
    assert len(calls.read_text().split()) == 3  # it has a journal here now: one fetch


def test_two_processes_of_one_clone_and_reservations_travel(tmp_path):
    """A rejection's reservation reaches the server; the other clone's writer of that
    file waits for it (or, with --no-wait, is rejected as reserved)."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv), reservation="30")
    b = clone(tmp_path, str(srv), "b", reservation="30")
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    assert storm(b, "write", "src/util.py", input="B\n", agent="eng_b").returncode == 0
    code, res = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 1 and res["rejection"]["reservation"]["holder"] == "eng_a"
    assert git(srv, "rev-parse", "refs/storm/reservations", check=False).returncode == 0
    assert storm(b, "read", "src/util.py", agent="eng_c").returncode == 0
    code, res = storm_json(b, "write", "src/util.py", "--no-wait", input="C\n", agent="eng_c")
    assert code == 1 and res["rejection"]["reason"] == "reserved" and "eng_a" in res["rejection"]["message"]


# -- the server's guard --------------------------------------------------------------------------
def _push(repo: Path, *specs: str) -> subprocess.CompletedProcess:
    return git(repo, "push", "--atomic", "origin", *specs, check=False)


def _commit(repo: Path, parent: str, files: dict[str, str], message: str) -> str:
    """A hand-made commit on ``parent`` with ``files`` changed (git plumbing, no storm)."""
    idx = {"GIT_INDEX_FILE": str(repo / ".git" / "forge-index")}
    env = dict(os.environ, **idx)
    subprocess.run(["git", "read-tree", parent], cwd=repo, env=env, check=True)
    for path, text in files.items():
        blob = git(repo, "hash-object", "-w", "--stdin", input=text.encode()).stdout.decode().strip()
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"], cwd=repo, env=env,
                       check=True)
    tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, check=True,
                          capture_output=True).stdout.decode().strip()
    return git(repo, "commit-tree", "-p", parent, "-m", message, tree).stdout.decode().strip()


def _trailers(agent: str, path: str) -> str:
    return f"hand-made\n\nStorm-Agent: {agent}\nStorm-Op: write\nStorm-Path: {path}\n"


def _notes_commit(repo: Path, agent: str, target: str, text: str) -> str:
    """The agent's notes ref with one more note (git notes, on a copy of the ref)."""
    ref = f"refs/notes/storm/agents/{agent}"
    git(repo, "notes", f"--ref={ref}", "add", "-f", "-m", text, target)
    return rev(repo, ref)


def _forged_push_is_refused(srv: Path, a: Path) -> None:
    """A hand-made commit without storm's trailers, pushed to the shared ref: refused."""
    h = rev(srv, WS)
    forged = _commit(a, h, {"src/util.py": "evil\n"}, "no trailers here")
    r = _push(a, f"{forged}:{WS}")
    assert r.returncode != 0 and b"lacks storm's trailers" in r.stderr, r.stderr
    assert rev(srv, WS) == h


def test_guard_refuses_a_forged_commit(guarded):
    _forged_push_is_refused(*guarded)


def test_guard_refuses_a_non_fast_forward(guarded):
    srv, a = guarded
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    assert storm(a, "write", "src/util.py", input="A\n", agent="eng_a").returncode == 0
    h = rev(srv, WS)
    r = _push(a, f"+{h}~1:{WS}")
    assert r.returncode != 0 and b"non-fast-forward" in r.stderr, r.stderr
    r = _push(a, f":{WS}")
    assert r.returncode != 0 and b"deleting it is not allowed" in r.stderr
    assert rev(srv, WS) == h


def test_guard_refuses_a_commit_without_provenance(guarded):
    srv, a = guarded
    h = rev(srv, WS)
    c = _commit(a, h, {"src/util.py": "x\n"}, _trailers("eng_z", "src/util.py"))
    r = _push(a, f"{c}:{WS}")
    assert r.returncode != 0 and b"has no provenance" in r.stderr, r.stderr
    assert rev(srv, WS) == h


def test_guard_refuses_a_write_without_provenance_trailers(guarded):
    """A hand-made write whose read set is only claimed in a note (no Storm-Read-Set
    trailer) has no provenance the guard can check: refused, atomically with its notes."""
    srv, a = guarded
    h0 = rev(srv, WS)
    old_util = git(a, "rev-parse", f"{h0}:src/util.py").stdout.decode().strip()
    c = _commit(a, h0, {"src/api.py": "skipped validation\n"}, _trailers("eng_z", "src/api.py"))
    prov = ("storm provenance: the read set this write was validated against\nagent: eng_z\n"
            f"validated-at: {h0}\nscope: all\n{old_util} {h0} src/util.py\n")
    notes = _notes_commit(a, "eng_z", c, prov)
    r = _push(a, f"{c}:{WS}", f"{notes}:refs/notes/storm/agents/eng_z")
    assert r.returncode != 0 and b"has no provenance" in r.stderr, r.stderr
    assert rev(srv, WS) == h0
    assert git(srv, "rev-parse", "refs/notes/storm/agents/eng_z", check=False).returncode != 0  # atomic


def test_guard_resolves_provenance_trailers_and_refuses_one_contradicting_the_parent(guarded):
    """A commit's Storm-Read-Set names a read set by reference (a read-set note blob and
    the first reads of its journal): the guard resolves it from the agent's notes ref
    as pushed and checks it against the parent."""
    srv, a = guarded
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/util.py", "src/api.py", agent="eng_a").returncode == 0
    assert storm(a, "write", "src/util.py", input="A\n", agent="eng_a").returncode == 0
    h1 = rev(srv, WS)
    first = git(a, "log", "-1", "--format=%B", h1).stdout.decode()
    stale = [ln for ln in first.splitlines() if ln.startswith("Storm-Read-Set: ")]
    assert stale == ["Storm-Read-Set: none 2"], first  # util.py as it was at h0: not h1's
    # a hand-made write of eng_a on h1 that claims the read set of eng_a's first write
    def forged(read_set: str, at: str = h1) -> str:
        return _commit(a, h1, {"src/api.py": "skipped validation\n"},
                       _trailers("eng_a", "src/api.py") + f"Storm-Validated-At: {at}\nStorm-Scope: all\n{read_set}\n")
    c = forged(stale[0])
    r = _push(a, f"{c}:{WS}")
    assert r.returncode != 0 and b"read src/util.py as" in r.stderr and b"but the parent has" in r.stderr, r.stderr
    assert rev(srv, WS) == h1
    # a journal that is nowhere (not folded, not pushed) cannot vouch for anything
    notes_tip = rev(a, "refs/notes/storm/agents/eng_a")
    base = readsets_base(a, "eng_a")
    r = _push(a, f"{forged(f'Storm-Read-Set: {base} 3')}:{WS}")
    assert r.returncode != 0 and b"is not in refs/notes/storm/agents/eng_a" in r.stderr, r.stderr
    # validated somewhere else than at the parent
    r = _push(a, f"{forged(f'Storm-Read-Set: {base} 0', at=h0)}:{WS}")
    assert r.returncode != 0 and b"not at its parent" in r.stderr, r.stderr
    # malformed
    r = _push(a, f"{forged('Storm-Read-Set: yesterday')}:{WS}")
    assert r.returncode != 0 and b"provenance trailers cannot be read" in r.stderr, r.stderr
    # the read set as it is now (eng_a's read-set note after its write: util.py at h1) passes
    assert rev(srv, "refs/notes/storm/agents/eng_a") == notes_tip
    c = forged(f"Storm-Read-Set: {base} 0")
    r = _push(a, f"{c}:{WS}")
    assert r.returncode == 0, r.stderr
    assert rev(srv, WS) == c


def readsets_base(repo: Path, agent: str) -> str:
    """The agent's current read-set note blob (what its next write's Storm-Read-Set names)."""
    from storm_git.core.readsets import load_view
    from storm_git.core.store import Store

    return load_view(Store.discover(str(repo)), agent).base


def test_guard_refuses_a_write_that_changes_unnamed_paths(guarded):
    srv, a = guarded
    h = rev(srv, WS)
    c = _commit(a, h, {"src/util.py": "x\n", "src/api.py": "sneaked\n"}, _trailers("eng_z", "src/util.py"))
    r = _push(a, f"{c}:{WS}")
    assert r.returncode != 0 and b"do not name" in r.stderr, r.stderr


def test_guard_install_refuses_a_non_bare_repository(tmp_path):
    a = make_repo(tmp_path / "a", init_storm=False)
    code, err = storm_json(a, "server-hook", "install")
    assert code == 2 and "not a bare repository" in err["error"]["message"]


def test_guard_keeps_and_chains_an_existing_hook(tmp_path):
    srv = bare(tmp_path / "proj.git")
    hook = srv / "hooks" / "pre-receive"
    log = tmp_path / "chained.log"
    hook.write_text(f"#!/bin/sh\ncat >> '{log}'\n")
    hook.chmod(0o755)
    code, res = storm_json(srv, "server-hook", "install")
    assert code == 0 and res["chained"].endswith("pre-receive.storm-chained")
    assert os.stat(hook).st_mode & stat.S_IXUSR
    seed(tmp_path, str(srv))
    assert WS in log.read_text()


def test_guard_install_compiles_storm_for_the_hooks_interpreter(tmp_path):
    """The hook starts a Python for every push: install writes storm's bytecode once, so
    that Python never compiles storm from source, even where nothing else writes it."""
    import importlib.util

    import storm_git.remote.server_hook as guard

    pyc = Path(importlib.util.cache_from_source(guard.__file__))
    pyc.unlink(missing_ok=True)
    srv = bare(tmp_path / "proj.git")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # the CLI's own imports write none
    code, res = storm_json(srv, "server-hook", "install", env=env)
    assert code == 0 and res["precompiled"] is True, res
    assert pyc.exists()


# -- many clones, many processes ------------------------------------------------------------------
def _run_writers(tmp_path: Path, clones: list[Path], procs: int, writes: int, share: float) -> list[dict]:
    ack = tmp_path / "acks.jsonl"
    running = []
    for i, c in enumerate(clones):
        for j in range(procs):
            agent = f"w{i}_{j}"
            running.append(subprocess.Popen(
                [sys.executable, str(SUPPORT / "remote_writer.py"), str(c), agent, str(writes), str(ack),
                 str(i * 100 + j), f"own/{agent}.txt", "shared.txt", str(share)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in running:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err.decode()[-2000:]
    return [json.loads(line) for line in ack.read_text().splitlines()]


def _check_invariants(srv: Path, h0: str, clones: list[Path], recs: list[dict]) -> None:
    acks = [r for r in recs if r["kind"] == "ack"]
    assert not [r for r in recs if r["kind"] == "gave_up"]
    history = server_log(srv, h0)
    # every accepted write is one commit on the server's shared ref, and nothing else is
    assert sorted(history) == sorted(r["commit"] for r in acks)
    # no acknowledged write lost: each line is in the server's final version of its file
    for r in acks:
        final = git(srv, "show", f"{WS}:{r['path']}").stdout.decode()
        assert r["line"] in final, r
    # every rejection is justified by the server's history: at the head that rejected it
    # the file was no longer the version the writer had seen
    for r in (r for r in recs if r["kind"] == "rejection"):
        if r["reason"] == "reserved":
            continue
        at = git(srv, "rev-parse", f"{r['head']}:{r['path']}", check=False).stdout.decode().strip() or None
        assert at == r["current"] and at != r["seen"], r
        assert r["head"] in history
    # every clone converges after sync
    for c in clones:
        assert storm(c, "sync").returncode == 0
        assert rev(c, WS) == rev(srv, WS)
        for path in git(srv, "ls-tree", "-r", "--name-only", WS).stdout.decode().split():
            assert (c / path).read_bytes() == git(srv, "show", f"{WS}:{path}").stdout, (c, path)
    r = git(srv, "fsck", "--no-progress", check=False)
    assert r.returncode == 0, r.stderr


def _fleet(tmp_path: Path, daemon: Daemon, n: int) -> tuple[Path, list[Path]]:
    srv = bare(daemon.base / "proj.git")
    _install_guard(srv)
    url = daemon.url("proj.git")
    clones = [seed(tmp_path, url)] + [clone(tmp_path, url, f"c{i}") for i in range(1, n)]
    return srv, clones


def test_clones_and_processes_write_at_once(tmp_path, daemon):
    """2 clones x 2 processes x 5 writes on own and shared files, against git daemon
    with the guard installed: the invariants (larger: the slow variant)."""
    srv, clones = _fleet(tmp_path, daemon, 2)
    h0 = rev(srv, WS)
    recs = _run_writers(tmp_path, clones, procs=2, writes=5, share=0.5)
    assert len([r for r in recs if r["kind"] == "ack"]) == 2 * 2 * 5
    _check_invariants(srv, h0, clones, recs)


@pytest.mark.slow
def test_clones_and_processes_write_at_once_large(tmp_path, daemon):
    srv, clones = _fleet(tmp_path, daemon, 4)
    h0 = rev(srv, WS)
    recs = _run_writers(tmp_path, clones, procs=3, writes=25, share=0.5)
    _check_invariants(srv, h0, clones, recs)


def test_rm_edit_and_exec_start_from_the_remote_head(tmp_path):
    """A file another clone created is there for rm/edit without a sync first; exec
    records a command's change and pushes it like any write (the guard accepts them all)."""
    srv = bare(tmp_path / "proj.git")
    _install_guard(srv)
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    assert storm(a, "write", "new.txt", input="one\n", agent="eng_a").returncode == 0
    code, res = storm_json(b, "rm", "new.txt", agent="eng_b")  # b never fetched it: not "not found"
    assert code == 1 and res["rejection"]["reason"] == "unread_target", res
    code, res = storm_json(b, "edit", "new.txt", "--old", "one", "--new", "two", agent="eng_b")
    assert code == 0 and res["accepted"] and git(srv, "show", f"{WS}:new.txt").stdout == b"two\n"
    r = storm(b, "exec", "--agent", "eng_b", "--", "sh", "-c", "echo three >> new.txt")
    assert r.returncode == 0, r.stderr
    assert git(srv, "show", f"{WS}:new.txt").stdout == b"two\nthree\n"
    code, res = storm_json(b, "rm", "new.txt", agent="eng_b")
    assert code == 0 and res["accepted"]
    assert git(srv, "cat-file", "-e", f"{WS}:new.txt", check=False).returncode != 0
    assert storm(a, "sync").returncode == 0 and not (a / "new.txt").exists()


def test_a_write_that_keeps_losing_gives_up_with_exit_3(tmp_path, daemon):
    """storm.remoteRetrySeconds bounds the retries: past it the write stops, exit 3,
    with the agent's journal as it was (the lost attempt does not count as read)."""
    srv = bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    b = clone(tmp_path, url, "b")
    h0 = rev(srv, WS)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    code, ra = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    git(srv, "update-ref", WS, h0, ra["commit"])
    marker = _window_hook(srv, ra["commit"], h0)
    git(b, "config", "storm.remoteRetrySeconds", "0")
    assert storm(b, "read", "src/api.py", agent="eng_b").returncode == 0
    journal = _journal(b, "eng_b")
    code, err = storm_json(b, "write", "src/api.py", input="B\n", agent="eng_b")
    assert marker.exists() and code == 3 and err["error"]["kind"] == "busy", err
    assert _journal(b, "eng_b") == journal and rev(srv, WS) == ra["commit"]
    git(b, "config", "--unset", "storm.remoteRetrySeconds")
    code, rb = storm_json(b, "write", "src/api.py", input="B\n", agent="eng_b")
    assert code == 0 and rb["accepted"] and rev(srv, WS) == rb["commit"]


def test_a_refused_push_is_exit_3_and_changes_nothing(tmp_path):
    """The server refuses (here a site's own pre-receive policy, chained after storm's
    guard): exit 3 naming the refusal; nothing changes here or there."""
    srv = bare(tmp_path / "proj.git")
    policy = srv / "hooks" / "pre-receive"
    policy.write_text("#!/bin/sh\ncat >/dev/null\necho 'site policy: frozen' >&2\nexit 1\n")
    policy.chmod(0o755)
    a = make_repo(tmp_path / "seed", init_storm=False)
    git(a, "remote", "add", "origin", str(srv))
    policy.rename(srv / "hooks" / "policy")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    (srv / "hooks" / "policy").rename(policy)
    _install_guard(srv)  # keeps the policy as pre-receive.storm-chained
    h = rev(srv, WS)
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    before = (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes())
    code, err = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 3 and err["error"]["kind"] == "remote_refused", err
    assert "pre-receive hook declined" in err["error"]["message"]
    assert (snapshot_refs(a), _journal(a, "eng_a"), (a / "src/util.py").read_bytes()) == before
    assert rev(srv, WS) == h


def test_guard_runs_only_for_storm_refs_and_fails_closed(guarded):
    """A branch push does not start the interpreter; a storm push whose guard cannot
    run (its interpreter is gone: the pre-receive guard's and the proc-receive hook's
    that orders writes) is refused, not let through."""
    srv, a = guarded
    hook = srv / "hooks" / "pre-receive"
    hook.write_text(hook.read_text().replace("STORM_PYTHON=", "STORM_PYTHON='/nonexistent/python' #"))
    order = srv / "hooks" / "proc-receive"
    order.write_text(order.read_text().replace("exec ", "exec '/nonexistent/python' #"))
    git(a, "commit", "-q", "--allow-empty", "--no-verify", "-m", "more")
    assert _push(a, "main").returncode == 0
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    h = rev(srv, WS)
    code, err = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 3 and err["error"]["kind"] == "remote_refused", err
    assert rev(srv, WS) == h


def test_remote_protocol_setting(tmp_path, daemon):
    """storm.remoteProtocol: auto fetches git:// with protocol v0 (v2 stalls on git
    daemon), keeps git's default elsewhere; an explicit version is used as given; a bad
    value is a one-line usage error (exit 2) that changes nothing."""
    from storm_git.core.store import Store
    from storm_git.remote.transport import protocol_args

    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    store = Store.discover(str(a))
    assert protocol_args(store, daemon.url("proj.git")) == ["-c", "protocol.version=0"]
    assert protocol_args(store, f"file://{srv}") == [] and protocol_args(store, str(srv)) == []
    git(a, "config", "storm.remoteProtocol", "2")
    assert protocol_args(Store.discover(str(a)), daemon.url("proj.git")) == ["-c", "protocol.version=2"]
    assert storm(a, "sync").returncode == 0  # v2 works, only slower
    git(a, "config", "storm.remoteProtocol", "fast")
    before = snapshot_refs(a)
    code, err = storm_json(a, "sync")
    assert code == 2 and "storm.remoteProtocol is 'fast'" in err["error"]["message"], err
    assert snapshot_refs(a) == before


@pytest.mark.parametrize("where", ["inside", "shared"])
def test_guard_install_follows_the_servers_core_hookspath(tmp_path, where):
    """A server whose git runs hooks from ``core.hooksPath`` (a directory shared by its
    repositories, or one inside the repository) never runs ``hooks/pre-receive``: a
    guard written there would let a forged commit through. The guard goes where git
    will run it, and says so."""
    srv = bare(tmp_path / "proj.git")
    hooks = (srv / "custom-hooks") if where == "inside" else (tmp_path / "server-hooks")
    hooks.mkdir()
    git(srv, "config", "core.hooksPath", "custom-hooks" if where == "inside" else str(hooks))
    code, res = storm_json(srv, "server-hook", "install")
    assert code == 0, res
    assert res["hook"] == str(hooks / "pre-receive") and os.access(hooks / "pre-receive", os.X_OK)
    assert not (srv / "hooks" / "pre-receive").exists()
    assert bool(res["shared"]) == (where == "shared")
    _forged_push_is_refused(srv, seed(tmp_path, str(srv)))


def test_guard_check_says_whether_git_will_run_the_guard(tmp_path):
    """``server-hook check``: exit 0 while git runs storm's guard; exit 3 naming the cause
    after core.hooksPath is set under an installed guard (it silently stops running)
    and after the guard's interpreter is gone (every push to storm's refs refused)."""
    srv = bare(tmp_path / "proj.git")
    code, err = storm_json(srv, "server-hook", "check")
    assert code == 3 and err["error"]["kind"] == "guard_inactive" and "not installed" in err["error"]["message"]
    _install_guard(srv)
    code, res = storm_json(srv, "server-hook", "check")
    assert code == 0 and res["hook"] == str(srv / "hooks" / "pre-receive") and res["python"] == sys.executable
    other = tmp_path / "ops-hooks"
    other.mkdir()
    git(srv, "config", "core.hooksPath", str(other))
    r = storm(srv, "server-hook", "check")
    assert r.returncode == 3 and "core.hooksPath sends hooks to" in r.stderr and str(other) in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # one line and the hint
    _install_guard(srv)
    assert storm(srv, "server-hook", "check").returncode == 0
    hook = other / "pre-receive"
    hook.write_text(hook.read_text().replace(f"STORM_PYTHON='{sys.executable}'", "STORM_PYTHON='/nonexistent/python3'"))
    code, err = storm_json(srv, "server-hook", "check")
    assert code == 3 and "/nonexistent/python3 is gone" in err["error"]["message"]
    hook.chmod(0o644)
    code, err = storm_json(srv, "server-hook", "check")
    assert code == 3 and "not executable" in err["error"]["message"]


def test_the_record_of_seen_agents_skips_what_is_not_a_whole_valid_row(tmp_path):
    from storm_git.core.agents import record_seen, seen_agents

    common = str(tmp_path)
    record_seen(common, {"eng_a", "bad id", "x.lock", "../up"})
    assert seen_agents(common) == {"eng_a"}
    path = tmp_path / "storm" / "agents-seen"
    with open(path, "ab") as fh:
        fh.write(b"eng_torn")  # a row without its newline: not yet one
    assert seen_agents(common) == {"eng_a"}
    record_seen(common, {"eng_b", "eng_a"})  # the next rows start on a line of their own
    assert seen_agents(common) == {"eng_a", "eng_b", "eng_torn"}
    assert path.read_text().splitlines() == ["eng_a", "eng_torn", "eng_b"]


def test_writers_a_fetch_brought_are_learnt_even_when_that_fetch_stopped_before_adopting(tmp_path):
    """A process killed between its git fetch and the adoption under the workspace lock
    (here: the fetch alone, run in-process) has moved the tracking ref; the next fetch
    still learns the writers it brought (counted from the local ref, which did not move)."""
    from storm_git.core.store import Store
    from storm_git.remote import transport

    _srv, _a, b, ra = _one_write_on_a(tmp_path, "eng_a", "A\n")
    transport.fetch(Store.discover(str(b)), "origin", ())  # ... and the process died here
    assert rev(b, "refs/storm-remote/origin/storm/workspace") == ra["commit"] != rev(b, WS)
    assert not (b / ".git/storm/agents-seen").exists()
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    assert (b / ".git/storm/agents-seen").read_text().split() == ["eng_a"]
    assert rev(b, WS) == ra["commit"]


def test_a_tracking_ref_locked_for_a_moment_by_git_is_waited_out(tmp_path):
    """``git pack-refs --prune`` (storm's maintenance runs it) locks each loose ref it
    packs for a moment; a write that lands meanwhile waits that lock out instead of
    dying with libgit2's "failed to lock file". The lock is held here by a file that a
    background process removes after 0.5 s."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    code, res = storm_json(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert code == 0 and res["accepted"], res
    tracking = "refs/storm-remote/origin/storm/workspace"  # every write's push moves it
    assert rev(a, tracking) == rev(srv, WS)
    lock = a / ".git" / f"{tracking}.lock"
    lock.write_text("")
    remover = subprocess.Popen(["sh", "-c", f"sleep 0.5; rm -f '{lock}'"])
    try:
        code, res = storm_json(a, "write", "src/util.py", input="B\n", agent="eng_a")
    finally:
        remover.wait()
    assert code == 0 and res["accepted"], res
    assert server_log(srv)[0] == res["commit"] and rev(a, tracking) == res["commit"]


def test_with_the_server_down_a_read_serves_the_last_head_and_says_how_old(tmp_path, daemon):
    """git reads offline; so does storm's read, saying so. A write still needs the server,
    and its error is git's whole message, not a line cut at the address."""
    bare(daemon.base / "proj.git")
    url = daemon.url("proj.git")
    a = seed(tmp_path, url)
    head = rev(a, WS)
    daemon.stop()
    r = storm(a, "read", "src/util.py", agent="eng_a")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (a / "src/util.py").read_text()
    assert "offline (cannot fetch the shared workspace from origin" in r.stderr, r.stderr
    assert f"read at the last head fetched, {head[:10]}, written" in r.stderr and " ago" in r.stderr
    code, res = storm_json(a, "read", "src/util.py", agent="eng_a")
    assert code == 0 and res["files"][0]["offline"].startswith("offline (") and res["head"] == head
    r = storm(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert r.returncode == 3, r.stderr
    line = r.stderr.strip().splitlines()[0]
    assert not line.rstrip().endswith(":"), line  # "unable to connect to 127.0.0.1:" went on with the errno
    assert "errno" in line or "refused" in line.lower(), line
