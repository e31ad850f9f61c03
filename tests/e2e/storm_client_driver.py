"""Drive the STORM paper's own file-editor client on git storm's drop-in manager.

Run by tests/e2e/test_storm_client.py with the Python 3.12 virtualenv that holds the
paper's OpenHands SDK fork (tests/e2e/install_storm_client.sh):

    python storm_client_driver.py CLIENT_COPY SCENARIO REPO [SCENARIO REPO ...]

CLIENT_COPY holds ``multiagent_sync/`` as published (``mgr_tools.py`` verbatim) plus a
``manager.py`` of one import selecting git storm's drop-in: the harness's only change.
Each executor is built as the harness builds it (``install_manager_bridge`` on an event
loop running in its own thread, one ``ManagerBackedFileEditorExecutor`` per agent id)
and called with real ``FileEditorAction`` objects. The shell is a plain ``sh -c`` in
the workspace, as the paper's terminal runs it (not through the manager). After every
action the driver records the observation with what the disk and
``refs/storm/workspace`` hold for the files the scenario names; one JSON object per
scenario on stdout.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
sys.path.insert(0, sys.argv[1])

from multiagent_sync import StateManager, install_manager_bridge  # noqa: E402
from multiagent_sync.mgr_tools import ManagerBackedFileEditorExecutor  # noqa: E402
from openhands.tools.file_editor.definition import FileEditorAction  # noqa: E402


class World:
    """One scenario's workspace: the manager, its loop thread, the executors, the log."""

    def __init__(self, repo: Path, watch: list[str]) -> None:
        self.repo = repo
        self.watch = watch
        self.manager = StateManager(str(repo))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        install_manager_bridge(self.manager, self.loop)
        self.editors: dict[str, ManagerBackedFileEditorExecutor] = {}
        self.steps: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def editor(self, agent: str) -> ManagerBackedFileEditorExecutor:
        if agent not in self.editors:
            self.editors[agent] = ManagerBackedFileEditorExecutor(self.manager, agent, self.loop)
        return self.editors[agent]

    def state(self) -> dict[str, dict[str, str | None]]:
        out: dict[str, dict[str, str | None]] = {}
        for p in self.watch:
            disk = self.repo / p
            r = subprocess.run(["git", "show", f"refs/storm/workspace:{p}"], cwd=self.repo, capture_output=True)
            out[p] = {"disk": disk.read_text() if disk.is_file() else None,
                      "shared": r.stdout.decode() if r.returncode == 0 else None}
        return out

    def act(self, agent: str, **kw: Any) -> dict[str, Any]:
        obs = self.editor(agent)(FileEditorAction(**kw))
        step = {"agent": agent, "action": kw, "is_error": bool(obs.is_error), "text": obs.text,
                "state": self.state()}
        with self.lock:
            self.steps.append(step)
        return step

    def shell(self, command: str) -> dict[str, Any]:
        r = subprocess.run(["sh", "-c", command], cwd=self.repo, capture_output=True, text=True, timeout=120)
        step = {"agent": "shell", "action": {"command": command}, "is_error": r.returncode != 0,
                "text": r.stdout + r.stderr, "state": self.state()}
        self.steps.append(step)
        return step

    def done(self, **extra: Any) -> dict[str, Any]:
        self.loop.call_soon_threadsafe(self.loop.stop)
        return {"steps": self.steps, "final": self.state(), **extra}


def threads(repo: Path) -> dict[str, Any]:
    """Three agents on threads: each views calc.py and adds its own function by
    str_replace, retrying on the fresh content a rejection gives; each creates a file."""
    w = World(repo, ["calc.py", "a1.py", "a2.py", "a3.py"])
    barrier = threading.Barrier(3)

    def agent(i: int) -> None:
        name = f"engineer_{i}"
        w.act(name, command="view", path=str(repo / "calc.py"))
        barrier.wait()
        for _ in range(10):
            step = w.act(name, command="str_replace", path=str(repo / "calc.py"),
                         old_str="# end\n", new_str=f"def f{i}():\n    return {i}\n# end\n")
            if not step["is_error"]:
                break
            w.act(name, command="view", path=str(repo / "calc.py"))
        w.act(name, command="create", path=str(repo / f"a{i}.py"), file_text=f"A = {i}\n")

    ts = [threading.Thread(target=agent, args=(i,)) for i in (1, 2, 3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    return w.done()


def sed(repo: Path) -> dict[str, Any]:
    """An agent views calc.py; a shell `sed -i` changes it; the agent edits from its view."""
    w = World(repo, ["calc.py"])
    w.act("engineer_1", command="view", path="calc.py")
    w.shell("sed -i 's/return a + b/return b + a/' calc.py")
    w.act("engineer_1", command="str_replace", path="calc.py", old_str="def add(a, b):",
          new_str="def add(a: int, b: int):")
    w.act("engineer_2", command="view", path="calc.py")
    return w.done()


def shell_files(repo: Path) -> dict[str, Any]:
    """The shell creates made.py and removes old.py; agents view and create them."""
    w = World(repo, ["made.py", "old.py"])
    w.act("engineer_1", command="view", path="old.py")
    w.shell("printf 'M = 1\\n' > made.py && rm old.py")
    w.act("engineer_1", command="view", path="made.py")
    w.act("engineer_2", command="create", path="made.py", file_text="M = 2\n")
    w.act("engineer_1", command="view", path="old.py")
    w.act("engineer_1", command="str_replace", path="old.py", old_str="OLD = 1", new_str="OLD = 2")
    return w.done()


def commit(repo: Path) -> dict[str, Any]:
    """The harness's collect_and_commit after an agent's edit and a shell edit:
    a plain `git add -A && git commit --author=X` in the workspace."""
    w = World(repo, ["calc.py", "notes.txt"])
    w.act("engineer_1", command="view", path="calc.py")
    w.act("engineer_1", command="str_replace", path="calc.py", old_str="# end", new_str="# end of calc")
    w.shell("printf 'by the shell\\n' > notes.txt && sed -i 's/return a - b/return -(b - a)/' calc.py")
    w.shell("git add -A && git commit -q --author='engineer_1 <engineer_1@storm.invalid>' -m 'engineer_1: work'")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    return w.done(status=status)


def old_version(repo: Path) -> dict[str, Any]:
    """An agent's view falls more versions behind than the manager keeps (the driver
    lowers storm's KEEP to STORM_KEEP to reach it in a few writes); its edit from that
    view is then a stale read, and the agent's next view and edit succeed."""
    from storm_git.paper import versions

    versions.KEEP = int(os.environ.get("STORM_KEEP", "3"))
    w = World(repo, ["calc.py"])
    w.act("engineer_1", command="view", path="calc.py")
    for i in range(versions.KEEP + 2):
        w.act("engineer_2", command="view", path="calc.py")
        w.act("engineer_2", command="str_replace", path="calc.py", old_str="# end",
              new_str=f"# step {i}\n# end")
    w.act("engineer_1", command="str_replace", path="calc.py", old_str="def add(a, b):", new_str="def add(a, b, /):")
    w.act("engineer_1", command="view", path="calc.py")
    w.act("engineer_1", command="str_replace", path="calc.py", old_str="def add(a, b):", new_str="def add(a, b, /):")
    return w.done()


SCENARIOS = {"threads": threads, "sed": sed, "shell_files": shell_files, "commit": commit,
             "old_version": old_version}


def main() -> None:
    args = sys.argv[2:]
    for name, repo in zip(args[::2], args[1::2], strict=True):
        try:
            result = SCENARIOS[name](Path(repo))
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            result = {"crash": repr(exc)}
        print(json.dumps({"scenario": name, **result}), flush=True)


if __name__ == "__main__":
    main()
