"""An edit saved while storm writes the disk is never deleted (outside ``checkout``).

Storm checks that a file still holds its own version, then swaps the new content
in. The window between the check and the swap is held open by strace delaying the
swap's system call (``renameat2``: RENAME_EXCHANGE for a file that exists,
RENAME_NOREPLACE for a new one), or the removal's first ``unlinkat``; a person's
edit is saved inside it. The write lands on the shared ref; the edit stays on
disk, listed as an unmediated edit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import git, storm, strace_works

DELAY_US = 1_500_000


pytestmark = pytest.mark.skipif(not strace_works(), reason="needs strace with ptrace allowed")


def _delayed_storm(repo: Path, *args: str, input: bytes, syscall: str = "renameat2") -> subprocess.Popen:
    """``git storm ARGS`` (a fresh interpreter) whose first ``syscall`` waits DELAY_US."""
    env = dict(os.environ)
    env.pop("STORM_AGENT", None)
    src = repo.parent / "input"
    src.write_bytes(input)
    with open(src, "rb") as stdin:
        return subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null",
                                 "-e", f"inject={syscall}:delay_enter={DELAY_US}:when=1",
                                 sys.executable, "-m", "storm_git", *args],
                                cwd=repo, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _in_the_window(directory: Path, content: bytes, proc: subprocess.Popen) -> None:
    """Wait until storm's temporary file holds ``content``: the check is done, the swap is next."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for f in directory.glob(".storm-tmp-*"):
            try:
                if f.read_bytes() == content:
                    return
            except OSError:
                pass
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.005)
    raise AssertionError("storm never wrote its temporary file")


def _unmediated(repo: Path) -> list[str]:
    r = storm(repo, "status", "--json")
    assert r.returncode == 0, r.stderr
    return [u["path"] for u in json.loads(r.stdout)["unmediated"]]


@pytest.mark.parametrize("case", ["existing file", "new file"])
def test_an_edit_saved_between_the_check_and_the_swap_is_kept(repo, case):
    path = "src/util.py" if case == "existing file" else "src/new.py"
    assert storm(repo, "read", path, agent="e1").returncode == 0
    proc = _delayed_storm(repo, "write", path, "--agent", "e1", input=b"agent's version\n")
    _in_the_window(repo / "src", b"agent's version\n", proc)
    (repo / path).write_bytes(b"the person's edit\n")  # an editor saving, in place
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert git(repo, "show", f"refs/storm/workspace:{path}").stdout == b"agent's version\n"
    assert (repo / path).read_bytes() == b"the person's edit\n"
    assert path in _unmediated(repo)
    assert not list((repo / "src").glob(".storm-tmp-*"))


def test_an_edit_saved_between_the_check_and_the_removal_is_kept(repo):
    """``rm``: the window between the check and the removal (the first unlinkat, after
    the pending entry is recorded) holds a save; the file is not deleted."""
    path = "src/util.py"
    assert storm(repo, "read", path, agent="e1").returncode == 0
    record = repo / ".git" / "storm" / "disk-record"
    proc = _delayed_storm(repo, "rm", path, "--agent", "e1", input=b"", syscall="unlinkat")
    deadline = time.monotonic() + 60
    while b"x " + path.encode() + b"\0" not in record.read_bytes():  # the removal is recorded as pending
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.005)
    (repo / path).write_bytes(b"the person's edit\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert git(repo, "cat-file", "-e", f"refs/storm/workspace:{path}", check=False).returncode != 0
    assert (repo / path).read_bytes() == b"the person's edit\n"
    assert path in _unmediated(repo)
    assert not list((repo / "src").glob(".storm-tmp-*"))
