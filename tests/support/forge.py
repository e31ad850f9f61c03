"""Hand-made commits with plain git plumbing (hash-object, mktree, commit-tree):
what a client that skips storm can push. mktree checks no names, so a tree can
hold anything git's object format can (``.GIT``, ``git~1``, links out)."""
from __future__ import annotations

from pathlib import Path

from helpers import git

LINK = "120000"
FILE = "100644"


def blob(repo: Path, data: bytes) -> str:
    return git(repo, "hash-object", "-w", "--stdin", input=data).stdout.decode().strip()


def tree_with(repo: Path, base: str | None, changes: dict[bytes, tuple[str, bytes]]) -> str:
    """The tree ``base`` (a tree-ish, None: empty) with ``changes``: path -> (mode, content)."""
    entries: dict[bytes, tuple[str, str, str]] = {}  # name -> (mode, type, id)
    if base is not None:
        for line in git(repo, "ls-tree", "-z", base).stdout.split(b"\0"):
            if line:
                meta, name = line.split(b"\t", 1)
                mode, kind, oid = meta.decode().split()
                entries[name] = (mode, kind, oid)
    here: dict[bytes, tuple[str, bytes]] = {}
    below: dict[bytes, dict[bytes, tuple[str, bytes]]] = {}
    for path, value in changes.items():
        head, _, rest = path.partition(b"/")
        if rest:
            below.setdefault(head, {})[rest] = value
        else:
            here[head] = value
    for name, (mode, data) in here.items():
        entries[name] = (mode, "blob", blob(repo, data))
    for name, sub in below.items():
        old = entries.get(name)
        inner = old[2] if old and old[1] == "tree" else None
        entries[name] = ("040000", "tree", tree_with(repo, inner, sub))
    text = b"".join(f"{m} {k} {o}\t".encode() + n + b"\0" for n, (m, k, o) in entries.items())
    return git(repo, "mktree", "-z", input=text).stdout.decode().strip()


def storm_message(agent: str, paths: list[str], parent: str, op: str = "write") -> str:
    """Storm's trailers with an empty provenance (``Storm-Read-Set: none 0``): a write that read nothing."""
    names = "".join(f"Storm-Path: {p}\n" for p in paths)
    return (f"forged\n\nStorm-Agent: {agent}\nStorm-Op: {op}\n{names}Storm-Validated-At: {parent}\n"
            "Storm-Scope: all\nStorm-Read-Set: none 0\n")


def commit(repo: Path, parent: str, changes: dict[bytes, tuple[str, bytes]], agent: str = "eng_x") -> str:
    """A commit on ``parent`` with ``changes``, carrying storm's trailers and an empty provenance."""
    tree = tree_with(repo, f"{parent}^{{tree}}", changes)
    msg = storm_message(agent, [p.decode("utf-8", "surrogateescape") for p in changes], parent)
    return git(repo, "commit-tree", "-p", parent, "-m", msg, tree).stdout.decode().strip()
