"""Turning a user's path into a safe repository-relative path, or refusing it.

Every verb goes through :func:`normalize` before touching git or the disk, so a
bad path is refused before anything changes. Paths are repository-relative POSIX
strings, as git stores them in trees.
"""
from __future__ import annotations

import os
import posixpath

from .errors import BadPath

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096


def _show(raw: str) -> str:
    return raw.encode("unicode_escape", "backslashreplace").decode("ascii")


def normalize(raw: str, prefix: str = "") -> str:
    """Return the repository-relative path for ``raw`` given relative to ``prefix``.

    ``prefix`` is the caller's directory relative to the top of the working tree
    ('' at the top), so ``git storm read x`` from ``src/`` means ``src/x`` as in git.
    Refuses absolute paths, escapes above the top, anything in ``.git``, control
    characters and names no filesystem can hold.
    """
    if not isinstance(raw, str) or raw == "":
        raise BadPath("empty path", hint="name a file relative to the repository")
    shown = _show(raw)
    if "\x00" in raw or "\n" in raw or "\r" in raw:
        raise BadPath(f"path {shown!r} contains a NUL, newline or carriage return",
                      hint="storm refuses such names")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise BadPath(f"path {shown!r} is not valid UTF-8") from None
    if raw.startswith("/") or os.path.isabs(raw):
        raise BadPath(f"absolute path {shown!r} refused",
                      hint="give a path relative to the repository (or your directory in it)")
    joined = posixpath.join(prefix, raw.replace(os.sep, "/")) if prefix else raw
    path = posixpath.normpath(joined)
    if path in (".", ""):
        raise BadPath(f"{shown!r} is the top of the repository, not a file")
    if path == ".." or path.startswith("../"):
        raise BadPath(f"path {shown!r} leads outside the repository")
    parts = path.split("/")
    for part in parts:
        if part.lower() in (".git", ".git.") or part.lower().startswith(".git/"):
            raise BadPath(f"path {shown!r} is inside .git", hint="storm never touches git's own files")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise BadPath(f"a component of {shown[:80]!r}... is longer than {MAX_COMPONENT_BYTES} bytes")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise BadPath(f"path {shown[:80]!r}... is longer than {MAX_PATH_BYTES} bytes")
    if raw.endswith("/"):
        raise BadPath(f"{shown!r} names a directory, not a file")
    return path


def check_on_disk(path: str, top: str, *, for_write: bool) -> None:
    """Refuse a path whose on-disk form is unsafe under working tree ``top``.

    A parent directory that is a symlink is refused (git calls this "beyond a
    symbolic link"; it is how writes escape the repository), a final symlink that
    leads out of the repository is refused, and so is a directory where a file is
    expected. A symlink inside the repository may be read (as git stores it: the
    link text) but not written through.
    """
    real_top = os.path.realpath(top)
    if for_write and len(os.fsencode(os.path.join(top, path))) >= MAX_PATH_BYTES:
        raise BadPath(f"{path[:80]!r}... is too long to be written under {top} (PATH_MAX {MAX_PATH_BYTES})",
                      hint="use a shorter path")
    parts = path.split("/")
    cur = top
    for i, part in enumerate(parts):
        cur = os.path.join(cur, part)
        last = i == len(parts) - 1
        if os.path.islink(cur):
            target = os.path.realpath(cur)
            inside = target == real_top or target.startswith(real_top + os.sep)
            if not inside:
                raise BadPath(f"{'/'.join(parts[:i + 1])!r} is a symbolic link leading out of the repository",
                              hint="storm never follows links out of the repository")
            if not last:
                raise BadPath(f"path {path!r} goes through the symbolic link {'/'.join(parts[:i + 1])!r}",
                              hint="name the file by its real path")
            if for_write:
                raise BadPath(f"{path!r} is a symbolic link", hint="storm writes regular files only")
            return
        if not os.path.lexists(cur):
            return
        if not last and not os.path.isdir(cur):
            raise BadPath(f"{'/'.join(parts[:i + 1])!r} is a file, so {path!r} cannot exist")
        if last and os.path.isdir(cur):
            raise BadPath(f"{path!r} is a directory, not a file")
