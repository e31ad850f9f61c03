"""Edits made on disk outside storm: listed (``unmediated``) and recorded (``adopt``).

An edit on disk was made on the version storm last put there (the disk record):
adopting it is a write validated against that version, so an edit made on an
old version can never undo a newer accepted write.
"""
from __future__ import annotations

import os
from typing import Any

from ..core.agents import validate_agent
from ..core.convert import Conversions
from ..core.diffs import is_binary, unified
from ..core.errors import BadPath, NotFound, NotInitialised, UsageError
from ..core.locks import flocked
from ..core.paths import check_on_disk, normalize
from ..core.payloads import WriteResult
from ..core.secret_files import likely_secret
from ..core.store import MODE_LINK, WORKSPACE_REF, hex_
from ..disk import sync as disk_sync
from ..disk.safe_fs import disk_state, same
from .reverts import reverted_paths
from .snapshot import (
    check_recordable,
    converted,
    entry_at,
    raise_failed_conversion,
    read_disk_content,
    snapshot,
    version_at,
    with_mode,
)
from .validated_writer import OnWait, ValidatedWriter


# -- unmediated edits ---------------------------------------------------------------
def unmediated(ws: ValidatedWriter, *, diffs: bool = True, untracked_content: bool = False,
               nested: list[str] | None = None) -> list[dict[str, Any]]:
    """Every path whose disk differs from what storm last put there, with the
    version it was made on (``base_version``) and, on request, its diff.
    ``nested``: receives the git repositories of their own found in the tree."""
    store = ws.store
    with flocked(store.commondir, "worktree"):
        snap = snapshot(store)
        if nested is not None:
            nested.extend(snap.nested)
        reverted = reverted_paths(store, snap.head, snap.dirty, snap.record)
        conv = Conversions(store)
        out = []
        for path in sorted(snap.dirty):
            have = snap.dirty[path]
            base = entry_at(store, snap.record, path)
            cur = version_at(store, snap.tree, path)
            if have is False:
                state = "not-a-file"
            elif path in reverted:
                state = "reverted"
            elif have is None:
                state = "deleted"
            elif base is None:
                state = "added"
            elif have[0] == base.oid:
                state = "mode-changed"
            else:
                state = "modified"
            item = {"path": path, "state": state, "shared_version": hex_(cur),
                    "base_version": hex_(base.oid) if base else None,
                    "behind": (base.oid if base else None) != cur,
                    "disk_version": hex_(have[0]) if isinstance(have, tuple) else None,
                    # an untracked .env, key…: for .gitignore, never for commit --adopt
                    "likely_secret": state == "added" and likely_secret(path)}
            show = diffs and have is not False and (state != "added" or untracked_content)
            if show:
                old = store.blob_bytes(base.oid) if base else None
                new = read_disk_content(store, path) if have is not None else None
                if new is not None and have[1] != MODE_LINK:
                    new = converted(conv, path, new)  # as git diff shows it: the CRLF of a checkout is no change
                item["binary"] = is_binary(old) or is_binary(new)
                item["diff"] = unified(path, old, new)
            out.append(item)
    return out


# -- adopt ---------------------------------------------------------------------------
class RevertRefused(UsageError):
    """Adopting content that is an older shared version would undo accepted work."""

    kind = "reverted"


def adopt(ws: ValidatedWriter, paths: list[str], *, agent: str | None, intent: str | None = None,
          wait: bool = True, repo_relative: bool = False, allow_revert: bool = False,
          on_wait: OnWait | None = None) -> WriteResult:
    """Record the disk content of ``paths`` (edited outside storm) as ``agent``'s write.

    Validated against the version each edit was made on (the disk record), plus
    the agent's read set: an edit made on an older version than the shared head
    is a direct conflict with the diff, never a silent revert of a newer write.
    """
    agent = validate_agent(agent)
    store = ws.store
    prefix = "" if repo_relative else store.prefix
    norm = list(dict.fromkeys(normalize(p, prefix, store.top) for p in paths))
    if not norm:
        raise UsageError("no path given", hint="name the files to adopt (git storm status lists them)")
    changes: dict[str, Any] = {}
    expected: dict[str, str | None] = {}
    with flocked(store.commondir, "worktree"):
        disk_sync.sync_locked(store, norm)  # a path that was only behind is brought forward, not adopted
        rtree, _ = disk_sync.record_tree(store)
        head = store.ref_target(WORKSPACE_REF)
        if head is None:
            raise NotInitialised("storm is not initialised in this repository", hint="run git storm init")
        conv = Conversions(store)
        states = {}
        for p in norm:
            if os.path.lexists(os.path.join(store.main_workdir, p)):
                check_on_disk(p, store.main_workdir, for_write=False)  # a directory, a link out
            have = disk_state(store.main_workdir, p, conv=conv)
            base = entry_at(store, rtree, p)
            if have is False:
                raise_failed_conversion(store, conv, p)
                raise BadPath(f"{p} is not a regular file on disk (or lies beyond a symbolic link)",
                              hint="storm adopts regular files and symbolic links inside the repository")
            if have is None and base is None and entry_at(store, store.commit(head).tree, p) is None:
                raise NotFound(f"{p}: no such file on disk or in the shared workspace",
                               hint="git storm status lists the edits on disk")
            if same(have, base):
                cur = entry_at(store, store.commit(head).tree, p)
                raise UsageError(f"{p} is not modified: the disk holds what storm put there"
                                 + ("" if same(have, cur) else " (it could not be brought up to date)"),
                                 hint="nothing to adopt; git storm status lists unmediated edits")
            check_recordable(store, p, have, ws)
            states[p] = have
        reverted = reverted_paths(store, head, states, rtree)
        if reverted and not allow_revert:
            names = ", ".join(sorted(reverted)[:5])
            raise RevertRefused(f"{names}: the disk holds an older shared version (a git stash or reset?); "
                                "adopting it would undo accepted writes",
                                hint="git storm checkout PATH restores the shared version; "
                                     "pass --allow-revert if the revert is intended")
        for p, have in states.items():
            content = read_disk_content(store, p) if have is not None else None
            if content is not None:
                ws.check_size(p, content)
            changes[p] = with_mode(content, have, entry_at(store, rtree, p))
            expected[p] = hex_(version_at(store, rtree, p))
    return ws.apply(agent, changes, intent=intent or f"storm: {agent} adopts {', '.join(norm[:3])}",
                    deps=None, wait=wait, op="adopt", expected=expected, on_wait=on_wait)
