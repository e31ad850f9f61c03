"""Assignments (each agent's primary file set) and restricted files.

``git storm assign A --files GLOB…`` records A's primary set; primary sets of
different agents must be disjoint. ``storm.restricted`` globs name files no
engineer may change (e.g. ``__init__.py``). The two modes use them differently:

* worktree mode: :mod:`storm_git.worktree.commit_rules` is the pre-commit rule (own
  branch only, inside the assignment when there is one, no restricted file);
  ``WorktreeWorkspace.commit`` applies it itself and the pre-commit hook applies
  it to a plain ``git commit`` in an agent's worktree;
* storm mode: a write outside the agent's primary set is allowed but flagged
  (``WriteResult.flags`` and a ``boundary`` event: STORM measures such crossings).

Storage: a commit chain under ``refs/storm/assignments`` whose tree holds one
JSON blob per agent (``<agent>.json``), moved by CAS under the workspace lock.
Chosen over git config because assignments are shared project state, not local
settings: the chain is auditable (``git log -p refs/storm/assignments`` shows who
assigned what when), it travels with ``refs/storm/*`` to a remote, and an update
is one atomic ref move. The write hot path of storm mode pays one ref lookup
when nobody has an assignment. ``storm.restricted`` stays in config, as the
issue names it and as it is a per-repository policy.

Patterns follow ``.gitignore`` rules: a pattern without ``/`` matches a file
or directory name at any depth; one with ``/`` is anchored at the top; ``*``
and ``?`` stop at ``/``, ``**`` crosses directories; a pattern naming a
directory covers everything under it.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pygit2

from ..core import events
from ..core.agents import validate_agent
from ..core.errors import CorruptState, RepoStateError, UsageError
from ..core.gitcmd import run_git
from ..core.locks import flocked
from ..core.store import MODE_BLOB, Store, ref_oid

ASSIGNMENTS_REF = "refs/storm/assignments"
RESTRICTED_KEY = "storm.restricted"
OUTSIDE_ASSIGNMENT = "outside_assignment"
RESTRICTED = "restricted"
READ_ONLY_KEY = "storm.readOnly"


class ReadOnlyAgent(UsageError):
    """A write by an agent that ``storm.readOnly`` names (a planning session): refused
    before anything is validated or changed."""

    kind = "read_only_agent"


# -- patterns ------------------------------------------------------------------
@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    pat = pattern.strip()
    if pat.startswith("./"):
        pat = pat[2:]
    anchored = "/" in pat.rstrip("/")
    pat = pat.strip("/")
    out, i = [], 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pat.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pat[i + 1:j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    core = "".join(out)
    lead = "^" if anchored else "^(?:.*/)?"
    return re.compile(lead + core + r"(?:/.*)?\Z")  # \Z: "$" also matches before a final newline


def check_pattern(pattern: str) -> str:
    p = pattern.strip()
    if not p or p in ("/", "."):
        raise UsageError(f"empty file pattern {pattern!r}", hint="give a path or glob such as src/api/**")
    if "\n" in p or "\x00" in p:
        raise UsageError(f"file pattern {pattern!r} contains a newline or NUL")
    if p.startswith("../") or "/../" in p or p == "..":
        raise UsageError(f"file pattern {pattern!r} leads outside the repository")
    try:
        _regex(p)
    except re.error as exc:
        raise UsageError(f"file pattern {pattern!r} is not a valid glob: {exc}") from None
    return p


def matches(pattern: str, path: str) -> bool:
    """Does ``path`` (repository-relative) fall under ``pattern``?"""
    return _regex(pattern).match(path) is not None


def matches_any(patterns: Iterable[str], path: str) -> bool:
    return any(matches(p, path) for p in patterns)


def _is_literal(pattern: str) -> bool:
    return not any(c in pattern for c in "*?[")


# -- config helpers ---------------------------------------------------------------
def config_list(store: Store, key: str) -> list[str]:
    """Every value of a multi-valued key, each value also split on whitespace and commas."""
    try:
        values = list(store.repo.config.get_multivar(key))
    except (KeyError, pygit2.GitError):
        values = []
    out: list[str] = []
    for v in values:
        out.extend(x for x in re.split(r"[\s,]+", v or "") if x)
    return out


def restricted_globs(store: Store) -> list[str]:
    return config_list(store, RESTRICTED_KEY)


def check_writable(store: Store, agent: str) -> None:
    """Refuse any write by an agent ``storm.readOnly`` names (``git storm team plan``'s
    manager session reads the repository and must change nothing)."""
    if agent in config_list(store, READ_ONLY_KEY):
        raise ReadOnlyAgent(f"{agent} is read-only here: it may read, not write",
                            hint=f"{READ_ONLY_KEY} names it (git config --unset-all {READ_ONLY_KEY} to lift it)")


def restricted_paths(store: Store, paths: Iterable[str]) -> list[str]:
    globs = restricted_globs(store)
    return [p for p in paths if matches_any(globs, p)] if globs else []


# -- assignments --------------------------------------------------------------------
@dataclass
class Assignment:
    agent: str
    files: list[str]
    task: str | None = None
    assigned_by: str | None = None
    time: float = 0.0

    def covers(self, path: str) -> bool:
        return matches_any(self.files, path)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AssignResult:
    assignment: Assignment | None
    previous: Assignment | None
    overlaps: dict[str, list[str]] = field(default_factory=dict)
    reads_reset: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "assignment": self.assignment.to_dict() if self.assignment else None,
            "previous": self.previous.to_dict() if self.previous else None,
            "overlaps": self.overlaps,
            "reads_reset": self.reads_reset,
        }


def _parse(store: Store, agent: str, oid: pygit2.Oid) -> Assignment:
    try:
        d = json.loads(store.blob_bytes(oid))
        return Assignment(agent, list(d["files"]), d.get("task"), d.get("assigned_by"), float(d.get("time", 0)))
    except (ValueError, KeyError, TypeError):
        raise CorruptState(f"unreadable assignment of {agent} in {ASSIGNMENTS_REF}",
                           hint=f"reassign it with git storm assign {agent} --files …") from None


def get(store: Store, agent: str) -> Assignment | None:
    """The agent's assignment: one ref lookup when nobody has one (the write hot path)."""
    oid = store.ref_target(ASSIGNMENTS_REF)
    if oid is None:
        return None
    try:
        entry = store.commit(oid).tree[f"{agent}.json"]
    except KeyError:
        return None
    return _parse(store, agent, entry.id)


def load_all(store: Store) -> dict[str, Assignment]:
    oid = store.ref_target(ASSIGNMENTS_REF)
    if oid is None:
        return {}
    out = {}
    for e in store.commit(oid).tree:
        name = str(e.name)
        if name.endswith(".json"):
            agent = name[:-5]
            out[agent] = _parse(store, agent, e.id)
    return dict(sorted(out.items()))


def _tracked_paths(store: Store, tree: pygit2.Oid | None) -> list[str]:
    if tree is None:
        return []
    r = run_git(["ls-tree", "-r", "-z", "--name-only", str(tree)], store.commondir)
    return [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def overlaps(mine: list[str], theirs: list[str], tracked: list[str], limit: int = 10) -> list[str]:
    """Paths (or patterns) covered by both sets: identical patterns, a literal path of
    one set covered by the other, and files of the integrated tree covered by both."""
    found: list[str] = []
    for a in mine:
        for b in theirs:
            if a.strip("/") == b.strip("/"):
                found.append(a)
            elif _is_literal(a) and matches(b, a.strip("/")):
                found.append(a)
            elif _is_literal(b) and matches(a, b.strip("/")):
                found.append(b)
    for p in tracked:
        if len(found) >= limit:
            break
        if matches_any(mine, p) and matches_any(theirs, p):
            found.append(p)
    return list(dict.fromkeys(found))[:limit]


def _write(store: Store, changes: dict[str, bytes | None], by: str, message: str) -> None:
    """CAS one commit on the assignments chain; caller holds the workspace lock."""
    while True:
        ref = store.ref(ASSIGNMENTS_REF)
        tree = store.commit(ref_oid(ref)).tree if ref else store.tree(store.empty_tree())
        new_tree = store.tree_with(tree, {
            name: None if data is None else (store.write_blob(data), MODE_BLOB) for name, data in changes.items()
        })
        commit = store.make_commit(new_tree, [ref_oid(ref)] if ref else [], by, message)
        if store.cas(ref, ASSIGNMENTS_REF, commit, "storm: assign"):
            return


def assign(store: Store, agent: str, files: list[str] | None, *, task: str | None = None,
           allow_overlap: bool = False, by: str = "manager", integrated_tree: pygit2.Oid | None = None
           ) -> AssignResult:
    """Record (``files``) or clear (``files`` None) the agent's primary set.

    Refused when it overlaps another agent's primary set unless ``allow_overlap``.
    A new task resets the agent's read set (a read set belongs to one task).
    """
    from ..core import readsets

    agent = validate_agent(agent)
    if files is not None:
        files = list(dict.fromkeys(check_pattern(f) for f in files))
        if not files:
            raise UsageError("no --files given", hint="name the agent's files, e.g. --files 'src/api/**'")
    with flocked(store.commondir, "workspace"):
        current = load_all(store)
        previous = current.get(agent)
        found: dict[str, list[str]] = {}
        if files is not None:
            others = {a: s for a, s in current.items() if a != agent}
            tracked = _tracked_paths(store, integrated_tree) if others else []
            for other, s in others.items():
                both = overlaps(files, s.files, tracked)
                if both:
                    found[other] = both
            if found and not allow_overlap:
                who = "; ".join(f"{a}: {', '.join(p[:5])}" for a, p in found.items())
                raise RepoStateError(f"the files of {agent} overlap other agents' primary sets ({who})",
                                     hint="make the sets disjoint, or pass --allow-overlap")
            new = Assignment(agent, files, task, by, time.time())
            data = json.dumps(new.to_dict(), indent=1, sort_keys=True).encode() + b"\n"
            _write(store, {f"{agent}.json": data}, by, f"storm: assign {agent}: {', '.join(files[:5])}\n"
                   + (f"\n{task}\n" if task else ""))
        else:
            new = None
            if previous is not None:
                _write(store, {f"{agent}.json": None}, by, f"storm: clear the assignment of {agent}\n")
        events.append(store, "assign", by, f"{agent}: {', '.join(files[:5]) if files else 'cleared'}",
                      {"assignee": agent, "files": files, "task": task, "overlaps": found})
    reset = False
    if new is not None and task and (previous is None or previous.task != task):
        readsets.forget(store, agent, None)
        reset = True
    return AssignResult(new, previous, found, reset)


def outside(store: Store, agent: str, paths: Iterable[str]) -> list[str]:
    """Paths outside the agent's primary set ([] when it has no assignment)."""
    a = get(store, agent)
    if a is None:
        return []
    return [p for p in paths if not a.covers(p)]


def flag_storm_write(store: Store, agent: str, paths: list[str], commit: Any) -> list[str]:
    """Storm mode, after an accepted write: the paths outside the agent's primary set,
    logged as a ``boundary`` event. The caller holds the workspace lock."""
    out = outside(store, agent, paths)
    if out:
        events.append(store, "boundary", agent, f"{agent} wrote outside its assignment: {', '.join(out[:3])}",
                      {"paths": out, "commit": None if commit is None else str(commit), "flag": OUTSIDE_ASSIGNMENT})
    return out
