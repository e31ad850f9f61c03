"""Turning a user's path into a safe repository-relative path, or refusing it.

Every verb goes through :func:`normalize` before touching git or the disk, so a
bad path is refused before anything changes. Paths are repository-relative POSIX
strings, as git stores them in trees.
"""
from __future__ import annotations

import os
import posixpath
import stat
from typing import Callable

from .errors import BadPath

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096


def _show(raw: str) -> str:
    return raw.encode("unicode_escape", "backslashreplace").decode("ascii")


# Code points HFS+ ignores in names, so ".g\u200cit" is ".git" on a Mac (git's next_hfs_char).
_HFS_IGNORED = frozenset([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])


def _is_ntfs_dotgit(part: str) -> bool:
    """git's is_ntfs_dotgit: ``.git`` or its 8.3 short name ``git~1`` (any case), followed
    only by spaces and dots (NTFS drops them) up to the end, a backslash (a directory
    separator on Windows) or a colon (an alternate data stream such as ``::$INDEX_ALLOCATION``)."""
    for seg in part.split("\\"):
        low = seg.lower()
        for name in (".git", "git~1"):
            if low.startswith(name):
                rest = seg[len(name):].split(":", 1)[0]
                if rest.strip(" .") == "":
                    return True
    return False


def _is_hfs_dotgit(part: str) -> bool:
    """git's is_hfs_dotgit: ``.git`` in any ASCII case once HFS+'s ignored code points are dropped."""
    return "".join(c for c in part if ord(c) not in _HFS_IGNORED).lower() == ".git"


def _refused_name(part: str) -> str | None:
    """Why git (with core.protectNTFS and core.protectHFS, as on Windows and macOS) refuses
    the component ``part``, or None. Storm refuses them on every platform: a tree holding one
    cannot be checked out there and could write into ``.git``."""
    if part.isascii() and "git" not in part.lower() and "::$" not in part:
        return None  # every refused spelling holds "git" in ASCII letters, or "::$"
    if part.lower() == ".git" or _is_ntfs_dotgit(part) or _is_hfs_dotgit(part):
        return "names .git on Windows or macOS"
    if "::$" in part:
        return "names an NTFS alternate data stream"
    return None


def _from_absolute(raw: str, top: str | None, shown: str) -> str:
    """The path of absolute ``raw`` relative to the working tree ``top``.

    Agents' file tools pass absolute paths. ``raw`` is taken lexically (no symlink
    inside the tree is resolved: check_on_disk judges those); only the top itself is
    compared by real path, so /tmp/repo and /private/tmp/repo name the same tree.
    """
    if top is None:
        raise BadPath(f"absolute path '{shown}' refused",
                      hint="give a path relative to the repository (or your directory in it)")
    path = os.path.normpath(raw)
    for root in dict.fromkeys((os.path.normpath(top), os.path.realpath(top))):
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, root)
    real_top = os.path.realpath(top)
    # The shortest leading part of raw that is the top (through a symlinked parent such as /tmp).
    head, rest = path, list[str]()
    chain = []
    while True:
        chain.append((head, list(reversed(rest))))
        parent, name = os.path.split(head)
        if not name:
            break
        rest.append(name)
        head = parent
    for head, tail in reversed(chain):
        if os.path.realpath(head) == real_top:
            return "/".join(tail) if tail else "."
    raise BadPath(f"'{shown}' is outside the repository ({top})",
                  hint="give a path inside the working tree, or relative to it")


def _plain(raw: str) -> bool:
    """A name every check of normalize passes unchanged: ASCII without NUL, newline or
    CR, at most MAX_COMPONENT_BYTES long (so no component or path is too long), no
    empty, "." or ".." component (no "//", no component starting with "."), not
    absolute, no trailing "/", and neither "git" (in any case) nor "::$" anywhere,
    so none of git's refused spellings. A batch of 2,000 ordinary paths skips the
    full checks (~10 µs a path); anything else takes them."""
    return (0 < len(raw) <= MAX_COMPONENT_BYTES and raw.isascii() and raw[0] not in "./"
            and raw[-1] != "/" and "/." not in raw and "//" not in raw and "::$" not in raw
            and "git" not in raw.lower() and "\x00" not in raw and "\n" not in raw and "\r" not in raw)


def normalize(raw: str, prefix: str = "", top: str | None = None) -> str:
    """Return the repository-relative path for ``raw`` given relative to ``prefix``.

    ``prefix`` is the caller's directory relative to the top of the working tree
    ('' at the top), so ``git storm read x`` from ``src/`` means ``src/x`` as in git.
    An absolute path is accepted when ``top`` (the working tree's top) is given and
    it lies inside it. Refuses escapes above the top, anything in ``.git`` (with
    the spellings Windows and macOS give it), control characters and names no
    filesystem can hold.
    """
    if isinstance(raw, str) and _plain(raw) and (not prefix or _plain(prefix)):
        return f"{prefix}/{raw}" if prefix else raw  # what _checked returns for it
    return _checked(raw, prefix, top)


def _checked(raw: str, prefix: str, top: str | None) -> str:
    """normalize, every check spelled out."""
    if not isinstance(raw, str) or raw == "":
        raise BadPath("empty path", hint="name a file relative to the repository")
    shown = _show(raw)
    if "\x00" in raw or "\n" in raw or "\r" in raw:
        raise BadPath(f"path '{shown}' contains a NUL, newline or carriage return",
                      hint="storm refuses such names")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise BadPath(f"path '{shown}' is not valid UTF-8") from None
    if raw.startswith("/") or os.path.isabs(raw):
        if raw.endswith("/"):
            raise BadPath(f"'{shown}' names a directory, not a file")
        raw, prefix = _from_absolute(raw, top, shown), ""
    joined = posixpath.join(prefix, raw.replace(os.sep, "/")) if prefix else raw
    path = posixpath.normpath(joined)
    if path in (".", ""):
        raise BadPath(f"'{shown}' is the top of the repository, not a file")
    if path == ".." or path.startswith("../"):
        raise BadPath(f"path '{shown}' leads outside the repository")
    parts = path.split("/")
    for part in parts:
        if part.lower() in (".git", ".git.") or part.lower().startswith(".git/"):
            raise BadPath(f"path '{shown}' is inside .git", hint="storm never touches git's own files")
        why = _refused_name(part)
        if why is not None:
            raise BadPath(f"path '{shown}' is refused: '{_show(part)}' {why}",
                          hint="git refuses such names too; choose another name")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise BadPath(f"a component of '{shown[:80]}'... is longer than {MAX_COMPONENT_BYTES} bytes")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise BadPath(f"path '{shown[:80]}'... is longer than {MAX_PATH_BYTES} bytes")
    if raw.endswith("/"):
        raise BadPath(f"'{shown}' names a directory, not a file")
    return path


def check_on_disk(path: str, top: str, *, for_write: bool, seen: dict[str, str] | None = None) -> None:
    """Refuse a path whose on-disk form is unsafe under working tree ``top``.

    A parent directory that is a symlink is refused (git calls this "beyond a
    symbolic link"; it is how writes escape the repository), a final symlink that
    leads out of the repository is refused, and so is a directory where a file is
    expected. A symlink inside the repository may be read (as git stores it: the
    link text) but not written through.

    ``seen``: one dict shared by the checks of one batch (a read of many paths), so each
    directory on the way is looked at once, not once per path below it.
    """
    if seen is None:
        seen = {}
    real_top = seen.get("") or seen.setdefault("", os.path.realpath(top))
    if for_write and len(os.fsencode(os.path.join(top, path))) >= MAX_PATH_BYTES:
        raise BadPath(f"{path[:80]!r}... is too long to be written under {top} (PATH_MAX {MAX_PATH_BYTES})",
                      hint="use a shorter path")
    start, cur = 0, top
    cut = path.rfind("/")
    if cut >= 0:  # in a batch, the directory was often checked for an earlier path
        parent = (top if top.endswith("/") else top + "/") + path[:cut]  # = os.path.join(top, ...)
        known = seen.get(parent)
        if known == "missing":
            return
        if known == "dir":  # only the file itself is left
            try:
                if stat.S_ISREG(os.lstat(parent + path[cut:]).st_mode):
                    return  # the common case, decided by one system call
            except OSError:
                return
            start, cur = path.count("/"), parent
    parts = path.split("/")
    for i in range(start, len(parts)):
        cur = os.path.join(cur, parts[i])
        last = i == len(parts) - 1
        if not last:
            known = seen.get(cur)
            if known == "dir":
                continue
            if known == "missing":
                return
        try:
            st = os.lstat(cur)  # one system call tells missing, link, directory and file apart
        except OSError:
            if not last:
                seen[cur] = "missing"
            return
        if stat.S_ISLNK(st.st_mode):
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
        if not last and os.path.lexists(os.path.join(cur, ".git")):
            inner = "/".join(parts[:i + 1])
            sub = os.path.isfile(os.path.join(cur, ".git"))
            what, whats = ("submodule", "submodules") if sub else ("nested repository", "nested repositories")
            raise BadPath(f"{path!r} is inside the {what} {inner!r}; storm does not write inside {whats}",
                          hint=f"work in {inner} with git itself")
        if not last and not stat.S_ISDIR(st.st_mode):
            raise BadPath(f"{'/'.join(parts[:i + 1])!r} is a file, so {path!r} cannot exist")
        if not last:
            seen[cur] = "dir"
        if last and stat.S_ISDIR(st.st_mode):
            if os.path.lexists(os.path.join(cur, ".git")):
                what = "a submodule" if os.path.isfile(os.path.join(cur, ".git")) else "a nested repository"
                raise BadPath(f"{path!r} is {what}, not a file; storm does not read or write it",
                              hint=f"work in {path} with git itself")
            raise BadPath(f"{path!r} is a directory, not a file")


# -- entries of a tree: what a push may bring and a sync may put on disk -------------------
# The file modes storm writes: a file, an executable, a link (and the trees holding them).
TREE_MODES = (0o100644, 0o100755, 0o120000)
LINK_MODE = 0o120000
# Files git reads itself: one that is a link could make git read (or write) outside the
# tree (git's fsck refuses a .gitmodules link; its checkout does not follow the others).
GIT_READS = (".gitmodules", ".gitattributes", ".gitignore", ".mailmap")
MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS


def _git_read_name(part: str) -> bool:
    """``part`` names one of GIT_READS, in any case or in NTFS's short or trailing-dot forms."""
    low = part.lower().rstrip(" .")
    return low in GIT_READS or low.startswith("gitmod~")


def link_refusal(path: str, target: bytes, links: Callable[[str], bytes | None]) -> str | None:
    """Why the link at ``path`` with text ``target`` must not be in the tree, or None.

    The link is resolved inside the tree as the kernel would resolve it on disk once
    the tree is checked out: ``links(p)`` gives the text of another link of the tree
    (None: not a link). Refused: a target that is absolute, climbs above the top, or
    passes through a name storm refuses (``.git`` and its spellings), directly or
    through other links; a loop. A link inside the tree is fine: git stores links, and
    storm reads them as their text and never writes through one."""
    try:
        text = target.decode("utf-8")
    except UnicodeDecodeError:
        return "is a symbolic link whose target is not UTF-8"
    if not text or "\x00" in text:
        return "is a symbolic link with an empty or NUL target"
    if text.startswith("/"):
        return "is a symbolic link to an absolute path, outside the repository"
    done: list[str] = path.split("/")[:-1]
    todo = [c for c in text.split("/") if c not in ("", ".")]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if not done:
                return "is a symbolic link leading out of the repository"
            done.pop()
            continue
        if part.lower() in (".git", ".git.") or _refused_name(part) is not None:
            return "is a symbolic link into .git"
        done.append(part)
        inner = links("/".join(done))
        if inner is not None:
            hops += 1
            if hops > MAX_LINK_HOPS:
                return "is a symbolic link in a loop of links"
            try:
                more = inner.decode("utf-8")
            except UnicodeDecodeError:
                return "is a symbolic link through a link whose target is not UTF-8"
            if more.startswith("/"):
                return "is a symbolic link through a link to an absolute path"
            done.pop()
            todo = [c for c in more.split("/") if c not in ("", ".")] + todo
    return None


def tree_entry_refusal(path: str, mode: int, *, link_target: bytes | None = None,
                       links: Callable[[str], bytes | None] | None = None,
                       size: int | None = None, limit: int | None = None) -> str | None:
    """Why a tree entry (``path``, ``mode``) must not reach a shared tree or a disk, or
    None: the one rule set the server guard, a sync and the local doors share. The
    name passes :func:`normalize` unchanged (git's fsck rules for names are part of
    it: ``.git`` in any case, ``git~1``, HFS+ and NTFS spellings), the mode is one
    storm writes, a file git reads itself is not a link, a link stays inside the tree
    (:func:`link_refusal`) and a file is at most ``limit`` bytes."""
    try:
        if normalize(path) != path:
            return f"{_show(path)!r} is not a plain repository path"
    except BadPath as exc:
        return exc.message
    if mode not in TREE_MODES:
        return f"{path!r} has mode {mode:o}: storm writes files, executables and links only"
    if mode == LINK_MODE:
        if _git_read_name(path.rsplit("/", 1)[-1]):
            return f"{path!r} is a symbolic link, and git reads that file itself"
        if link_target is not None:
            why = link_refusal(path, link_target, links or (lambda _p: None))
            if why is not None:
                return f"{path!r} {why}"
    elif size is not None and limit is not None and size > limit:
        return f"{path!r} has {size} bytes, over storm.maxFileBytes ({limit})"
    return None


_C_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n",
              "\v": "\\v", "\f": "\\f", "\r": "\\r"}


def quoted(path: str) -> str:
    """``path`` as git prints a name that needs quoting (C style, in double quotes:
    control characters, a double quote, a backslash, and the bytes of a name that
    is not UTF-8, which a file system gives storm as surrogate escapes), else
    unchanged; letters beyond ASCII stay as they are (``core.quotePath=false``). A
    name a command created (``"x\\n  deleted: src/api.py"``) then cannot forge a
    line of storm's output or a diff header."""
    if not any(c in _C_ESCAPES or ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in path):
        return path
    return '"' + "".join(_C_ESCAPES.get(c) or (f"\\{ord(c):03o}" if ord(c) < 0x20 or ord(c) == 0x7F else
                                              f"\\{ord(c) - 0xDC00:03o}" if 0xDC80 <= ord(c) <= 0xDCFF else
                                              f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c)
                         for c in path) + '"'


def printable(text: str) -> str:
    """``text`` with what cannot be sent as UTF-8 (a surrogate escape of a byte that is
    not UTF-8, a lone surrogate) written as a backslash escape: JSON, MCP and a
    terminal all take the result. A file named ``bad\\xffname.txt`` in the tree must
    not stop a server that lists it."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else
                       f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}"
                       for c in text)
