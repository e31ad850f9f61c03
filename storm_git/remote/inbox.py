"""A clone's side of the server's ordering: push the queue to its inbox, read the verdicts.

A server that orders writes (storm_git.remote.server_order; it has
``refs/storm/ordering``, which every fetch of ``refs/storm/*`` copies) takes a
clone's queued writes at ``refs/storm/inbox/<clone>/workspace`` and the notes refs
of their agents at ``refs/storm/inbox/<clone>/notes/<agent>``, applies them in
arrival order and answers for each write: one ``ok`` line per write landed
(``refs/storm/workspace``, the head it went on and the commit it became), the
rest not applied. No lease can go stale: a push is never lost to another clone's.

``<clone>`` names the clone for the server's log and for people; it gives no
rights (the server's authentication does) and needs no record: it is derived
from the host and the repository's path.
"""
from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass, field

import pygit2

from ..core.store import AGENTS_PREFIX, WORKSPACE_REF, Store
from . import transport
from .server_hook import GUARD_NAME, INBOX_PREFIX, NO_ORDERING, ORDERING_REF
from .server_order import BUSY, NOT_APPLIED, inbox_ref
from .transport import tracking_ref

# what receive-pack says when the hook died or answered nothing: the writes may have
# landed (the hook commits, then answers); the same queue is pushed again to learn it
_HOOK_FAILED = ("proc-receive", "failed to report", "unpacker error", "unpack failed")


def clone_name(store: Store) -> str:
    """This clone's name in its inbox ref: stable, and distinct per host and path."""
    key = f"{socket.gethostname()}\0{os.path.realpath(store.commondir)}".encode("utf-8", "surrogateescape")
    return hashlib.sha1(key).hexdigest()[:16]


def server_orders(store: Store, remote: str) -> bool:
    """Whether ``remote`` ordered writes when last fetched (its ``refs/storm/ordering``)."""
    return store.ref_target(tracking_ref(remote, ORDERING_REF)) is not None


@dataclass
class InboxAnswer:
    """The server's answer to one push to the inbox."""

    landed: list[tuple[pygit2.Oid, pygit2.Oid]] = field(default_factory=list)  # (head it went on, landed as)
    notes: dict[str, pygit2.Oid] = field(default_factory=dict)  # agent notes ref -> its value there now
    refused: str | None = None  # the guard refused the push: nothing of it applied
    not_applied: str | None = None  # no write applied: each conflicts with what the head has now
    notes_refused: str | None = None  # an agent's notes ref the server has from another clone
    busy: str | None = None  # the server could not take its turn: push again
    unclear: str | None = None  # the answer was lost (the hook died, the connection broke): push again
    unordered: str | None = None  # the server does not order writes after all: push with a lease
    unreachable: str | None = None
    stray: list[str] = field(default_factory=list)  # inbox refs a server without the hook created

    @property
    def head(self) -> pygit2.Oid | None:
        """The last commit this push landed (the head as it left it, or an ancestor of it)."""
        return self.landed[-1][1] if self.landed else None


def push(store: Store, remote: str, tip: pygit2.Oid, notes: dict[str, pygit2.Oid]) -> InboxAnswer:
    """Push the queue ending at ``tip`` and the agents' ``notes`` (agent -> notes
    commit) to this clone's inbox; the server's answer, read (never raises for it)."""
    clone = clone_name(store)
    updates: list[tuple[str, str, str | None]] = [(str(tip), inbox_ref(clone, WORKSPACE_REF), None)]
    updates += [(str(oid), inbox_ref(clone, AGENTS_PREFIX + a), None) for a, oid in notes.items()]
    return read_answer(transport.push(store, remote, updates, atomic=False))


def read_answer(out: transport.PushOutcome) -> InboxAnswer:
    """The verdicts in ``git push --porcelain``'s lines (transport.push)."""
    ans = InboxAnswer()
    if not out.lines:
        if out.unreachable:
            ans.unreachable = transport.describe_failure(out)
        else:  # the push died before any answer: the server may or may not have it
            ans.unclear = transport.describe_failure(out)
        return ans
    if NO_ORDERING in out.stderr:
        ans.unordered = NO_ORDERING
        return ans
    for flag, _src, dst, summary in out.lines:
        if flag != "!" and dst.startswith(INBOX_PREFIX):  # a server without the hook made the ref itself
            ans.stray.append(dst)
            ans.unordered = f"{dst} was created as a ref: the server has no storm proc-receive hook"
        elif flag != "!" and dst == WORKSPACE_REF:
            old, _dots, new = summary.partition("..")
            try:
                ans.landed.append((pygit2.Oid(hex=old), pygit2.Oid(hex=new.rstrip("."))))
            except ValueError:
                ans.unclear = f"cannot read the server's answer {summary!r}"
        elif flag != "!" and dst.startswith(AGENTS_PREFIX):
            ans.notes[dst] = pygit2.Oid(hex=_src)
        elif flag == "!":
            _refusal(ans, dst, _reason(summary), out.stderr)
    return ans


def _reason(summary: str) -> str:
    """The reason in a refusal's summary: ``[remote rejected] (reason)``."""
    start, end = summary.find("("), summary.rfind(")")
    return summary[start + 1:end] if 0 <= start < end else summary


def _refusal(ans: InboxAnswer, dst: str, reason: str, stderr: str) -> None:
    if reason.startswith(GUARD_NAME):
        ans.refused = ans.refused or reason
    elif reason.startswith(BUSY):
        ans.busy = reason
    elif reason.startswith(NOT_APPLIED):
        ans.not_applied = reason
    elif reason.startswith("non-fast-forward") and "/notes/" in dst:
        ans.notes_refused = ans.notes_refused or AGENTS_PREFIX + dst.rsplit("/notes/", 1)[1]
    elif reason.startswith("not applied"):
        pass  # a notes ref that goes with a write not applied: the queue's own line says why
    elif "pre-receive hook declined" in reason:  # before anything was applied: a refusal
        guard = [ln.split("remote:", 1)[1].strip() for ln in stderr.splitlines() if GUARD_NAME in ln]
        ans.refused = ans.refused or (guard[0] if guard else f"{dst}: {reason}")
    elif "fail to negotiate version with proc-receive hook" in stderr:
        # the hook never read the push (it cannot start: its interpreter gone): nothing
        # applied; the guard decides whether the lease may go instead
        ans.unordered = f"the server's proc-receive hook does not run: {reason}"
    elif any(m in reason for m in _HOOK_FAILED):
        ans.unclear = ans.unclear or reason
    else:
        ans.refused = ans.refused or reason


def remove_stray(store: Store, remote: str, refs: list[str]) -> None:
    """Delete inbox refs a server without the hook created (best effort: nothing reads them)."""
    if refs:
        try:
            transport.push(store, remote, [("", r, None) for r in refs], atomic=False)
        except transport.Unreachable:
            pass
