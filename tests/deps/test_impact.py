"""``--deps auto`` looks inside a moved dependency (storm_git.deps.impact): a read
file another agent changed is left out of the scope only when its change touches no
name the write uses; every change that can reach the write still rejects it.

Each case: agent a reads, agent b changes a file a read, a writes with ``--deps auto``.
The controls show the same situation is a rejection with the whole read set.
"""
from __future__ import annotations

import pytest

from helpers import (  # a reads, b changes, a writes
    change_as as _change,
    git,
    make_repo,
    read_as as _read,
    storm,
    storm_json,
    write_as as _write,
)

CORE = "def helper():\n    return _impl()\n\n\ndef _impl():\n    return 1\n\n\ndef other():\n    return 2\n"
FILES = {
    "pkg/__init__.py": "from .core import helper\n",
    "pkg/core.py": CORE,
    "notes.py": "X = 1\nY = 2\n",
    "app.py": "from pkg import helper\n\n\ndef run():\n    return helper()\n",
}
NEW_APP = FILES["app.py"] + "\n\ndef run_twice():\n    return run(), run()\n"
REPO_FILES = FILES  # the conftest's `repo`
# a second change that reaches helper through run (a definition of the target it calls)
RUN_THRICE = "\n\ndef run_thrice():\n    return run(), run(), run()\n"


def _stale(out):
    assert out and not out["accepted"], out
    return [s["path"] for s in out["rejection"]["stale"]]


def test_a_change_to_a_function_the_write_does_not_use_is_left_out(repo):
    for agent in "ac":
        _read(repo, agent, "app.py", "pkg/core.py", "pkg/__init__.py")
    _change(repo, "pkg/core.py", "return 2", "return 3")  # other(): app uses helper only
    # control: c, with the whole read set (a rejection shows c the file, so not a's)
    code, out = storm_json(repo, "write", "app.py", "--no-wait", input=NEW_APP, agent="c")
    assert code == 1 and _stale(out) == ["pkg/core.py"]
    storm(repo, "release", "app.py", agent="c")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and out["accepted"], out
    assert list(out["unaffected_deps"]) == ["pkg/core.py"]
    assert "other" in out["unaffected_deps"]["pkg/core.py"]
    # the provenance names what the write was validated against: not the moved file
    msg = git(repo, "log", "-1", "--format=%B", out["commit"]).stdout.decode()
    assert "\nStorm-Scope: auto\n" in msg and "\nStorm-Dep: app.py\n" in msg, msg
    assert "Storm-Dep: pkg/core.py" not in msg, msg
    text = storm(repo, "write", "app.py", "--deps", "auto", input=NEW_APP + "\n# again\n", agent="a")
    assert text.returncode == 0 and "moved, unused by this write: pkg/core.py" in text.stdout, text.stdout


def test_a_change_to_a_helper_of_a_used_function_rejects(repo):
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def _impl():\n    return 1", "def _impl():\n    return -1")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out
    assert "_impl" in out["rejection"]["scope"]["moved"]["pkg/core.py"], out


def test_a_changed_module_level_statement_rejects(repo):
    for agent in "ac":
        _read(repo, agent, "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def other():", "print('loaded')\n\n\ndef other():")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out
    assert "a module-level statement changed (line" in out["rejection"]["scope"]["moved"]["pkg/core.py"], out
    storm(repo, "release", "app.py", agent="a")
    text = storm(repo, "write", "app.py", "--deps", "auto", "--no-wait", input=NEW_APP, agent="c")
    assert "still a dependency: a module-level statement changed" in text.stdout, text.stdout


def test_an_import_from_outside_the_repository_counts_as_a_definition(repo):
    # `import os` added to pkg/core.py: it binds a name app.py does not use, runs nothing
    # of the repository's and can close no import cycle with it
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def other():", "import os\n\n\ndef other():")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and "os" in out["unaffected_deps"]["pkg/core.py"], out


def test_a_re_export_that_changed_rejects(repo):
    _read(repo, "a", "app.py", "pkg/__init__.py")
    _change(repo, "pkg/__init__.py", "from .core import helper", "from .core import other as helper")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/__init__.py"], out


def test_comments_and_blank_lines_only_are_left_out(repo):
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():\n", "# the helper\n\ndef helper():  # noqa\n")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and "formatting" in out["unaffected_deps"]["pkg/core.py"], out


def test_a_module_used_by_attribute_counts_only_the_attributes_used(repo):
    _read(repo, "a", "app.py", "notes.py")
    app = "import notes\n\n\ndef run():\n    return notes.X\n"
    _change(repo, "notes.py", "Y = 2", "Y = 3")
    code, out = _write(repo, "app.py", app, "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["notes.py"], out
    _change(repo, "notes.py", "X = 1", "X = 5")
    code, out = _write(repo, "app.py", app.replace("notes.X", "notes.X + 1"), "--deps", "auto")
    assert code == 1 and _stale(out) == ["notes.py"], out


@pytest.mark.parametrize("app", [
    "import notes\n\n\ndef run():\n    return vars(notes)\n",  # the module object, used whole
    "from notes import *\n\n\ndef run():\n    return X\n",  # a star import: Y may shadow anything
])
def test_a_module_used_as_a_whole_rejects_any_change(repo, app):
    _read(repo, "a", "app.py", "notes.py")
    _change(repo, "notes.py", "Y = 2", "Y = 3")
    code, out = _write(repo, "app.py", app, "--deps", "auto")
    assert code == 1 and _stale(out) == ["notes.py"], out


def test_an_importer_changed_away_from_the_target_is_left_out(repo):
    # a rewrites pkg/core.py; b meanwhile changed app.py, which imports it, but not
    # in code that mentions anything pkg/core.py exposes
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "def run():", "def banner():\n    return 'x'\n\n\ndef run():")
    new_core = CORE.replace("return 1", "return 10")
    code, out = _write(repo, "pkg/core.py", new_core, "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["app.py"], out


def test_an_importer_changed_where_it_calls_the_target_rejects(repo):
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "return helper()", "return helper() + 1")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 1", "return 10"), "--deps", "auto")
    assert code == 1 and _stale(out) == ["app.py"], out


def test_a_file_changed_again_after_it_was_left_out_is_judged_again(repo):
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "return 2", "return 3")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0, out
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    code, out = _write(repo, "app.py", NEW_APP + RUN_THRICE, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out


def test_a_deleted_or_created_dependency_rejects(repo):
    _read(repo, "a", "app.py", "notes.py")
    app = "import notes\n\n\ndef run():\n    return notes.X\n"
    _read(repo, "b", "notes.py")
    assert storm(repo, "rm", "notes.py", agent="b").returncode == 0
    code, out = _write(repo, "app.py", app, "--deps", "auto")
    assert code == 1 and _stale(out) == ["notes.py"], out


def test_an_importer_changed_where_it_uses_what_the_write_does_not_change_is_left_out(repo):
    # the write changes _impl (reached through helper); b's change to app.py uses other only
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "from pkg import helper\n",
            "from pkg import helper\nfrom pkg.core import other\n")
    _read(repo, "a", "pkg/core.py")  # (the import line is a module-level change: see below)
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 1", "return 10"), "--deps", "auto")
    assert code == 1 and _stale(out) == ["app.py"], out  # a changed import in the caller rejects
    storm(repo, "release", "pkg/core.py", agent="a")
    _read(repo, "a", "app.py")
    _change(repo, "app.py", "def run():", "def run_other():\n    return other()\n\n\ndef run():")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 1", "return 10"), "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["app.py"], out


def test_a_write_changing_the_targets_module_level_code_reaches_every_caller(repo):
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "def run():", "def banner():\n    return 'x'\n\n\ndef run():")
    code, out = _write(repo, "pkg/core.py", "from pkg import models\n\n" + CORE, "--deps", "auto")
    assert code == 1 and _stale(out) == ["app.py"], out
    assert "module-level code this write changes" in out["rejection"]["scope"]["moved"]["app.py"], out


@pytest.mark.parametrize("added, accepted", [
    ("import notes", True),  # notes.py imports nothing: no cycle can close, `notes` is unused
    ("import app", False),  # app imports pkg, which imports pkg.core: a cycle
])
def test_a_repository_import_counts_as_a_definition_unless_it_may_close_a_cycle(repo, added, accepted):
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def other():", f"{added}\n\n\ndef other():")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    if accepted:
        assert code == 0 and list(out["unaffected_deps"]) == ["pkg/core.py"], out
    else:
        assert code == 1 and "import cycle" in out["rejection"]["scope"]["moved"]["pkg/core.py"], out


@pytest.mark.parametrize("before, after, accepted", [
    # a name added to an import of a module the file already loaded: no new edge in the
    # import graph, so no new cycle; `other` is a definition app.py's changed code does not use
    ("from pkg.core import helper", "from pkg.core import helper, other", True),
    # the same module, newly loaded: pkg/core.py is the write's target, a cycle may close
    ("from pkg import helper", "from pkg import helper\nfrom pkg.core import other", False),
])
def test_an_import_that_loads_only_what_the_file_loaded_closes_no_cycle(repo, before, after, accepted):
    _change(repo, "app.py", "from pkg import helper", before)
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", before, after)
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 1", "return 10"), "--deps", "auto")
    if accepted:
        assert code == 0 and list(out["unaffected_deps"]) == ["app.py"], out
    else:
        assert code == 1 and "import cycle" in out["rejection"]["scope"]["moved"]["app.py"], out


def test_source_nested_deeper_than_the_parser_allows_is_not_a_crash(repo):
    """CPython's parser raises RecursionError (not SyntaxError) on a generated
    5,000-term expression; the computed scope treats it as unparsable."""
    deep = "X = " + "+".join(["1"] * 5000) + "\n"
    _read(repo, "a", "app.py", "notes.py")
    _change(repo, "notes.py", "X = 1\nY = 2\n", deep)  # a moved dependency that cannot be looked inside
    code, out = _write(repo, "app.py", "import notes\n\n\ndef run():\n    return notes.Y\n", "--deps", "auto")
    assert code == 1 and _stale(out) == ["notes.py"], out
    assert out["rejection"]["scope"]["moved"]["notes.py"] == "does not parse", out
    code, out = _write(repo, "app.py", deep, "--deps", "auto")  # a target that cannot be parsed
    assert code == 0 or out["rejection"]["scope"]["name"] == "auto:all", out


def test_an_own_earlier_write_that_the_write_imports_is_judged_by_names(repo):
    """The agent wrote pkg/core.py, then b changed a function in it that app.py does not
    use: the names decide, as for any import. (An own write that is not an import stays
    in the scope: tests/deps/test_scope.py::test_own_earlier_write_stays_in_scope.)"""
    _read(repo, "a", "app.py", "pkg/core.py")
    r = storm(repo, "edit", "pkg/core.py", "--old", "return 2", "--new", "return 20", agent="a")
    assert r.returncode == 0, r.stderr
    _change(repo, "pkg/core.py", "return 20", "return 21")  # other(): app uses helper only
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["pkg/core.py"], out
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    code, out = _write(repo, "app.py", NEW_APP + RUN_THRICE, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out


def test_a_name_added_to_an_import_changes_no_other_name(repo):
    """`from .core import helper` became `from .core import helper, other` in the
    package app.py takes helper from: helper itself did not change."""
    _read(repo, "a", "app.py", "pkg/__init__.py")
    _change(repo, "pkg/__init__.py", "from .core import helper", "from .core import helper, other")
    code, out = _write(repo, "app.py", NEW_APP, "--deps", "auto")
    assert code == 0 and "changed other" in out["unaffected_deps"]["pkg/__init__.py"], out


# -- a class counts whole: a used class that changed keeps its file, whichever member changed -----
STORE = '''class Store:
    """Objects by path."""

    def __init__(self, root):
        self.root = root

    def entry(self, path):
        return (self.root, path)

    def gc(self):
        return 1


def compact(root):
    return 2
'''
USER = "from store import Store\n\n\ndef lookup(root, path):\n    s = Store(root)\n    return s.entry(path)\n"
NEW_USER = USER + "\n\ndef lookup_all(root, paths):\n    return [lookup(root, p) for p in paths]\n"


@pytest.fixture
def classes(tmp_path):
    return make_repo(tmp_path / "c", {"store.py": STORE, "user.py": USER})


def test_a_changed_method_of_a_used_class_rejects_even_one_the_write_never_calls(classes):
    """The write uses Store (``Store(root).entry``); b changes ``Store.gc``, which it
    never calls: the class counts whole, so store.py stays a stale dependency."""
    for agent in "ac":
        _read(classes, agent, "user.py", "store.py")
    _change(classes, "store.py", "return 1", "return 10")  # Store.gc
    code, out = _write(classes, "user.py", NEW_USER, "--deps", "auto")
    assert code == 1 and _stale(out) == ["store.py"], out
    assert out["rejection"]["scope"]["moved"]["store.py"] == "changed Store, which the write uses", out
    storm(classes, "release", "user.py", agent="a")  # (a rejection shows a the file, so c's text)
    text = storm(classes, "write", "user.py", "--deps", "auto", "--no-wait", input=NEW_USER, agent="c")
    assert "still a dependency: changed Store, which the write uses" in text.stdout, text.stdout


def test_a_changed_top_level_function_the_write_does_not_use_is_left_out_beside_a_used_class(classes):
    """The same file, the same write: b changes ``compact()``, a top-level function the
    write does not use; the file leaves the scope (control: the whole read set rejects)."""
    for agent in "ac":
        _read(classes, agent, "user.py", "store.py")
    _change(classes, "store.py", "return 2", "return 20")  # compact()
    code, out = storm_json(classes, "write", "user.py", "--no-wait", input=NEW_USER, agent="c")
    assert code == 1 and _stale(out) == ["store.py"]  # control: the whole read set
    storm(classes, "release", "user.py", agent="c")  # its reservation would hold a's write for 30 s
    code, out = _write(classes, "user.py", NEW_USER, "--deps", "auto")
    assert code == 0 and out["accepted"], out
    assert out["unaffected_deps"] == {"store.py": "changed compact, which the write's change does not use"}, out


# -- what the write's change uses, not all of the target ---------------------------------------------
# The target as read is FILES["app.py"]: `run()` calls helper. b changes helper's signature.
BANNER = "\n\ndef banner():\n    return 'app'\n"


def test_a_change_that_does_not_reach_the_moved_function_is_left_out(repo):
    """a adds banner(), which calls nothing; run(), unchanged, still calls helper: the
    write's change uses nothing pkg/core.py changed, so it is accepted."""
    for agent in "ac":
        _read(repo, agent, "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    code, out = storm_json(repo, "write", "app.py", "--no-wait", input=FILES["app.py"] + BANNER, agent="c")
    assert code == 1 and _stale(out) == ["pkg/core.py"]  # control: the whole read set
    storm(repo, "release", "app.py", agent="c")
    code, out = _write(repo, "app.py", FILES["app.py"] + BANNER, "--deps", "auto")
    assert code == 0 and out["unaffected_deps"] == \
        {"pkg/core.py": "changed helper, which the write's change does not use"}, out


SHOW = "return show(helper())\n\n\ndef show(x):\n    return x\n"
SHOW_VIA = "got = helper()\n    unrelated = 1\n    return show(got)\n\n\ndef show(x):\n    return x\n"


@pytest.mark.parametrize("old, new", [
    # the change adds main(), which calls run(), an unchanged definition that calls helper
    ("return helper()\n", "return helper()\n\n\ndef main():\n    return run()\n"),
    # the change is to run() itself
    ("return helper()\n", "return helper() or 0\n"),
    # the change is to show(), and run(), unchanged, passes it helper's result: a caller in
    # the target is part of the contract the change keeps
    (SHOW, SHOW.replace("return x", "return str(x)")),
    # the same, with helper's result passed through a local name
    (SHOW_VIA, SHOW_VIA.replace("return x", "return str(x)")),
])
def test_a_change_that_reaches_the_moved_function_through_the_target_rejects(repo, old, new):
    if "def show" in old:  # the target as read already has show()
        _change(repo, "app.py", "return helper()\n", old)
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    new_app = git(repo, "show", "refs/storm/workspace:app.py").stdout.decode().replace(old, new)
    code, out = _write(repo, "app.py", new_app, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out
    assert "helper" in out["rejection"]["scope"]["moved"]["pkg/core.py"], out


def test_a_changed_module_level_statement_of_the_target_uses_all_of_it(repo):
    # a statement that runs on import may call anything of the module: no narrowing
    _read(repo, "a", "app.py", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    code, out = _write(repo, "app.py", FILES["app.py"] + "\nprint('loaded')\n", "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out


def test_a_target_the_agent_did_not_read_uses_all_of_it(repo):
    # a new file has no version as read: all of its content is the change
    _read(repo, "a", "pkg/core.py")
    _change(repo, "pkg/core.py", "def helper():", "def helper(strict):")
    tool = "from pkg.core import helper\n\n\ndef tool():\n    return helper()\n"
    code, out = _write(repo, "tool.py", tool, "--deps", "auto")
    assert code == 1 and _stale(out) == ["pkg/core.py"], out


def test_a_caller_whose_change_reaches_the_target_through_its_own_code_rejects(repo):
    """b adds main() to app.py, calling app.py's own run(), which calls helper; a
    changes helper: b's new code depends on it through run()."""
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "def run():", "def main():\n    return run() + 1\n\n\ndef run():")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return _impl()", "return _impl() * 2"), "--deps", "auto")
    assert code == 1 and _stale(out) == ["app.py"], out
    assert "its changed code uses helper" in out["rejection"]["scope"]["moved"]["app.py"], out
    # control: the same caller change with a write to a function run() does not reach
    storm(repo, "release", "pkg/core.py", agent="a")
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "return run() + 1", "return run() + 2")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 2", "return 20"), "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["app.py"], out


def test_a_caller_name_bound_by_the_caller_itself_is_not_the_targets(repo):
    """b adds to app.py its own other() and a banner() calling it; a changes
    pkg.core.other: app.py's other is not the one that changed."""
    _change(repo, "app.py", "from pkg import helper", "from pkg.core import helper")
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "def run():",
            "def other():\n    return 5\n\n\ndef banner():\n    return other()\n\n\ndef run():")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 2", "return 20"), "--deps", "auto")
    assert code == 0 and list(out["unaffected_deps"]) == ["app.py"], out
    # control: the same name taken from the target counts
    storm(repo, "release", "pkg/core.py", agent="a")
    _read(repo, "a", "pkg/core.py", "app.py")
    _change(repo, "app.py", "def other():\n    return 5\n\n\n", "")
    _change(repo, "app.py", "from pkg.core import helper", "from pkg.core import helper, other")
    code, out = _write(repo, "pkg/core.py", CORE.replace("return 2", "return 21"), "--deps", "auto")
    assert code == 1 and _stale(out) == ["app.py"], out
    assert "its changed code uses other" in out["rejection"]["scope"]["moved"]["app.py"], out
