"""Agent ids: declared names that become ref-name components.

An id lands in ref names (``refs/notes/storm/agents/<id>``), branch names and
commit authors, so it must be one safe ref-name component. The rules are a strict
subset of git-check-ref-format(1) so that no id can escape its ref namespace.
"""
from __future__ import annotations

import os
import re

from .errors import BadAgent
from .files import append_rows, read_own, stamp

_AGENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" would accept a trailing newline

ENV_VAR = "STORM_AGENT"


def is_valid(agent: str) -> bool:
    """Whether ``agent`` is a safe id (validate_agent's rule, without raising)."""
    return bool(_AGENT_RE.fullmatch(agent)) and ".." not in agent and not agent.endswith((".", ".lock"))


def validate_agent(agent: str | None) -> str:
    """Return ``agent`` if it is a safe id, else raise BadAgent."""
    if agent is None or agent == "":
        raise BadAgent(
            "no agent id given",
            hint=f"pass --agent NAME or set {ENV_VAR}",
        )
    if not is_valid(agent):
        shown = agent.encode("unicode_escape").decode("ascii")
        raise BadAgent(
            f"invalid agent id '{shown}'",
            hint="use 1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter"
            " or digit, no '..', not ending in '.' or '.lock'",
        )
    return agent


def agent_from_env(agent: str | None) -> str:
    """The explicit id, or $STORM_AGENT, validated."""
    return validate_agent(agent if agent else os.environ.get(ENV_VAR))


# -- agents seen in the shared history (a remote workspace) ---------------------------
# A clone of a remote workspace fetches other machines' writes but not their agents'
# notes refs (storm_git.remote.workspace: holding every agent's notes ref made every git
# fetch and push of the clone walk them all). The ids of the agents whose writes it
# fetched are recorded here, one per line, so that intent comments of agents of other
# machines are recognised (storm_git.coordination.intents) without their notes.
SEEN_FILE = "agents-seen"
_SEEN_CACHE: dict[str, tuple[tuple[int, int, int], frozenset[str]]] = {}


def seen_path(commondir: str) -> str:
    return os.path.join(commondir, "storm", SEEN_FILE)


def seen_agents(commondir: str) -> frozenset[str]:
    """The ids recorded by :func:`record_seen` (parsed once per change of the file).
    A line that is not a valid id (a hand edit) and a last row without its newline
    are left out."""
    path = seen_path(commondir)
    st = stamp(path)
    if st is None:
        return frozenset()
    cached = _SEEN_CACHE.get(path)
    if cached is not None and cached[0] == st:
        return cached[1]
    raw = read_own(path) or b""
    rows = raw.decode("utf-8", "replace").split("\n")[:-1]  # after the last newline: a row not complete yet
    names = frozenset(n for n in rows if is_valid(n))
    _SEEN_CACHE[path] = (st, names)
    return names


def record_seen(commondir: str, names: set[str]) -> None:
    """Add the ids in ``names`` not recorded yet (the caller holds the workspace lock,
    which serialises the appenders). Invalid ids are never recorded."""
    new = sorted(n for n in names if is_valid(n) and n not in seen_agents(commondir))
    if not new:
        return
    path = seen_path(commondir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    append_rows(path, "".join(f"{n}\n" for n in new).encode("ascii"))
