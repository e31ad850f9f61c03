"""The build backend: setuptools', plus the data files in editable wheels.

setuptools leaves ``data_files`` out of the editable wheel that ``pip install -e``
installs, so ``share/man/man1/git-storm.1`` never reaches the environment and
``git storm --help`` (which git turns into ``man git-storm``) finds no page. Every
hook is setuptools' own; ``build_editable`` then copies the data files into the
wheel's ``.data/data/`` directory, where pip installs them under the
environment's prefix (``<venv>/share/man/man1``: man finds it through the
``bin`` directory on PATH). A copy, as for any wheel: rerun ``pip install -e .``
after regenerating the page.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools'


def _data_files() -> list[tuple[str, list[str]]]:
    """``[tool.setuptools.data-files]`` as setuptools reads it from pyproject.toml."""
    from setuptools.dist import Distribution

    dist = Distribution()
    dist.parse_config_files()
    return [(target, list(sources)) for target, sources in (dist.data_files or [])]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def add_data_files(wheel_path: str, files: list[tuple[str, list[str]]]) -> None:
    """Rewrite the wheel with ``files`` under ``<name>.data/data/`` and RECORD updated."""
    with zipfile.ZipFile(wheel_path) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    [record] = [info.filename for info, _ in entries if info.filename.endswith(".dist-info/RECORD")]
    data_dir = record.split("/")[0][: -len(".dist-info")] + ".data/data"
    added = []
    for target, sources in files:
        for source in sources:
            with open(source, "rb") as fh:
                added.append((f"{data_dir}/{target}/{os.path.basename(source)}", fh.read()))
    tmp = wheel_path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as new:
        for info, data in entries:
            if info.filename == record:
                lines = data.decode().splitlines()
                keep = [ln for ln in lines if not ln.startswith(record + ",")]
                keep += [_record_line(name, body) for name, body in added] + [record + ",,"]
                new.writestr(info, "\n".join(keep) + "\n")
            else:
                new.writestr(info, data)
        for name, body in added:
            new.writestr(name, body)
    os.replace(tmp, wheel_path)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_data_files(os.path.join(wheel_directory, name), _data_files())
    return name
