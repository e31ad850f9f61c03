"""This installation of git storm: the command a shell runs it by, and the pip command
that installs it again.

A harness gives its hooks and its agent's shell a PATH of its own (Codex's shell
is a login shell), which need not hold the virtualenv git storm is installed in:
commands storm writes into settings or tells an agent to run name it by path
(:func:`storm_program`).

git storm is installed from its repository (``pip install -e .`` in a clone), so a
hint naming the package on an index (``pip install 'git-storm[mcp]'``) sends the
person to a package that may not be there. pip records where an installation came
from (``direct_url.json``, PEP 610); the hint repeats that source, editable or not,
with the interpreter of this environment so the package lands where git storm runs.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import unquote, urlparse

DIST = "git-storm"


def _with_extra(target: str, extra: str | None) -> str:
    return f"{target}[{extra}]" if extra else target


@dataclass
class Source:
    """Where pip took this copy from: a directory (``path``, maybe editable), a URL
    (an archive or a VCS checkout), or, with neither, an index."""

    path: str | None = None
    url: str | None = None
    editable: bool = False

    def spec(self, extra: str | None) -> str:
        if self.path is not None:
            return _with_extra(self.path, extra)
        name = _with_extra(DIST, extra)
        return f"{name} @ {self.url}" if self.url else name


def source() -> Source:
    """Where this copy of git storm was installed from (pip's direct_url.json)."""
    # every copy of the metadata on sys.path (a checkout's stray git_storm.egg-info
    # may come first); the installed one records its source
    raw = next((r for r in (d.read_text("direct_url.json") for d in metadata.distributions(name=DIST)) if r),
               None)
    if not raw:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if os.path.isfile(os.path.join(root, "pyproject.toml")):
            return Source(path=root, editable=True)  # imported from a checkout (PYTHONPATH)
        return Source()  # from an index
    try:
        info = json.loads(raw)
        url = str(info["url"])
    except (ValueError, KeyError, TypeError):
        return Source()
    if url.startswith("file://") and isinstance(info.get("dir_info"), dict):
        return Source(path=unquote(urlparse(url).path), editable=bool(info["dir_info"].get("editable")))
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        return Source(url=f"{vcs['vcs']}+{url}")
    return Source(url=url)


def pip_install(extra: str | None = None, *, python: str | None = None) -> str:
    """The shell command that (re)installs git storm with ``extra`` from where it came.

    ``python``: the interpreter to run pip with (default: this one, so the package
    lands in the environment git storm runs from)."""
    src = source()
    return f"{_pip(python)} {'-e ' if src.editable else ''}{shlex.quote(src.spec(extra))}"


def pip_install_requirement(requirement: str, *, python: str | None = None) -> str:
    """The shell command that installs ``requirement`` into this environment."""
    return f"{_pip(python)} {shlex.quote(requirement)}"


def _pip(python: str | None) -> str:
    return f"{shlex.quote(python or sys.executable)} -m pip install"


def storm_program() -> str:
    """This installation's ``git-storm``, quoted for a shell (or its Python with ``-m storm_git``)."""
    script = os.path.join(os.path.dirname(sys.executable), "git-storm")
    return shlex.quote(script) if os.access(script, os.X_OK) else f"{shlex.quote(sys.executable)} -m storm_git"
