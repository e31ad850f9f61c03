"""The server orders clones' writes: pushes to ``refs/storm/inbox/<clone>/`` go to
storm's ``proc-receive`` hook, which applies them in arrival order with the guard's
checks and answers per write. Real servers (a bare repository behind ``file://`` or
``git daemon``), real clones, writes queued by ``git storm`` and pushed with plain
git or with the clone's inbox push (storm_git.remote.inbox)."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pygit2
import pytest

import forge
from helpers import git, make_repo, read_as, rev, storm, write_as
from servers import bare, clone, queue, seed, served
from storm_git.remote import inbox
from storm_git.remote.arrival import lock_path, order_dir
from storm_git.remote.transport import read_push

WS = "refs/storm/workspace"
NOTES = "refs/notes/storm/agents/"


# Every scenario runs over file://; over git daemon (the hooks under another process's
# environment, the answer through git's transport) the three marked BOTH run by default
# and the rest with the long variants (-m slow).
BOTH = pytest.mark.parametrize("site", ["file", "daemon"], indirect=True)


@pytest.fixture(params=["file", pytest.param("daemon", marks=pytest.mark.slow)])
def site(request, tmp_path: Path):
    """(server, clone a, clone b, clone c): the server has storm's guard and ordering."""
    srv, url = served(request, tmp_path, request.param)
    r = storm(srv, "server-hook", "install", str(srv))
    assert r.returncode == 0 and "orders clones' writes" in r.stdout, r.stderr
    clones = [seed(tmp_path, url, reservation=None, name="a")]
    clones += [clone(tmp_path, url, name, reservation=None) for name in ("b", "c")]
    return srv, *clones


def plain_push(c: Path, commit: pygit2.Oid, agent: str, clone: str = "x1") -> subprocess.Popen:
    """The inbox push, with plain git (no storm on the pushing side)."""
    return subprocess.Popen(["git", "-c", "core.abbrev=no", "push", "--porcelain", "origin",
                             f"{commit}:refs/storm/inbox/{clone}/workspace",
                             f"{NOTES}{agent}:refs/storm/inbox/{clone}/notes/{agent}"],
                            cwd=c, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def moved_from(srv: Path, commit: str) -> str | None:
    body = git(srv, "log", "-1", "--format=%B", commit).stdout.decode()
    return next((ln.split(": ", 1)[1] for ln in body.splitlines() if ln.startswith("Storm-Moved-From: ")), None)


def history(srv: Path) -> list[str]:
    return git(srv, "rev-list", "--reverse", WS).stdout.decode().split()


def applied(srv: Path, queued: pygit2.Oid) -> list[str]:
    """The server's commits that are ``queued`` (as pushed, or rebuilt from it)."""
    return [c for c in history(srv) if c == str(queued) or moved_from(srv, c) == str(queued)]


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def tickets(srv: Path) -> list[str]:
    d = order_dir(str(srv))
    return sorted(n for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


# -- verdicts -------------------------------------------------------------------------------
@BOTH
def test_write_on_the_head_lands_as_it_is(site) -> None:
    srv, _a, b, _c = site
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")
    before = rev(srv, WS)
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert ans.landed == [(pygit2.Oid(hex=before), q)] and not (ans.refused or ans.unclear or ans.not_applied)
    assert rev(srv, WS) == str(q)
    assert ans.notes == {NOTES + "bob": notes} and rev(srv, NOTES + "bob") == str(notes)


def test_write_behind_the_head_is_moved_onto_it_and_answered(site) -> None:
    """Another clone landed a write on another file meanwhile: the server rebuilds the
    queued write on the new head (no lease lost, no second round trip), and says
    what it became; the rebuilt commit passes the guard's checks as any write."""
    srv, a, b, _c = site
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")
    read_as(a, "al", "src/util.py")
    assert write_as(a, "src/util.py", "x = 1\n", agent="al")[0] == 0
    theirs = rev(srv, WS)
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert len(ans.landed) == 1 and str(ans.landed[0][0]) == theirs
    now = str(ans.landed[0][1])
    assert now != str(q) and rev(srv, WS) == now and moved_from(srv, now) == str(q)
    body = git(srv, "log", "-1", "--format=%B", now).stdout.decode()
    assert f"Storm-Validated-At: {theirs}" in body
    assert git(srv, "show", f"{now}:README.md").stdout == b"# bob\n"
    assert git(srv, "show", f"{now}:src/util.py").stdout == b"x = 1\n"


def test_conflicting_write_is_not_applied_and_says_which_path_moved(site) -> None:
    srv, a, b, _c = site
    st, q, notes = queue(b, "bob", "src/util.py", "bob's\n")
    read_as(a, "al", "src/util.py")
    assert write_as(a, "src/util.py", "al's\n", agent="al")[0] == 0
    head = rev(srv, WS)
    p = plain_push(b, q, "bob")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "no write applied" in out.decode() and "src/util.py changed since it was validated" in out.decode()
    assert rev(srv, WS) == head
    assert git(srv, "rev-parse", "-q", "--verify", NOTES + "bob", check=False).returncode != 0  # its reads not either
    assert not git(srv, "for-each-ref", "refs/storm/inbox").stdout  # an inbox ref is never created


@pytest.mark.parametrize("moved", [True, False])
def test_a_write_of_a_path_another_agent_reserved_is_not_applied(site, moved: bool) -> None:
    """al was rejected for a conflict on README.md and holds it (a reservation, on the
    server) for its retry; bob's write of README.md, validated before that, is not
    applied, whether it goes on the head it was validated at or has to be moved onto
    a newer one: its validation would refuse it now."""
    srv, a, b, c = site
    for repo in (a, b, c):
        git(repo, "config", "storm.reservationSeconds", "60")
    read_as(a, "al", "README.md")
    read_as(c, "cy", "README.md")
    assert write_as(c, "README.md", "# cy\n", agent="cy")[0] == 0
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")  # on cy's write
    code, res = write_as(a, "README.md", "# al\n", agent="al")
    assert code == 1 and res["rejection"]["reason"] == "direct_conflict", res
    assert git(srv, "ls-tree", "refs/storm/reservations").stdout  # al's reservation reached the server
    if moved:
        read_as(c, "cy", "src/api.py")
        assert write_as(c, "src/api.py", "cy = 2\n", agent="cy")[0] == 0  # bob's write must move
    head = rev(srv, WS)
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert not ans.landed and ans.not_applied and "README.md" in ans.not_applied, ans
    assert rev(srv, WS) == head


# -- order ----------------------------------------------------------------------------------
@BOTH
def test_pushes_are_applied_in_arrival_order(site) -> None:
    """The server lock held: b's push arrives, then c's; released, b's write lands
    first and c's is moved onto it, whatever the scheduler wakes first."""
    srv, _a, b, c = site
    _sb, qb, _nb = queue(b, "bob", "README.md", "# bob\n")
    _sc, qc, _nc = queue(c, "cy", "src/api.py", "cy = 1\n")
    # -o: killing flock frees it
    holder = subprocess.Popen(["flock", "-o", lock_path(str(srv), "order"), "sleep", "60"])
    try:
        wait_for(lambda: os.path.exists(lock_path(str(srv), "order")) and holder.poll() is None, "the lock")
        time.sleep(0.2)
        pb = plain_push(b, qb, "bob", "b")
        wait_for(lambda: len(tickets(srv)) == 1, "b's ticket")
        pc = plain_push(c, qc, "cy", "c")
        wait_for(lambda: len(tickets(srv)) == 2, "c's ticket")
        assert rev(srv, WS) not in (str(qb), str(qc))  # neither applied while the lock is held
    finally:
        holder.kill()
        holder.wait()
    for p in (pb, pc):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)
    h = history(srv)
    assert h[-2] == str(qb) and moved_from(srv, h[-1]) == str(qc)
    log = (Path(order_dir(str(srv))) / "log").read_text().splitlines()
    assert [ln.split()[2] for ln in log[-2:]] == ["b", "c"]
    assert tickets(srv) == []


def test_hook_killed_after_applying_the_push_again_learns_it_landed_once(site) -> None:
    """The hook is killed between moving the refs and answering (it blocks opening its
    log, a FIFO here): the push fails without a verdict; pushed again, the same queue
    is answered landed, with the commit it became the first time, and is on the
    server once."""
    srv, a, b, _c = site
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")
    read_as(a, "al", "src/util.py")
    assert write_as(a, "src/util.py", "x = 1\n", agent="al")[0] == 0  # b's write will be rebuilt
    log = Path(order_dir(str(srv))) / "log"
    log.unlink(missing_ok=True)
    os.mkfifo(log)
    p = plain_push(b, q, "bob")
    try:
        wait_for(lambda: moved_from(srv, rev(srv, WS)) == str(q), "the hook to apply the write")
        (ticket,) = tickets(srv)
        pid = int((Path(order_dir(str(srv))) / ticket).read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    finally:
        log.unlink()
    assert p.returncode != 0
    first = inbox.read_answer(read_push(p.returncode, out, err))
    assert first.unclear and not first.landed and not first.refused, first
    landed_as = rev(srv, WS)
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert [str(n) for _o, n in ans.landed] == [landed_as] and not ans.unclear
    assert rev(srv, WS) == landed_as and len(applied(srv, q)) == 1


def test_a_copy_pushed_to_another_clones_inbox_lands_once(site) -> None:
    """An inbox name gives no rights and no identity: b's queued write pushed by c to
    b's inbox is a write like any other; b's own push of it afterwards is answered
    landed, and the write is on the server once."""
    srv, _a, b, c = site
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")
    git(c, "fetch", "-q", str(b), f"+{q}:refs/heads/stolen", f"+{notes}:refs/heads/stolen-notes")
    r = git(c, "push", "--porcelain", "origin", f"{q}:refs/storm/inbox/{inbox.clone_name(st)}/workspace",
            f"{notes}:refs/storm/inbox/{inbox.clone_name(st)}/notes/bob", check=False)
    assert r.returncode == 0, r.stderr
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert [n for _o, n in ans.landed] == [q] and applied(srv, q) == [str(q)]


def test_a_lease_push_beside_the_inbox_is_never_overwritten(site) -> None:
    """A clone pushing to the workspace with a lease while an inbox push waits for the
    server lock: both land, the inbox's write moved onto the leased one."""
    srv, a, b, _c = site
    _st, q, _notes = queue(b, "bob", "README.md", "# bob\n")
    _sa, qa, na = queue(a, "al", "src/util.py", "x = 1\n")
    head = rev(srv, WS)
    # -o: killing flock frees it
    holder = subprocess.Popen(["flock", "-o", lock_path(str(srv), "order"), "sleep", "60"])
    try:
        time.sleep(0.2)
        p = plain_push(b, q, "bob")
        wait_for(lambda: len(tickets(srv)) == 1, "b's ticket")
        r = git(a, "push", "--atomic", "--porcelain", f"--force-with-lease={WS}:{head}", "origin",
                f"{qa}:{WS}", f"{na}:{NOTES}al", check=False)  # a client that pushes with a lease
        assert r.returncode == 0, r.stdout + r.stderr
        leased = rev(srv, WS)
        assert leased == str(qa)
    finally:
        holder.kill()
        holder.wait()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    h = history(srv)
    assert h[-2] == leased and moved_from(srv, h[-1]) == str(q)


def test_a_held_ref_lock_makes_the_server_answer_busy_and_change_nothing(site) -> None:
    """``refs/storm/workspace.lock`` held on the server (a push leased on it, stuck; kept
    as young as a live update's lock, or it would be taken for a dead one's after 2 s):
    the hook's transaction cannot take it, it tries again a few times, then answers
    "busy" naming the lock (the clone pushes again); nothing moved."""
    srv, _a, b, _c = site
    st, q, notes = queue(b, "bob", "README.md", "# bob\n")
    head = rev(srv, WS)
    lock = srv / "refs" / "storm" / "workspace.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(head + "\n")
    done = threading.Event()
    fresh = threading.Thread(target=lambda: [os.utime(lock) for _ in iter(lambda: done.wait(0.3), True)])
    fresh.start()
    try:
        ans = inbox.push(st, "origin", q, {"bob": notes})
    finally:
        done.set()
        fresh.join()
        lock.unlink()
    assert ans.busy and not ans.landed and "workspace.lock" in ans.busy, ans
    assert rev(srv, WS) == head
    ans = inbox.push(st, "origin", q, {"bob": notes})
    assert [n for _o, n in ans.landed] == [q]


# -- hostile inboxes ------------------------------------------------------------------------
@BOTH
def test_what_the_guard_refuses_is_refused_in_an_inbox(site) -> None:
    """Through the inbox as on the workspace: a commit that is not a storm write, a
    tree with a link out of it, a file over the server's storm.maxFileBytes, an
    object that is not a commit. Nothing moves."""
    srv, _a, b, _c = site
    git(srv, "config", "storm.maxFileBytes", "1024")
    head = rev(srv, WS)
    git(b, "fetch", "-q", "origin", f"+{WS}:refs/forged-base")
    tree = git(b, "rev-parse", f"{head}^{{tree}}").stdout.decode().strip()
    plain = git(b, "commit-tree", "-p", head, "-m", "not storm's", tree).stdout.decode().strip()
    cases = {
        plain: "lacks storm's trailers",
        forge.commit(b, head, {b"docs/api": (forge.LINK, b"../../../etc/passwd")}): "docs/api",
        forge.commit(b, head, {b"big.bin": (forge.FILE, b"x" * 1025)}): "big.bin",
        forge.blob(b, b"data"): "not a commit",
    }
    for oid, why in cases.items():
        r = git(b, "push", "--porcelain", "origin", f"{oid}:refs/storm/inbox/x/workspace", check=False)
        out = r.stdout.decode() + r.stderr.decode()  # refused by the pre-receive hook: its reason is on stderr
        assert r.returncode == 1 and "git storm guard: refused" in out and why in out, out
        assert rev(srv, WS) == head
    fine = forge.commit(b, head, {b"big.bin": (forge.FILE, b"x" * 1024)})  # the guard's limit, not a bug
    r = git(b, "push", "--porcelain", "origin", f"{fine}:refs/storm/inbox/x/workspace", check=False)
    assert r.returncode == 0 and rev(srv, WS) == fine


@pytest.mark.parametrize("ref", ["refs/storm/inbox/../workspace", "refs/storm/inbox/x/other",
                                 "refs/storm/inbox/x/notes/bad agent", "refs/storm/inbox/-x/workspace"])
def test_odd_inbox_names_are_refused(site, ref: str) -> None:
    srv, _a, b, _c = site
    head = rev(srv, WS)
    r = git(b, "push", "--porcelain", "origin", f"{head}:{ref}", check=False)
    assert r.returncode != 0
    assert rev(srv, WS) == head and not git(srv, "for-each-ref", "refs/storm/inbox").stdout


def test_the_ordering_ref_cannot_be_pushed(site) -> None:
    srv, _a, b, _c = site
    before = rev(srv, "refs/storm/ordering")
    head = rev(srv, WS)
    for spec in (f"{head}:refs/storm/ordering", ":refs/storm/ordering"):
        r = git(b, "push", "--porcelain", "--force", "origin", spec, check=False)
        assert r.returncode != 0, spec
    assert rev(srv, "refs/storm/ordering") == before


# -- servers that do not order --------------------------------------------------------------
def test_without_ordering_the_inbox_is_refused_and_the_clone_told_to_lease(tmp_path: Path) -> None:
    srv = bare(tmp_path / "proj.git")
    r = storm(srv, "server-hook", "install", "--no-order", str(srv))
    assert r.returncode == 0 and "orders" not in r.stdout
    assert git(srv, "rev-parse", "-q", "--verify", "refs/storm/ordering", check=False).returncode != 0
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", f"file://{srv}")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    st, q, notes = queue(a, "al", "README.md", "# al\n")
    assert not inbox.server_orders(st, "origin")
    ans = inbox.push(st, "origin", q, {"al": notes})
    assert ans.unordered and not ans.landed and not ans.refused, ans
    assert not git(srv, "for-each-ref", "refs/storm/inbox").stdout


def test_without_any_hook_the_stray_inbox_ref_is_seen(tmp_path: Path) -> None:
    """A server with no hook at all makes the inbox ref a plain ref: the clone sees it
    was not ordered (and can delete it)."""
    srv = bare(tmp_path / "proj.git")
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", f"file://{srv}")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    st, q, notes = queue(a, "al", "README.md", "# al\n")
    ans = inbox.push(st, "origin", q, {"al": notes})
    assert ans.unordered and ans.stray and not ans.landed
    inbox.remove_stray(st, "origin", ans.stray)
    assert not git(srv, "for-each-ref", "refs/storm/inbox").stdout


def test_check_reports_ordering_and_a_broken_one(tmp_path: Path) -> None:
    srv = bare(tmp_path / "proj.git")
    assert storm(srv, "server-hook", "install", str(srv)).returncode == 0
    r = storm(srv, "server-hook", "check", str(srv))
    assert r.returncode == 0 and "ordered here" in r.stdout
    git(srv, "config", "--unset-all", "receive.procReceiveRefs")
    r = storm(srv, "server-hook", "check", str(srv))
    assert r.returncode == 3 and "refs/storm/ordering" in r.stderr
