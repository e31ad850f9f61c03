"""What the simulated agents do: changes, workloads, history replay, import graph.

A :class:`Change` is one unit of an agent's work (one commit of a real history,
or one edit of a scenario). It is *re-applicable*: given the current content of
the files it reads, it computes the content it writes. A history change does so
by a three-way merge of its own diff (parent -> post) onto the current content;
a scenario change runs a small program (``storm_git.sim.scenarios.PROGRAMS``)
that decides like a careful agent would. Re-applying is what an agent does after
a rejection (storm mode) or when resolving a merge conflict (worktree mode), so
both modes pay for the same work in the same way.
"""
from __future__ import annotations

import ast
import base64
import os
import random
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import UsageError

Files = dict[str, "bytes | None"]


@dataclass
class Change:
    """One task: read ``reads`` (plus the targets), write ``targets``."""

    message: str
    targets: list[str]
    reads: list[str] = field(default_factory=list)
    parent: Files = field(default_factory=dict)  # pre-images of the targets (history replay)
    post: Files = field(default_factory=dict)  # post-images of the targets (history replay)
    program: str | None = None  # scenario program; None: three-way merge of parent -> post
    args: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["parent"] = _enc(self.parent)
        d["post"] = _enc(self.post)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Change":
        d = dict(d)
        d["parent"], d["post"] = _dec(d["parent"]), _dec(d["post"])
        return cls(**d)


@dataclass
class Workload:
    """The same work for both modes: a base tree and each agent's list of changes.

    ``reference`` is what a correct integration looks like: for a replay the
    history's end state of the touched paths, for a scenario ``None`` (its test
    is the reference). ``overlaps`` counts the pairs of changes by different
    agents where one writes a file the other reads: the conflicts to catch.
    """

    name: str
    kind: str  # "replay" | "scenario"
    base: Files
    agents: list[list[Change]]
    test_cmd: str | None = None
    reference: Files | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def n_changes(self) -> int:
        return sum(len(a) for a in self.agents)

    def overlaps(self) -> int:
        """Pairs (change, change) of different agents in the same round where one
        writes what the other reads or writes: where the two modes can differ."""
        n = 0
        rounds = max((len(a) for a in self.agents), default=0)
        for r in range(rounds):
            cs = [(i, a[r]) for i, a in enumerate(self.agents) if r < len(a)]
            for x in range(len(cs)):
                for y in range(x + 1, len(cs)):
                    a, b = cs[x][1], cs[y][1]
                    ra, rb = set(a.reads) | set(a.targets), set(b.reads) | set(b.targets)
                    if set(a.targets) & rb or set(b.targets) & ra:
                        n += 1
        return n


def _enc(files: Files) -> dict[str, str | None]:
    return {p: None if c is None else base64.b64encode(c).decode() for p, c in files.items()}


def _dec(files: dict[str, str | None]) -> Files:
    return {p: None if c is None else base64.b64decode(c) for p, c in files.items()}


# -- three-way merge -------------------------------------------------------------------
@dataclass
class Merged:
    content: bytes | None
    conflicts: int  # hunks that needed the agent's judgement (resolved in favour of its own change)


def merge3(base: bytes | None, current: bytes | None, post: bytes | None) -> Merged:
    """Re-apply the change ``base -> post`` onto ``current`` (``git merge-file``).

    A conflicting hunk is work that needs the agent's judgement: it is counted,
    and resolved in favour of the agent's own change (``--theirs``), which is
    what re-applying "its hunks where they still apply" amounts to."""
    if current == base or current == post:
        return Merged(post, 0)
    if post == base:
        return Merged(current, 0)
    if post is None:  # the change deletes a file someone else changed meanwhile
        return Merged(None, 1)
    if current is None:  # the change edits a file someone else deleted
        return Merged(post, 1)
    if b"\0" in (base or b"") + current + post:
        return Merged(post, 1)
    with tempfile.TemporaryDirectory(prefix="storm-sim-merge-") as d:
        names = []
        for n, c in (("current", current), ("base", base or b""), ("post", post)):
            names.append(os.path.join(d, n))
            with open(names[-1], "wb") as fh:
                fh.write(c)
        r = subprocess.run(["git", "merge-file", "-p", *names], capture_output=True)
        if r.returncode < 0 or r.returncode > 127:
            raise RuntimeError(f"git merge-file failed: {r.stderr.decode(errors='replace')}")
        if r.returncode == 0:
            return Merged(r.stdout, 0)
        n = r.returncode
        r = subprocess.run(["git", "merge-file", "-p", "--theirs", *names], capture_output=True)
        return Merged(r.stdout, n)


# -- Python import graph -------------------------------------------------------------
def module_index(paths: list[str]) -> dict[str, str]:
    """Dotted module names (every suffix of the path) -> file, for ``.py`` files."""
    index: dict[str, str] = {}
    for p in sorted(paths, key=lambda s: s.count("/"), reverse=True):
        if not p.endswith(".py"):
            continue
        parts = p[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(len(parts)):
            index[".".join(parts[i:])] = p  # shallower files win (sorted deepest first)
    return index


def imports_of(path: str, content: bytes | None, index: dict[str, str]) -> list[str]:
    """Files of the tree that ``path`` imports (absolute and relative imports)."""
    if not path.endswith(".py") or not content:
        return []
    try:
        tree = ast.parse(content)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    pkg = path.rsplit("/", 1)[0].replace("/", ".") if "/" in path else ""
    found: list[str] = []

    def add(name: str) -> None:
        for cand in (name, name.split(".", 1)[-1] if "." in name else None):
            if cand and cand in index and index[cand] != path:
                found.append(index[cand])
                return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = pkg.split(".") if pkg else []
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                mod = ".".join(up + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            before = len(found)
            for a in node.names:
                if mod:
                    add(f"{mod}.{a.name}")
            if len(found) == before and mod:
                add(mod)
    return list(dict.fromkeys(found))


# -- history replay ------------------------------------------------------------------
def _git(repo: str, *args: str) -> bytes:
    r = subprocess.run(["git", *args], cwd=repo, capture_output=True)
    if r.returncode != 0:
        msg = r.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"git {' '.join(args[:3])} failed in {repo}: {msg[-1] if msg else r.returncode}",
                         hint="check --repo (a git repository) and --range (A..B, two revisions of it)")
    return r.stdout


def tree_files(repo: str, rev: str) -> Files:
    """Every file of ``rev`` (symbolic links and submodules left out)."""
    out: Files = {}
    listing = _git(repo, "ls-tree", "-r", "-z", rev).split(b"\0")
    for entry in listing:
        if not entry:
            continue
        meta, path = entry.split(b"\t", 1)
        mode, kind, oid = meta.split()
        if kind == b"blob" and mode in (b"100644", b"100755"):
            out[path.decode("utf-8", "surrogateescape")] = _git(repo, "cat-file", "blob", oid.decode())
    return out


def _show(repo: str, rev: str, path: str) -> bytes | None:
    r = subprocess.run(["git", "cat-file", "blob", f"{rev}:{path}"], cwd=repo, capture_output=True)
    return r.stdout if r.returncode == 0 else None


def last_commits(repo: str, n: int) -> str:
    """The range of HEAD's last ``n`` first-parent commits (fewer in a shorter history):
    what ``--repo`` replays without ``--range``."""
    if not os.path.isdir(repo):
        raise UsageError(f"--repo {repo}: no such directory")
    count = int(_git(repo, "rev-list", "--first-parent", "--count", "HEAD").decode().strip() or 0)
    take = min(n, count - 1)
    if take < 1:
        raise UsageError(f"--repo {repo}: HEAD has no parent, so there is no commit to replay",
                         hint="a replay starts from a commit and replays the ones after it")
    return f"HEAD~{take}..HEAD"


def replay(repo: str, rng: str, agents: int, *, test_cmd: str | None = None,
           max_changes: int | None = None, seed: int | None = 0) -> Workload:
    """Deal the first-parent commits of ``A..B`` round-robin to ``agents`` agents
    that all start from A; each reads its targets and what they import.

    ``seed``: the agents of a round all read first, then write one after another in
    an order shuffled with this seed (the same seed, the same run: two validation
    scopes or two versions of storm are compared on the same interleaving). None:
    they all write at once and the machine's timing decides who wins."""
    if ".." not in rng:
        raise UsageError(f"--range {rng!r} is not A..B; give two revisions, e.g. HEAD~10..HEAD")
    a, b = rng.split("..", 1)
    a = _git(repo, "rev-parse", "--verify", (a or "HEAD") + "^{commit}").decode().strip()
    b = _git(repo, "rev-parse", "--verify", (b or "HEAD") + "^{commit}").decode().strip()
    commits = _git(repo, "rev-list", "--reverse", "--first-parent", f"{a}..{b}").decode().split()
    in_range = len(commits)
    if max_changes:
        commits = commits[:max_changes]
    if not commits:
        raise UsageError(f"--range {rng} holds no commits", hint="B must be a descendant of A, e.g. HEAD~10..HEAD")
    base = tree_files(repo, a)
    dealt: list[list[Change]] = [[] for _ in range(agents)]
    touched: set[str] = set()
    for i, c in enumerate(commits):
        change = _commit_change(repo, c)
        if change is None:
            continue
        touched.update(change.targets)
        dealt[i % agents].append(change)
    if seed is not None:
        for r in range(max((len(a) for a in dealt), default=0)):
            order = list(range(agents))
            random.Random(f"{seed}:{r}").shuffle(order)
            for k, lst in enumerate(dealt):
                if r < len(lst):
                    lst[r].args["_order"] = order[k]
    end = commits[-1]
    reference = {p: _show(repo, end, p) for p in sorted(touched)}
    index = module_index(list(base) + list(touched))
    for lst in dealt:
        for ch in lst:
            extra = [m for p in ch.targets for m in imports_of(p, ch.parent.get(p), index)]
            ch.reads = [m for m in dict.fromkeys(extra) if m not in ch.targets]
    # the name says what was replayed: the range given, or its first commits when capped
    what = rng if len(commits) == in_range else f"{rng}, first {len(commits)} of {in_range} commits"
    return Workload(f"replay {os.path.basename(os.path.abspath(repo))} {what}", "replay", base, dealt,
                    test_cmd=test_cmd, reference=reference,
                    params={"repo": os.path.abspath(repo), "range": rng, "agents": agents,
                            "commits": len(commits), "commits_in_range": in_range, "from": a, "to": end,
                            "order": "race" if seed is None else f"seed {seed}"})


def _commit_change(repo: str, commit: str) -> Change | None:
    parent = _git(repo, "rev-parse", f"{commit}^").decode().strip()
    raw = _git(repo, "diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", parent, commit).split(b"\0")
    paths = []
    for i in range(0, len(raw) - 1, 2):
        meta, path = raw[i], raw[i + 1]
        modes = meta.split()
        if not modes:
            continue
        if all(m in (b":100644", b"100644", b":100755", b"100755", b":000000", b"000000") for m in modes[:2]):
            paths.append(path.decode("utf-8", "surrogateescape"))
    if not paths:
        return None
    subject = _git(repo, "log", "-1", "--format=%s", commit).decode(errors="replace").strip()
    return Change(f"{commit[:10]} {subject}"[:120], paths,
                  parent={p: _show(repo, parent, p) for p in paths},
                  post={p: _show(repo, commit, p) for p in paths})
