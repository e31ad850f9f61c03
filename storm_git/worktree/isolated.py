"""Worktree mode: one worktree and branch per agent, merge at the end (CAID).

The verbs keep the names, signatures and result types of storm mode
(:class:`storm_git.storm.workspace.SharedWorkspace`) but act in the agent's own worktree
without validation: isolation is the protection, and conflicts surface at
``git storm merge``. Reads are still recorded in the agent's read set (version:
the blob id of the file in its worktree) and writes are logged as ``write``
events, so the log and statistics of both modes are comparable. A write has no
commit until ``git storm commit --agent A`` commits A's worktree to its branch.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from typing import Any

import pygit2

from ..core import assignments as scope, events, history, readsets
from ..core.agents import validate_agent
from ..core.errors import BadPath, NotFound, RepoStateError, StormError, UsageError
from ..core.files import index_copy, read_regular
from ..core.locks import flocked
from ..core.paths import check_on_disk, normalize
from ..core.payloads import AgentStatus, CommitResult, ExecResult, ReadResult, Status, WriteResult
from ..core.readsets import ReadEntry
from ..core.store import MODE_BLOB, MODE_EXEC, MODE_LINK, WORKSPACE_REF
from ..core.workspace import BaseWorkspace, replace_once
from ..disk.safe_fs import UnsafePath, remove_path, write_file
from . import radar
from .commit_rules import worktree_commit_problems
from .worktrees import (
    WorktreeInfo,
    agent_worktree,
    ahead_behind,
    branch_for,
    copy_patterns,
    dirty_paths,
    list_worktrees,
    run_git,
    status_entries,
    storm_branches,
    target_branch,
)


class CommitRefused(StormError):
    """An engineer's commit broke a worktree-mode rule (exit 1, like a rejected write)."""

    exit_code = 1
    kind = "commit_refused"


def _disk_version(full: str) -> tuple[str | None, bytes | None, int | None]:
    """(blob id, content, git mode) of the file at ``full``; (None, None, None) if absent."""
    if os.path.islink(full):
        data = os.fsencode(os.readlink(full))
        return str(pygit2.hash(data)), data, MODE_LINK
    try:
        data = read_regular(full)  # a FIFO in the worktree is refused (exit 2), never waited on
        mode = MODE_EXEC if os.stat(full).st_mode & 0o111 else MODE_BLOB
    except FileNotFoundError:
        return None, None, None
    return str(pygit2.hash(data)), data, mode


class WorktreeWorkspace(BaseWorkspace):
    """The verbs of worktree mode; stateless apart from the repository."""

    mode = "worktree"

    # -- helpers ---------------------------------------------------------------
    def worktree(self, agent: str) -> WorktreeInfo:
        w = agent_worktree(self.store, agent)
        if w is None:
            raise RepoStateError(f"{agent} has no worktree", hint=f"run git storm spawn {agent}")
        if w.prunable:
            raise RepoStateError(f"the worktree of {agent} at {w.path} is missing (stale record)",
                                 hint=f"run git storm cleanup, then git storm spawn {agent}")
        return w

    def _path(self, raw: str, top: str, *, for_write: bool = False) -> str:
        p = normalize(raw, self.store.prefix, top)
        check_on_disk(p, top, for_write=for_write)
        return p

    def _head(self, w: WorktreeInfo) -> str:
        return w.head or ""

    def _flags(self, agent: str, paths: list[str]) -> list[str]:
        flags = []
        if scope.outside(self.store, agent, paths):
            flags.append(scope.OUTSIDE_ASSIGNMENT)
        if scope.restricted_paths(self.store, paths):
            flags.append(scope.RESTRICTED)
        return flags

    def _log_write(self, agent: str, op: str, paths: list[str], intent: str | None, flags: list[str],
                   extra: dict[str, Any] | None = None) -> None:
        data = {"op": op, "paths": paths, "intent": intent or f"{agent} {op} {', '.join(paths[:3])}",
                "commit": None, "mode": "worktree", "flags": flags}
        data.update(extra or {})
        with flocked(self.store.commondir, "workspace"):
            events.append(self.store, "write", agent, f"{agent} {op} {', '.join(paths[:3])} (worktree)", data)

    # -- read ------------------------------------------------------------------
    def read(self, paths: Iterable[str], *, agent: str | None) -> list[ReadResult]:
        """Files as they are in the agent's worktree; recorded in its read set."""
        agent = validate_agent(agent)
        w = self.worktree(agent)
        norm = list(dict.fromkeys(self._path(p, w.path) for p in paths))
        if not norm:
            raise UsageError("no path given")
        head = self._head(w)
        results = []
        for p in norm:
            version, data, mode = _disk_version(os.path.join(w.path, p))
            results.append(ReadResult(p, version, head, data, mode))
        readsets.record(self.store, agent, [ReadEntry(r.path, r.version, head) for r in results], why="read")
        return results

    # -- writes (no validation) --------------------------------------------------
    def _put(self, agent: str, w: WorktreeInfo, p: str, content: bytes | None, op: str,
             intent: str | None) -> WriteResult:
        full = os.path.join(w.path, p)
        try:
            if content is None:
                remove_path(w.path, p)
                version = None
            else:
                executable = bool(os.path.isfile(full) and os.stat(full).st_mode & 0o111)
                write_file(w.path, p, content, MODE_EXEC if executable else MODE_BLOB)
                version = str(pygit2.hash(content))
        except UnsafePath:
            raise
        except OSError as exc:
            raise BadPath(f"cannot write {p} in {agent}'s worktree: {exc.strerror or exc}") from None
        head = self._head(w)
        readsets.record(self.store, agent, [ReadEntry(p, version, head)], why=op)
        flags = self._flags(agent, [p])
        self._log_write(agent, op, [p], intent, flags)
        return WriteResult(True, agent, [p], head, None, {p: version},
                           disk={p: "written" if content is not None else "removed"}, flags=flags)

    def write(self, path: str, content: bytes, *, agent: str | None, intent: str | None = None,
              deps: Iterable[str] | None = None, wait: bool = True) -> WriteResult:
        """Write the file in the agent's worktree (``deps``/``wait`` have no meaning here)."""
        agent = validate_agent(agent)
        w = self.worktree(agent)
        p = self._path(path, w.path, for_write=True)
        self.check_size(p, content)
        return self._put(agent, w, p, content, "write", intent)

    def edit(self, path: str, old: str, new: str, *, agent: str | None, intent: str | None = None,
             deps: Iterable[str] | None = None, wait: bool = True) -> WriteResult:
        """Replace exactly one occurrence of ``old`` in the file in the agent's worktree."""
        agent = validate_agent(agent)
        w = self.worktree(agent)
        p = self._path(path, w.path, for_write=True)
        if old == "":
            raise UsageError("--old is empty", hint="give the exact text to replace")
        _, base, _ = _disk_version(os.path.join(w.path, p))
        if base is None:
            raise NotFound(f"{p} does not exist in the worktree of {agent}", hint="use git storm write to create it")
        content = replace_once(base, old, new, f"{p} in the worktree of {agent}")
        self.check_size(p, content)
        return self._put(agent, w, p, content, "edit", intent)

    def rm(self, path: str, *, agent: str | None, intent: str | None = None,
           deps: Iterable[str] | None = None, wait: bool = True) -> WriteResult:
        agent = validate_agent(agent)
        w = self.worktree(agent)
        p = self._path(path, w.path, for_write=True)
        if not os.path.lexists(os.path.join(w.path, p)):
            raise NotFound(f"{p} does not exist in the worktree of {agent}")
        return self._put(agent, w, p, None, "rm", intent)

    def release(self, path: str, *, agent: str | None) -> None:
        validate_agent(agent)
        raise UsageError("worktree mode has no reservations: each agent works in its own worktree",
                         hint="reservations exist in storm mode only (git storm mode)")

    # -- exec --------------------------------------------------------------------------
    def _snapshot(self, top: str) -> dict[str, tuple[str, str | None]]:
        out = {}
        for xy, p in status_entries(top, copy_patterns(self.store)):
            out[p] = (xy, _disk_version(os.path.join(top, p))[0])
        return out

    def exec(self, argv: list[str], *, agent: str | None, intent: str | None = None,
             timeout: float | None = None, wait: bool = True) -> ExecResult:
        """Run ``argv`` in the agent's worktree (stdio inherited); report the paths it changed."""
        agent = validate_agent(agent)
        if not argv:
            raise UsageError("no command given", hint="git storm exec --agent A -- CMD ARGS…")
        w = self.worktree(agent)
        cwd = os.path.join(w.path, self.store.prefix) if self.store.prefix else w.path
        if not os.path.isdir(cwd):
            cwd = w.path
        before = self._snapshot(w.path)
        env = dict(os.environ, STORM_AGENT=agent)
        timed_out = False
        try:
            rc = subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, check=False).returncode
        except FileNotFoundError:
            raise UsageError(f"command not found: {argv[0]}") from None
        except PermissionError:
            raise UsageError(f"command not executable: {argv[0]}") from None
        except subprocess.TimeoutExpired:
            rc, timed_out = -9, True
        after = self._snapshot(w.path)
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        write = None
        if changed:
            head = self._head(w)
            versions = {p: after[p][1] if p in after else _disk_version(os.path.join(w.path, p))[0] for p in changed}
            readsets.record(self.store, agent, [ReadEntry(p, v, head) for p, v in versions.items()], why="exec")
            flags = self._flags(agent, changed)
            self._log_write(agent, "exec", changed, intent or f"{agent} exec {' '.join(argv)[:60]}", flags,
                            {"argv": argv, "returncode": rc})
            write = WriteResult(True, agent, changed, head, None, versions, disk={p: "written" for p in changed},
                                flags=flags)
        return ExecResult(list(argv), rc, timed_out, changed, write)

    # -- commit ---------------------------------------------------------------------------
    def commit(self, message: str, *, agent: str | None = None, adopt: bool = False,
               strict: bool = False, sign: bool | None = None, verify: bool = True,
               keep_shared: bool = False) -> CommitResult:
        """Commit everything changed in the agent's worktree to its branch.

        Refused (CommitRefused, nothing staged, nothing changed) when the worktree is
        not on the agent's own branch, or a changed file is outside its assignment
        or restricted; the pre-commit hook applies the same rule to plain ``git
        commit``. ``adopt`` has no meaning here: every change in the worktree is
        the agent's. ``sign``: ``git commit -S`` / ``--no-gpg-sign`` (None: as
        ``commit.gpgSign`` says, which git commit reads itself).
        """
        if keep_shared:
            raise UsageError("--keep-shared is for storm mode's manager commit",
                             hint="in worktree mode each agent commits its own worktree")
        if not agent:
            raise UsageError("commit in worktree mode needs --agent",
                             hint="each engineer commits its own worktree: git storm commit --agent A -m MSG")
        agent = validate_agent(agent)
        w = self.worktree(agent)
        excludes = copy_patterns(self.store)
        paths = sorted(dict.fromkeys(p for _, p in status_entries(w.path, excludes)))
        branch = branch_for(self.store, agent)
        if not paths:
            return CommitResult(None, w.branch or branch, [agent], 0, [], "nothing to commit")
        from .sync import taken_from_target

        theirs = taken_from_target(w.path, paths)  # concluding a sync: the target's files are not the agent's
        problems = worktree_commit_problems(self.store, agent, w.branch, [p for p in paths if p not in theirs])
        if problems:
            self._log_refusal(agent, paths, problems)
            raise CommitRefused(f"commit by {agent} refused: {'; '.join(problems)}",
                                hint="undo those changes (or ask the manager to change the assignment)")
        subject = (message or "").strip() or f"storm: {agent} commit"
        body = subject + "\n\n" + "\n".join(
            [f"Storm-Agent: {agent}", "Storm-Op: commit"] + [f"Storm-Path: {p}" for p in paths]) + "\n"
        index = run_git(["rev-parse", "--path-format=absolute", "--git-path", "index"], w.path).stdout.decode().strip()
        with index_copy(index) as tmp_index:
            env = {"GIT_INDEX_FILE": tmp_index, "STORM_AGENT": agent, radar.OFF_ENV: "off",
                   "GIT_AUTHOR_NAME": agent, "GIT_AUTHOR_EMAIL": f"{agent}@storm.invalid",
                   "GIT_COMMITTER_NAME": agent, "GIT_COMMITTER_EMAIL": f"{agent}@storm.invalid"}
            # exactly the paths status reported (copied untracked files are not among them);
            # a staged deletion (git rm, a sync's merge, a rename's source) is in neither the
            # index nor the worktree, and git add refuses a pathspec that matches nothing
            added = [p for xy, p in status_entries(w.path, excludes, rename_sources=False) if xy != "D "]
            run_git(["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"], w.path, env=env,
                    input="\0".join(f":(literal){p}" for p in added).encode("utf-8", "surrogateescape"))
            flag = ([] if sign is None else ["-S" if sign else "--no-gpg-sign"]) + ([] if verify else ["--no-verify"])
            r = run_git(["commit", "--quiet", *flag, "-F", "-"], w.path, env=env, input=body.encode(), check=False)
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).decode("utf-8", "replace").strip().replace("\n", " ")
                self._log_refusal(agent, paths, [msg])
                raise CommitRefused(f"git commit in the worktree of {agent} failed: {msg}",
                                    hint="fix what the pre-commit hook names, then commit again")
            os.replace(tmp_index, index)
        oid = run_git(["rev-parse", "HEAD"], w.path).stdout.decode().strip()
        writes = self._writes_since_last_commit(agent)
        with flocked(self.store.commondir, "workspace"):
            events.append(self.store, "commit", agent, f"{agent} committed {len(paths)} path(s) to {w.branch}",
                          {"commit": oid, "branch": w.branch, "paths": paths, "writes": writes, "mode": "worktree"})
        return CommitResult(oid, w.branch or branch, [agent], writes, paths, subject,
                            radar=radar.safe_hits(self.store, agent))

    def _log_refusal(self, agent: str, paths: list[str], problems: list[str]) -> None:
        with flocked(self.store.commondir, "workspace"):
            events.append(self.store, "commit_refused", agent, f"{agent}: {problems[0][:80]}",
                          {"paths": paths, "problems": problems})

    def _writes_since_last_commit(self, agent: str, limit: int = 5000) -> int:
        n = 0
        for e in events.read(self.store, limit):
            if e.get("agent") != agent:
                continue
            if e.get("type") == "commit":
                break
            if e.get("type") == "write":
                n += 1
        return n

    # -- status and log -----------------------------------------------------------------
    def status(self, *, diffs: bool = False, untracked_content: bool = False) -> Status:
        """Target branch, agents' read sets, and every agent worktree with branch,
        ahead/behind the target, uncommitted changes and last merge outcome."""
        try:
            target = target_branch(self.store)
        except UsageError:
            target = None
        target_oid = self.store.ref_target("refs/heads/" + target) if target else None
        wts = list_worktrees(self.store)
        outcomes: dict[str, dict[str, Any]] = {}
        for e in events.read(self.store, 2000):
            if e.get("type") == "merge" and e.get("agent") not in outcomes:
                outcomes[e["agent"]] = e
        rows = []
        dirty_by_agent: dict[str, list[str]] = {}
        names = set(storm_branches(self.store))
        names.update(w.agent for w in wts if w.agent and not w.main)
        for agent in sorted(names):
            branch = branch_for(self.store, agent)
            w = next((x for x in wts if x.branch == branch), None)
            tip = self.store.ref_target("refs/heads/" + branch)
            ahead, behind = ahead_behind(self.store, str(tip) if tip else None, target_oid)
            dirty = dirty_paths(self.store, w.path) if w and not w.prunable else []
            dirty_by_agent[agent] = dirty
            last = outcomes.get(agent)
            outcome = None
            if last is not None:
                outcome = last.get("status")
                if outcome == "merged" and ahead:
                    outcome = "merged earlier; new commits since"
            elif tip is not None and ahead == 0:
                outcome = "nothing to merge"
            state = "missing (stale record)" if w and w.prunable else ("no worktree" if w is None else "")
            summary = (f"{agent}: {branch} {('@ ' + str(tip)[:10]) if tip else '(no branch)'}, "
                       f"{ahead} ahead / {behind} behind {target or '?'}, "
                       f"{'clean' if not dirty else f'{len(dirty)} uncommitted'}"
                       f", merge: {outcome or 'not yet'}" + (f", {state}" if state else ""))
            # "path" and "state" are what `git storm status` prints for each entry.
            rows.append({"agent": agent, "branch": branch, "path": w.path if w else "(no worktree)",
                         "head": str(tip) if tip else None, "ahead": ahead, "behind": behind,
                         "dirty": len(dirty), "dirty_paths": dirty[:20], "merge": outcome,
                         "worktree": state or "ok", "state": summary})
        agents, corrupt = [], []
        for a in readsets.agents(self.store):
            try:
                agents.append(AgentStatus(a, len(readsets.load(self.store, a)), []))
            except readsets.CorruptReadSet as exc:
                corrupt.append(str(exc))
        return Status(self.mode, str(target_oid) if target_oid else "", agents, [],
                      extra={"target": target, "worktrees": rows, "radar": radar.status_items(self.store, dirty_by_agent),
                             **({"corrupt_read_sets": corrupt} if corrupt else {})})

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """Recorded events (writes in worktrees, commits, merges, mode switches…) and the
        writes accepted while the repository was in storm mode, newest first."""
        out = history.log(self.store, self.store.ref_target(WORKSPACE_REF), limit)
        for e in out:
            if e.get("type") == "write":
                e.setdefault("commit", None)
                e.setdefault("op", "write")
                e.setdefault("paths", [])
                e.setdefault("intent", "")
        return out

