"""Run one workload in one mode with real processes, and measure it.

Every run gets a fresh temporary repository holding the workload's base tree:
storm mode runs ``git storm init``; worktree mode switches to worktree mode and
spawns one worktree per agent. Then one process per agent
(:mod:`storm_git.sim.agent`) does its changes concurrently. Integration:
storm mode — the manager commits the shared state; worktree mode — the manager
merges every branch (``--strategy abort``); a conflicted agent syncs, re-applies
its own changes to the conflicting files on top of the target (the same
re-application storm mode's agents do after a rejection), commits, and is merged
again. The result is exported and tested; lost updates are checked against the
final tree.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ..core.errors import StormError, UsageError
from .agent import apply_change
from .metrics import RunMetrics, Write, lost_updates
from .workload import Change, Workload

MODES = ("storm", "worktree")
IDENT = {"GIT_AUTHOR_NAME": "storm-sim", "GIT_AUTHOR_EMAIL": "sim@storm.invalid",
         "GIT_COMMITTER_NAME": "storm-sim", "GIT_COMMITTER_EMAIL": "sim@storm.invalid"}
AGENT_TIMEOUT = 900.0
OnFinal = Callable[[str, str, RunMetrics], None]


def _git(cwd: str, *args: str, input: bytes | None = None) -> bytes:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, input=input, env={**os.environ, **IDENT})
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def _env() -> dict[str, str]:
    env = dict(os.environ, **IDENT)
    env.pop("STORM_AGENT", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def make_repo(root: str, w: Workload) -> str:
    """A fresh repository whose ``main`` holds the workload's base tree."""
    repo = os.path.join(root, "repo")
    os.makedirs(repo)
    _git(repo, "init", "-q", "-b", "main")
    for p, c in w.base.items():
        if c is None:
            continue
        full = os.path.join(repo, p)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(c)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--no-verify", "-m", "base")
    return repo


def _plans(w: Workload, names: list[str]) -> list[list[dict[str, int]]]:
    """Per agent, per round: {agent: order} of the agents working in that round."""
    rounds = max((len(a) for a in w.agents), default=0)
    per_round = [{names[i]: a[r].args.get("_order", 0) for i, a in enumerate(w.agents) if r < len(a)}
                 for r in range(rounds)]
    return [[per_round[r] for r in range(len(a))] for a in w.agents]


def _start_agents(w: Workload, mode: str, repo: str, root: str, names: list[str], deps: str,
                  agent_opts: dict[str, Any] | None = None) -> list[Any]:
    """One process per agent; ``agent_opts``: ``via="cli"`` runs :mod:`storm_git.sim.cli_agent`
    (every step a ``git storm`` command), the rest goes into each agent's spec."""
    opts = dict(agent_opts or {})
    module = "storm_git.sim.cli_agent" if opts.pop("via", "api") == "cli" else "storm_git.sim.agent"
    sync_dir = os.path.join(root, "sync")
    os.makedirs(sync_dir)
    procs = []
    for name, changes, plans in zip(names, w.agents, _plans(w, names), strict=True):
        spec = {"agent": name, "mode": mode, "repo": repo, "kind": w.kind, "deps": deps, "sync_dir": sync_dir,
                "changes": [c.to_json() for c in changes], "plans": plans,
                "out": os.path.join(root, f"{name}.json"), **opts}
        path = os.path.join(root, f"{name}.spec.json")
        with open(path, "w") as fh:
            json.dump(spec, fh)
        # cwd outside the repository: `python -m` puts cwd first on sys.path, and a replay of
        # storm's own history has an older storm_git/ there
        procs.append((name, subprocess.Popen([sys.executable, "-m", module, path], cwd=root,
                                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    return procs


def _collect(procs: list[Any], root: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    reports, errors = {}, []
    for name, p in procs:
        try:
            _, err = p.communicate(timeout=AGENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out = os.path.join(root, f"{name}.json")
        if os.path.exists(out):
            with open(out) as fh:
                reports[name] = json.load(fh)
            if "error" in reports[name]:
                errors.append(f"{name}: {reports[name]['error']}")
        else:
            errors.append(f"{name}: exit {p.returncode}: {err.decode(errors='replace').strip()[-300:]}")
    return reports, errors


def _content(repo: str, rev: str, path: str) -> bytes | None:
    r = subprocess.run(["git", "cat-file", "blob", f"{rev}:{path}"], cwd=repo, capture_output=True)
    return r.stdout if r.returncode == 0 else None


def _dec(s: str | None) -> bytes | None:
    import base64

    return None if s is None else base64.b64decode(s)


class _Run:
    """One workload in one mode: state shared by the integration and the measurement."""

    def __init__(self, w: Workload, mode: str, deps: str, test_cmd: str | None,
                 agent_opts: dict[str, Any] | None = None, on_final: OnFinal | None = None) -> None:
        self.w, self.mode, self.deps, self.test_cmd = w, mode, deps, test_cmd or w.test_cmd
        self.agent_opts, self.on_final = agent_opts, on_final
        self.root = tempfile.mkdtemp(prefix=f"storm-sim-{mode}-")
        self.names = [f"agent_{i + 1}" for i in range(len(w.agents))]
        self.m = RunMetrics(w.name, w.kind, mode, deps if mode == "storm" else "-", len(w.agents),
                            w.params.get("coupling"), w.n_changes, w.overlaps())
        self.resolutions: list[Write] = []

    def setup(self) -> None:
        from storm_git.admin.setup import init
        from storm_git.core.store import Store

        self.repo = make_repo(self.root, self.w)
        self.store = Store.discover(self.repo)
        init(self.store)
        if self.mode == "worktree":
            from storm_git.admin.modes import switch
            from storm_git.worktree.worktrees import spawn

            switch(self.store, "worktree")
            for n in self.names:
                spawn(self.store, n)

    def run(self) -> RunMetrics:
        old = {k: os.environ.get(k) for k in IDENT}
        os.environ.update(IDENT)  # the library's own git commands (sync, merge) commit too
        try:
            self.setup()
            t0 = time.monotonic()
            procs = _start_agents(self.w, self.mode, self.repo, self.root, self.names, self.deps, self.agent_opts)
            self.reports, self.m.agent_errors = _collect(procs, self.root)
            t1 = time.monotonic()
            final_rev = self.integrate()
            self.m.wall_s = time.monotonic() - t0
            self.m.agents_s, self.m.integrate_s = t1 - t0, self.m.wall_s - (t1 - t0)
            self.measure(final_rev)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(self.root, ignore_errors=True)
        return self.m

    # -- integration -------------------------------------------------------------------
    def integrate(self) -> str:
        if self.mode == "storm":
            from storm_git.storm.workspace import SharedWorkspace

            ws = SharedWorkspace(self.store)
            ws.commit("integrate the agents' work", agent="manager")
            return "refs/storm/workspace"
        from storm_git.worktree.merge import merge

        rep = merge(self.store, strategy="abort")
        self.m.merge_rounds = 1
        pending = [r.agent for r in rep.conflicted]
        self.m.caught_at_merge += sum(len(r.conflicts) for r in rep.conflicted)
        for agent in pending:
            for _ in range(3):
                self.resolve(agent)
                again = merge(self.store, [agent], strategy="abort")
                self.m.merge_rounds += 1
                if not again.conflicted:
                    break
                self.m.caught_at_merge += sum(len(r.conflicts) for r in again.conflicted)
        return "refs/heads/main"

    def resolve(self, agent: str) -> None:
        """The conflicted agent merges the target in and re-applies its own changes to
        the conflicting files on top of the target's version."""
        from storm_git.worktree.sync import sync
        from storm_git.worktree.workspace import WorktreeWorkspace

        res = sync(self.store, agent)
        if res.status != "conflicted":
            return
        wt = res.path
        changes = [Change.from_json(c.to_json()) for c in self.w.agents[self.names.index(agent)]]
        target = "refs/heads/main"
        for cf in res.conflicts:
            p = cf.path
            content = _content(self.repo, target, p)
            start = content
            for ch in (c for c in changes if p in c.targets):
                view = {q: _content(self.repo, target, q) for q in ch.reads + ch.targets}
                view[p] = content
                out, judged = apply_change(ch, view)
                content = out[p]
                self.m.judgement += judged
            full = os.path.join(wt, p)
            if content is None:
                if os.path.exists(full):
                    os.unlink(full)
            else:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as fh:
                    fh.write(content)
            self.resolutions.append(Write(agent, p, start, content, seen=_content(self.repo, res.before, p)))
        self.m.agent_calls += 3 + len(res.conflicts)  # sync, read the conflicted files, write each, commit
        message = f"{agent}: resolve the merge with main"
        try:
            WorktreeWorkspace(self.store).commit(message, agent=agent)
        except StormError as exc:
            # concluding the merge as a person would, so one storm bug does not end the run;
            # the note carries the worktree's state for the bug report
            lines = _git(wt, "status", "--porcelain").decode(errors="replace").splitlines()
            named = [ln for ln in lines if any(part in exc.message for part in ln[3:].split(" -> "))]
            state = "; ".join(named or lines)[:400]
            self.m.notes.append(f"{agent}: git storm commit failed ({exc.message}); committed with plain git. "
                                f"status: {state}")
            _git(wt, "add", "-A")
            _git(wt, "commit", "-q", "--no-verify", "-m", message)

    # -- measurement -------------------------------------------------------------------
    def _writes(self) -> list[Write]:
        """Accepted writes in integration order (storm: the shared ref's order)."""
        tasks = [(name, t) for name, r in self.reports.items() for t in r.get("tasks", [])]
        if self.mode == "storm":
            chain = _git(self.repo, "rev-list", "--reverse", "refs/storm/workspace").decode().split()
            pos = {c: i for i, c in enumerate(chain)}
            tasks.sort(key=lambda nt: pos.get(nt[1].get("commit") or "", -1))
        else:
            tasks.sort(key=lambda nt: nt[1].get("time", 0))
        out = [Write(name, p, _dec(wr["base"]), _dec(wr["written"]))
               for name, t in tasks if t.get("accepted") for p, wr in t.get("writes", {}).items()]
        return out + self.resolutions

    def _blind_overwrites(self) -> list[dict[str, Any]]:
        """Storm mode: an accepted write's parent must hold what its author based it on."""
        bad = []
        for name, r in self.reports.items():
            for t in r.get("tasks", []):
                if not t.get("commit"):
                    continue
                for p, wr in t.get("writes", {}).items():
                    if _content(self.repo, (wr.get("commit") or t["commit"]) + "^", p) != _dec(wr["base"]):
                        bad.append({"agent": name, "path": p, "commit": t["commit"]})
        return bad

    def test(self, rev: str) -> None:
        if not self.test_cmd:
            return
        out = os.path.join(self.root, "result")
        os.makedirs(out)
        tar = _git(self.repo, "archive", "--format=tar", rev)
        subprocess.run(["tar", "-x", "-C", out], input=tar, check=True)
        r = subprocess.run(self.test_cmd, shell=True, cwd=out, capture_output=True, env=_env(), timeout=1800)
        self.m.test_passed = r.returncode == 0
        self.m.test_output = (r.stdout + r.stderr).decode(errors="replace").strip()[-600:]

    def measure(self, rev: str) -> None:
        m = self.m
        self.test(rev)
        writes = self._writes()
        paths = {wr.path for wr in writes} | set(self.w.reference or {})
        final = {p: _content(self.repo, rev, p) for p in paths}
        lost = lost_updates(writes, final) + (self._blind_overwrites() if self.mode == "storm" else [])
        m.lost_updates = len(lost)
        m.writes_checked = len(writes)
        if self.w.reference is not None:
            m.diverged_paths = sorted(p for p, c in self.w.reference.items() if final.get(p) != c)
        failed = m.test_passed is False
        m.caught_by_tests = int(failed)
        m.caught_never = 0 if failed else len(m.diverged_paths)
        for name, r in self.reports.items():
            tasks = r.get("tasks", [])
            m.per_agent[name] = {"tasks": len(tasks), "rejections": sum(len(t["rejections"]) for t in tasks),
                                 "rereads": sum(t["rereads"] for t in tasks),
                                 "reservation_waits": sum(t["reservation_waits"] for t in tasks),
                                 "task_s": round(sum(t.get("task_s", 0.0) for t in tasks), 3)}
            for t in tasks:
                rej = t["rejections"]
                m.rejections += len(rej)
                m.rejections_needless += sum(1 for x in rej if x["unchanged"]) if not failed else 0
                for x in rej:
                    row = m.rejections_by_reason.setdefault(x["reason"], {"all": 0, "needless": 0})
                    row["all"] += 1
                    row["needless"] += int(x["unchanged"] and not failed)
                    if x["reason"] == "stale_dependency":
                        m.stale_rejections.append({
                            "agent": name, "change": (t["message"].splitlines() or [""])[0],
                            "path": x["path"], "stale": x["stale"], "moved": x.get("moved"),
                            "needless": bool(x["unchanged"] and not failed)})
                m.rereads += t["rereads"]
                m.judgement += t["judgement"]
                m.reservation_waits += t["reservation_waits"]
                m.reservation_wait_s += t["waited_s"] if t["reservation_waits"] else 0.0
                m.gave_up += int(t["gave_up"])
        m.rejections_needed = m.rejections - m.rejections_needless
        m.retries = m.rejections
        m.caught_at_write = m.rejections_needed
        self.lost = lost
        for t in (t for r in self.reports.values() for t in r.get("tasks", [])):
            m.agent_calls += t.get("calls", 0)
            m.rebased_accepted += t.get("rebased_accepted", 0)
            m.rebased_refused += t.get("rebased_refused", 0)
        if self.on_final:
            self.on_final(self.repo, rev, m)


def failed_run(w: Workload, mode: str, deps: str, error: str) -> RunMetrics:
    """The metrics of a run that could not finish: the error is reported, nothing measured."""
    m = RunMetrics(w.name, w.kind, mode, deps if mode == "storm" else "-", len(w.agents),
                   w.params.get("coupling"), w.n_changes, w.overlaps())
    m.agent_errors = [f"run failed: {error}"]
    return m


def run(w: Workload, mode: str, *, deps: str = "full", test_cmd: str | None = None,
        agent_opts: dict[str, Any] | None = None, on_final: OnFinal | None = None) -> RunMetrics:
    """Run ``w`` in ``mode`` ("storm" or "worktree"); the metrics of that run.

    ``agent_opts`` go to each agent's spec (``via="cli"``: agents that work through
    ``git storm`` commands; ``rebased``: they accept rebased changes). ``on_final(repo,
    rev, metrics)`` looks at the integrated result before the run's repository goes."""
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}")
    return _Run(w, mode, deps, test_cmd, agent_opts, on_final).run()
