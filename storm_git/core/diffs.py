"""Unified diffs for rejection payloads.

Produced with difflib in the format ``unidiff`` and ``git apply`` parse (with
``\\ No newline at end of file`` markers); binary content is reported as git
does, "Binary files … differ", using git's NUL-byte heuristic.
"""
from __future__ import annotations

import difflib

from .paths import quoted


def is_binary(data: bytes | None) -> bool:
    return data is not None and b"\x00" in data[:8000]


def text_lines(text: str, keepends: bool = False) -> list[str]:
    """Lines as git counts them: ended by "\\n" only. (str.splitlines also ends one at
    a form feed, a lone CR, U+2028 ...: a file with a ^L line would get "No newline
    at end of file" markers mid-file, a diff git apply refuses, and line numbers past
    it that git does not give.)"""
    parts = text.split("\n")
    if keepends:
        return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return parts[:-1] if parts[-1] == "" else parts


def _lines(data: bytes | None) -> list[str]:
    return text_lines((data or b"").decode("utf-8", "replace"), keepends=True)


def unified(path: str, old: bytes | None, new: bytes | None, context: int = 3) -> str:
    """Diff from ``old`` to ``new`` (None: the file is absent). A name with control
    characters is quoted in the headers as git does."""
    a = quoted(f"a/{path}") if old is not None else "/dev/null"
    b = quoted(f"b/{path}") if new is not None else "/dev/null"
    if old == new:
        return ""
    if is_binary(old) or is_binary(new):
        return f"Binary files {a} and {b} differ\n"
    old_lines, new_lines = _lines(old), _lines(new)
    out = []
    for line in difflib.unified_diff(old_lines, new_lines, a, b, n=context):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif not line.endswith("\n"):
            out.append(line + "\n\\ No newline at end of file\n")
        else:
            out.append(line)
    return "".join(out)
