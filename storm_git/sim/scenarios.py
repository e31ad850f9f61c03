"""The generated scenario suite: the conflicts multi-agent teams run into.

Each scenario is a tiny Python project (files under ``src/``), a task per agent
written as a *program* that reads the current files and decides what to write
(as a careful agent would: it looks up the function's current name, the field's
current spelling, whether an import would close a cycle), and ``sim_check.py``,
a test that fails on the semantic breakage the scenario is about. Running each
agent's program on the base alone and combining the results (what isolation
plus a clean merge gives) breaks the test; running them one after another, each
on the current files, passes it (``tests/sim/test_simulate.py`` checks both).

Agents beyond those a scenario needs do disjoint work (their own module), so
the same scenario runs with 2, 4 or 8 agents. ``coupling`` is its own generated
scenario: a fraction F of the agents also register themselves in one shared
registry file.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable

from ..core.errors import UsageError
from .workload import Change, Workload, imports_of, merge3, module_index

View = dict[str, "str | None"]
Program = Callable[..., dict[str, "str | None"]]
PROGRAMS: dict[str, Program] = {}
CHECK = "sim_check.py"
TEST_CMD = f"python {CHECK}"
_PRELUDE = "import sys\nsys.path.insert(0, 'src')\n"


def program(f: Program) -> Program:
    PROGRAMS[f.__name__] = f
    return f


def run_program(change: Change, view: dict[str, bytes | None]) -> dict[str, bytes | None]:
    """What ``change`` writes given the current content of what it read."""
    text = {p: None if c is None else c.decode("utf-8") for p, c in view.items()}
    args = {k: v for k, v in change.args.items() if not k.startswith("_")}  # "_order": the runner's
    out = PROGRAMS[change.program](text, **args)  # type: ignore[index]
    return {p: None if c is None else c.encode("utf-8") for p, c in out.items()}


# -- programs (one agent's task each) ----------------------------------------------------
@program
def own_module(view: View, i: int) -> View:
    return {f"src/mod_{i}.py": f"def work_{i}():\n    return {i}\n"}


@program
def add_param(view: View, name: str) -> View:
    """Add keyword ``name`` to ``fetch``'s signature and result, on whatever it is now."""
    text = view["src/api.py"] or ""
    text = re.sub(r"def fetch\((.*?)\):", lambda m: f"def fetch({m.group(1)}, {name}=None):", text, count=1)
    text = re.sub(r"    return \{(.*?)\}\n", lambda m: f"    return {{{m.group(1)}, \"{name}\": {name}}}\n",
                  text, count=1)
    return {"src/api.py": text}


def _fetch_name(text: str) -> str:
    return re.search(r"def (fetch\w*)\(", text).group(1)  # type: ignore[union-attr]


@program
def rename_fetch(view: View) -> View:
    """Rename fetch -> fetch_url in its module and every caller this agent read."""
    return {p: re.sub(r"\bfetch\b", "fetch_url", view[p] or "") for p in ("src/api.py", "src/client.py")}


@program
def add_batch(view: View) -> View:
    """New code calling the fetch function by the name it has now."""
    name = _fetch_name(view["src/api.py"] or "")
    return {"src/batch.py": f"from api import {name}\n\n\ndef load_all(urls):\n"
                            f"    return [{name}(u) for u in urls]\n"}


@program
def rename_field(view: View) -> View:
    """The data structure's ``email`` becomes ``email_address`` (and its reader follows)."""
    return {p: re.sub(r"\bemail\b", "email_address", view[p] or "") for p in ("src/models.py", "src/views.py")}


@program
def add_report(view: View) -> View:
    """New code reading the user's e-mail field, by the name the dataclass has now."""
    field_name = "email_address" if "email_address" in (view["src/models.py"] or "") else "email"
    return {"src/report.py": f"from models import User\n\n\ndef summary(user: User) -> str:\n"
                             f"    return user.name + ' <' + user.{field_name} + '>'\n"}


@program
def add_entry(view: View, key: str) -> View:
    """Register one handler: a new line just before the dict's closing brace."""
    text = view["src/registry.py"] or ""
    text = text.replace("\n}\n", f"\n    {key!r}: 'handle_{key}',\n}}\n", 1)
    return {"src/registry.py": text}


@program
def move_fmt(view: View) -> View:
    """Move ``fmt`` to a new module ``text`` that uses ``core.register``."""
    return {"src/text.py": "from core import register\n\n\ndef fmt(x):\n    return '<' + register(x) + '>'\n",
            "src/helpers.py": "from text import fmt  # moved to text.py\n\n__all__ = ['fmt']\n"}


def _reaches(view: View, start: str, goal: str) -> bool:
    """Does importing ``start`` import ``goal`` (through the files this agent read)?"""
    index = module_index([p for p, c in view.items() if c is not None])
    seen, todo = set(), [start]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        deps = imports_of(p, (view.get(p) or "").encode(), index)
        if goal in deps:
            return True
        todo.extend(d for d in deps if d in view)
    return False


@program
def use_fmt_in_core(view: View) -> View:
    """``core.label`` uses ``helpers.fmt``; imported lazily if a top-level import would be circular."""
    text = view["src/core.py"] or ""
    if _reaches(view, "src/helpers.py", "src/core.py"):
        text += "\n\ndef label(x):\n    from helpers import fmt  # lazy: helpers imports core\n    return fmt(x)\n"
    else:
        text = "from helpers import fmt\n\n\n" + text + "\n\ndef label(x):\n    return fmt(x)\n"
    return {"src/core.py": text}


@program
def query_params(view: View) -> View:
    """``db.query(sql)`` becomes ``query(sql, params)``; repo and service follow."""
    return {
        "src/db.py": "def query(sql, params):\n    return [sql, tuple(params)]\n",
        "src/repo.py": "from db import query\n\n\ndef find(name, limit=10):\n"
                       "    return query('select ? limit ?', (name, limit))\n",
        "src/service.py": "from repo import find\n\n\ndef handle(name):\n    return find(name, limit=5)\n",
    }


@program
def add_admin(view: View) -> View:
    """New code calling db.query and repo.find with the signatures they have now."""
    db = ast.parse(view["src/db.py"] or "")
    q = next(n for n in db.body if isinstance(n, ast.FunctionDef) and n.name == "query")
    call = "query('select 1', ())" if len(q.args.args) > 1 else "query('select 1')"
    return {"src/admin.py": f"from db import query\nfrom repo import find\n\n\ndef run():\n"
                            f"    return {call}, find('root')\n"}


@program
def join_registry(view: View, i: int) -> View:
    """Coupled agent: its own module, and an entry for it in the shared registry."""
    out = own_module(view, i)
    text = view["src/registry.py"] or ""
    out["src/registry.py"] = text.replace("\n}\n", f"\n    'mod_{i}': 'work_{i}',\n}}\n", 1)
    return out


# -- the scenarios ------------------------------------------------------------------------
API = "def fetch(url):\n    return {\"url\": url}\n"
CLIENT = "from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n"


def _check(body: str) -> str:
    return _PRELUDE + body + "print('ok')\n"


def _disjoint_check(agents: range) -> str:
    return "".join(f"import mod_{i}\nassert mod_{i}.work_{i}() == {i}\n" for i in agents)


SCENARIOS: dict[str, dict] = {
    "signature": {
        "why": "two agents add different parameters to the same function's signature",
        "files": {"src/api.py": API, "src/client.py": CLIENT},
        "changes": [
            Change("add timeout to fetch", ["src/api.py"], program="add_param", args={"name": "timeout"}),
            Change("add retries to fetch", ["src/api.py"], program="add_param", args={"name": "retries"}),
        ],
        "check": "from api import fetch\n"
                 "assert fetch('u', timeout=1, retries=2) == {'url': 'u', 'timeout': 1, 'retries': 2}\n"
                 "import client\nassert client.load('v')['url'] == 'v'\n",
    },
    "rename": {
        "why": "one renames a function that the other's new code calls (renamer finishes first)",
        "files": {"src/api.py": API, "src/client.py": CLIENT},
        "changes": [
            Change("rename fetch to fetch_url", ["src/api.py", "src/client.py"], program="rename_fetch",
                   args={}),
            Change("add batch loading", ["src/batch.py"], reads=["src/api.py"], program="add_batch"),
        ],
        "order": [0, 1],
        "check": "import batch, client\nassert batch.load_all(['a']) == [{'url': 'a'}]\n"
                 "assert client.load('b') == {'url': 'b'}\n",
    },
    "rename-late": {
        "why": "the same rename, but the renamer finishes last (it never read the new caller)",
        "like": "rename",
        "order": [1, 0],
    },
    "fields": {
        "why": "one changes a shared data structure's field that the other's new code reads",
        "files": {"src/models.py": "from dataclasses import dataclass\n\n\n@dataclass\nclass User:\n"
                                   "    name: str\n    email: str\n",
                  "src/views.py": "from models import User\n\n\ndef show(u: User) -> str:\n"
                                  "    return u.email\n"},
        "changes": [
            Change("email -> email_address", ["src/models.py", "src/views.py"], program="rename_field"),
            Change("add user summary report", ["src/report.py"], reads=["src/models.py"], program="add_report"),
        ],
        "order": [0, 1],
        "check": "from models import User\nimport report, views\nu = User('ann', 'a@x')\n"
                 "assert report.summary(u) == 'ann <a@x>'\nassert views.show(u) == 'a@x'\n",
    },
    "registry": {
        "why": "both add an entry to one registry in one file",
        "files": {"src/registry.py": "HANDLERS = {\n    'json': 'handle_json',\n}\n"},
        "changes": [
            Change("register csv", ["src/registry.py"], program="add_entry", args={"key": "csv"}),
            Change("register xml", ["src/registry.py"], program="add_entry", args={"key": "xml"}),
        ],
        "check": "from registry import HANDLERS\nassert set(HANDLERS) == {'json', 'csv', 'xml'}, HANDLERS\n",
    },
    "cycle": {
        "why": "one moves a helper into a new module that imports core; the other makes core import the helper",
        "files": {"src/core.py": "def register(name):\n    return name.upper()\n",
                  "src/helpers.py": "def fmt(x):\n    return '<' + x + '>'\n"},
        "changes": [
            Change("move fmt to text.py", ["src/text.py", "src/helpers.py"], reads=["src/core.py"],
                   program="move_fmt"),
            Change("core.label uses fmt", ["src/core.py"], reads=["src/helpers.py"], program="use_fmt_in_core"),
        ],
        "order": [0, 1],
        "check": "import core, helpers\nassert core.label('a') == helpers.fmt('a')\n",
    },
    "ripple": {
        "why": "an interface change ripples through three modules while another agent adds a caller",
        "files": {"src/db.py": "def query(sql):\n    return [sql]\n",
                  "src/repo.py": "from db import query\n\n\ndef find(name):\n    return query('select ' + name)\n",
                  "src/service.py": "from repo import find\n\n\ndef handle(name):\n    return find(name)\n"},
        "changes": [
            Change("query takes params", ["src/db.py", "src/repo.py", "src/service.py"], program="query_params"),
            Change("add admin command", ["src/admin.py"], reads=["src/db.py", "src/repo.py"],
                   program="add_admin"),
        ],
        "order": [0, 1],
        "check": "import admin, service\nadmin.run()\nservice.handle('x')\n",
    },
    "disjoint": {
        "why": "control: every agent works on its own module",
        "files": {"src/__init__.py": ""},
        "changes": [],
        "check": "",
    },
}
NAMED = list(SCENARIOS)


def scenario(name: str, agents: int = 2) -> Workload:
    """Scenario ``name`` with ``agents`` agents (the extra ones do disjoint work)."""
    if name not in SCENARIOS:
        raise UsageError(f"unknown scenario {name!r}; known: {', '.join(NAMED)}, coupling")
    spec = dict(SCENARIOS[name])
    if "like" in spec:
        spec = {**SCENARIOS[spec["like"]], **spec}
    core = [Change(c.message, list(c.targets), list(c.reads), program=c.program, args=dict(c.args))
            for c in spec["changes"]]
    if agents < len(core):
        raise UsageError(f"scenario {name} needs at least {len(core)} agents")
    extra = range(len(core), agents)
    changes = core + [Change(f"module mod_{i}", [f"src/mod_{i}.py"], program="own_module", args={"i": i})
                      for i in extra]
    files = dict(spec["files"])
    files[CHECK] = _check(spec["check"] + _disjoint_check(extra))
    return _workload(name, files, changes, spec.get("order", []), {"why": spec["why"], "agents": agents})


def coupling(agents: int, fraction: float) -> Workload:
    """``round(fraction * agents)`` agents also register in one shared registry file."""
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(f"--coupling {fraction} is not between 0 and 1")
    shared = round(fraction * agents)
    changes = [Change(f"module mod_{i}" + (" + registry entry" if i < shared else ""),
                      [f"src/mod_{i}.py"] + (["src/registry.py"] if i < shared else []),
                      program="join_registry" if i < shared else "own_module", args={"i": i})
               for i in range(agents)]
    files = {"src/registry.py": "REGISTRY = {\n    'base': 'work_base',\n}\n"}
    check = (_disjoint_check(range(agents)) + "from registry import REGISTRY\n"
             f"assert set(REGISTRY) == {{'base'}} | {{f'mod_{{i}}' for i in range({shared})}}, REGISTRY\n")
    files[CHECK] = _check(check)
    return _workload(f"coupling {fraction:g}", files, changes, [],
                     {"why": f"{shared} of {agents} agents also add to one shared registry",
                      "agents": agents, "coupling": fraction})


def _workload(name: str, files: dict[str, str], changes: list[Change], order: list[int],
              params: dict) -> Workload:
    for i, c in enumerate(changes):
        c.args.setdefault("_order", order[i] if i < len(order) else 0)
    base: dict[str, bytes | None] = {p: c.encode() for p, c in files.items()}
    return Workload(name, "scenario", base, [[c] for c in changes], test_cmd=TEST_CMD, params=params)


def combine(base: dict[str, bytes | None], results: list[dict[str, bytes | None]]) -> dict[str, bytes | None]:
    """Each agent's result on the base, merged file by file (isolation, then a merge that
    favours the later agent where both changed the same lines)."""
    out = dict(base)
    for res in results:
        for p, c in res.items():
            out[p] = merge3(base.get(p), out.get(p), c).content
    return out


def isolated_result(w: Workload) -> dict[str, bytes | None]:
    """Every change run on the base only, combined: what isolation without re-planning gives."""
    results = [run_program(c, {p: w.base.get(p) for p in c.reads + c.targets}) for a in w.agents for c in a]
    return combine(w.base, results)


def sequential_result(w: Workload) -> dict[str, bytes | None]:
    """Every change run in order on the current files: what re-planning on fresh reads gives."""
    cur = dict(w.base)
    changes = sorted((c for a in w.agents for c in a), key=lambda c: c.args.get("_order", 0))
    for c in changes:
        view = {p: cur.get(p) for p in set(c.reads + c.targets) | set(cur)}
        cur.update(run_program(c, view))
    return cur
