#!/usr/bin/env python3
"""mypy over the package as it is installed: ``cli/`` and ``hooks/`` as
``storm_git.cli`` and ``storm_git.hooks``.

pyproject.toml maps those two directories into the package
(``[tool.setuptools.package-dir]``); an editable install does it with an import
hook, which mypy does not run, so a plain ``mypy cli`` would name the modules
``cli.*`` and find no ``storm_git.cli``. This gives mypy each file under the
module name it has at run time and otherwise runs mypy unchanged: the options
are ``[tool.mypy]`` in pyproject.toml, extra arguments go to mypy (e.g.
``--no-incremental``), and the exit status is mypy's (0 clean, 1 errors, 2 a
file mypy cannot parse or a bad option).

Usage: python .ci/typecheck.py [mypy options]
"""
from __future__ import annotations

import os
import sys

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["storm_git", "cli", "hooks"]
# directory -> the package it is installed as (pyproject's package-dir)
INSTALLED_AS = {"cli": "storm_git.cli", "hooks": "storm_git.hooks"}


def installed_name(module: str) -> str:
    top, _, rest = module.partition(".")
    if top in INSTALLED_AS:
        return INSTALLED_AS[top] + ("." + rest if rest else "")
    return module


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    sources, options = process_options([*argv, *TARGETS], stdout=sys.stdout, stderr=sys.stderr)
    sources = [BuildSource(s.path, installed_name(s.module), s.text, s.base_dir) for s in sources]
    try:
        result = build.build(sources, options)
    except CompileError as exc:
        print("\n".join(exc.messages), file=sys.stderr)
        return 2
    for line in result.errors:
        print(line)
    errors = [line for line in result.errors if ": error:" in line]
    if errors:
        files = {line.split(":", 1)[0] for line in errors}
        print(f"Found {len(errors)} errors in {len(files)} files (checked {len(sources)} source files)")
        return 1
    print(f"Success: no issues found in {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
