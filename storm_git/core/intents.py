"""Intent annotations: ``# engineer_1: why`` / ``// engineer_1: why`` comments.

STORM asks agents to leave a short comment naming themselves and the reason
next to a non-obvious change, so another agent about to touch that line knows
whose decision it undoes. This module finds them and tells who wrote them:

* :func:`annotations` parses a text for them. An annotation names an agent
  storm knows (one with a read set or writes: ``refs/notes/storm/agents/*``,
  plus ``storm.manager``), so ordinary tags (``# TODO: …``, ``# noqa: …``,
  ``# Returns: …``) never count.
* :func:`list_intents` lists them in the shared tree with the agent whose
  write last changed each line (``git blame`` on ``refs/storm/workspace``, the
  commit mapped to its ``Storm-Agent`` trailer).
* :func:`flag_write` is called by :meth:`SharedWorkspace.apply` after an
  accepted write (workspace lock held): a write that deletes or rewords an
  annotation by *another* agent (changing the code beside it does not count) is
  accepted but flagged ``intent_overwritten`` and logged as an event of that type.
* :func:`in_rejection` lists the annotations a rejection's diffs add, remove or
  keep, so the rejected agent sees whose intent it is about to touch.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pygit2

from . import events, readsets, trailers
from .agents import seen_agents
from .diffs import is_binary, text_lines
from .errors import BadPath, RepoStateError
from .store import WORKSPACE_REF, Store, git_env as store_git_env

INTENT_OVERWRITTEN = "intent_overwritten"
# A comment marker, an agent-shaped id, a colon and a reason. The id is then
# checked against the agents storm knows.
_ANNOTATION = re.compile(r"(?:^|(?<=\s))(?:#|//)\s*([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):\s+(\S.*?)\s*$")
_QUICK = re.compile(rb"(?:#|//)\s*[A-Za-z0-9][A-Za-z0-9_.-]{0,63}:\s")
MAX_SCAN_BYTES = 4 << 20  # larger files are not scanned on the write path
DEFLATE_MAX_RATIO = 1032  # zlib's worst-case expansion of a deflate stream


@dataclass
class Annotation:
    """One annotated line: ``agent`` is the agent the comment names."""

    path: str
    line: int
    agent: str
    why: str
    text: str
    written_by: str | None = None  # the agent whose write last changed the line
    commit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def known_agents(store: Store) -> set[str]:
    """Every agent id storm has seen (read sets, writes, and in a clone of a remote
    workspace the writers of the history it fetched) and the manager."""
    out = set(readsets.agents(store)) | seen_agents(store.commondir)
    out.add(store.config_get("storm.manager") or "manager")
    return out


def _known(store: Store, name: str) -> bool:
    """Is ``name`` an agent storm knows (a notes ref, a read-set journal not yet
    folded, or a writer of the fetched history)? One ref lookup and two stats (the
    write path's check)."""
    if name == (store.config_get("storm.manager") or "manager") or name in seen_agents(store.commondir):
        return True
    try:
        if os.path.exists(readsets.journal_path(store, name)):
            return True
        return store.ref_target(readsets.agent_ref(name)) is not None
    except (ValueError, KeyError, pygit2.GitError):
        return False


def parse_line(text: str, agents: set[str]) -> tuple[str, str] | None:
    """(agent, why) when ``text`` holds an annotation naming a known agent."""
    for m in _ANNOTATION.finditer(text):
        if m.group(1) in agents:
            return m.group(1), m.group(2)
    return None


def annotations(path: str, data: bytes | None, agents: set[str]) -> list[Annotation]:
    """The annotation lines of one file's content (none for binary content)."""
    if not data or is_binary(data) or not _QUICK.search(data):
        return []
    out = []
    for n, raw in enumerate(text_lines(data.decode("utf-8", "replace")), 1):
        hit = parse_line(raw, agents)
        if hit:
            out.append(Annotation(path, n, hit[0], hit[1], raw.strip()))
    return out


# -- listing (git storm intents) ------------------------------------------------------
def _git(store: Store, args: list[str]) -> subprocess.CompletedProcess:
    env = store_git_env(GIT_DIR=store.gitdir, LC_ALL="C")  # HEAD: this worktree's; refs: shared
    return subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=store.top,
                          env=env, capture_output=True)


def _candidates(store: Store, paths: list[str], rev: str) -> dict[str, list[tuple[int, str]]]:
    """{path: [(line, text)]} of lines that look like annotations, by ``git grep``
    on ``rev``'s tree (no checkout, no reading of files without a hit)."""
    r = _git(store, ["grep", "-I", "-n", "-z", "-E", r"(^|[[:space:]])(#|//)[[:space:]]*[A-Za-z0-9][A-Za-z0-9_.-]*:[[:space:]]",
                     rev, "--", *paths])
    if r.returncode not in (0, 1):
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RepoStateError(f"git grep failed: {err[-1] if err else r.returncode}", hint="run git storm doctor")
    out: dict[str, list[tuple[int, str]]] = {}
    for rec in r.stdout.split(b"\n"):
        if not rec:
            continue
        parts = rec.split(b"\0", 2)  # <ref>:<path>\0<line>\0<text>
        if len(parts) != 3:
            continue
        path = parts[0].decode("utf-8", "surrogateescape").split(":", 1)[1]
        out.setdefault(path, []).append((int(parts[1]), parts[2].decode("utf-8", "replace")))
    return out


def _blame(store: Store, path: str, lines: list[int], rev: str) -> dict[int, str]:
    """{line: commit} for ``lines`` of ``path`` at ``rev``."""
    args = ["blame", "--porcelain"]
    for n in lines:
        args += ["-L", f"{n},{n}"]
    r = _git(store, [*args, rev, "--", path])
    out: dict[int, str] = {}
    if r.returncode != 0:
        return out
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split(" ")
        if len(parts) >= 3 and len(parts[0]) in (40, 64) and all(c in "0123456789abcdef" for c in parts[0]):
            out[int(parts[2])] = parts[0]
    return out


def _agent_of(store: Store, commit: str, cache: dict[str, str]) -> str:
    if commit not in cache:
        try:
            c = store.commit(pygit2.Oid(hex=commit))
            cache[commit] = trailers.parse(c.message).get("Storm-Agent", [c.author.name])[0]
        except (KeyError, ValueError):
            cache[commit] = "?"
    return cache[commit]


def list_intents(store: Store, paths: Iterable[str] = (), rev: str = WORKSPACE_REF) -> list[Annotation]:
    """The annotations in ``rev``'s tree (default: the shared head; worktree mode
    passes the target branch) under ``paths``, each with the agent whose write or
    commit last changed its line."""
    if rev == WORKSPACE_REF and store.ref_target(WORKSPACE_REF) is None:
        from .errors import NotInitialised

        raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
    if _git(store, ["rev-parse", "--verify", "--quiet", f"{rev}^{{tree}}"]).returncode != 0:
        from .errors import UsageError

        raise UsageError(f"{rev} does not name a commit", hint="give a branch, tag or commit")
    agents = known_agents(store)
    out: list[Annotation] = []
    cache: dict[str, str] = {}
    for path, hits in sorted(_candidates(store, list(paths), rev).items()):
        found = [Annotation(path, n, *hit, text.strip()) for n, text in hits
                 if (hit := parse_line(text, agents))]
        if not found:
            continue
        blame = _blame(store, path, [a.line for a in found], rev)
        for a in found:
            a.commit = blame.get(a.line)
            a.written_by = _agent_of(store, a.commit, cache) if a.commit else None
        out.extend(found)
    return out


# -- the write path ------------------------------------------------------------------
def _lost(old: list[Annotation], new_data: bytes | None, agents: set[str]) -> list[Annotation]:
    """Annotations of ``old`` that the new content no longer holds word for word: the
    same agent and reason, on any line and beside any code (a write that changes the
    code on an annotated line keeps the intent; one that rewords or drops it does not).
    Counted, so dropping one of two equal annotations loses one."""
    have = Counter((a.agent, a.why) for a in annotations("", new_data, agents))
    lost = []
    for a in old:
        if have[(a.agent, a.why)] > 0:
            have[(a.agent, a.why)] -= 1
        else:
            lost.append(a)
    return lost


def _plain(store: Store) -> dict:
    """Blobs known to hold nothing that looks like an annotation (per process;
    content-addressed, so never stale)."""
    cache = store.caches.setdefault("intents-plain", {})
    if len(cache) > 4096:
        cache.clear()
    return cache


def remember(store: Store, contents: dict[pygit2.Oid, bytes]) -> None:
    """Note which blobs this process just wrote hold no annotation, so that the next
    write over them (often this agent's own) does not read them back to scan them."""
    cache = _plain(store)
    for oid, data in contents.items():
        if len(data) <= MAX_SCAN_BYTES and not _QUICK.search(data):
            cache[oid] = True


def _small_loose(objects: str, oid: pygit2.Oid) -> bool:
    """Is ``oid`` a loose object whose file is so small that its content cannot exceed
    MAX_SCAN_BYTES (deflate expands at most 1032:1)? Then it is read at once: libgit2
    opens and inflates a loose object for its header as for its content (~20 µs
    each), and an exec deleting 2,000 files flags them all under the workspace lock."""
    h = str(oid)
    try:
        size = os.stat(f"{objects}/{h[:2]}/{h[2:]}").st_size
    except OSError:
        return False  # packed, or elsewhere: its header tells
    return size * DEFLATE_MAX_RATIO <= MAX_SCAN_BYTES


def flag_write(store: Store, agent: str, old_tree: pygit2.Tree, blobs: dict[str, Any], commit: Any) -> list[str]:
    """After an accepted write (outside the workspace lock): the paths where ``agent``
    deleted or reworded another agent's annotation, logged as an
    ``intent_overwritten`` event. Costs one regex scan of each old version."""
    lost_all: list[Annotation] = []
    agents: set[str] | None = None
    odb = store.repo.odb
    objects = os.path.join(store.commondir, "objects")
    for path, blob in blobs.items():
        try:
            old = store.entry(old_tree, path)
        except BadPath:  # a path that was a directory: nothing annotated to lose
            old = None
        if old is None or old.oid == blob or _plain(store).get(old.oid):
            continue  # nothing there, unchanged, or known to hold nothing annotation-like
        try:
            if not _small_loose(objects, old.oid) and odb.read_header(old.oid)[1] > MAX_SCAN_BYTES:
                continue  # sized from the header: a large file is never loaded for this
            data = odb.read(old.oid)[1]  # small: read directly (blob_bytes would read the header again)
        except KeyError:  # a partial clone's blob not fetched yet (storm_git.core.promisor)
            data = store.blob_bytes(old.oid)
            if len(data) > MAX_SCAN_BYTES:
                continue
        if not _QUICK.search(data):
            _plain(store)[old.oid] = True
            continue
        # the ids named in the file, other than the writer, checked one ref lookup each
        named = {m.group(1) for line in data.decode("utf-8", "replace").splitlines()
                 for m in _ANNOTATION.finditer(line)} - {agent}
        if not named:
            continue
        if agents is None:
            agents = set()
        agents |= {n for n in named if _known(store, n)}
        theirs = [a for a in annotations(path, data, agents) if a.agent != agent]
        if not theirs:
            continue
        new = store.blob_bytes(blob) if isinstance(blob, pygit2.Oid) else None  # None: deleted
        lost_all.extend(_lost(theirs, new, agents))
    if not lost_all:
        return []
    paths = list(dict.fromkeys(a.path for a in lost_all))
    owners = sorted({a.agent for a in lost_all})
    events.append(store, INTENT_OVERWRITTEN, agent,
                  f"{agent} overwrote intent annotation(s) of {', '.join(owners)} in {', '.join(paths[:3])}",
                  {"paths": paths, "owners": owners, "flag": INTENT_OVERWRITTEN,
                   "commit": None if commit is None else str(commit),
                   "lines": [{"path": a.path, "line": a.line, "agent": a.agent, "text": a.text}
                             for a in lost_all[:20]]})
    return paths


# -- rejections ----------------------------------------------------------------------
def in_diff(path: str, diff: str, agents: set[str]) -> list[dict[str, Any]]:
    """Annotations on the lines of a unified diff: added (+), removed (-) or
    kept as context, with the new-side line number (old side for removals)."""
    out: list[dict[str, Any]] = []
    old_n = new_n = 0
    for raw in text_lines(diff):
        if raw.startswith("@@"):
            m = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", raw)
            if m:
                old_n, new_n = int(m.group(1)), int(m.group(2))
            continue
        if raw.startswith(("---", "+++")) or not raw:
            continue
        sign, text = raw[0], raw[1:]
        hit = parse_line(text, agents)
        if hit:
            change = {"+": "added", "-": "removed"}.get(sign, "context")
            out.append({"path": path, "line": old_n if sign == "-" else new_n, "agent": hit[0],
                        "why": hit[1], "change": change, "text": text.strip()})
        if sign in (" ", "-"):
            old_n += 1
        if sign in (" ", "+"):
            new_n += 1
    return out


def in_rejection(store: Store, rejection: Any) -> list[dict[str, Any]]:
    """The annotations in a rejection's diffs (target first, then stale files)."""
    changes = [c for c in [rejection.target, *rejection.stale] if c is not None and c.diff]
    if not changes or not any(_QUICK.search(c.diff.encode("utf-8", "replace")) for c in changes):
        return []
    agents = known_agents(store)
    out: list[dict[str, Any]] = []
    for c in changes:
        out.extend(in_diff(c.path, c.diff, agents))
    return out
