"""Shared by tests/team: a small repository, a plan for it, the scripted engineer's command."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import SUPPORT, storm

REPO_FILES = {
    "src/api.py": "TIMEOUT = 1\n",
    "src/util.py": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "src/client.py": "def load(url):\n    return url\n",
    "README.md": "# service\n",
    "check.py": ("import sys\nsys.path.insert(0, 'src')\nimport client\n"
                 "got = client.load('x')\n"
                 "if '?' in got:\n    print('FAIL src/client.py: load(x) returned %r' % got)\n    sys.exit(1)\n"
                 "print('ok')\n"),
}

PLAN = {"task": "make the service sturdier", "subtasks": [
    {"id": "s1", "title": "longer timeout", "brief": "Raise TIMEOUT to 10 and note it in the README.",
     "files": ["src/api.py"], "depends_on": []},
    {"id": "s2", "title": "clamp notes", "brief": "Document clamp in the README; tidy util.",
     "files": ["src/util.py"], "depends_on": []},
    {"id": "s3", "title": "client marks", "brief": "load() returns the url with a '!' (check.py says so).",
     "files": ["src/client.py"], "depends_on": ["s1"]},
]}




def plan_file(tmp_path: Path, plan: dict | None = None, name: str = "plan.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(PLAN if plan is None else plan))
    return p


def agent_cmd(scenario: Path, log: Path) -> str:
    return f"TEAM_SCENARIO={scenario} TEAM_LOG={log} {sys.executable} {SUPPORT / 'team_agent.py'}"


def team(repo: Path, *args: str, **kw):
    """``git storm team ARGS`` as a new process."""
    kw.setdefault("timeout", 180)
    return storm(repo, "team", *args, fresh=True, **kw)
