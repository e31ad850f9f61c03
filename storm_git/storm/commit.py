"""The manager's commit (storm mode): the shared state becomes a commit on the branch.

In storm mode engineers never commit; their accepted writes are the history of
``refs/storm/workspace``. The manager (``storm.manager``, default ``manager``)
integrates: ``commit`` makes a commit on the current branch whose tree is the
shared head's tree, whose parent is the branch tip, and whose trailers name the
agents whose writes it contains since the previous such commit. Afterwards the
index is reset to that tree, so ``git status`` is clean when the disk matches
the shared head. Unmediated edits on disk are reported, adopted with ``--adopt``
(validated against the version each was made on), or refused with ``--strict``.

``refs/storm/committed`` remembers the shared head last committed, and a
``commit`` event in ``refs/storm/log`` lists the writes each commit contains.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile

import pygit2

from ..core import events, signing, trailers
from ..core.agents import validate_agent
from ..core.errors import OperationInProgress, RepoStateError, StormError, UsageError
from ..core.locks import flocked
from ..core.payloads import CommitResult
from ..core.store import Store, git_env, ref_oid, signature
from . import branch, index
from .adopt import adopt, unmediated
from .validated_writer import ValidatedWriter

COMMITTED_REF = "refs/storm/committed"
DEFAULT_MANAGER = "manager"
MAX_WALK = 100000
MAX_LISTED_WRITES = 1000


class UnmediatedEdits(RepoStateError):
    """The disk holds edits storm did not record; committing would hide them."""

    kind = "unmediated_edits"


class AdoptRejected(StormError):
    """``commit --adopt`` could not record the unmediated edits (a conflict)."""

    kind = "rejected"
    exit_code = 1


def manager_id(store: Store) -> str:
    return str(store.config_get("storm.manager", DEFAULT_MANAGER) or DEFAULT_MANAGER)


def writes_since(store: Store, head: pygit2.Oid, since: pygit2.Oid | None) -> list[pygit2.Commit]:
    """Accepted writes on the shared ref after ``since`` (oldest first)."""
    out = []
    c = store.commit(head)
    for _ in range(MAX_WALK):
        if since is not None and c.id == since:
            break
        if "Storm-Agent" not in trailers.parse(c.message):
            break  # the commit storm was initialised from
        out.append(c)
        if not c.parent_ids:
            break
        c = store.commit(c.parent_ids[0])
    out.reverse()
    return out


def _identity(store: Store, fallback: str) -> pygit2.Signature:
    """The person committing: GIT_COMMITTER_*, then user.name/email, then the manager id."""
    name = os.environ.get("GIT_COMMITTER_NAME") or store.config_get("user.name")
    email = os.environ.get("GIT_COMMITTER_EMAIL") or store.config_get("user.email")
    if name and email:
        return pygit2.Signature(str(name), str(email))
    return signature(fallback)


def format_message(message: str, agents: list[str], head: pygit2.Oid, writes: int) -> str:
    lines = [message.strip(), ""]
    if agents:
        lines.append(f"Storm-Agents: {', '.join(agents)}")
        lines += [f"Storm-Agent: {a}" for a in agents]
    lines.append(f"Storm-Workspace: {head}")
    lines.append(f"Storm-Writes: {writes}")
    return "\n".join(lines) + "\n"


class HookRefused(RepoStateError):
    """The repository's commit-msg hook refused the manager's commit (exit 3)."""

    kind = "hook_refused"


def _hook(store: Store, name: str, *args: str) -> subprocess.CompletedProcess:
    """Run the repository's ``name`` hook as git commit would (``git hook run``: it
    finds core.hooksPath, or the hooks directory); nothing when there is none."""
    return subprocess.run(["git", "hook", "run", "--ignore-missing", name, "--", *args], cwd=store.top,
                          env=git_env(GIT_DIR=store.gitdir, GIT_WORK_TREE=store.top, GIT_EDITOR=":"),
                          capture_output=True, stdin=subprocess.DEVNULL)


def _commit_msg(store: Store, text: str) -> str:
    """The message after the repository's commit-msg hook, which may rewrite it (a
    Gerrit Change-Id, a DCO sign-off) or refuse it, as for git commit: without it a
    Change-Id that the server requires would be missing and a hook that refuses a
    message format bypassed."""
    fd, path = tempfile.mkstemp(prefix="STORM_COMMIT_EDITMSG.", dir=store.gitdir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        r = _hook(store, "commit-msg", path)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).decode("utf-8", "replace").strip().splitlines()
            raise HookRefused("the commit-msg hook refused the commit: "
                              + (said[-1] if said else f"exit {r.returncode}"),
                              hint="fix the message (-m), or commit without the hooks: git storm commit --no-verify")
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def commit(ws: ValidatedWriter, message: str, *, agent: str | None = None, adopt: bool = False,
           strict: bool = False, sign: bool | None = None, verify: bool = True,
           keep_shared: bool = False) -> CommitResult:
    """The shared head's tree becomes a commit on the branch. Unmediated edits on
    disk are not part of the shared state: they are reported (like git's untracked
    files), adopted first with ``adopt`` (validated against the version each was
    made on; a reverted file or an untracked file named like a secret is never
    adopted: storm_git.core.secret_files), or refused with ``strict``.
    ``sign``: GPG/SSH-sign it (None: as ``commit.gpgSign`` says; storm_git.core.signing).
    ``verify``: run the repository's commit-msg hook on the message and its
    post-commit hook after, as git commit does (``--no-verify`` skips them).
    Commits the branch gained outside storm are merged into the shared workspace
    first (:func:`storm_git.storm.branch.integrate`; ``keep_shared``: the shared version resolves
    paths both changed)."""
    store = ws.store
    manager = manager_id(store)
    who = validate_agent(agent) if agent else validate_agent(manager)
    if who != manager:
        raise UsageError(f"{who} is not the manager ({manager}): in storm mode only the manager commits "
                         "the shared state",
                         hint="engineers' accepted writes are already shared; the manager runs "
                              "git storm commit -m MSG (git config storm.manager names it)")
    if not message or not message.strip():
        raise UsageError("empty commit message", hint="git storm commit -m 'what this integrates'")
    if store.repo.head_is_detached:
        raise UsageError("HEAD is detached", hint="check out the branch the shared state goes to")
    if store.repo.head_is_unborn:
        raise RepoStateError("the branch has no commit yet", hint="make a first commit")
    _no_operation_in_progress(store)
    news, brought = branch.integrate(ws, manager, keep_shared=keep_shared)
    pending = unmediated(ws, diffs=False)  # also brings every path that was only behind forward
    adopted: list[str] = []
    if pending and adopt:
        # never a reverted file (it would undo accepted work), nor an untracked .env or key
        # (git storm adopt PATH records one on purpose; .gitignore is where it belongs)
        adoptable = [u["path"] for u in pending
                     if u["state"] not in ("reverted", "not-a-file") and not u["likely_secret"]]
        if adoptable:
            res = _adopt(ws, adoptable, manager)
            if not res.accepted:
                raise AdoptRejected(f"could not adopt the unmediated edits: {res.rejection.message}",
                                    hint="they were made on a version another agent has replaced since; "
                                         "git storm status -v shows them")
            adopted = adoptable
            pending = [u for u in pending if u["path"] not in adopted]
    if pending and strict:
        names = ", ".join(u["path"] for u in pending[:10]) + (" …" if len(pending) > 10 else "")
        raise UnmediatedEdits(f"{len(pending)} unmediated edit(s) on disk: {names}",
                              hint="record them with git storm adopt PATH... --agent ID (or --adopt), "
                                   "or restore them with git storm checkout PATH; git storm status -v shows them")

    with index.locked(store) as index_lock:  # before the branch moves, held until the index has its tree
        with flocked(store.commondir, "workspace"):
            head = ws.head()
            shared = store.commit(head)
            branch_ref = store.repo.lookup_reference("HEAD").resolve()
            if branch.news(store, branch_ref, head) is not None:  # moved again since it was merged in
                raise RepoStateError(f"{branch_ref.shorthand} moved outside storm while committing; nothing "
                                     "was committed", hint="run git storm commit again")
            parent = store.commit(ref_oid(branch_ref))
            committed = store.ref(COMMITTED_REF)
            since = ref_oid(committed) if committed is not None else None
            writes = writes_since(store, head, since)
            agents = sorted({trailers.parse(c.message).get("Storm-Agent", [c.author.name])[0] for c in writes})
            paths = sorted({p for c in writes for p in trailers.parse(c.message).get("Storm-Path", [])})
            new = None
            if shared.tree.id != parent.tree.id:
                sig = _identity(store, manager)
                text = format_message(message, agents, head, len(writes))
                if verify:  # under the lock: the trailers name this head (a slow hook holds writers back)
                    text = _commit_msg(store, text)
                new = signing.make_commit(store, shared.tree.id, [parent.id], sig, sig, text,
                                          sign=signing.wanted(store, sign))
                index_lock.write(new)  # a kill from here on: doctor knows the index must follow
                if not store.cas(branch_ref, branch_ref.name, new, f"storm commit: {trailers.subject(text)}"):
                    raise RepoStateError(f"{branch_ref.shorthand} moved while committing",
                                         hint="run git storm commit again")
            if since != head:
                store.cas(committed, COMMITTED_REF, head, "storm: committed")
            branch.record(store, new if new is not None else parent.id)
            events.append(store, "commit", manager,
                          f"{manager} committed {len(writes)} write(s) to {branch_ref.shorthand}",
                          {"commit": str(new) if new else None, "branch": branch_ref.shorthand,
                           "workspace": str(head), "agents": agents, "count": len(writes),
                           "writes": [str(c.id) for c in writes[-MAX_LISTED_WRITES:]]})
        if new is not None:
            index.reset(store, shared.tree.id)
    if new is not None and verify:
        _hook(store, "post-commit")  # as for git commit: its exit status changes nothing
    return CommitResult(str(new) if new else None, branch_ref.shorthand, agents, len(writes), paths,
                        message.strip() if new else "nothing to commit: the branch already has the shared tree",
                        adopted=adopted, unmediated=[{"path": u["path"], "state": u["state"],
                                                      "likely_secret": u["likely_secret"]} for u in pending],
                        branch_news=news.to_dict() | {"paths": brought} if news else None)


# libgit2's repository states -> (what is under way, how a person ends it)
_OPERATIONS = {
    "MERGE": ("a merge", "record the resolved files with git storm adopt PATH... --agent ID, then "
                         "git merge --continue (the guard lets it through once the staged tree is the shared "
                         "one); or git merge --abort"),
    "REVERT": ("a revert", "git revert --continue, or git revert --abort"),
    "REVERT_SEQUENCE": ("a revert", "git revert --continue, or git revert --abort"),
    "CHERRYPICK": ("a cherry-pick", "git cherry-pick --continue, or git cherry-pick --abort"),
    "CHERRYPICK_SEQUENCE": ("a cherry-pick", "git cherry-pick --continue, or git cherry-pick --abort"),
    "BISECT": ("a bisect", "git bisect reset"),
    "REBASE": ("a rebase", "git rebase --continue, or git rebase --abort"),
    "REBASE_INTERACTIVE": ("a rebase", "git rebase --continue, or git rebase --abort"),
    "REBASE_MERGE": ("a rebase", "git rebase --continue, or git rebase --abort"),
    "APPLY_MAILBOX": ("git am", "git am --continue, or git am --abort"),
    "APPLY_MAILBOX_OR_REBASE": ("a rebase or git am", "git rebase --abort or git am --abort"),
}


def _no_operation_in_progress(store: Store) -> None:
    """Refuse to commit over a person's merge (rebase, …) in progress: the commit resets
    the index to the shared tree, which would drop its conflict stages while MERGE_HEAD
    stays, and the person's next git commit would record a merge of the wrong content."""
    state = store.repo.state()
    if state:
        what, end = _OPERATIONS.get(getattr(state, "name", ""), ("a git operation", "finish or abort it"))
        raise OperationInProgress(f"{what} is in progress in {store.top}; git storm commit would discard "
                                  "its state", hint=f"end it first ({end}), then commit again; nothing was changed")


def _adopt(ws: ValidatedWriter, paths: list[str], manager: str):
    return adopt(ws, paths, agent=manager, intent=f"{manager}: adopt unmediated edits before commit",
                 repo_relative=True)
