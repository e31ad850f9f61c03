"""Partial clones (``git clone --filter=blob:none``): blobs git left on the server.

A partial clone has every commit and tree but only the blobs its checkout needed;
git fetches any other blob from the clone's *promisor* remote the first time a
command needs it (git's "lazy fetch"). libgit2 has no lazy fetch: it reports such
a blob missing. Storm said "blob … is missing (run git fsck)" on a healthy clone,
so an agent could not read a file outside the sparse checkout of a blobless clone,
and a blobless clone that joined a shared workspace on a remote failed on the
first file another machine wrote (the fetch of the storm refs inherited the clone's
``blob:none`` filter; :mod:`storm_git.remote.transport` now fetches them whole).

Storm fetches what is missing as git does, with the command git's lazy fetch runs
(``git fetch <promisor> --filter=blob:none --stdin``, the ids on stdin), once for
all the blobs a command needs at once (:func:`prefetch`, called by a read of many
paths) and otherwise once per blob. Nothing here runs in a clone that is not
partial: a missing object there is corruption, as before.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterable

import pygit2

from .errors import CorruptState, Unreachable

FETCH_TIMEOUT = 300.0  # seconds: a large blob on a slow link; git itself waits for ever


def remote_of(repo: pygit2.Repository) -> str | None:
    """The remote a partial clone fetches missing objects from, None when it is not one:
    ``extensions.partialClone`` (older gits), else the first ``remote.<name>.promisor``."""
    try:
        config = repo.config
        if "extensions.partialclone" in config:
            return str(config["extensions.partialclone"])
        for name in repo.remotes.names():
            key = f"remote.{name}.promisor"
            if key in config and config.get_bool(key):
                return name
    except (pygit2.GitError, ValueError):
        return None
    return None


def missing(repo: pygit2.Repository, oids: Iterable[pygit2.Oid]) -> list[pygit2.Oid]:
    """The ids of ``oids`` that are not in the object store (each once, in order)."""
    exists = repo.odb.exists
    return [o for o in dict.fromkeys(oids) if not exists(o)]


def fetch(repo: pygit2.Repository, cwd: str, oids: list[pygit2.Oid], env: dict[str, str]) -> None:
    """Fetch ``oids`` from the promisor remote in one ``git fetch``.

    Raises CorruptState when the clone is not partial (a missing object is then
    damage: ``git fsck``), Unreachable when the fetch failed or did not bring them."""
    remote = remote_of(repo)
    if remote is None:
        raise CorruptState(f"blob {oids[0]} is missing", hint="run git fsck")
    # what git's lazy fetch runs (promisor-remote.c): no negotiation, no tags, no FETCH_HEAD
    args = ["git", "-c", "fetch.negotiationAlgorithm=noop", "fetch", remote, "--no-tags",
            "--no-write-fetch-head", "--recurse-submodules=no", "--filter=blob:none", "--stdin"]
    env = {**env, "GIT_TERMINAL_PROMPT": "0"}  # an agent's command never waits at a password prompt
    what = f"{len(oids)} blobs" if len(oids) > 1 else f"blob {oids[0]}"
    try:
        r = subprocess.run(args, cwd=cwd, input="".join(f"{o}\n" for o in oids).encode(),
                           capture_output=True, env=env, timeout=FETCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Unreachable(f"fetching {what} of this partial clone from {remote} took more than "
                          f"{FETCH_TIMEOUT:.0f}s", hint="check the network and the server, then retry") from None
    except OSError as exc:
        raise Unreachable(f"cannot run git to fetch {what} from {remote}: {exc}") from None
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[0] if lines else "failed")
        raise Unreachable(f"{what} of this partial clone could not be fetched from {remote}: {why}",
                          hint="check that the server is up and reachable, then retry; nothing was changed")
    still = missing(repo, oids)  # libgit2 rescans the packs on a miss: it sees the new pack
    if still:
        raise Unreachable(f"{remote} did not send blob {still[0]} of this partial clone",
                          hint="the server may not allow fetching objects by id (uploadpack.allowAnySHA1InWant)")


def prefetch(repo: pygit2.Repository, cwd: str, oids: Iterable[pygit2.Oid], env: dict[str, str]) -> int:
    """In a partial clone, fetch those of ``oids`` that are missing, in one go (a read
    of many paths would otherwise fetch them one by one). Returns how many were."""
    if remote_of(repo) is None:
        return 0
    need = missing(repo, oids)
    if need:
        fetch(repo, cwd, need, env)
    return len(need)
