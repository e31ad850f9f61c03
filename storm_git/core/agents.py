"""Agent ids: declared names that become ref-name components.

An id lands in ref names (``refs/notes/storm/agents/<id>``), branch names and
commit authors, so it must be one safe ref-name component. The rules are a strict
subset of git-check-ref-format(1) so that no id can escape its ref namespace.
"""
from __future__ import annotations

import os
import re

from .errors import BadAgent

_AGENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" would accept a trailing newline

ENV_VAR = "STORM_AGENT"


def validate_agent(agent: str | None) -> str:
    """Return ``agent`` if it is a safe id, else raise BadAgent."""
    if agent is None or agent == "":
        raise BadAgent(
            "no agent id given",
            hint=f"pass --agent NAME or set {ENV_VAR}",
        )
    if (
        not _AGENT_RE.fullmatch(agent)
        or ".." in agent
        or agent.endswith(".")
        or agent.endswith(".lock")
    ):
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
