"""The plan of a team run and its validation.

A plan is JSON: ``{"task": ..., "subtasks": [{"id", "title", "brief", "files",
"depends_on", "harness"?}]}``. ``files`` are the subtask's primary files (paths or
globs, ``.gitignore`` rules as in ``git storm assign``). Validation reports every
problem, one line each, before anything is started: primary files must be disjoint
across subtasks (STORM's assignment), ``depends_on`` must name other subtasks and
form no cycle, a path must exist or be new under an existing folder, a glob must
match something, and no key may be unknown (a typo must not be silently ignored).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..coordination import assignments
from ..core.errors import UsageError

PLAN_KEYS = {"task", "subtasks"}
SUBTASK_KEYS = {"id", "title", "brief", "files", "depends_on", "harness"}
HARNESSES = ("claude", "codex", "cmd")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
MAX_SUBTASKS = 64


class PlanError(UsageError):
    """A plan that cannot be used: every problem found, one line each (exit 2)."""

    kind = "bad_plan"

    def __init__(self, problems: list[str], where: str = "the plan") -> None:
        self.problems = problems
        super().__init__(f"{where} has {len(problems)} problem(s): " + "; ".join(problems),
                         hint="fix the plan file and run again; nothing was started")


@dataclass
class Subtask:
    id: str
    title: str
    brief: str
    files: list[str]
    depends_on: list[str] = field(default_factory=list)
    harness: str | None = None  # a mixed team: this subtask's harness instead of --harness


@dataclass
class Plan:
    task: str
    subtasks: list[Subtask]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task, "subtasks": []}
        for s in self.subtasks:
            d = asdict(s)
            if d["harness"] is None:
                del d["harness"]
            out["subtasks"].append(d)
        return out

    def by_id(self) -> dict[str, Subtask]:
        return {s.id: s for s in self.subtasks}

    def order(self) -> list[Subtask]:
        """Subtasks in dependency order (a dependency before its dependents; ties in plan order)."""
        done: list[str] = []
        left = list(self.subtasks)
        while left:
            ready = [s for s in left if all(d in done for d in s.depends_on)]
            if not ready:  # a validated plan has no cycle
                raise PlanError(["depends_on has a cycle"])
            for s in ready:
                done.append(s.id)
                left.remove(s)
        by = self.by_id()
        return [by[i] for i in done]


def parse_text(text: str, where: str = "the plan") -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise PlanError([f"not JSON: {exc}"], where) from None
    except RecursionError:
        raise PlanError(["not a plan: JSON nested too deeply"], where) from None


def load_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the plan {path}: {exc}", hint="give a readable JSON plan file") from None
    return parse_text(text, path)


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _shape(data: Any) -> tuple[list[str], Plan | None]:
    """The plan's structure: its keys and their types."""
    problems: list[str] = []
    if not isinstance(data, dict):
        return ["the plan must be a JSON object with 'task' and 'subtasks'"], None
    for k in sorted(set(data) - PLAN_KEYS):
        problems.append(f"unknown key {k!r} at the top (known: task, subtasks)")
    task = data.get("task")
    if not isinstance(task, str) or not task.strip():
        problems.append("'task' must be a non-empty string")
    subs = data.get("subtasks")
    if not isinstance(subs, list) or not subs:
        problems.append("'subtasks' must be a non-empty list")
        return problems, None
    if len(subs) > MAX_SUBTASKS:
        problems.append(f"{len(subs)} subtasks: at most {MAX_SUBTASKS}")
    out: list[Subtask] = []
    for i, s in enumerate(subs, 1):
        name = f"subtask {i}"
        if not isinstance(s, dict):
            problems.append(f"{name} must be an object")
            continue
        sid = s.get("id")
        if isinstance(sid, str) and ID_RE.match(sid):
            name = f"subtask {sid}"
        else:
            problems.append(f"{name}: 'id' must be 1-40 letters, digits, _ . - (got {sid!r})")
        for k in sorted(set(s) - SUBTASK_KEYS):
            problems.append(f"{name}: unknown key {k!r} (known: {', '.join(sorted(SUBTASK_KEYS))})")
        for k in ("title", "brief"):
            if not isinstance(s.get(k), str) or not s[k].strip():
                problems.append(f"{name}: {k!r} must be a non-empty string")
        files = s.get("files")
        if not _strs(files) or not files:
            problems.append(f"{name}: 'files' must be a non-empty list of paths or globs")
            files = []
        deps = s.get("depends_on", [])
        if not _strs(deps):
            problems.append(f"{name}: 'depends_on' must be a list of subtask ids")
            deps = []
        harness = s.get("harness")
        if harness is not None and harness not in HARNESSES:
            problems.append(f"{name}: 'harness' must be one of {', '.join(HARNESSES)} (got {harness!r})")
        out.append(Subtask(str(sid), str(s.get("title", "")), str(s.get("brief", "")), list(files),
                           list(dict.fromkeys(deps)), harness if isinstance(harness, str) else None))
    return problems, Plan(str(task or ""), out)


def _cycle(plan: Plan) -> list[str] | None:
    """One dependency cycle (ids, first repeated at the end), or None."""
    graph: dict[str, list[str]] = {}
    for s in plan.subtasks:  # a duplicated id: its dependencies together (the duplicate is reported apart)
        graph.setdefault(s.id, []).extend(d for d in s.depends_on if d != s.id)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in graph.get(n, []):
            if d not in graph:
                continue
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[n] = 2
        path.pop()
        return None

    for n in graph:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def expand(pattern: str, tracked: list[str]) -> list[str]:
    return [p for p in tracked if assignments.matches(pattern, p)]


def validate(data: Any, top: str, tracked: list[str], where: str = "the plan") -> Plan:
    """The plan, or PlanError naming every problem. ``tracked``: the files of the tree
    globs are expanded against (the shared head, or the branch's tree)."""
    problems, plan = _shape(data)
    if plan is None:
        raise PlanError(problems, where)
    ids = [s.id for s in plan.subtasks]
    for sid in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"subtask id {sid!r} is used {ids.count(sid)} times")
    known = set(ids)
    for s in plan.subtasks:
        for d in s.depends_on:
            if d == s.id:
                problems.append(f"subtask {s.id} depends on itself")
            elif d not in known:
                problems.append(f"subtask {s.id} depends on {d!r}, which is not a subtask")
    cyc = _cycle(plan)
    if cyc:
        problems.append("depends_on has a cycle: " + " -> ".join(cyc))
    tracked_set = set(tracked)
    dirs = {os.path.dirname(p) for p in tracked} | {""}
    for p in list(dirs):
        while p:
            p = os.path.dirname(p)
            dirs.add(p)
    owner: dict[str, str] = {}
    for s in plan.subtasks:
        for raw in s.files:
            try:
                pat = assignments.check_pattern(raw)
            except UsageError as exc:
                problems.append(f"subtask {s.id}: {exc.message}")
                continue
            literal = not any(c in pat for c in "*?[")
            if literal:
                path = pat.strip("/").removeprefix("./")
                if path in tracked_set:
                    files = [path]
                elif path in dirs:
                    files = expand(path, tracked)
                else:
                    parent = os.path.dirname(path)
                    if parent not in dirs and not os.path.isdir(os.path.join(top, parent)):
                        problems.append(f"subtask {s.id}: {path} does not exist and its folder "
                                        f"{parent or '.'}/ does not either")
                        continue
                    files = [path]  # a new file under an existing folder
            else:
                files = expand(pat, tracked)
                if not files:
                    problems.append(f"subtask {s.id}: the glob {pat} matches no file")
                    continue
            for f in files:
                other = owner.setdefault(f, s.id)
                if other != s.id:
                    problems.append(f"subtasks {other} and {s.id} both have {f} among their primary files "
                                    "(primary files must be disjoint)")
    if problems:
        raise PlanError(list(dict.fromkeys(problems)), where)
    return plan
