"""Storm mode's verbs on one shared workspace: read, write, edit, rm, exec, adopt, status.

STORM's local state consistency on git: a write by agent ``a`` to ``f`` is valid
iff every ``(g, v)`` in ``S_a ∪ {(f, v_f observed)}`` still has version ``v`` at
the shared head. Versions are blob ids, so a file that went A → B → A is
consistent for an agent that read A (no false conflict, never a wrong accept).

Every change goes through one validated write (storm_git.storm.write, its steps
named there; the rule in storm_git.storm.validate; where the commit goes in
storm_git.storm.publication).
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from typing import Any

import pygit2

from ..core import events, readsets, reservations
from ..core.agents import validate_agent
from ..core.convert import Conversions
from ..core.errors import BadPath, NotFound, NotInitialised, UsageError
from ..core.locks import flocked
from ..core.paths import check_on_disk, normalize
from ..core.payloads import (
    AgentStatus,
    CommitResult,
    ExecResult,
    ReadResult,
    Rejection,
    Status,
    WriteResult,
)
from ..core.readsets import ReadEntry
from ..core.reservations import Reservation
from ..core.store import MODE_LINK, WORKSPACE_REF, hex_, ref_oid
from ..core.workspace import BaseWorkspace, replace_once
from . import branch, rebased, shell_edits, write
from .publication import Publication
from .validate import entry_or_none
from .validated_writer import UNDO_OP, OnWait
from .verdict import MUST_REJECT

DEFAULT_RESERVATION_SECONDS = 30
# writes whose content storm puts on disk (exec, adopt, a harness tool, the shell: read from it)
CONTENT_OPS = ("write", "edit", "rm", UNDO_OP)


class SharedWorkspace(BaseWorkspace):
    """The verbs of storm mode."""

    mode = "storm"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        # agent -> (read-set parse, re-read paths then, head): the agent's whole read
        # set was valid at that head (storm_git.storm.write; per process, never persisted)
        self.valid_cache: dict[str, tuple[int, int, pygit2.Oid]] = {}
        self.publication = Publication(store)  # where a validated write goes (storm_git.remote: a server)
        # a door's own default for storm.shellEdits when it is unset (the drop-in: adopt)
        self.shell_edits: str | None = None
        self._real_top: tuple[tuple[int, int], str] | None = None  # (identity of the top, its real path)

    # -- settings --------------------------------------------------------------
    @property
    def reservation_seconds(self) -> float:
        return self.store.config_float("storm.reservationSeconds", DEFAULT_RESERVATION_SECONDS)

    # -- helpers ---------------------------------------------------------------
    def path(self, raw: str, *, for_write: bool = False, seen: dict[str, str] | None = None) -> str:
        """Validate a user path (relative to the caller's directory); ``seen`` is shared by
        the paths of one call (see check_on_disk)."""
        p = normalize(raw, self.store.prefix, self.store.top)
        if seen is None:
            seen = {}
        if "" not in seen:
            seen[""] = self.real_top()
        check_on_disk(p, self.store.main_workdir, for_write=for_write, seen=seen)
        return p

    def real_top(self) -> str:
        """The working tree's real path, resolved again only when the directory the
        path leads to is another one (one stat instead of one per component)."""
        top = self.store.main_workdir
        st = os.stat(top)
        ident = (st.st_dev, st.st_ino)
        if self._real_top is None or self._real_top[0] != ident:
            self._real_top = (ident, os.path.realpath(top))
        return self._real_top[1]

    def head_ref(self) -> pygit2.Reference:
        ref = self.store.ref(WORKSPACE_REF)
        if ref is None:
            raise NotInitialised("storm is not initialised in this repository",
                                 hint="run git storm init")
        return ref

    def head(self) -> pygit2.Oid:
        return ref_oid(self.head_ref())

    def catch_up(self, agent: str | None = None) -> None:
        """Bring the shared head to the truth before a decision made outside ``apply``
        (a harness pre-hook's lease). Locally the ref is the truth: nothing to do."""

    def publish_reservations(self) -> None:
        """Make reservations changed outside ``apply`` (a harness lease) reach the other
        machines. Locally they are already shared: nothing to do."""

    # -- read ------------------------------------------------------------------
    def read(self, paths: Iterable[str], *, agent: str | None) -> list[ReadResult]:
        """Content and version of each path at the shared head, recorded in the read set."""
        agent = validate_agent(agent)
        seen: dict[str, str] = {}
        norm = list(dict.fromkeys(self.path(p, seen=seen) for p in paths))
        if not norm:
            raise UsageError("no path given")
        self.take_in_shell_edits(norm, only_adopting=True)  # a view shows what is on disk
        head = self.head()
        tree = self.store.commit(head).tree
        results = []
        found = [(p, self.store.entry(tree, p)) for p in norm]
        if len(found) > 1:  # a partial clone fetches what it lacks in one go, not path by path
            self.store.prefetch([e.oid for _, e in found if e is not None])
        conv = Conversions(self.store)
        for p, e in found:
            results.append(ReadResult(p, hex_(e.oid) if e else None, str(head),
                                      self.agent_content(p, e.oid, e.mode, conv) if e else None,
                                      e.mode if e else None))
        readsets.record(self.store, agent,
                        [ReadEntry(r.path, r.version, str(head)) for r in results], why="read")
        return results

    def note_reads(self, agent: str | None, versions: Iterable[tuple[str, str | None, str]], *, why: str) -> None:
        """Record in the agent's read set that it holds these versions ``(path, blob or
        None, shared head)`` of files it got some other way (a harness's cached view)."""
        readsets.record(self.store, validate_agent(agent), [ReadEntry(p, b, h) for p, b, h in versions], why=why)

    def reservation(self, path: str) -> Reservation | None:
        """The live reservation on a repository path, whoever holds it."""
        return reservations.get(self.store, path)

    def agent_content(self, path: str, oid: pygit2.Oid, mode: int | None = None,
                      conv: Conversions | None = None) -> bytes:
        """Blob ``oid`` of ``path`` as agents are given it: what ``write`` takes back
        (storm_git.core.convert.Conversions.for_agent; a link's target as stored)."""
        data = self.store.blob_bytes(oid)
        if mode == MODE_LINK:
            return data
        return (conv or Conversions(self.store)).for_agent(path, data, oid)

    # -- writes ----------------------------------------------------------------
    def write(self, path: str, content: bytes, *, agent: str | None, intent: str | None = None,
              deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Validated write of one file (see module docstring)."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        self.check_size(p, content)
        return self.apply(agent, {p: content}, intent=intent, deps=deps, wait=wait, op="write", on_wait=on_wait)

    def edit(self, path: str, old: str, new: str, *, agent: str | None, intent: str | None = None,
             deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Replace exactly one occurrence of ``old`` in the version the agent last read,
        then write it with validation: a concurrent change is a rejection, not "not found"."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        if old == "":
            raise UsageError("--old is empty", hint="give the exact text to replace")
        seen = readsets.load(self.store, agent).get(p)
        if seen is None or seen.blob is None:
            if self.store.entry(self.store.commit(self.head()).tree, p) is None:
                raise NotFound(f"{p} does not exist in the shared workspace",
                               hint="use git storm write to create it")
            # Never read (or read while absent): the validation refuses it and the
            # rejection gives the agent the content to edit.
            return self.apply(agent, {p: MUST_REJECT}, intent=intent, deps=deps, wait=wait, op="edit",
                              on_wait=on_wait)
        base = self.agent_content(p, pygit2.Oid(hex=seen.blob))
        content = rebased.Edited(replace_once(base, old, new, f"the version of {p} that {agent} last read "
                                                             f"({seen.blob[:12]})"), old.encode(), new.encode())
        self.check_size(p, content)
        return self.apply(agent, {p: content}, intent=intent, deps=deps, wait=wait, op="edit", on_wait=on_wait)

    def rm(self, path: str, *, agent: str | None, intent: str | None = None,
           deps: Iterable[str] | None = None, wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Validated delete."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        if self.store.entry(self.store.commit(self.head()).tree, p) is None:
            raise NotFound(f"{p} does not exist in the shared workspace")
        return self.apply(agent, {p: None}, intent=intent, deps=deps, wait=wait, op="rm", on_wait=on_wait)

    def release(self, path: str, *, agent: str | None) -> Reservation | None:
        """End the agent's own reservation on ``path``; returns it (None if there was none)."""
        agent = validate_agent(agent)
        p = normalize(path, self.store.prefix, self.store.top)
        with flocked(self.store.commondir, "workspace"):
            self.head_ref()
            r = reservations.get(self.store, p)
            if r is None:
                return None
            if r.holder != agent:
                raise UsageError(f"{p} is reserved by {r.holder}, not {agent}",
                                 hint=f"only {r.holder} can release it; it expires in {r.remaining():.0f}s")
            reservations.update(self.store, {p: None}, agent=agent, message=f"storm: {agent} released {p}")
            events.append(self.store, "release", agent, f"{agent} released {p}", {"path": p})
        return r

    def apply(self, agent: str, changes: dict[str, Any], *, intent: str | None, deps: Iterable[str] | None,
              wait: bool, op: str, expected: dict[str, str | None] | None = None,
              on_wait: OnWait | None = None) -> WriteResult:
        """The validated atomic write of ``changes`` ({path: bytes, or None to delete}):
        storm_git.storm.write, its steps named there. A write whose content storm must
        put on disk first meets the edits on disk outside storm at its targets
        (storm_git.storm.shell_edits): taken in as the shell's, or refused; and an edit
        saved while its disk step ran is said in the answer and, where shell edits are
        writes, taken in on top of it, so the shared state is what the disk holds."""
        if op in CONTENT_OPS and shell_edits.looks_edited(self.store, list(changes)):
            left = self.take_in_shell_edits(list(changes)).left
            if left:
                shell_edits.refuse_edited(self.store, left, op)
        res = write.apply(self, agent, changes, intent=intent, deps=deps, wait=wait, op=op,
                          expected=expected, on_wait=on_wait)
        if op in CONTENT_OPS and res.accepted:
            self._displaced(res)
        return res

    def take_in_shell_edits(self, paths: list[str] | None = None, *, only_adopting: bool = False,
                            made_on: dict[str, str | None] | None = None) -> shell_edits.TakeIn:
        """The edits on disk outside storm (at ``paths``; None: the whole tree) taken in as
        ``storm.shellAgent``'s write where ``storm.shellEdits`` is adopt, else listed."""
        if only_adopting and shell_edits.policy(self.store, self.shell_edits) != shell_edits.ADOPT:
            return shell_edits.TakeIn()
        return shell_edits.take_in(self, paths, override=self.shell_edits, made_on=made_on)

    def _displaced(self, res: WriteResult) -> None:
        """An edit saved on disk between the write's check and its disk step (kept there, as
        storm never writes over one): the answer says so, and where shell edits are writes
        it is taken in on top of the accepted write (made on it, the version the shared
        ref then held), so the shared file is what the disk holds."""
        from ..disk.sync import KEPT

        kept = sorted(p for p, o in res.disk.items() if o == KEPT)
        if not kept:
            return
        taken = self.take_in_shell_edits(kept, only_adopting=True,
                                         made_on={p: res.versions.get(p) for p in kept})
        for p in kept:
            if p in taken.paths:
                res.displaced.append(p)
                res.warnings.append(f"{p}: an edit made outside storm while this write reached the disk replaced "
                                    f"it there; storm recorded it as {shell_edits.shell_agent(self.store)}'s write "
                                    f"({taken.write.commit if taken.write else '?'}): the shared file is now what "
                                    "the disk holds; read it again")
            else:
                res.warnings.append(f"{p}: an edit made outside storm while this write reached the disk is kept "
                                    "there (storm never writes over one): the disk differs from the shared version "
                                    "until it is adopted or checked out (git storm status)")

    def offer_rebased(self, agent: str, rejection: Rejection, seen: ReadEntry | None,
                       change: Any) -> rebased.Rebased | None:
        """The agent's change of the target re-applied on its current version (kept for
        ``write --rebased``), when it read a version of it and wrote text."""
        mine = change[0] if isinstance(change, tuple) else change
        if seen is None or not seen.blob or not isinstance(mine, bytes) or rejection.current_content is None:
            return None
        base = self.agent_content(rejection.path, pygit2.Oid(hex=seen.blob), None)
        offer = rebased.merge(rejection.path, base, mine, rejection.current_content,
                              read_version=seen.blob, current_version=rejection.current_version)
        if offer is not None:
            rebased.keep(self.store, agent, offer)
        return offer

    def write_rebased(self, path: str, *, agent: str | None, intent: str | None = None,
                      wait: bool = True, on_wait: OnWait | None = None) -> WriteResult:
        """Accept the rebased change the agent's last rejection of ``path`` offered: a
        validated write of it (rejected again if anything moved since)."""
        agent = validate_agent(agent)
        p = self.path(path, for_write=True)
        content, made_on = rebased.take(self.store, agent, p)
        now = entry_or_none(self.store, self.store.commit(self.head()).tree, p)
        if hex_(now.oid if now else None) != made_on:
            rebased.drop(self.store, agent, p)
            raise UsageError(f"{p} changed since the rebased change was offered to {agent}",
                             hint="write it again: the rejection then offers a new one")
        res = self.write(p, content, agent=agent, intent=intent, wait=wait, on_wait=on_wait)
        if res.accepted:
            rebased.drop(self.store, agent, p)
        return res

    # -- status and log ----------------------------------------------------------
    def status(self, *, diffs: bool = False, untracked_content: bool = False) -> Status:
        readsets.fold_all(self.store)  # status is where journals reach the notes at the latest
        head = self.head()
        tree = self.store.commit(head).tree
        agents, corrupt = [], []
        for a in readsets.agents(self.store):
            try:
                reads = readsets.peek(self.store, a)
            except readsets.CorruptReadSet as exc:  # that agent's problem: status still reports the rest
                corrupt.append(str(exc))
                continue
            stale = sorted(p for p, e in reads.items()
                           if hex_(getattr(entry_or_none(self.store, tree, p), "oid", None)) != e.blob)
            agents.append(AgentStatus(a, len(reads), stale))
        self.take_in_shell_edits(only_adopting=True)
        nested: list[str] = []
        edits = self.unmediated(diffs=diffs, untracked_content=untracked_content, nested=nested)
        news = self._branch_news(head)
        return Status(self.mode, str(head), agents, reservations.active(self.store),
                      extra={"unmediated": edits, **({"nested_repositories": nested} if nested else {}),
                             **({"branch_news": news.to_dict()} if news else {}),
                             **({"corrupt_read_sets": corrupt} if corrupt else {})})

    def _branch_news(self, head: pygit2.Oid) -> branch.BranchNews | None:
        """Commits the checked-out branch gained outside storm (the manager's commit merges them in)."""
        repo = self.store.repo
        if repo.head_is_unborn or repo.head_is_detached:
            return None
        try:
            return branch.news(self.store, repo.lookup_reference("HEAD").resolve(), head)
        except (pygit2.GitError, KeyError):
            return None

    # -- the shared working tree (storm_git.storm.commands, .adopt, .commit) ----------
    def exec(self, argv: list[str], *, agent: str | None, intent: str | None = None,
             timeout: float | None = None, wait: bool = True, on_wait: OnWait | None = None) -> ExecResult:
        """Run a command in the shared working tree; record what it changed as one write."""
        from .commands import exec_

        return exec_(self, argv, agent=agent, intent=intent, timeout=timeout, wait=wait, on_wait=on_wait)

    def adopt(self, paths: list[str], *, agent: str | None, intent: str | None = None,
              wait: bool = True, allow_revert: bool = False, on_wait: OnWait | None = None) -> WriteResult:
        """Record files edited outside storm as the agent's write, validated against
        the version each edit was made on."""
        from .adopt import adopt

        for p in paths:  # a name that is nowhere: said as such, not as "a directory" or "not modified"
            if isinstance(p, str) and p.endswith("/") and self._directory(p) is None:
                shown = p.rstrip("/") or p
                raise NotFound(f"{shown}/: no such directory on disk or in the shared workspace",
                               hint="git storm status lists the edits on disk")
        if any(self._directory(p) is not None for p in paths):  # a directory: its edits, as git add DIR
            paths = self._under_directories(paths, skip=("not-a-file",) if allow_revert else ("not-a-file", "reverted"))
            if not paths:
                raise UsageError("nothing to adopt under that directory: the disk holds the shared state there",
                                 hint="git storm status lists the edits on disk")
            return adopt(self, paths, agent=agent, intent=intent, wait=wait, allow_revert=allow_revert,
                         on_wait=on_wait, repo_relative=True)
        return adopt(self, paths, agent=agent, intent=intent, wait=wait, allow_revert=allow_revert,
                     on_wait=on_wait)

    def unmediated(self, *, diffs: bool = True, untracked_content: bool = False,
                   nested: list[str] | None = None) -> list[dict[str, Any]]:
        """Paths whose disk differs from what storm last put there (with diffs on request);
        ``nested`` receives the git repositories of their own that storm does not record."""
        from .adopt import unmediated

        return unmediated(self, diffs=diffs, untracked_content=untracked_content, nested=nested)

    def checkout(self, paths: list[str]) -> dict[str, str]:
        """Restore ``paths`` on disk from the shared head, discarding edits made there.
        A directory (``.`` for all) means every edited or deleted file of the shared
        state under it, as ``git checkout -- DIR`` restores tracked files: files the
        shared state does not have (``added``) are left, as git leaves untracked ones."""
        from ..disk.sync import restore

        if not paths:
            raise UsageError("no path given", hint="git storm checkout PATH... (git storm status lists them)")
        norm = self._under_directories(paths, skip=("added", "not-a-file"), check=True)
        return restore(self.store, norm) if norm else {}

    def _under_directories(self, paths: list[str], *, skip: tuple[str, ...], check: bool = False) -> list[str]:
        """``paths`` as repository paths, each directory among them replaced by the
        files under it that differ on disk (unmediated edits), but those in ``skip``
        states. ``check``: a file is checked on disk as ``path`` does."""
        out: list[str] = []
        edits: list[dict[str, Any]] | None = None
        for raw in paths:
            d = self._directory(raw)
            if d is None:
                out.append(self.path(raw) if check else normalize(raw, self.store.prefix, self.store.top))
                continue
            if edits is None:
                edits = self.unmediated(diffs=False)
            out.extend(u["path"] for u in edits if u["state"] not in skip and (not d or u["path"].startswith(d + "/")))
        return list(dict.fromkeys(out))

    def _directory(self, raw: str) -> str | None:
        """The repository path of the directory ``raw`` names ('' for the top), or None
        when it names something else (then ``path`` judges it)."""
        store = self.store
        if isinstance(raw, str) and raw and not os.path.isabs(raw):
            joined = posixpath.normpath(posixpath.join(store.prefix, raw)) if store.prefix else posixpath.normpath(raw)
            if joined in (".", ""):
                return ""
        elif isinstance(raw, str) and os.path.isabs(raw) and os.path.realpath(raw) == os.path.realpath(store.top):
            return ""
        try:
            p = normalize(raw.rstrip("/") if isinstance(raw, str) and len(raw) > 1 else raw, store.prefix, store.top)
        except BadPath:
            return None
        full = os.path.join(store.main_workdir, p)
        if os.path.isdir(full) and not os.path.islink(full):
            return p
        try:
            return p if isinstance(self.store.commit(self.head()).tree[p], pygit2.Tree) else None
        except KeyError:
            return None

    def commit(self, message: str, *, agent: str | None = None, adopt: bool = False,
               strict: bool = False, sign: bool | None = None, verify: bool = True,
               keep_shared: bool = False) -> CommitResult:
        """The manager commits the shared head's tree to the current branch (after
        merging in the commits the branch gained outside storm)."""
        from .commit import commit

        self.take_in_shell_edits(only_adopting=True)  # the commit holds what the disk holds
        return commit(self, message, agent=agent, adopt=adopt, strict=strict, sign=sign, verify=verify,
                      keep_shared=keep_shared)

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """Accepted writes (the shared ref's history) and recorded events, newest first."""
        return events.log(self.store, self.head(), limit)
