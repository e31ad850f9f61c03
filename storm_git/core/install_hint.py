"""The pip command that installs git storm again, the way this copy was installed.

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
from importlib import metadata
from urllib.parse import unquote, urlparse

DIST = "git-storm"


def _with_extra(target: str, extra: str | None) -> str:
    return f"{target}[{extra}]" if extra else target


def _source() -> tuple[str, bool]:
    """(what pip installs, editable?) for this copy of git storm."""
    # every copy of the metadata on sys.path (a checkout's stray git_storm.egg-info
    # may come first); the installed one records its source
    raw = next((r for r in (d.read_text("direct_url.json") for d in metadata.distributions(name=DIST)) if r),
               None)
    if not raw:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if os.path.isfile(os.path.join(root, "pyproject.toml")):
            return root, True  # imported from a checkout (PYTHONPATH), not installed
        return DIST, False  # from an index
    try:
        info = json.loads(raw)
        url = str(info["url"])
    except (ValueError, KeyError, TypeError):
        return DIST, False
    if url.startswith("file://") and "dir_info" in info:
        return unquote(urlparse(url).path), bool(info["dir_info"].get("editable"))
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        return f"{DIST} @ {vcs['vcs']}+{url}", False
    return f"{DIST} @ {url}", False


def pip_install(extra: str | None = None, *, python: str | None = None) -> str:
    """The shell command that (re)installs git storm with ``extra`` from where it came.

    ``python``: the interpreter to run pip with (default: this one, so the package
    lands in the environment git storm runs from)."""
    target, editable = _source()
    if " @ " in target:
        name, _, url = target.partition(" @ ")
        spec = f"{_with_extra(name, extra)} @ {url}"
    else:
        spec = _with_extra(target, extra)
    return f"{_pip(python)} {'-e ' if editable else ''}{shlex.quote(spec)}"


def pip_install_requirement(requirement: str, *, python: str | None = None) -> str:
    """The shell command that installs ``requirement`` into this environment."""
    return f"{_pip(python)} {shlex.quote(requirement)}"


def _pip(python: str | None) -> str:
    return f"{shlex.quote(python or sys.executable)} -m pip install"
