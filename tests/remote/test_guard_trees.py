"""Trees storm refuses, pushed past storm with plain git (hash-object, mktree,
commit-tree with storm's trailers and an empty provenance) to a bare server with
storm's guard installed: the guard refuses each, with why, and the shared ref
does not move. A clone whose shared ref holds such a tree anyway (a server
without the guard) refuses to put it on disk and keeps working."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import forge
from forge import FILE, LINK
from helpers import git, make_repo, rev, storm, storm_json
from servers import WS, bare, clone, install_guard as _install_guard, seed

# (changes, the words the guard's refusal holds)
HOSTILE_TREES = {
    "dotgit upper case": ({b".GIT/hooks/pre-commit": (FILE, b"#!/bin/sh\necho owned\n")}, b".git"),
    "dotgit mixed case deeper": ({b"src/.gIt/config": (FILE, b"x\n")}, b".git"),
    "NTFS short name": ({b"GIT~1/hooks/post-checkout": (FILE, b"x\n")}, b".git on Windows"),
    "NTFS trailing dot and space": ({b".git. ./hooks/x": (FILE, b"x\n")}, b".git"),
    "HFS+ ignored code point": ({".g\u200cit/hooks/x".encode(): (FILE, b"x\n")}, b".git on Windows or macOS"),
    "NTFS data stream": ({b"a/b::$DATA": (FILE, b"x\n")}, b"alternate data stream"),
    "not UTF-8": ({b"bad\xffname.txt": (FILE, b"x\n")}, b"not valid UTF-8"),
    "newline": ({b"line\nbreak": (FILE, b"x\n")}, None),
    "link to an absolute path": ({b"docs/passwd": (LINK, b"/etc/passwd")}, b"absolute path"),
    "link climbing out": ({b"docs/out": (LINK, b"../../../../etc")}, b"leading out of the repository"),
    "link into .git": ({b"hooks": (LINK, b".git/hooks")}, b"into .git"),
    "link out through another link": ({b"d": (LINK, b"src/deep"), b"e": (LINK, b"d/../../..")},
                                      b"leading out of the repository"),
    ".gitmodules link": ({b".gitmodules": (LINK, b"src/util.py")}, b"git reads that file itself"),
    "gitlink mode": (None, b"mode 160000"),
}


def _forged(a: Path, h: str, name: str) -> str:
    changes, _ = HOSTILE_TREES[name]
    if changes is None:  # a submodule entry (a gitlink): mktree takes a commit id as it is
        entries = git(a, "ls-tree", f"{h}^{{tree}}").stdout + f"160000 commit {h}\tsub\n".encode()
        tree = git(a, "mktree", input=entries).stdout.decode().strip()
        return git(a, "commit-tree", "-p", h, "-m", forge.storm_message("eng_x", ["sub"], h), tree).stdout.decode().strip()
    return forge.commit(a, h, changes)


@pytest.mark.parametrize("name", sorted(HOSTILE_TREES))
def test_guard_refuses_a_pushed_tree_storm_refuses(guarded, name):
    srv, a = guarded
    h = rev(srv, WS)
    c = _forged(a, h, name)
    r = git(a, "push", "origin", f"{c}:{WS}", check=False)
    assert r.returncode != 0, r.stderr
    words = HOSTILE_TREES[name][1]
    assert b"git storm guard: refused" in r.stderr, r.stderr
    if words is not None:
        assert words in r.stderr, r.stderr
    assert rev(srv, WS) == h


def test_guard_accepts_the_same_forged_write_with_a_plain_tree(guarded):
    """The same hand-made commit with ordinary entries (a file, a link inside the tree)
    passes: the refusals above are the path rules, not the forging."""
    srv, a = guarded
    h = rev(srv, WS)
    c = forge.commit(a, h, {b"docs/new.txt": (FILE, b"fine\n"), b"docs/api": (LINK, b"../src/api.py"),
                            b".git-blame-ignore-revs": (FILE, b"\n"), b"legit": (FILE, b"x\n")})
    r = git(a, "push", "origin", f"{c}:{WS}", check=False)
    assert r.returncode == 0, r.stderr
    assert rev(srv, WS) == c


def test_guard_enforces_the_servers_size_limit(guarded):
    """storm.maxFileBytes in the server's config: a client's own limit is its word only."""
    srv, a = guarded
    git(srv, "config", "storm.maxFileBytes", "1k")
    h = rev(srv, WS)
    c = forge.commit(a, h, {b"big.bin": (FILE, b"x" * 1025)})
    r = git(a, "push", "origin", f"{c}:{WS}", check=False)
    assert r.returncode != 0 and b"over storm.maxFileBytes (1024)" in r.stderr, r.stderr
    assert rev(srv, WS) == h
    c = forge.commit(a, h, {b"big.bin": (FILE, b"x" * 1024)})
    assert git(a, "push", "origin", f"{c}:{WS}", check=False).returncode == 0


def test_guard_refuses_to_start_a_workspace_from_a_hostile_tree(tmp_path):
    """The first push of the shared ref (its creation) is checked in full."""
    srv = bare(tmp_path / "proj.git")
    _install_guard(srv)
    a = make_repo(tmp_path / "a", init_storm=False)
    h = rev(a, "HEAD")
    c = git(a, "commit-tree", "-p", h, "-m", "project",
            forge.tree_with(a, f"{h}^{{tree}}", {b".GIT/hooks/pre-commit": (FILE, b"x\n")})).stdout.decode().strip()
    git(a, "remote", "add", "origin", str(srv))
    r = git(a, "push", "origin", f"{c}:{WS}", check=False)
    assert r.returncode != 0 and b".git" in r.stderr, r.stderr
    assert git(srv, "rev-parse", "-q", "--verify", WS, check=False).returncode != 0
    assert git(a, "push", "origin", f"{h}:{WS}", check=False).returncode == 0  # the project's own tree


@pytest.mark.parametrize("name", [".GIT", "link out"])
def test_a_clone_refuses_to_put_a_hostile_tree_on_disk(tmp_path, name):
    """A server without the guard took the forged write: every clone's sync refuses to
    write the refused entry (exit 3 naming it), writes the rest, and status, read and
    write keep working (before, sync wrote .GIT/hooks/pre-commit and every command
    then failed with git's "invalid name for a tree entry")."""
    srv = bare(tmp_path / "proj.git")
    a = seed(tmp_path, str(srv))
    b = clone(tmp_path, str(srv), "b")
    h = rev(srv, WS)
    bad = {".GIT": {b".GIT/hooks/pre-commit": (FILE, b"#!/bin/sh\necho owned\n")},
           "link out": {b"docs/passwd": (LINK, b"../../../../../../etc/passwd")}}[name]
    c = forge.commit(a, h, {**bad, b"docs/fine.txt": (FILE, b"fine\n")})
    assert git(a, "push", "origin", f"{c}:{WS}").returncode == 0  # no guard on this server
    code, out = storm_json(b, "sync")
    assert code == 3, out
    text = json.dumps(out)
    assert "refused" in text and ("GIT" in text or "leading out" in text), out
    assert (b / "docs" / "fine.txt").read_text() == "fine\n"
    assert not (b / ".GIT").exists() and b"owned" not in (b / ".git" / "hooks" / "pre-commit").read_bytes()
    assert not (b / "docs" / "passwd").exists() and not (b / "docs" / "passwd").is_symlink()
    r = storm(b, "status")
    assert r.returncode == 0, r.stderr
    assert storm(b, "read", "src/util.py", agent="eng_b").returncode == 0
    r = storm(b, "write", "src/util.py", input="after\n", agent="eng_b")
    assert r.returncode == 0, r.stderr
    assert (b / "src" / "util.py").read_text() == "after\n"
