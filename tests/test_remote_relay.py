"""The relay (storm_git.remote.relay): storm's git commands to a ``git://`` server go
through a long-lived loopback process with TCP_NODELAY and TCP_QUICKACK set. Real
``git daemon``s, real relay processes, and adversaries that kill the relay, hold
its lock, point its record at a dead port, or lose a push's answer on purpose."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import git, rev, storm, storm_json
from test_remote import bare, clone, daemon, seed, server_log  # noqa: F401 (daemon: a fixture)

from storm_git.remote import relay


def dest_of(repo: Path) -> relay.Destination:
    url = git(repo, "config", "remote.origin.url").stdout.decode().strip()
    d = relay.destination(url)
    assert d is not None, url
    return d


def commondir(repo: Path) -> str:
    return str(repo / ".git")


def wait_for(predicate, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def running(repo: Path) -> relay.RelayState | None:
    return relay.running(commondir(repo), dest_of(repo))


def write(repo: Path, path: str, content: str, agent: str = "eng_a") -> dict:
    code, res = storm_json(repo, "write", path, "-m", f"{agent}: relay test", input=content, agent=agent)
    assert code == 0 and res["accepted"], res
    return res


def test_destinations_and_settings():
    d = relay.destination("git://127.0.0.1:9999/proj.git")
    assert (d.host, d.port, d.prefix) == ("127.0.0.1", 9999, "git://127.0.0.1:9999/")
    d = relay.destination("git://example.org/srv/proj.git")
    assert (d.host, d.port, d.prefix) == ("example.org", relay.GIT_PORT, "git://example.org/")
    d = relay.destination("git://[::1]:7000/p.git")
    assert (d.host, d.port, d.prefix) == ("::1", 7000, "git://[::1]:7000/")
    for url in ("ssh://host/p.git", "https://host/p.git", "file:///srv/p.git", "/srv/p.git",
                "git://host:notaport/p.git", "git://", "git://host"):
        assert relay.destination(url) is None, url
    assert relay.enabled(None) and relay.enabled("auto") and relay.enabled("True")
    assert not relay.enabled("false") and not relay.enabled("0")
    with pytest.raises(ValueError):
        relay.enabled("sometimes")


def test_a_record_that_is_not_one_reads_as_none(tmp_path):
    d = relay.destination("git://127.0.0.1:9/p.git")
    path = Path(relay.state_path(str(tmp_path), d))
    path.parent.mkdir(parents=True)
    for text in ("{not json", "[1, 2]", '"text"', '{"port": "x"}', "", "\x00\xff"):
        path.write_text(text)
        assert relay.read_state(str(tmp_path), d) is None, text
    path.write_text('{"port": 5, "pid": 7, "unknown": 1}')
    assert relay.read_state(str(tmp_path), d) == relay.RelayState(pid=7, port=5)
    assert relay.running(str(tmp_path), d) is None  # nobody holds its lock


def test_a_git_url_clone_starts_a_relay_and_its_commands_go_through_it(tmp_path, daemon):
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    h0 = rev(srv, "refs/storm/workspace")
    first = wait_for(lambda: running(a))  # started by the seed's own commands
    assert first.dport == daemon.port and first.host == "127.0.0.1"
    served = first.served
    for i in range(3):
        write(a, f"relayed{i}.txt", f"{i}\n")
    now = running(a)
    assert now.pid == first.pid and now.served >= served + 3  # one push a write, at least
    assert len(server_log(srv, h0)) == 3
    code, res = storm_json(a, "relay")
    assert code == 0 and res["running"] and res["pid"] == first.pid and res["port"] == first.port
    assert res["served"] == now.served and res["server"] == f"127.0.0.1:{daemon.port}"
    text = storm(a, "relay")
    assert text.returncode == 0 and f"pid {first.pid}" in text.stdout and "connection(s) carried" in text.stdout
    # --stop: it exits, its lock and record go; the next command starts another
    code, res = storm_json(a, "relay", "--stop")
    assert code == 0 and res["stopped"] and res["pid"] == first.pid
    assert running(a) is None and not relay.alive(commondir(a), dest_of(a))
    assert not os.path.exists(relay.state_path(commondir(a), dest_of(a)))
    write(a, "after_stop.txt", "x\n")  # direct, and it starts one
    assert wait_for(lambda: running(a)).pid != first.pid


def test_a_killed_relay_costs_nothing_and_is_replaced(tmp_path, daemon):
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    first = wait_for(lambda: running(a))
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not relay.alive(commondir(a), dest_of(a)))
    # its record still names its port: unused, since nobody holds its lock
    assert relay.read_state(commondir(a), dest_of(a)).port == first.port
    h0 = rev(srv, "refs/storm/workspace")
    res = write(a, "k.txt", "k\n")
    assert server_log(srv, h0) == [res["commit"]]
    assert wait_for(lambda: running(a)).pid != first.pid


def test_a_held_lock_with_a_record_naming_a_dead_port_falls_back_to_git(tmp_path, daemon):
    """Someone else holds the relay's lock (flock, as a stuck relay would) and the
    record names a port where nothing listens: each command tries it, fails to
    connect, and runs on git's own connection; no relay is started beside it."""
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    first = wait_for(lambda: running(a))
    storm(a, "relay", "--stop")
    d = dest_of(a)
    with socket_port() as dead:
        pass  # bound, then closed: nothing listens there now
    relay._write_state(relay.state_path(commondir(a), d), relay.RelayState(pid=first.pid, port=dead, host="x"))
    holder = subprocess.Popen(["flock", "-o", relay.lock_path(commondir(a), d), "sleep", "60"])
    try:
        wait_for(lambda: relay.alive(commondir(a), d))
        h0 = rev(srv, "refs/storm/workspace")
        res = write(a, "dead.txt", "d\n")
        assert server_log(srv, h0) == [res["commit"]]
        assert storm(a, "read", "dead.txt", agent="eng_b").returncode == 0  # a fetch, the same way
        assert relay.read_state(commondir(a), d).port == dead  # nobody replaced the holder's record
        # --stop signals only the lock's holder: the record's pid is not it, so nobody is
        r = storm(a, "relay", "--stop")
        assert r.returncode == 3 and r.stderr.count("\n") == 1 and "not stopped" in r.stderr, r.stderr
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


class socket_port:
    """A loopback port that was free a moment ago."""

    def __enter__(self) -> int:
        import socket

        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        return self.s.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.s.close()


FORWARDER = r'''
import fcntl, json, os, socket, sys, threading
lock, state, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fd = os.open(lock, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(16)
with open(state + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "port": ls.getsockname()[1], "host": host, "dport": port}, f)
os.replace(state + ".tmp", state)
print("ready", flush=True)
dropped = False
while True:
    c, _ = ls.accept()
    u = socket.create_connection((host, port))
    first = b""
    while b"\0" not in first:  # the request line: "git-upload-pack /p.git\0host=...\0"
        more = c.recv(65536)
        if not more:
            break
        first += more
    u.sendall(first)
    push = b"git-receive-pack" in first
    victim = not dropped and push
    packed = threading.Event()
    def up(c=c, u=u, packed=packed):
        tail = b""
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                if b"PACK" in tail + d:  # (the signature may straddle two reads)
                    packed.set()
                tail = d[-3:]
                u.sendall(d)
            u.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    threading.Thread(target=up, daemon=True).start()
    while True:
        d = u.recv(65536)
        if not d:
            break
        if victim and packed.is_set():  # the server's answer to the pushed pack: lost
            dropped = True
            break
        c.sendall(d)
    print(f"{'push' if push else 'fetch'} packed={packed.is_set()} dropped={victim and dropped}", flush=True)
    for s in (c, u):  # shutdown first: it wakes the other thread's recv and sends the FIN
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
'''


def lines_until(proc: subprocess.Popen, wanted: str, seconds: float = 60) -> list[str]:
    """The lines ``proc`` prints until one starts with ``wanted`` (that one last), or
    until ``seconds`` pass (then the test fails with what it printed): a forwarder
    that never drops must not hang the suite. Read from the pipe's descriptor itself
    (a buffered reader would hold lines that select() no longer sees)."""
    import select

    fd = proc.stdout.fileno()
    buf: bytes = getattr(proc, "pending", b"")
    out: list[str] = []
    deadline = time.monotonic() + seconds
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            out.append(line.decode().strip())
            if out[-1].startswith(wanted):
                proc.pending = buf  # what came after it, for the next call
                return out
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"no {wanted!r} line in {seconds} s; printed: {out}"
        chunk = os.read(fd, 4096)
        assert chunk, f"the forwarder ended; printed: {out}"
        buf += chunk


def test_a_push_whose_answer_the_relay_lost_lands_once(tmp_path, daemon):
    """The relay carries a write's push to the server, which applies it, and drops
    the connection before the answer: git fails; storm runs the push again on git's
    own connection, whose lease is stale (the server has the write), learns by a
    fetch that the write landed, and answers accepted. One commit on the server."""
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    storm(a, "relay", "--stop")
    git(a, "config", "storm.remoteRelayIdle", "600")
    d = dest_of(a)
    script = tmp_path / "forwarder.py"
    script.write_text(FORWARDER)
    fw = subprocess.Popen([sys.executable, str(script), relay.lock_path(commondir(a), d),
                           relay.state_path(commondir(a), d), d.host, str(d.port)],
                          stdout=subprocess.PIPE)
    try:
        assert lines_until(fw, "ready", 30) == ["ready"]
        assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
        h0 = rev(srv, "refs/storm/workspace")
        res = write(a, "src/util.py", "def clamp(x, lo, hi):\n    return x\n")
        seen = lines_until(fw, "push packed=True dropped=True", 5)  # the window was opened
        assert seen[-1] == "push packed=True dropped=True", seen
        assert server_log(srv, h0) == [res["commit"]]  # applied once
        assert rev(a, "refs/storm/workspace") == res["commit"]
        assert (a / "src/util.py").read_text() == "def clamp(x, lo, hi):\n    return x\n"
        res2 = write(a, "next.txt", "n\n")  # and the clone goes on (through the forwarder)
        assert server_log(srv, h0) == [res2["commit"], res["commit"]]
    finally:
        fw.kill()
        fw.wait()
    assert git(srv, "fsck", "--no-progress").returncode == 0


def test_the_server_down_behind_a_running_relay_is_the_usual_one_line_error(tmp_path, daemon):
    srv = bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    wait_for(lambda: running(a))
    assert storm(a, "read", "src/util.py", agent="eng_a").returncode == 0
    daemon.stop()
    r = storm(a, "write", "src/util.py", input="A\n", agent="eng_a")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    # the relay could not reach the server either: git's own connection gave the answer
    assert "cannot push the write to origin" in r.stderr and "unable to connect" in r.stderr, r.stderr


def test_a_relay_started_while_another_holds_the_lock_leaves_at_once(tmp_path):
    """Two commands that start a relay at the same moment: the second finds the lock
    held (here by flock, deterministically) and exits without listening or touching
    the record of the first."""
    d = relay.destination("git://127.0.0.1:9/p.git")
    lock = Path(relay.lock_path(str(tmp_path), d))
    lock.parent.mkdir(parents=True)
    record = Path(relay.state_path(str(tmp_path), d))
    record.parent.mkdir(parents=True)
    record.write_text('{"pid": 1, "port": 5}')
    holder = subprocess.Popen(["flock", "-o", str(lock), "sleep", "60"])
    try:
        wait_for(lambda: relay.alive(str(tmp_path), d))
        r = subprocess.run([sys.executable, "-I", relay.__file__, str(tmp_path), d.host, str(d.port), "30", d.key],
                           capture_output=True, timeout=20)
        assert r.returncode == 0 and r.stderr == b"", r.stderr
        assert record.read_text() == '{"pid": 1, "port": 5}'
    finally:
        holder.kill()
        holder.wait()


def test_an_idle_relay_exits_and_removes_its_record(tmp_path, daemon):
    bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    storm(a, "relay", "--stop")
    git(a, "config", "storm.remoteRelayIdle", "0.5")
    write(a, "one.txt", "1\n")  # direct; it starts a relay with the new idle time
    st = wait_for(lambda: running(a))
    wait_for(lambda: not relay.alive(commondir(a), dest_of(a)), 10)
    assert not os.path.exists(relay.state_path(commondir(a), dest_of(a)))
    with pytest.raises(ProcessLookupError):
        wait_for(lambda: os.kill(st.pid, 0) and False, 5)


def test_a_recent_start_that_never_came_up_is_not_retried_at_every_command(tmp_path, daemon):
    bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    storm(a, "relay", "--stop")
    d = dest_of(a)
    relay._write_state(relay.state_path(commondir(a), d), relay.RelayState(spawned=time.time()))
    write(a, "one.txt", "1\n")
    write(a, "two.txt", "2\n")
    assert not relay.alive(commondir(a), d)
    # a record too old (or unreadable) starts one again
    with open(relay.state_path(commondir(a), d), "w") as f:
        f.write("[1, 2]")  # JSON, not a record
    write(a, "three.txt", "3\n")
    assert wait_for(lambda: running(a))


def test_relay_off_and_bad_settings(tmp_path, daemon):
    bare(daemon.base / "proj.git")
    a = seed(tmp_path, daemon.url("proj.git"))
    storm(a, "relay", "--stop")
    git(a, "config", "storm.remoteRelay", "false")
    write(a, "one.txt", "1\n")
    time.sleep(0.3)  # a relay, had one been started, takes its lock within this
    assert not relay.alive(commondir(a), dest_of(a)) and relay.read_state(commondir(a), dest_of(a)) is None
    code, res = storm_json(a, "relay")
    assert code == 0 and res["enabled"] is False and res["running"] is False
    git(a, "config", "storm.remoteRelay", "sometimes")
    before = rev(a, "refs/storm/workspace")
    r = storm(a, "write", "two.txt", input="2\n", agent="eng_a")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "storm.remoteRelay" in r.stderr, r.stderr
    assert rev(a, "refs/storm/workspace") == before
    git(a, "config", "storm.remoteRelay", "auto")
    git(a, "config", "storm.remoteRelayIdle", "soon")
    r = storm(a, "write", "two.txt", input="2\n", agent="eng_a")
    assert r.returncode not in (0, 1) and r.stderr.count("\n") == 1 and "storm.remoteRelayIdle" in r.stderr, r.stderr
    assert rev(a, "refs/storm/workspace") == before


def test_other_transports_have_no_relay(tmp_path):
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, f"file://{srv}")
    write(a, "one.txt", "1\n")
    assert not (a / ".git" / "storm" / "relay").exists()
    code, res = storm_json(a, "relay")
    assert code == 0 and res["running"] is False and res["relayed"] is False
    assert "file://" in storm(a, "relay").stdout


def test_relay_outside_a_remote_workspace_is_refused(tmp_path):
    from helpers import make_repo

    r = make_repo(tmp_path / "local")
    out = storm(r, "relay")
    assert out.returncode != 0 and out.stderr.count("\n") == 1 and "storm.remote" in out.stderr, out.stderr
