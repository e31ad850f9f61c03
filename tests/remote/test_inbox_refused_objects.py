"""A push to an inbox that storm refuses leaves nothing in the server's object store:
its objects are refused while git still holds them in quarantine (the pre-receive
hook, storm_git.remote.inbox_check), not after git moved them in (the proc-receive
hook runs after that). Pushes made with plain git: a tree holding ``.GIT``, a blob
over the server's size limit, a queue longer than a push may carry."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import forge
from helpers import git, make_repo, rev, storm
from servers import bare

WS = "refs/storm/workspace"


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path]:
    """(a server that orders writes, over file://; a clone of it)."""
    srv = bare(tmp_path / "proj.git")
    assert storm(srv, "server-hook", "install", str(srv)).returncode == 0
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", f"file://{srv}")
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    return srv, a


def objects(srv: Path) -> dict[str, str]:
    out = git(srv, "count-objects", "-v").stdout.decode().splitlines()
    return {k: v.strip() for k, v in (ln.split(":", 1) for ln in out) if k in ("count", "in-pack", "packs")}


def chain(c: Path, head: str, n: int) -> str:
    """``n`` commits on ``head``, one after the other (one git fast-import)."""
    stream = []
    for i in range(n):
        stream.append(f"commit refs/heads/long\ncommitter x <x@x> {1700000000 + i} +0000\ndata 2\n{i % 10}\n")
        if i == 0:
            stream.append(f"from {head}\n")
        stream.append(f"M 100644 inline n.txt\ndata {len(str(i)) + 1}\n{i}\n\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=c, input="".join(stream).encode(), check=True)
    return git(c, "rev-parse", "refs/heads/long").stdout.decode().strip()


@pytest.mark.parametrize("case", ["dotgit", "big", "long"])
def test_a_refused_inbox_push_leaves_no_objects(site, case: str) -> None:
    srv, a = site
    head = rev(srv, WS)
    git(a, "fetch", "-q", "origin", f"+{WS}:refs/forged-base")
    if case == "dotgit":
        tip, why = forge.commit(a, head, {b".GIT/config": (forge.FILE, b"[core]\n")}), ".GIT"
    elif case == "big":
        tip, why = forge.commit(a, head, {b"big.bin": (forge.FILE, os.urandom(11 << 20))}), "big.bin"
    else:
        tip, why = chain(a, head, 1025), "more than 1024 writes"
    before = objects(srv)
    r = git(a, "push", "--porcelain", "origin", f"{tip}:refs/storm/inbox/x1/workspace", check=False)
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 1 and "git storm guard: refused" in out and why in out, out
    assert rev(srv, WS) == head
    assert objects(srv) == before, (before, objects(srv))
    fsck = git(srv, "fsck", "--no-dangling", check=False)
    assert fsck.returncode == 0 and b"hasDotgit" not in fsck.stdout + fsck.stderr


def test_an_honest_write_still_lands_through_both_hooks(site) -> None:
    """The pre-receive's checks let a storm write through to the ordering."""
    srv, a = site
    r = storm(a, "read", "README.md", agent="al")
    assert r.returncode == 0, r.stderr
    r = storm(a, "write", "README.md", input="# al\n", agent="al")
    assert r.returncode == 0, r.stderr
    assert git(srv, "show", f"{WS}:README.md").stdout == b"# al\n"
