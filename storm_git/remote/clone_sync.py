"""``git storm sync`` and ``git storm push-reads`` on a clone of a shared workspace."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import readsets
from ..core.errors import RepoStateError
from ..core.locks import flocked
from ..core.readsets import agent_ref
from ..core.store import WORKSPACE_REF, Store
from . import transport
from .branch_follow import follow
from .exchange import adopt_tracking, exchanging, learn_writers
from .transport import Unreachable, tracking_ref
from .workspace import RemoteWorkspace
from .write_queue import force


@dataclass
class RemoteSyncResult:
    remote: str
    before: str
    head: str
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    branch: dict[str, Any] | None = None  # what following the server's branch did (branch_follow)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sync_remote(store: Store, remote: str) -> RemoteSyncResult:
    """``git storm sync``: fetch the storm refs and converge the working tree to the
    shared head (a local unmediated edit is kept, as everywhere in storm)."""
    from ..disk.sync import sync

    before = store.ref_target(WORKSPACE_REF)
    ws = RemoteWorkspace(store, remote)
    ws.flush()  # writes queued here by processes that stopped before pushing them
    with exchanging(store):
        ws.fetch_adopt()  # the working tree needs no agent's notes (status and log fetch them)
    res = sync(store, full=True)
    followed = follow(store, remote)
    return RemoteSyncResult(remote, str(before), str(res.head), res.outcomes, res.errors, followed.to_dict())


def push_reads(store: Store, remote: str, agent: str) -> dict[str, Any]:
    """Fold the agent's journal and push its notes ref alone (fast-forward only)."""
    readsets.fold(store, agent)
    with exchanging(store):
        transport.fetch(store, remote, [agent])
        with flocked(store.commondir, "workspace"):
            learn_writers(store, remote)
            adopt_tracking(store, remote)
        mine = store.ref_target(agent_ref(agent))
        theirs = store.ref_target(tracking_ref(remote, agent_ref(agent)))
        if mine is None or mine == theirs:
            return {"agent": agent, "pushed": False, "notes": str(mine) if mine else None}
        out = transport.push(store, remote, [(str(mine), agent_ref(agent), None)])
        if not out.ok:
            if out.unreachable:
                raise Unreachable(f"cannot push the reads of {agent} to {remote}: {transport.describe_failure(out)}",
                                  hint="check that the server is up, then retry; the reads stay recorded here")
            raise RepoStateError(f"{remote} did not take the notes of {agent}: {transport.describe_failure(out)}",
                                 hint="an agent id works from one clone at a time; use another --agent here")
        with flocked(store.commondir, "workspace"):
            force(store, tracking_ref(remote, agent_ref(agent)), mine)
    return {"agent": agent, "pushed": True, "notes": str(mine)}
