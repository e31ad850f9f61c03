"""Unified diffs for rejection payloads.

Produced with difflib in the format ``unidiff`` and ``git apply`` parse (with
``\\ No newline at end of file`` markers); binary content is reported as git
does, "Binary files … differ", using git's NUL-byte heuristic.
"""
from __future__ import annotations

import difflib


def is_binary(data: bytes | None) -> bool:
    return data is not None and b"\x00" in data[:8000]


def unified(path: str, old: bytes | None, new: bytes | None, context: int = 3) -> str:
    """Diff from ``old`` to ``new`` (None: the file is absent)."""
    a = f"a/{path}" if old is not None else "/dev/null"
    b = f"b/{path}" if new is not None else "/dev/null"
    if old == new:
        return ""
    if is_binary(old) or is_binary(new):
        return f"Binary files {a} and {b} differ\n"
    old_lines = (old or b"").decode("utf-8", "replace").splitlines(keepends=True)
    new_lines = (new or b"").decode("utf-8", "replace").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(old_lines, new_lines, a, b, n=context):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif not line.endswith("\n"):
            out.append(line + "\n\\ No newline at end of file\n")
        else:
            out.append(line)
    return "".join(out)
