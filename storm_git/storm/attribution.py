"""Which of the files changed while an agent's command ran are the command's.

Storm sees a command from outside: a clock mark before it, a snapshot after it.
Anything saved in between is dated inside the window, the command's writes and a
person's save of another file alike (``make test`` runs for minutes; an editor
saves meanwhile). Telling them apart exactly needs the command's own system calls,
which storm does not trace (a harness runs its shell itself). So storm errs on the
side of *not* crediting the agent: under ``storm.execAttribution=named`` (the
default) a change in the window is the command's only when the command's text
names it —

* the file's path, as a word or inside one (``> out.txt``, ``--out=build/x``,
  ``open('gen.txt', 'w')``), or its file name where the text names it as a whole
  name (``cd src && sed -i … api.py``);
* a directory holding it, as a whole word (``black src``, ``rm -rf build``, ``.``);
* a glob matching it (``src/*.py``);
* or the command runs git porcelain that rewrites the tree (``git checkout``,
  ``stash``, ``reset`` …: they name no file yet change many).

Any other change in the window stays on disk as an edit made outside storm (a
person's, or with ``storm.shellEdits=adopt`` the shell identity's), and the agent is
told which files it was not credited with and how to record them
(``git storm adopt PATH --agent ME``). ``storm.execAttribution=window`` credits the
command with every change in its window (one person, no editor open).
"""
from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex

from ..core.errors import UsageError
from ..core.store import Store

SETTING = "storm.execAttribution"
NAMED = "named"
WINDOW = "window"
# git commands that change files they do not name
TREE_REWRITING_GIT = {"checkout", "restore", "reset", "stash", "apply", "am", "merge", "pull", "rebase",
                      "cherry-pick", "revert", "switch", "clean", "mv", "rm"}
_NAME_CHAR = r"[\w.+-]"
_GLOB = re.compile(r"[*?\[]")


def mode(store: Store) -> str:
    value = str(store.config_get(SETTING) or NAMED).strip().lower()
    if value not in (NAMED, WINDOW):
        raise UsageError(f"{SETTING} is {value!r}, not '{NAMED}' or '{WINDOW}'",
                         hint=f"git config {SETTING} named (only files the command names) or window (every change)")
    return value


def _words(command: str, depth: int = 3) -> list[str]:
    """The command's words, and the words of each word that is itself a command line
    (``sh -c 'git checkout -- . && …'``)."""
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:  # an unbalanced quote: the plain words still tell
        words = command.split()
    out: list[str] = []
    for w in words:
        out.append(w)
        if depth and any(c.isspace() for c in w):
            out.extend(_words(w, depth - 1))
    return out


def _tokens(words: list[str]) -> list[str]:
    """Each word, and the parts of it that follow ``=`` or a redirection (``--out=x``, ``2>x``)."""
    out: list[str] = []
    for w in words:
        out.append(w)
        for part in re.split(r"[=<>|;&()]+", w):
            if part and part != w:
                out.append(part)
    return out


def _rel(word: str, cwd: str) -> str:
    """A word as a repository path, seen from ``cwd`` (the command's directory)."""
    w = word.strip()
    if w.startswith("./"):
        w = w[2:]
    if posixpath.isabs(w):
        return ""  # outside the repository's relative names (storm compares relative paths)
    joined = posixpath.normpath(posixpath.join(cwd, w)) if cwd else posixpath.normpath(w)
    return "" if joined == "." else joined


def rewrites_tree(words: list[str]) -> bool:
    return any(w == "git" and i + 1 < len(words) and _git_sub(words[i + 1:]) in TREE_REWRITING_GIT
               for i, w in enumerate(words))


def _git_sub(rest: list[str]) -> str:
    """git's subcommand among the words after ``git`` (past ``-C dir``, ``-c k=v``)."""
    i = 0
    while i < len(rest):
        w = rest[i]
        if w in ("-C", "-c", "--git-dir", "--work-tree"):
            i += 2
            continue
        if w.startswith("-"):
            i += 1
            continue
        return w
    return ""


def named(command: str, paths: list[str], cwd: str = "") -> set[str]:
    """The paths among ``paths`` that ``command`` (run in repository directory ``cwd``) names."""
    words = _words(command)
    if rewrites_tree(words):
        return set(paths)
    tokens = _tokens(words)
    rels = [_rel(t, cwd) for t in tokens if t]
    whole_tree = any(r == "" and t.strip() in (".", "./", cwd or ".") for r, t in zip(rels, tokens, strict=True))
    out: set[str] = set()
    for p in paths:
        if whole_tree and (not cwd or p.startswith(cwd + "/")):
            out.add(p)
            continue
        base = p.rsplit("/", 1)[-1]
        if re.search(rf"(?<!{_NAME_CHAR}){re.escape(p)}(?!{_NAME_CHAR})", command) or \
                re.search(rf"(?<![\w.+/-]){re.escape(base)}(?!{_NAME_CHAR})", command):
            out.add(p)
            continue
        for r in rels:
            if not r:
                continue
            if p == r or p.startswith(r.rstrip("/") + "/"):
                out.add(p)
                break
            if _GLOB.search(r) and (fnmatch.fnmatchcase(p, r) or any(
                    fnmatch.fnmatchcase(d, r) for d in _parents(p))):
                out.add(p)
                break
    return out


def _parents(p: str) -> list[str]:
    parts = p.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
