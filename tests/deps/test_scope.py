"""``--deps auto`` / ``storm.deps=auto``: a write is validated against the read files
its new content depends on (storm_git.deps.scope), never fewer than a real conflict
needs: an unrelated stale read is let through, a changed import, name-defining
file or importer is still a rejection, and other languages use the whole read set."""
from __future__ import annotations

import pytest

from helpers import (  # a reads, b changes, a writes
    PY_PROJECT,
    change_as as _change,
    git,
    read_as as _read,
    start_write,
    storm,
    storm_json,
    write_as as _write,
)

FILES = {**PY_PROJECT, "data.txt": "one\n"}
REPO_FILES = FILES  # the conftest's `repo`
NEW_APP = FILES["app.py"] + "\n\ndef run_twice():\n    return run(), run()\n"


def test_unrelated_stale_read_is_accepted_only_with_auto(repo):
    _read(repo, "a", "app.py", "notes.py", "pkg/models.py")
    _change(repo, "notes.py", "X = 1", "X = 2")
    code, out = _write(repo, "app.py", NEW_APP)  # the whole read set: notes.py is stale
    assert code == 1 and out["rejection"]["reason"] == "stale_dependency"
    assert out["rejection"]["scope"]["name"] == "all"
    assert [s["path"] for s in out["rejection"]["stale"]] == ["notes.py"]
    storm(repo, "release", "app.py", agent="a")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and out["accepted"], out
    assert git(repo, "show", "refs/storm/workspace:app.py").stdout.decode() == NEW_APP


def test_changed_import_is_rejected_with_the_scope_named(repo):
    # the write reads User.name (a write that never does is left out: test_deps_impact.py)
    _read(repo, "a", "app.py", "pkg/models.py", "notes.py")
    _change(repo, "pkg/models.py", "name = ''", "full_name = ''")
    code, out = _write(repo, "app.py", NEW_APP + "\n\ndef user_name():\n    return User().name\n", "--deps", "auto")
    assert code == 1, out
    rej = out["rejection"]
    assert rej["reason"] == "stale_dependency" and [s["path"] for s in rej["stale"]] == ["pkg/models.py"]
    assert rej["scope"]["name"] == "auto" and "pkg/models.py" in rej["scope"]["paths"]
    assert "notes.py" not in rej["scope"]["paths"]
    assert "validated against scope auto" in rej["message"]


def test_name_defining_file_behind_a_reexport_is_rejected(repo):
    # app.py imports helper from pkg, which takes it from pkg/core.py
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 1 and [s["path"] for s in out["rejection"]["stale"]] == ["pkg/core.py"], out


def test_changed_importer_of_the_target_is_rejected(repo):
    # a changes helper; b meanwhile changed app.py, which calls it
    _read(repo, "a", "pkg/core.py", "app.py", "notes.py")
    _change(repo, "app.py", "return helper(), User()", "return helper() + 1, User()")
    new_core = "def helper(strict=False):\n    return 1\n"
    code, out = _write(repo, "pkg/core.py", new_core, "--deps", "auto")
    assert code == 1 and [s["path"] for s in out["rejection"]["stale"]] == ["app.py"], out


def test_non_python_target_falls_back_to_the_whole_read_set(repo):
    _read(repo, "a", "README.md", "data.txt")
    _change(repo, "data.txt", "one", "two")
    code, out = _write(repo, "README.md", "# demo\n\nmore\n", "--deps", "auto")
    assert code == 1 and out["rejection"]["reason"] == "stale_dependency"
    assert out["rejection"]["scope"]["name"] == "auto:all" and "not Python" in out["rejection"]["scope"]["why"]


def test_python_that_does_not_parse_falls_back(repo):
    _read(repo, "a", "app.py", "notes.py")
    _change(repo, "notes.py", "X = 1", "X = 3")
    code, out = _write(repo, "app.py", "def broken(:\n", "--deps", "auto")
    assert code == 1 and out["rejection"]["scope"]["name"] == "auto:all", out


def test_own_earlier_write_stays_in_scope(repo):
    """A file the agent wrote in this task is validated too (its work must fit together)."""
    _read(repo, "a", "notes.py", "app.py")
    r = storm(repo, "edit", "notes.py", "--old", "X = 1", "--new", "X = 10", agent="a")
    assert r.returncode == 0, r.stderr
    _change(repo, "notes.py", "X = 10", "X = 11")  # b overwrote a's own write
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 1 and [s["path"] for s in out["rejection"]["stale"]] == ["notes.py"], out


def test_config_makes_auto_the_default_and_all_overrides_it(repo):
    git(repo, "config", "storm.deps", "auto")
    _read(repo, "a", "app.py", "notes.py")
    _change(repo, "notes.py", "X = 1", "X = 2")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "all")
    assert code == 1 and out["rejection"]["scope"]["name"] == "all"
    storm(repo, "release", "app.py", agent="a")
    code, out = _write(repo, "app.py", NEW_APP)
    assert code == 0, out
    # provenance (the commit's trailers) records the scope the write was validated against
    msg = git(repo, "log", "-1", "--format=%B", out["commit"]).stdout.decode()
    assert "\nStorm-Scope: auto\n" in msg and "\nStorm-Dep: app.py\n" in msg and "Storm-Dep: notes.py" not in msg
    git(repo, "config", "storm.deps", "sometimes")
    r = storm(repo, "write", "app.py", input=NEW_APP, agent="a")
    assert r.returncode == 2 and "storm.deps" in r.stderr


def test_auto_cannot_be_combined_with_paths(repo):
    _read(repo, "a", "app.py")
    r = storm(repo, "write", "app.py", "--deps", "auto", "--deps", "notes.py", input=NEW_APP, agent="a")
    assert r.returncode == 2 and "--deps auto" in r.stderr


def test_library_accepts_the_constant(repo):
    from storm_git.api import open_workspace
    from storm_git.storm.write import AUTO_DEPS

    ws = open_workspace(str(repo))
    ws.read(["app.py", "notes.py"], agent="a")
    _change(repo, "notes.py", "X = 1", "X = 5")
    res = ws.write("app.py", NEW_APP.encode(), agent="a", deps=AUTO_DEPS)
    assert res.accepted, res.rejection and res.rejection.message


def test_conftest_target_covers_the_tests_below_it(repo):
    files = {"tests/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef user():\n    return 1\n",
             "tests/test_user.py": "def test_user(user):\n    assert user == 1\n"}
    for path, text in files.items():
        _read(repo, "b", path)
        assert storm(repo, "write", path, input=text, agent="b").returncode == 0
    _read(repo, "a", "tests/conftest.py", "tests/test_user.py")
    _change(repo, "tests/test_user.py", "assert user == 1", "assert user == 2")
    code, out = _write(repo, "tests/conftest.py", files["tests/conftest.py"].replace("return 1", "return 3"),
                       "--deps", "auto")
    assert code == 1 and [s["path"] for s in out["rejection"]["stale"]] == ["tests/test_user.py"], out


def _waiters(lock: str) -> int:
    """Processes blocked in flock() on ``lock`` (from /proc/locks)."""
    from helpers import flock_waiters

    return flock_waiters(lock)


def test_a_dependency_added_while_the_write_waited_for_the_lock_is_not_missed(repo):
    """The scope is computed before the workspace lock; an importer of the target that
    appears meanwhile (another writer moved the head) must still reject the write."""
    import fcntl
    import os
    import time

    import pygit2

    from storm_git.core.store import WORKSPACE_REF, Store

    _read(repo, "a", "pkg/core.py", "notes.py")
    lock = str(repo / ".git" / "storm" / "locks" / "workspace")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = start_write(repo, "a", "pkg/core.py", "def helper(strict=False):\n    return 1\n",
                        "--deps", "auto", "--json")
        deadline = time.monotonic() + 60
        while _waiters(lock) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _waiters(lock) == 1, "the writer never reached the lock"
        # another agent's write lands meanwhile: notes.py now calls helper from pkg.core
        store = Store.discover(str(repo))
        ref = store.ref(WORKSPACE_REF)
        tree = store.commit(ref.target).tree
        blob = store.write_blob(b"from pkg.core import helper\n\nX = helper()\n")
        new = store.make_commit(store.tree_with(tree, {"notes.py": (blob, pygit2.GIT_FILEMODE_BLOB)}), [ref.target],
                                "b", "b: notes uses helper\n\nStorm-Agent: b\nStorm-Op: write\nStorm-Path: notes.py\n")
        assert store.cas(ref, WORKSPACE_REF, new, "test")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    p.wait(timeout=60)
    out, err = p.stdout.read(), p.stderr.read()
    assert p.returncode == 1, (out, err)
    import json

    rej = json.loads(out)["rejection"]
    assert [s["path"] for s in rej["stale"]] == ["notes.py"] and "notes.py" in rej["scope"]["paths"]


def test_a_deletion_falls_back_to_the_whole_read_set(repo):
    _read(repo, "a", "pkg/models.py", "notes.py")
    _change(repo, "notes.py", "X = 1", "X = 4")
    code, out = storm_json(repo, "rm", "pkg/models.py", "--deps", "auto", agent="a")
    scope = out["rejection"]["scope"]
    assert code == 1 and scope["name"] == "auto:all" and "deleted" in scope["why"]


def _mixed_write(repo, *extra_reads, moved=("notes.py", "X = 1", "X = 7")):
    """Agent a writes app.py with a changelog line in README.md (one write of both),
    under --deps auto, after agent b changed ``moved``; returns the result."""
    from storm_git.api import open_workspace
    from storm_git.storm.write import AUTO_DEPS

    ws = open_workspace(str(repo))
    ws.read(["app.py", "README.md", *extra_reads], agent="a")
    _change(repo, *moved)
    return ws.apply("a", {"app.py": NEW_APP.encode(), "README.md": b"# demo\n\n* run_twice\n"},
                    intent="a: run_twice, and say so", deps=AUTO_DEPS, wait=False, op="write")


def test_a_non_python_file_written_with_code_depends_on_what_the_code_does(repo):
    """A changelog written in the same write as code is validated against the code's
    computed scope and the non-Python files read: a Python file that nothing in the
    write depends on no longer rejects it (it did: the whole read set)."""
    res = _mixed_write(repo, "notes.py")
    assert res.accepted, res.rejection and res.rejection.message
    assert git(repo, "show", "refs/storm/workspace:README.md").stdout == b"# demo\n\n* run_twice\n"


def test_a_mixed_write_is_still_rejected_by_a_moved_non_python_read(repo):
    res = _mixed_write(repo, "data.txt", moved=("data.txt", "one", "two"))
    assert not res.accepted and res.rejection.reason == "stale_dependency"
    assert [s.path for s in res.rejection.stale] == ["data.txt"]
    assert "the non-Python files read" in res.rejection.scope["why"]


def test_a_mixed_write_is_still_rejected_by_what_its_code_uses(repo):
    res = _mixed_write(repo, "pkg/core.py", moved=("pkg/core.py", "return 1", "return 2"))
    assert not res.accepted and [s.path for s in res.rejection.stale] == ["pkg/core.py"], res.rejection


@pytest.mark.slow
def test_module_walk_matches_ast_walk_on_real_code():
    """depscope walks a write's new module with its own walker (twice ast.walk's speed):
    same nodes, same order, and the same imports, names and free names as the
    ast.walk-based analysis it replaced, over this repository's own modules."""
    import ast
    from pathlib import Path

    from storm_git.deps import scope as depscope

    root = Path(depscope.__file__).resolve().parents[1]
    files = sorted(root.rglob("*.py"))
    assert len(files) > 40
    for f in files:
        tree = ast.parse(f.read_bytes())
        assert [id(n) for n in depscope._nodes(tree)] == [id(n) for n in ast.walk(tree)], f
        info = depscope.parse(f.read_bytes())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert info is not None and info.free <= names
        imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert len(info.imports) == sum(len(n.names) if isinstance(n, ast.Import) else 1 for n in imported)


def test_written_module_is_parsed_once(repo):
    """The new content of a write is parsed once and kept under its blob id, so the next
    write of that file finds the head's version parsed: the same analysis object."""
    import pygit2

    from storm_git.core.store import Store
    from storm_git.deps import scope as depscope

    depscope._INFO.clear()
    new = NEW_APP.encode()
    first = depscope.parse_new(new)
    assert first is not None and "run_twice" in first.defs
    assert depscope.parse_new(new) is first
    store = Store.discover(str(repo))
    assert depscope._info(store, str(pygit2.hash(new))) is first
    assert depscope.parse_new(b"def broken(:\n") is None
