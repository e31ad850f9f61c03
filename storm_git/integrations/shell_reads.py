"""The files a shell command reads, from its bash syntax (bashlex), for the harness
shell door: an agent that looks at a file with ``cat``, ``sed -n '1,80p'``, ``nl -ba``,
``head``, ``tail``, ``less`` or ``grep``/``rg`` with file arguments has read it, and its
later write is validated against what it saw.

Only what a command shows of a file's content counts: a file that is there, named as
an argument of a reader or as an input redirection. A file only listed or searched for
(``ls``, ``find``, ``grep -r PAT DIR``, ``rg PAT`` with no file, ``grep -l``) is not a
read, nor is a name that is no file (a directory, a missing file).
Pipelines, lists (``&&``, ``||``, ``;``), subshells, command substitutions,
``bash -c``/``sh -c`` scripts and input redirections (``< f``) are followed; a plain
``cd DIR`` moves the directory later words resolve from. A word bash would expand from
the environment (``$F``, ``$(…)``) is skipped; a glob is expanded as bash would.

Fail safe: a command that does not parse, or is too long to parse, names no read, and
nothing here raises (:func:`read_paths` returns []).
"""
from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import bashlex

MAX_COMMAND_CHARS = 20_000  # longer command lines are not parsed (the parser is not linear-time)
SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
WRAPPERS = frozenset({"sudo", "command", "builtin", "exec", "nice", "nohup", "time", "env", "xargs"})

# reader -> options that take a value (the next word, unless given as -n5 / --lines=5)
_VALUED: dict[str, frozenset[str]] = {
    "cat": frozenset(),
    "tac": frozenset({"-s", "--separator"}),
    "nl": frozenset({"-b", "-d", "-f", "-h", "-i", "-l", "-n", "-s", "-v", "-w", "--body-numbering",
                     "--section-delimiter", "--footer-numbering", "--header-numbering", "--line-increment",
                     "--join-blank-lines", "--number-format", "--number-separator", "--starting-line-number",
                     "--number-width"}),
    "head": frozenset({"-n", "-c", "--lines", "--bytes"}),
    "tail": frozenset({"-n", "-c", "--lines", "--bytes", "-s", "--sleep-interval", "--pid", "--max-unchanged-stats"}),
    "less": frozenset({"-b", "-h", "-j", "-k", "-o", "-O", "-p", "-P", "-t", "-T", "-x", "-y", "-z", "--pattern"}),
    "more": frozenset({"-n", "--lines"}),
    "bat": frozenset({"-l", "--language", "-r", "--line-range", "-H", "--highlight-line", "--style", "--theme",
                      "--tabs", "--wrap", "--color", "--paging", "-m", "--map-syntax"}),
    "batcat": frozenset({"-l", "--language", "-r", "--line-range", "-H", "--highlight-line", "--style", "--theme"}),
}
_GREP_VALUED = frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "-d", "-D", "--regexp", "--file", "--max-count",
                          "--after-context", "--before-context", "--context", "--label", "--include",
                          "--exclude", "--exclude-dir", "--exclude-from", "--binary-files", "--color",
                          "--colour", "--devices", "--directories"})
_RG_VALUED = frozenset({"-e", "-f", "-m", "-A", "-B", "-C", "-g", "-t", "-T", "-E", "-j", "-M", "-r", "--regexp",
                        "--file", "--max-count", "--after-context", "--before-context", "--context", "--glob",
                        "--iglob", "--type", "--type-not", "--encoding", "--threads", "--max-columns",
                        "--replace", "--max-depth", "--max-filesize", "--color", "--colors", "--sort",
                        "--sortr", "--type-add", "--pre", "--pre-glob", "--path-separator", "--context-separator",
                        "--field-match-separator", "--field-context-separator", "--engine", "--dfa-size-limit",
                        "--regex-size-limit", "--ignore-file"})
_SED_VALUED = frozenset({"-e", "-f", "-l", "--expression", "--file", "--line-length"})
# options after which grep/rg print no line of a file (names, counts, exit status only)
_NO_CONTENT = frozenset({"-l", "-L", "-c", "-q", "--files-with-matches", "--files-without-match", "--count",
                         "--quiet", "--silent", "--files", "--count-matches"})
_RECURSIVE = frozenset({"-r", "-R", "--recursive", "--dereference-recursive"})


@dataclass
class _Walk:
    cwd: str
    words: list[tuple[str, str]] = field(default_factory=list)  # (raw path, the directory it resolves from)


def read_paths(command: Any, cwd: str, resolve: Callable[[str, str], str | None]) -> list[str]:
    """The repository paths of the files ``command`` reads (a string, or the argv list
    a harness gives: ``["bash", "-lc", SCRIPT]``), each through ``resolve(raw, cwd)``
    (the door's path rules: None or an exception drops the word). Never raises."""
    try:
        raws = raw_reads(command, cwd)
    except Exception:  # noqa: BLE001 - a reader the parser cannot follow records nothing, never fails the door
        return []
    out: list[str] = []
    for raw, where in raws:
        try:
            p = resolve(raw, where)
        except Exception:  # noqa: BLE001 - a name the door's rules refuse is not recorded
            continue
        if p and p not in out:
            out.append(p)
    return out


def raw_reads(command: Any, cwd: str) -> list[tuple[str, str]]:
    """(word as written, the directory it resolves from) for each file the command reads.
    Raises on a command bashlex cannot parse."""
    script = _script(command)
    if script is None or not script.strip() or len(script) > MAX_COMMAND_CHARS:
        return []
    walk = _Walk(cwd)
    for tree in bashlex.parse(script):
        _visit(tree, walk, script)
    return [(raw, where) for raw, where in walk.words if _is_file(raw, where)]


def _script(command: Any) -> str | None:
    if isinstance(command, str):
        return command
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        if os.path.basename(command[0]) in SHELLS and len(command) >= 3 and command[1] in ("-c", "-lc", "-ic"):
            return command[2]
        return " ".join(_quote(c) for c in command)
    return None


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def _visit(node: Any, walk: _Walk, script: str) -> None:
    kind = node.kind
    if kind == "command":
        _command(node, walk, script)
        return
    for child in _children(node):
        _visit(child, walk, script)
    for r in getattr(node, "redirects", None) or []:  # while …; done < f, { …; } < f
        _redirect(r, walk, script)


def _redirect(part: Any, walk: _Walk, script: str) -> None:
    if part.type == "<" and hasattr(part.output, "kind") and part.output.kind == "word":
        target = _literal(part.output)
        if target:
            walk.words.append((target, walk.cwd))
    elif hasattr(part.output, "kind"):
        for sub in getattr(part.output, "parts", []) or []:
            if sub.kind in ("commandsubstitution", "processsubstitution"):
                _visit(sub.command, walk, script)


def _children(node: Any) -> Iterable[Any]:
    for attr in ("parts", "list", "command"):
        got = getattr(node, attr, None)
        if isinstance(got, list):
            yield from got
        elif got is not None and hasattr(got, "kind"):
            yield got


def _command(node: Any, walk: _Walk, script: str) -> None:
    words: list[str | None] = []
    for part in node.parts:
        if part.kind == "word":
            for sub in getattr(part, "parts", []) or []:
                if sub.kind in ("commandsubstitution", "processsubstitution"):
                    _visit(sub.command, walk, script)
            words.append(_literal(part))
        elif part.kind == "redirect":
            _redirect(part, walk, script)
        elif part.kind == "assignment":
            continue
    while words:
        first = words[0]
        if first in WRAPPERS:  # sudo cat f, env -i cat f, time cat f
            words = words[1:]
            while words and words[0] is not None and words[0].startswith("-"):
                words = words[1:]
        elif first is not None and "=" in first and not first.startswith("-"):
            words = words[1:]  # env's VAR=value
        else:
            break
    if not words or words[0] is None:
        return
    name = os.path.basename(words[0])
    args = words[1:]
    if name == "cd":
        target = next((a for a in args if a is not None and not a.startswith("-")), None)
        if target is not None:
            walk.cwd = os.path.normpath(os.path.join(walk.cwd, os.path.expanduser(target)))
        return
    if name in SHELLS:
        inner = _inline_script(args)
        if inner is not None:
            for tree in bashlex.parse(inner):
                _visit(tree, walk, inner)
        return
    files = _reader_files(name, args)
    for raw in files:
        walk.words.extend((g, walk.cwd) for g in _expand(raw, walk.cwd))


def _inline_script(args: list[str | None]) -> str | None:
    for i, a in enumerate(args):
        if a is None:
            return None
        if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
            return args[i + 1] if i + 1 < len(args) else None
        if not a.startswith("-"):
            return None
    return None


def _literal(word: Any) -> str | None:
    """The word as bash passes it, quotes removed; None when it expands from the
    environment (a parameter, a command substitution, a tilde is kept as written)."""
    for sub in getattr(word, "parts", []) or []:
        if sub.kind in ("parameter", "commandsubstitution", "processsubstitution"):
            return None
    return None if "\0" in word.word else word.word  # a NUL: a name no file can have


def _operands(args: list[str | None], valued: frozenset[str]) -> tuple[list[str], set[str]]:
    """(the operands, the options given) of a getopt-style argument list."""
    operands: list[str] = []
    opts: set[str] = set()
    i = 0
    only = False
    while i < len(args):
        a = args[i]
        i += 1
        if a is None:
            continue  # expands from the environment: not a name we can know
        if only or a == "-" or not a.startswith("-"):
            if a != "-":
                operands.append(a)
            continue
        if a == "--":
            only = True
            continue
        if a.startswith("--"):
            name = a.split("=", 1)[0]
            opts.add(name)
            if name in valued and "=" not in a:
                i += 1
            continue
        # a cluster of short options: -n5, -ba, -A 3
        for j, ch in enumerate(a[1:], start=1):
            flag = "-" + ch
            opts.add(flag)
            if flag in valued:
                if j == len(a) - 1:
                    i += 1  # its value is the next word
                break
    return operands, opts


def _reader_files(name: str, args: list[str | None]) -> list[str]:
    if name in _VALUED:
        operands, _ = _operands(args, _VALUED[name])
        return operands
    if name in ("grep", "egrep", "fgrep"):
        operands, opts = _operands(args, _GREP_VALUED)
        if opts & _NO_CONTENT:
            return []
        if not opts & {"-e", "-f", "--regexp", "--file"}:
            operands = operands[1:]  # the first operand is the pattern
        if opts & _RECURSIVE:
            return [o for o in operands if not o.endswith("/")]  # directories are dropped by the caller
        return operands
    if name == "rg":
        operands, opts = _operands(args, _RG_VALUED)
        if opts & _NO_CONTENT:
            return []
        if not opts & {"-e", "-f", "--regexp", "--file"}:
            operands = operands[1:]
        return operands
    if name == "sed":
        operands, opts = _operands(args, _SED_VALUED)
        if opts & {"-i", "--in-place"} or any(o.startswith("--in-place") for o in opts):
            return []  # an edit, not a read
        if not opts & {"-e", "-f", "--expression", "--file"}:
            operands = operands[1:]  # the first operand is the script
        return operands
    return []


def _expand(raw: str, cwd: str) -> list[str]:
    """A word's files as bash gives them: a glob that matches is its matches, sorted."""
    if any(c in raw for c in "*?[") and not raw.startswith("~"):
        pattern = raw if os.path.isabs(raw) else os.path.join(cwd, raw)
        found = sorted(glob.glob(pattern))
        if found:
            return found
    return [os.path.expanduser(raw)] if raw.startswith("~") else [raw]


def _is_file(raw: str, cwd: str) -> bool:
    """Only a file that is there was shown: a directory was listed or searched, and a
    missing name showed nothing (an error)."""
    full = raw if os.path.isabs(raw) else os.path.join(cwd, raw)
    try:
        return os.path.isfile(full)
    except (OSError, ValueError):
        return False
