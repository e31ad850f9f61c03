"""The rejection's unified diff (storm_git.core.diffs): git applies it as written."""
from __future__ import annotations

import subprocess

import pytest
from unidiff import PatchSet

from helpers import git


@pytest.mark.parametrize("old,new", [
    # a form feed line (Python's stdlib has them)
    (b"x = 1\n\x0c\ndef f():\n    pass\n", b"x = 2\n\x0c\ndef f():\n    pass\n"),
    (b"a\x0cb\nz\n", b"a\x0cc\nz\n"),
    (b"a\rb\nz\n", b"a\rc\nz\n"),  # a lone CR inside a line
    (b"a\x0bb\x1cc\x1dd\x1ee\nz\n", b"a\x0bb\x1cc\x1dd\x1ee!\nz\n"),
    ("a\u2028b\x85c\nz\n".encode(), "a\u2028b\x85c!\nz\n".encode()),  # Unicode line and next-line separators
    (b"a\r\nb\r\n", b"a\r\nc\r\n"),
    (b"no newline", b"no newline at all"),
    (b"", b"new\n"),
    (b"old\n\x0c", b"old\n\x0c\n"),
])
def test_a_diff_splits_lines_at_newlines_only_and_applies_with_git(tmp_path, old, new):
    """The rejection's diff is what the agent re-plans from. Lines split at every
    separator str.splitlines knows (form feed, CR, U+2028 ...) would give a file with a
    ^L "No newline at end of file" markers mid-file, wrong hunks, and a diff that git
    apply refuses. Each diff applies to the old file and gives the new."""
    from storm_git.core.diffs import unified

    git(tmp_path, "init", "-q")
    for name in ("f.py", "new\nline \"q\"\t.py"):
        (tmp_path / name).write_bytes(old)
        patch = unified(name, old, new)
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tmp_path, input=patch.encode(),
                           capture_output=True)
        assert r.returncode == 0, (r.stderr, patch)
        assert (tmp_path / name).read_bytes() == new, patch
        ours = PatchSet(patch)
        assert len(ours) == 1
