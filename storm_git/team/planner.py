"""``team plan``: one read-only manager session of a real harness writes the plan.

The session gets the manager's brief and the repository's file list and is asked
for the plan as JSON. It runs as the agent ``team_planner``, which
``storm.readOnly`` names while it runs, so storm's hooks refuse any write it
tries; the harness is started in its own read-only mode as well (Claude Code's
plan mode, Codex's read-only sandbox). Its answer is taken from the harness's
JSON output (Claude Code's ``result`` event, Codex's last agent message), the
first JSON object in it with ``subtasks`` is the plan, validated as any plan.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from ..coordination.assignments import READ_ONLY_KEY
from ..core.errors import RepoStateError
from ..core.gitcmd import run_git
from ..core.store import Store
from ..integrations.brief import brief as agent_brief
from . import launcher
from .plan import Plan, PlanError
from .state import RunDir, new_run_id

PLANNER = "team_planner"


@dataclass
class Planned:
    run: str
    path: str
    plan: Plan
    transcript: str


def planning_prompt(task: str, agents: int, mode: str, files: list[str]) -> str:
    shown = "\n".join(files[:400]) + ("\n…" if len(files) > 400 else "")
    return (agent_brief("manager", mode, "manager").rstrip() + "\n\n# Plan this task\n\n"
            f"Task: {task}\n\nSplit it into at most {agents} subtasks for {agents} engineers working at the same "
            "time. Read what you need; do not change any file (your writes are refused). Answer with only one "
            "JSON object, in a ```json block:\n\n"
            '{"task": "...", "subtasks": [{"id": "s1", "title": "...", "brief": "what to do and how to tell it '
            'is done", "files": ["path/or/glob"], "depends_on": []}]}\n\n'
            "Rules: each subtask's files are its primary files, disjoint across subtasks; a path exists or is "
            "new in an existing folder; depends_on names subtasks whose work this one builds on (no cycle).\n\n"
            f"The repository's files:\n{shown}\n")


def answer_text(harness: str, transcript: str) -> str:
    """The session's final answer from its JSON output lines."""
    text = ""
    try:
        with open(transcript, "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        if harness == "claude" and ev.get("type") == "result" and isinstance(ev.get("result"), str):
            text = ev["result"]
        elif harness == "codex" and ev.get("type") == "item.completed":
            item = ev.get("item") or {}
            if item.get("type") in ("agent_message", "assistant_message") and isinstance(item.get("text"), str):
                text = item["text"]
    return text or "\n".join(lines)


def extract(text: str) -> Any:
    """The first JSON object with ``subtasks`` in ``text`` (a fenced block first)."""
    blocks = re.findall(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    dec = json.JSONDecoder()
    for chunk in [*blocks, text]:
        i = chunk.find("{")
        while i != -1:
            try:
                obj, _ = dec.raw_decode(chunk, i)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and "subtasks" in obj:
                return obj
            i = chunk.find("{", i + 1)
    raise PlanError(["the manager session's answer holds no JSON plan with 'subtasks'"], "the manager's answer")


def plan(store: Store, task: str, agents: int, harness: str, *, timeout: float = 900,
         extra: list[str] | None = None) -> Planned:
    from .runner import check_plan, current_mode, plan_tree, tree_paths

    mode = current_mode(store)
    run = new_run_id()
    rd = RunDir(store.commondir, run)
    rd.create()
    files = tree_paths(store, plan_tree(store, mode))
    prompt = planning_prompt(task, agents, mode, files)
    top = store.main_workdir
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORM_TEAM_")}
    env.update(STORM_AGENT=PLANNER, STORM_TEAM_RUN=run)
    if mode == "storm":
        why = launcher.install_hooks(harness, top, env)
        if why:
            raise RepoStateError(f"the manager session was not started: {why}")
    run_git(["config", "--add", READ_ONLY_KEY, PLANNER], top)
    out, err = rd.file("transcripts", "manager.1.out"), rd.file("transcripts", "manager.1.err")
    try:
        started = launcher.start(launcher.argv_for(harness, prompt, extra=extra, read_only=True), cwd=top, env=env,
                                 out=out, err=err, exit_file=rd.file("transcripts", "manager.1.exit"))
        try:
            started.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.end(started.pid, started.pstart)
            raise RepoStateError(f"the manager session gave no plan in {timeout:.0f} s",
                                 hint=f"its transcript is {out}") from None
    finally:
        subprocess.run(["git", "config", "--unset", READ_ONLY_KEY, f"^{PLANNER}$"], cwd=top, capture_output=True,
                       check=False)
    text = answer_text(harness, out)
    data = extract(text)
    if isinstance(data.get("subtasks"), list) and len(data["subtasks"]) > agents:
        raise PlanError([f"the manager planned {len(data['subtasks'])} subtasks for {agents} engineers"],
                        "the manager's plan")
    data.setdefault("task", task)
    path = rd.file("plan.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    checked = check_plan(store, data, mode, path)
    rd.event("planned", harness=harness, subtasks=len(checked.subtasks), path=path, time_taken=time.time())
    return Planned(run, path, checked, out)
