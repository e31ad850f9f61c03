"""The marked shell blocks of the README and docs run as written.

A block preceded by ``<!-- run: NAME -->`` is run verbatim by ``bash -e -o
pipefail`` in a scratch copy of what a newcomer has: a git repository
``myproject`` on branch ``main`` with one commit of its own (a README), git storm
on PATH and nothing else. The marked blocks of one document share that scratch
directory and run in their order, as a reader follows them; ``<!-- run: NAME;
cwd: .. -->`` starts a block beside ``myproject`` instead of in it. A block that
stops working fails here, so the docs cannot drift from the program.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, git

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- run: ([A-Za-z0-9_-]+)(?:; cwd: ([^ ]+))? -->\n```(?:sh|bash)\n(.*?)^```", re.M | re.S)


def marked(doc: Path) -> list[tuple[str, str, str]]:
    """(name, cwd, body) of each marked block of ``doc``, in order."""
    return [(m.group(1), m.group(2) or ".", m.group(3)) for m in MARK.finditer(doc.read_text(encoding="utf-8"))]


RUN_DOCS = [d for d in DOCS if marked(d)]


def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A newcomer's machine in miniature: ``myproject`` with one commit, a HOME of its
    own with a git identity, git storm on PATH."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = A Newcomer\n\temail = newcomer@example.invalid\n"
                                     "[init]\n\tdefaultBranch = main\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "STORM_"))}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               STORM_NO_DAEMON="1")
    proj = tmp_path / "work" / "myproject"
    proj.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(proj)], check=True, env=env)
    (proj / "README.md").write_text("# myproject\n\nA project of one's own.\n")
    subprocess.run(["git", "add", "-A"], cwd=proj, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "Start"], cwd=proj, check=True, env=env)
    return proj, env


def test_the_docs_mark_blocks_to_run():
    names = [n for d in RUN_DOCS for n, _, _ in marked(d)]
    assert "quick-start" in names and "remote-setup" in names, names
    assert len(names) == len(set(names)), "two marked blocks share a name"


@pytest.mark.parametrize("doc", RUN_DOCS, ids=lambda d: d.name)
def test_marked_blocks_run_as_written(doc, tmp_path):
    proj, env = scratch(tmp_path)
    for name, cwd, body in marked(doc):
        where = (proj / cwd).resolve()
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=where, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{doc.name} block {name!r} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n" \
                                  f"{r.stderr[-3000:]}"
    assert git(proj, "fsck", "--no-progress", check=False).returncode == 0
