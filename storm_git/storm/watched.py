"""A snapshot from the resident process's watch, without walking the tree.

A snapshot taken under a watch token (:mod:`storm_git.storm.tree_watch`) is kept
as the *base*, ``<common git dir>/storm/exec-watch``: the token, the disk record's
tree, the paths that differed and their states, the nested repositories, and the
stat data of the files that change what a walk finds (git's configuration, the
exclude and attribute files outside the tree). The next snapshot asks the watch
what changed since the base's token; then the paths that can differ from the
disk record are the base's, the changed ones and those whose record entry moved
(a tree diff): only those are looked at. A changed directory is listed (``git
ls-files --others``) and its recorded files are looked at; an untracked file is
asked ``git check-ignore``.

Whenever that cannot be sure it answers nothing and the caller walks (``git
status``): no watch (no resident process, ``storm.watch=false``, a sparse
checkout), another epoch (a queue overflow, a restart), a base unreadable or of
another record no longer in the object store, a ``.gitignore``/``.gitattributes``
or anything named ``.git`` changed, a change at or inside a nested repository,
or the configuration or exclude files changed.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.convert import Conversions
from ..core.files import read_own, replace_file
from ..core.store import Store
from ..core.tree_diff import tree_changes
from ..disk import safe_fs
from ..disk.record import entry_or_none
from ..disk.safe_fs import disk_state, same
from . import tree_watch

BASE_NAME = "exec-watch"
WATCH = "storm.watch"
WALK, WATCHED = "walk", "watch"
DOUBT_NAMES = (".gitignore", ".gitattributes")


@dataclass
class Look:
    """The watch's answer for one snapshot and the base it answers about."""

    answer: tree_watch.Answer
    base: "Base | None"
    fingerprint: list[Any]


@dataclass
class Base:
    epoch: str
    gen: int
    record: str
    fingerprint: list[Any]
    dirty: dict[str, Any]
    nested: list[str] = field(default_factory=list)
    how: str = WALK  # how this snapshot was found (tests and benchmarks read it)


def _encode(v: Any) -> Any:
    return [str(v[0]), v[1]] if isinstance(v, tuple) else v


def _decode(v: Any) -> Any:
    return (pygit2.Oid(hex=v[0]), int(v[1])) if isinstance(v, list) else v


def base_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", BASE_NAME)


def load_base(store: Store) -> Base | None:
    raw = read_own(base_path(store))
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        return Base(str(d["epoch"]), int(d["gen"]), str(d["record"]), list(d["fp"]),
                    {str(p): _decode(v) for p, v in d["dirty"].items()}, [str(p) for p in d["nested"]],
                    str(d.get("how") or WALK))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None  # unreadable: walk, and write a new one


def save_base(store: Store, look: Look, record: pygit2.Tree, dirty: dict[str, Any], nested: list[str],
              how: str) -> None:
    path = base_path(store)
    data = {"epoch": look.answer.epoch, "gen": look.answer.gen, "record": str(record.id), "fp": look.fingerprint,
            "dirty": {p: _encode(v) for p, v in dirty.items()}, "nested": nested, "how": how}
    replace_file(path, json.dumps(data).encode("ascii"), tmp=f"{path}.{os.getpid()}")


def fingerprint(store: Store) -> list[Any]:
    """What, outside the working tree, changes which paths a walk reports: the
    configuration files, exclude and attribute files, and the variables that move them."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.path.join(store.commondir, "config"), os.path.join(store.gitdir, "config.worktree"),
             os.path.join(store.commondir, "info", "exclude"), os.path.join(store.commondir, "info", "attributes"),
             os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"), os.path.join(xdg, "git", "ignore"),
             os.path.join(xdg, "git", "attributes"), "/etc/gitconfig"]
    cfg = store.repo.config
    for key in ("core.excludesFile", "core.attributesFile"):
        try:
            files.append(os.path.expanduser(str(cfg[key])))
        except (KeyError, ValueError):
            pass
    out: list[Any] = [[k, os.environ.get(k)] for k in sorted(os.environ) if k.startswith("GIT_CONFIG")]
    for f in files:
        try:
            st = os.stat(f)
            out.append([f, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            out.append([f, None])
    return out


def look(store: Store) -> Look | None:
    """Ask the watch (before anything on disk is looked at); None: no watch to ask."""
    if os.environ.get("STORM_NO_DAEMON"):
        return None  # the path without the resident process: walk
    if not store.config_bool(WATCH, True) or store.config_bool("core.sparseCheckout", False):
        return None
    base = load_base(store)
    answer = tree_watch.ask(store.commondir, store.main_workdir, base.epoch if base else None,
                            base.gen if base else None)
    if answer is None:
        return None
    return Look(answer, base, fingerprint(store))


def _doubt(path: str, nested: list[str]) -> bool:
    if not path or ".git" in path.split("/") or path.rsplit("/", 1)[-1] in DOUBT_NAMES:
        return True
    return any(path == n or path.startswith(n + "/") or n.startswith(path + "/") for n in nested)


def _record_files(store: Store, tree: pygit2.Tree, path: str) -> list[str]:
    """The recorded files at or under ``path``."""
    try:
        obj = tree[path]
    except (KeyError, ValueError):
        return []
    if obj.type_str != "tree":
        return [path]
    out: list[str] = []
    stack = [(path, store.repo[obj.id].peel(pygit2.Tree))]
    while stack:
        prefix, t = stack.pop()
        for e in t:
            p = f"{prefix}/{e.name}"
            if e.type_str == "tree":
                stack.append((p, store.repo[e.id].peel(pygit2.Tree)))
            else:
                out.append(p)
    return out


def find(store: Store, record: pygit2.Tree, lk: Look, git_env: dict[str, str],
         conv: Conversions) -> tuple[dict[str, Any], list[str]] | None:
    """(dirty, nested) as a walk would find them, from the base and what changed
    since; None when that cannot be sure (the caller walks)."""
    base, changed = lk.base, lk.answer.changed
    if base is None or changed is None or base.fingerprint != lk.fingerprint:
        return None
    moved: list[str] = []
    if base.record != str(record.id):
        try:
            old = store.repo[pygit2.Oid(hex=base.record)].peel(pygit2.Tree)
        except (KeyError, ValueError):
            return None
        moved = [p for p, _ in tree_changes(store, old, record)]
    if any(_doubt(p, base.nested) for p in changed):
        return None
    top = store.main_workdir
    dirs = sorted(p for p in changed if tree_watch.is_dir(top, p))
    candidates = set(base.dirty) | set(moved)
    for p in changed:
        candidates.update(_record_files(store, record, p) or [p])
    known_untracked = {p for p in base.dirty if p not in moved and entry_or_none(store, record, p) is None}
    dirty: dict[str, Any] = {}
    nested = list(base.nested)
    ask_ignore: list[str] = []
    with safe_fs.DirFds(top) as fds:
        for p in sorted(candidates):
            have = disk_state(top, p, fds, conv)
            e = entry_or_none(store, record, p)
            if have is False and tree_watch.is_dir(top, p):
                if e is not None:
                    dirty[p] = False  # a directory where a recorded file was
                if p not in dirs:
                    dirs.append(p)
                continue
            if same(have, e):
                continue
            if e is None and p not in known_untracked:
                ask_ignore.append(p)
            dirty[p] = have
        listed = _others(store, sorted(set(dirs)), git_env) if dirs else []
        if listed is None:
            return None
        for p in listed:
            if p.endswith("/"):
                nested.append(p[:-1])
                continue
            if p in dirty:
                continue
            have = disk_state(top, p, fds, conv)
            if not same(have, entry_or_none(store, record, p)):
                dirty[p] = have
    if ask_ignore:
        ignored = _ignored(store, ask_ignore, git_env)
        if ignored is None:
            return None
        for p in ignored:
            dirty.pop(p, None)
    return dirty, sorted(set(nested))


def _others(store: Store, dirs: list[str], git_env: dict[str, str]) -> list[str] | None:
    """Every file under ``dirs`` that is not ignored (tracked or not: the index is
    empty), and the nested repositories (``name/``)."""
    env = dict(git_env, GIT_INDEX_FILE=os.path.join(store.commondir, "storm", BASE_NAME + ".no-index"))
    r = subprocess.run(["git", "--literal-pathspecs", "-c", "core.quotePath=false", "ls-files", "-z", "--others",
                        "--exclude-standard", "--", *[d + "/" for d in dirs]],
                       cwd=store.main_workdir, env=env, capture_output=True)
    if r.returncode != 0:
        return None
    return [p.decode("utf-8", "surrogateescape") for p in r.stdout.split(b"\0") if p]


def _ignored(store: Store, paths: list[str], git_env: dict[str, str]) -> list[str] | None:
    r = subprocess.run(["git", "check-ignore", "--no-index", "-z", "--stdin"], cwd=store.main_workdir,
                       env=git_env, input=b"".join(os.fsencode(p) + b"\0" for p in paths), capture_output=True)
    if r.returncode not in (0, 1):
        return None
    return [p.decode("utf-8", "surrogateescape") for p in r.stdout.split(b"\0") if p]
