"""OpenHands ``file_editor`` text semantics, as pure functions on text.

An agent trained on that interface (view / create / str_replace / insert /
undo_edit) should need no new habits, so the numbering (``cat -n``), the
``view_range`` rules, the uniqueness rule of ``old_str`` and the wording of
its errors follow file_editor. Storm adds only what it must: versions, and a
rejection when someone else changed the file. Errors are
:class:`storm_git.core.errors.UsageError` (bad input, nothing changed).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..core.errors import UsageError

SNIPPET_CONTEXT = 4  # lines shown around an edit, as file_editor does
MAX_VIEW_CHARS = 64_000  # a longer view is clipped with a hint to use view_range
MAX_LISTING = 2_000  # directory entries listed at most


class EditorError(UsageError):
    """A file_editor precondition failed (bad range, old_str not unique...)."""

    kind = "editor"


def is_binary(data: bytes) -> bool:
    return b"\x00" in data[:8000]


def decode(path: str, data: bytes) -> str:
    """The text of a file an edit applies to; binary or non-UTF-8 content is refused."""
    if is_binary(data):
        raise EditorError(f"{path} is a binary file: it cannot be edited as text",
                          hint="replace it whole with the write tool")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditorError(f"{path} is not valid UTF-8 text", hint="replace it whole with the write tool") from None


@dataclass
class Lines:
    """A text as numbered lines, remembering whether it ended with a newline."""

    lines: list[str]
    trailing_newline: bool

    @classmethod
    def of(cls, text: str) -> "Lines":
        if text == "":
            return cls([], False)
        trailing = text.endswith("\n")
        return cls((text[:-1] if trailing else text).split("\n"), trailing)

    def text(self) -> str:
        body = "\n".join(self.lines)
        return body + "\n" if self.trailing_newline and self.lines else body


def cat_n(lines: Iterable[str], first: int = 1) -> str:
    """``cat -n``: the line number right-aligned in 6 columns, a tab, the line."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, first))


def clip(text: str, limit: int = MAX_VIEW_CHARS) -> str:
    if len(text) <= limit:
        return text
    return (text[:limit] + "\n<response clipped: the file is longer; view it in parts with "
            "view_range [start, end] to see the rest>")


def view_lines(path: str, text: str, view_range: list[int] | None) -> tuple[str, int, int]:
    """(``cat -n`` of the requested lines, first, last) with file_editor's range rules:
    1-based, inclusive, ``end`` -1 for the end of the file."""
    lines = Lines.of(text).lines
    n = len(lines)
    if view_range is None:
        return cat_n(lines), 1, n
    if len(view_range) != 2 or not all(isinstance(x, int) for x in view_range):
        raise EditorError("Invalid `view_range` parameter: it should be a list of two integers [start, end]",
                          hint="for example [10, 20], or [10, -1] for line 10 to the end")
    start, end = view_range
    if start < 1 or start > max(n, 1):
        raise EditorError(f"Invalid `view_range` parameter: {view_range}. Its first element `{start}` "
                          f"should be within the range of lines of the file: [1, {n}]")
    if end == -1:
        end = n
    elif end < start:
        raise EditorError(f"Invalid `view_range` parameter: {view_range}. Its second element `{end}` "
                          f"should be larger or equal than its first element `{start}`")
    elif end > n:
        raise EditorError(f"Invalid `view_range` parameter: {view_range}. Its second element `{end}` "
                          f"should be smaller than the number of lines in the file: `{n}`",
                          hint="use -1 for the end of the file")
    return cat_n(lines[start - 1:end], start), start, end


def occurrence_lines(text: str, old: str) -> list[int]:
    """1-based line numbers where each occurrence of ``old`` starts."""
    out, at = [], text.find(old)
    while at != -1:
        out.append(text.count("\n", 0, at) + 1)
        at = text.find(old, at + 1)
    return out


def replace_once(path: str, text: str, old: str, new: str) -> tuple[str, int]:
    """(new text, line where the replacement starts); ``old`` must occur exactly once."""
    if old == "":
        raise EditorError("Parameter `old_str` is required and must not be empty for command: str_replace")
    if old == new:
        raise EditorError("No replacement was performed. `new_str` and `old_str` must be different.")
    where = occurrence_lines(text, old)
    if not where:
        raise EditorError(f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}.",
                          hint="view the file again and copy the text exactly, without the line numbers")
    if len(where) > 1:
        raise EditorError(f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines "
                          f"{where}. Please ensure it is unique",
                          hint="include more surrounding lines so it matches once")
    at = text.find(old)
    return text[:at] + new + text[at + len(old):], where[0]


def insert_after(path: str, text: str, line: int, new: str) -> str:
    """``new`` inserted after line ``line`` (0: at the top)."""
    doc = Lines.of(text)
    n = len(doc.lines)
    if line < 0 or line > n:
        raise EditorError(f"Invalid `insert_line` parameter: {line}. It should be within the range of lines "
                          f"of the file: [0, {n}]")
    added = new[:-1].split("\n") if new.endswith("\n") else new.split("\n")
    trailing = doc.trailing_newline or (line == n and new.endswith("\n")) or n == 0
    return Lines(doc.lines[:line] + added + doc.lines[line:], trailing).text()


def snippet(text: str, first_line: int, changed_lines: int) -> str:
    """``cat -n`` of the edited region with SNIPPET_CONTEXT lines around it."""
    lines = Lines.of(text).lines
    start = max(1, first_line - SNIPPET_CONTEXT)
    end = min(len(lines), first_line + max(changed_lines, 1) - 1 + SNIPPET_CONTEXT)
    return cat_n(lines[start - 1:end], start)


def listing(root: str, entries: Iterable[tuple[str, bool]]) -> str:
    """file_editor's directory view: non-hidden entries up to two levels below ``root``.

    ``entries`` are (path relative to root, is_directory) pairs, already limited to
    two levels and without hidden names; directories get a trailing slash."""
    shown = sorted(entries)
    more = len(shown) - MAX_LISTING
    body = [root.rstrip("/") + "/"] + [f"{root.rstrip('/')}/{p}" + ("/" if d else "") for p, d in shown[:MAX_LISTING]]
    if more > 0:
        body.append(f"... and {more} more entries (view a subdirectory to see them)")
    return (f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden items:\n"
            + "\n".join(body))
