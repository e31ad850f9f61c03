"""An engineer for ``git storm team run --harness-cmd``: a script, no model.

It plays the steps the scenario file (``$TEAM_SCENARIO``, JSON) gives its subtask
(``$STORM_TEAM_SUBTASK``) for the round it is started in (``$STORM_TEAM_ROUND``:
work, fix, conflict; ``work2``: the second attempt's, after a resume), through
storm's public verbs (``git storm read/write/edit/exec``) or plain commands, and
logs what it received (its environment's team variables and its brief) to
``$TEAM_LOG/<agent>.<round>.json``. A step that does not end as the scenario
expects ends the script with exit 9.

Steps: ``{"read": [paths]}``; ``{"append": path, "text": s, "expect": 0|1}`` (the
content last read plus ``text``); ``{"put": path, "text": s}`` (whole content; either with ``"wait": true``: the write
waits for another agent's reservation, instead of --no-wait);
``{"edit": path, "old": s, "new": s}``; ``{"exec": "sh command"}`` (git storm exec);
``{"sh": "sh command"}``; ``{"wait_ws": path, "contains": s}`` (until the shared
head's file holds it); ``{"wait_file": path}``; ``{"sleep": seconds}``; ``{"exit": n}``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

STORM = [sys.executable, "-m", "storm_git"]


def run(args: list[str], data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=data, capture_output=True, check=False)


def main() -> int:
    agent, sub = os.environ["STORM_AGENT"], os.environ["STORM_TEAM_SUBTASK"]
    round_ = os.environ.get("STORM_TEAM_ROUND", "work")
    with open(os.environ["TEAM_SCENARIO"], encoding="utf-8") as fh:  # steps by round and attempt ("work2")
        mine = json.load(fh).get(sub, {})
    attempt = os.environ.get("STORM_TEAM_ATTEMPT", "1")
    steps = mine.get(f"{round_}{attempt}", mine.get(round_, []))
    log = os.environ.get("TEAM_LOG")
    got = {k: v for k, v in os.environ.items() if k.startswith("STORM_")}
    with open(os.environ["STORM_TEAM_BRIEF"], encoding="utf-8") as fh:
        got["brief"] = fh.read()
    got["cwd"] = os.getcwd()
    got["started"] = time.time()
    results: list[dict] = []
    seen: dict[str, str] = {}

    def dump() -> None:
        if log:
            name = f"{agent}.{round_}" + (f".{attempt}" if attempt != "1" and round_ == "work" else "")
            with open(os.path.join(log, f"{name}.json"), "w", encoding="utf-8") as fh:
                json.dump({**got, "results": results}, fh, indent=1)

    for step in steps:
        if "read" in step:
            r = run([*STORM, "read", *step["read"], "--json"])
            if r.returncode:
                results.append({"read": step["read"], "rc": r.returncode, "err": r.stderr.decode()})
                dump()
                return 9
            for f in json.loads(r.stdout)["files"]:
                seen[f["path"]] = f.get("content") or ""
            results.append({"read": step["read"], "rc": 0})
        elif "append" in step or "put" in step:
            path = step.get("append") or step["put"]
            text = (seen.get(path, "") + step["text"]) if "append" in step else step["text"]
            r = run([*STORM, "write", path, "--json", *([] if step.get("wait") else ["--no-wait"]), "-m",
                     step.get("intent", f"{agent} {path}")], text.encode())
            out = json.loads(r.stdout or "{}")
            rej = out.get("rejection") or {}
            results.append({"write": path, "rc": r.returncode, "reason": rej.get("reason")})
            if r.returncode != step.get("expect", 0):
                results[-1]["err"] = r.stderr.decode() + r.stdout.decode()[:2000]
                dump()
                return 9
            if r.returncode == 0:
                seen[path] = text
        elif "edit" in step:
            r = run([*STORM, "edit", step["edit"], "--old", step["old"], "--new", step["new"], "--json"])
            results.append({"edit": step["edit"], "rc": r.returncode})
            if r.returncode != step.get("expect", 0):
                results[-1]["err"] = r.stderr.decode() + r.stdout.decode()[:2000]
                dump()
                return 9
        elif "exec" in step:
            r = run([*STORM, "exec", "--json", "--", "sh", "-c", step["exec"]])
            results.append({"exec": step["exec"], "rc": r.returncode})
            if r.returncode != step.get("expect", 0):
                results[-1]["err"] = r.stderr.decode() + r.stdout.decode()[:2000]
                dump()
                return 9
        elif "sh" in step:
            r = run(["sh", "-c", step["sh"]])
            results.append({"sh": step["sh"], "rc": r.returncode, "out": (r.stdout + r.stderr).decode()[-2000:]})
            if r.returncode != step.get("expect", 0):
                dump()
                return 9
        elif "wait_ws" in step:
            deadline = time.time() + step.get("timeout", 60)
            while True:
                r = run(["git", "show", f"refs/storm/workspace:{step['wait_ws']}"])
                if step["contains"] in r.stdout.decode("utf-8", "replace"):
                    break
                if time.time() > deadline:
                    results.append({"wait_ws": step["wait_ws"], "timeout": True})
                    dump()
                    return 9
                time.sleep(0.05)
        elif "wait_file" in step:
            deadline = time.time() + step.get("timeout", 60)
            while not os.path.exists(step["wait_file"]):
                if time.time() > deadline:
                    dump()
                    return 9
                time.sleep(0.05)
        elif "sleep" in step:
            time.sleep(step["sleep"])
        elif "exit" in step:
            dump()
            return int(step["exit"])
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
