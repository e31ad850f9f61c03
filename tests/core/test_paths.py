"""One table of hostile names through every door that takes a path.

The rule set is storm_git.core.paths (normalize for names; tree_entry_refusal for
entries of a tree). Each door below is driven as its user drives it: the CLI's
``write`` and ``adopt``, ``exec`` running a command that creates the file, the MCP
``create`` tool (the SDK's in-memory client), ``git storm harness hook`` with a
Claude Code ``PreToolUse`` event on stdin, the server guard on a commit made with
plain git, and a sync of a shared head that holds the entry. Every door refuses
every name it can be given, changes no ref and writes nothing.

A cell is skipped where the door cannot carry the name at all (a NUL in argv or in
a tree entry, a path that climbs out as a tree entry, a name no file system holds).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pygit2
import pytest

import forge
from helpers import git, make_repo, rev, snapshot_refs, storm

NAMES = {
    "dotgit": ".git/config",
    "dotgit upper": ".GIT/hooks/pre-commit",
    "dotgit deeper": "src/.Git/config",
    "NTFS short name": "GIT~1/hooks/pre-commit",
    "NTFS trailing dots": ".git../hooks/x",
    "HFS+ ignored code point": ".g\u200cit/hooks/x",
    "NTFS data stream": "src/a::$DATA",
    "climbs out": "../outside.txt",
    "newline": "a\nb.txt",
    "NUL": "a\x00b.txt",
    "not UTF-8": os.fsdecode(b"bad\xffname.txt"),
    "component too long": "x" * 300 + ".txt",
}
DOORS = ["write", "adopt", "exec", "mcp", "harness", "guard", "sync"]

NOT_CARRIED = {
    # argv holds no NUL; a tree entry holds no NUL and no "/"; no file system holds these names
    ("write", "NUL"), ("adopt", "NUL"), ("exec", "NUL"), ("guard", "NUL"), ("sync", "NUL"),
    ("guard", "climbs out"), ("sync", "climbs out"), ("exec", "climbs out"),
    ("adopt", "component too long"), ("exec", "component too long"),
    ("exec", "dotgit"),  # inside .git: git status never lists it, so no command's change is ever seen there
    ("harness", "climbs out"),  # outside the shared tree: not storm's to govern (the harness's own rules apply)
}
COUNTS: dict[str, int] = {}


def _cells():
    """Every (door, name) a door can carry: a cell no input can reach is no test, so none is made."""
    for door in DOORS:
        for name in NAMES:
            if (door, name) not in NOT_CARRIED:
                yield pytest.param(door, name, id=f"{door}-{name}")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One repository per module: each cell checks that its refusal changed nothing."""
    return make_repo(tmp_path_factory.mktemp("rules") / "repo")


def _create(repo: Path, name: str) -> bool:
    """Put ``name`` on disk under ``repo`` (False when the file system refuses it)."""
    full = repo / name
    if not os.path.realpath(full).startswith(os.path.realpath(repo) + os.sep):
        return True  # outside: the door is given the name only
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        if not full.exists():
            full.write_bytes(b"hostile\n")
    except OSError:
        return False
    return True


def _listing(repo: Path) -> set[Path]:
    return {repo / n for n in os.listdir(repo)} | {repo / "src" / n for n in os.listdir(repo / "src")}


def _clean(repo: Path, before: set[Path]) -> None:
    """Remove what a cell left in the working tree (new entries at the top or in src/ only)."""
    import shutil

    for path in _listing(repo) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _refused_cli(r) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _mcp(repo: Path, name: str):
    anyio = pytest.importorskip("anyio")
    mcp = pytest.importorskip("mcp")
    from storm_git.integrations.mcp_server import build_server

    async def main():
        async with mcp.Client(build_server(str(repo), "engineer_1")) as c:
            return await c.call_tool("create", {"path": name, "file_text": "hostile\n"})

    return anyio.run(main)


def _hook_event(repo: Path, name: str) -> dict:
    return {"session_id": "rules-1", "transcript_path": None, "cwd": str(repo), "permission_mode": "default",
            "hook_event_name": "PreToolUse", "tool_name": "Write",
            "tool_input": {"file_path": str(repo / name) if not name.startswith("/") else name,
                           "content": "hostile\n"},
            "tool_use_id": "toolu_rules"}


def _denied(r) -> bool:
    """A Claude Code pre-hook denial: exit 2, or a JSON decision that denies."""
    if r.returncode == 2:
        return True
    if r.returncode != 0 or not r.stdout.strip():
        return False
    out = json.loads(r.stdout)
    spec = out.get("hookSpecificOutput") or {}
    return spec.get("permissionDecision") == "deny" or out.get("decision") == "block"


def _tree_change(name: str) -> dict[bytes, tuple[str, bytes]]:
    return {os.fsencode(name): (forge.FILE, b"hostile\n")}


@pytest.mark.parametrize("door,name", list(_cells()))
def test_every_door_refuses_every_hostile_name(shared, tmp_path, door, name):
    raw = NAMES[name]
    repo = shared
    COUNTS[door] = COUNTS.get(door, 0) + 1
    refs = snapshot_refs(repo)
    outside = tmp_path / "outside.txt"
    listed = _listing(repo)
    try:
        if door == "write":
            _refused_cli(storm(repo, "write", raw, input="hostile\n", agent="e1"))
        elif door == "adopt":
            if not _create(repo, raw):
                pytest.skip("the file system refuses this name")
            _refused_cli(storm(repo, "adopt", raw, agent="e1"))
        elif door == "exec":
            script = (f"import os, sys\np = {raw!r}\nd = os.path.dirname(p)\n"
                      "d and os.makedirs(d, exist_ok=True)\nopen(p, 'w').write('hostile')\n")
            r = storm(repo, "exec", "--", "python3", "-c", script, agent="e1")
            _refused_cli(r)
            assert "cannot record" in r.stderr, r.stderr
        elif door == "mcp":
            res = _mcp(repo, raw)
            t = "\n".join(c.text for c in res.content if getattr(c, "type", "") == "text")
            assert res.is_error and "Traceback" not in t, t
        elif door == "harness":
            r = storm(repo, "harness", "hook", input=json.dumps(_hook_event(repo, raw)))
            assert "Traceback" not in r.stderr
            assert _denied(r), (r.returncode, r.stdout, r.stderr)
        elif door == "guard":
            from storm_git.remote import server_hook

            srv = tmp_path / "srv.git"
            git(tmp_path, "init", "-q", "--bare", str(srv))
            git(repo, "push", "-q", str(srv), "refs/storm/workspace:refs/storm/workspace")
            h = rev(srv, "refs/storm/workspace")
            c = forge.commit(srv, h, _tree_change(raw))
            v = server_hook.check(pygit2.Repository(str(srv)), [server_hook.Update(h, c, "refs/storm/workspace")])
            assert not v.ok, f"the guard accepted {raw!r}"
            assert "lacks storm's trailers" not in v.refused[0], v.refused
        elif door == "sync":
            from storm_git.core.store import Store
            from storm_git.disk import sync as disk_sync

            h = rev(repo, "refs/storm/workspace")
            c = forge.commit(repo, h, _tree_change(raw))
            git(repo, "update-ref", "refs/storm/workspace", c, h)  # as a fetch from an unguarded server would
            try:
                res = disk_sync.sync(Store.discover(str(repo)), full=True)
                assert res.outcomes.get(raw) == disk_sync.FAILED, res.outcomes
                assert "refused" in res.errors[raw], res.errors
                assert not os.path.lexists(repo / raw) or raw.startswith(".git/"), raw
            finally:
                git(repo, "update-ref", "refs/storm/workspace", h, c)
                disk_sync.sync(Store.discover(str(repo)), full=True)
            return
        assert snapshot_refs(repo) == refs
        assert not outside.exists()
        if door in ("write", "mcp", "harness"):
            assert not os.path.lexists(repo / raw) or raw.startswith(".git/"), raw
    finally:
        _clean(repo, listed)


@pytest.mark.parametrize("door", ["adopt", "exec"])
@pytest.mark.parametrize("link,target", [("hooks", ".git/hooks"), (".gitmodules", "src/util.py"),
                                         ("up", "src/../..")])
def test_links_storm_refuses_are_refused_at_the_local_doors(repo, door, link, target):
    """The link rules of a pushed tree hold for what exec and adopt record: no link into
    .git, no link for a file git reads itself, none leading out."""
    refs = snapshot_refs(repo)
    if door == "adopt":
        os.symlink(target, repo / link)
        r = storm(repo, "adopt", link, agent="e1")
    else:
        r = storm(repo, "exec", "--", "ln", "-s", target, link, agent="e1")
    _refused_cli(r)
    assert "cannot record" in r.stderr or "leading out" in r.stderr, r.stderr
    assert snapshot_refs(repo) == refs
