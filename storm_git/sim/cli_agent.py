"""A simulated agent that works through the ``git storm`` command line, as a coding
agent's tool calls do: ``python -m storm_git.sim.cli_agent SPEC.json``.

Storm mode: one ``git storm read --json`` of the change's files, then one
``git storm write --json`` per file. After a rejection the agent either re-plans
(re-reads its files and re-applies its change: the STORM rule's cost), or, with
``rebased`` in the spec, accepts the rebased change the rejection offers (its own
edit, from the version it read to what it tried to write, three-way merged onto
the current version) with ``git storm write --rebased``: one call. A rebased
change with conflict markers is never accepted: the agent re-plans. Stale files
a rejection names are re-read before they are written, so nothing is written
from a view the agent knows is old.

Worktree mode: the agent reads and writes the files of its own worktree and
commits with ``git storm commit``; conflicts wait for the manager's merge.

Every command counts as one agent call (a tool call of an LLM agent): one per
read (any number of files), one per file written, one per commit.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .agent import MAX_ATTEMPTS, Agent, apply_change, b64, main
from .workload import Change


def _content(d: dict[str, Any], key: str) -> bytes | None:
    if d.get(f"{key}_base64") is not None:
        return base64.b64decode(d[f"{key}_base64"])
    return None if d.get(key) is None else d[key].encode("utf-8")


class CliAgent(Agent):
    """The :class:`Agent`'s task loop, each step a ``git storm`` process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.rebased = bool(spec.get("rebased"))
        self.calls = 0

    def storm(self, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any]]:
        """One ``git storm`` call: (exit code, its JSON)."""
        self.calls += 1
        r = subprocess.run(["git", "storm", *args, "--agent", self.name, "--json"], cwd=self.spec["repo"],
                           input=stdin, capture_output=True)
        if r.returncode not in (0, 1):
            err = r.stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"git storm {args[0]}: exit {r.returncode}: {err[-1] if err else ''}")
        return r.returncode, json.loads(r.stdout)

    # -- reading -----------------------------------------------------------------------
    def read_paths(self, paths: list[str]) -> dict[str, bytes | None]:
        if self.mode == "storm":
            _, out = self.storm("read", *paths)
            return {f["path"]: _content(f, "content") if f.get("exists", True) else None for f in out["files"]}
        self.calls += 1
        wt = self.ws.worktree(self.name).path
        view: dict[str, bytes | None] = {}
        for p in paths:
            full = Path(wt, p)
            view[p] = full.read_bytes() if full.is_file() else None
        return view

    def read(self, change: Change) -> dict[str, bytes | None]:
        return self.read_paths(list(dict.fromkeys(change.targets + change.reads)))

    # -- writing -----------------------------------------------------------------------
    def write_file(self, change: Change, path: str, content: bytes | None) -> dict[str, Any]:
        """One file through ``git storm write`` (or ``rm``): the command's JSON."""
        if content is None:
            _, out = self.storm("rm", path, "-m", change.message)
        else:
            _, out = self.storm("write", path, "-m", change.message, stdin=content)
        return out

    @staticmethod
    def rebased_change(rej: dict[str, Any]) -> bytes | None:
        """What ``git storm write --rebased`` would write: the rejection's offer, when it
        has no conflict markers (None: the agent re-plans)."""
        offered = rej.get("rebased")
        if not offered or not offered.get("clean") or offered.get("content") is None:
            return None
        return offered["content"].encode("utf-8")

    def task(self, rnd: int, change: Change, plan: dict[str, int]) -> dict[str, Any]:
        if rnd:
            self.barrier.wait("done", rnd - 1, list(self.spec["plans"][rnd - 1]))
        t0, calls0 = time.monotonic(), self.calls
        view = self.read(change)
        rec: dict[str, Any] = {"message": change.message, "rejections": [], "rereads": 0, "judgement": 0,
                               "reservation_waits": 0, "waited_s": 0.0, "accepted": False, "gave_up": False,
                               "rebased_accepted": 0, "rebased_refused": 0}
        self.barrier.mark("read", rnd)
        self.barrier.wait("read", rnd, list(plan))
        mine = plan[self.name]
        self.barrier.wait("done", rnd, [a for a, o in plan.items() if o < mine])
        content, judged = apply_change(change, view)
        rec["judgement"] += judged
        if self.mode == "storm":
            self._write_storm(change, content, view, rec)
        else:
            for p, c in content.items():
                if c != view.get(p):
                    self._write_worktree(p, c)
            rec["accepted"] = True
            _, out = self.storm("commit", "-m", change.message)
            rec["commit"] = out.get("commit")
        rec["time"] = time.time()
        rec["writes"] = {p: {"base": b64(view.get(p)), "written": b64(c)} for p, c in content.items()
                         if c != view.get(p)}
        for p, c in rec.get("commits", {}).items():  # storm: one commit per file written
            rec["writes"][p]["commit"] = c
        rec["task_s"] = round(time.monotonic() - t0, 4)
        rec["calls"] = self.calls - calls0
        self.barrier.mark("done", rnd)
        return rec

    def _write_worktree(self, path: str, content: bytes | None) -> None:
        self.calls += 1
        full = os.path.join(self.ws.worktree(self.name).path, path)
        if content is None:
            if os.path.exists(full):
                os.unlink(full)
            return
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(content)

    def _write_storm(self, change: Change, content: dict[str, bytes | None], view: dict[str, bytes | None],
                     rec: dict[str, Any]) -> None:
        """Write each changed file; after a rejection re-plan or accept the rebased change."""
        stale: set[str] = set()
        commits: dict[str, str | None] = {}
        for p in list(content):
            if content[p] == view.get(p):
                continue
            for _attempt in range(MAX_ATTEMPTS):
                if p in stale:  # a rejection said it moved: look at it before writing it
                    view.update(self.read_paths([p]))
                    rec["rereads"] += 1
                    content[p], judged = self._reapply(change, p, view)
                    rec["judgement"] += judged
                    stale.discard(p)
                out = self.write_file(change, p, content[p])
                rec["waited_s"] += out.get("waited") or 0.0
                rec["reservation_waits"] += int(out.get("reservation_wait") is not None)
                if out["accepted"]:
                    commits[p] = out.get("commit")
                    break
                rej = out["rejection"]
                before = content[p]
                stale.update(s["path"] for s in rej.get("stale", []) if s["path"] in content)
                row = {"reason": rej["reason"], "path": rej["path"], "stale": [s["path"] for s in rej.get("stale", [])],
                       "moved": (rej.get("scope") or {}).get("moved"), "rebased": None}
                rec["rejections"].append(row)
                done = None
                offer = None
                if self.rebased and rej["reason"] == "direct_conflict":
                    # refused (conflict markers) unless accepted below; stale files are
                    # re-read only on the way to accepting it
                    offer, row["rebased"] = self.rebased_change(rej), "refused"
                if offer is not None:
                    others = sorted(stale - {p})
                    if others:  # what the validation compares them with must be what the agent saw,
                        view.update(self.read_paths(others))  # and what it writes there is re-applied
                        rec["rereads"] += 1
                        for q in others:
                            content[q], judged = self._reapply(change, q, view)
                            rec["judgement"] += judged
                        stale.difference_update(others)
                    _, done = self.storm("write", "--rebased", p)
                    view[p], content[p] = _content(rej, "current_content"), offer
                    row["rebased"] = "accepted" if done["accepted"] else "rejected"
                if done is not None:
                    row["judged"], row["unchanged"] = 0, content[p] == before
                    if done["accepted"]:
                        rec["rebased_accepted"] += 1
                        commits[p] = done.get("commit")
                        break
                    continue  # rejected again: the next round handles it as any rejection
                rec["rebased_refused"] += int(row["rebased"] == "refused")
                # re-plan: re-read the change's files, re-apply the change to what is there now
                view.update(self.read(change))
                rec["rereads"] += 1
                stale.clear()
                again, judged = apply_change(change, view)  # every file not written yet: on what it read now
                content.update({q: c for q, c in again.items() if q not in commits})
                rec["judgement"] += judged
                row["judged"], row["unchanged"] = judged, content[p] == before and not judged
            else:
                rec["gave_up"] = True
                return
        rec["accepted"] = True
        rec["commit"] = list(commits.values())[-1] if commits else None
        rec["commits"] = commits

    @staticmethod
    def _reapply(change: Change, path: str, view: dict[str, bytes | None]) -> tuple[bytes | None, int]:
        out, judged = apply_change(change, view)
        return out.get(path), judged


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], CliAgent))
