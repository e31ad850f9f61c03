"""A validation's outcome, shared by the validator and the rejection it builds."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.store import Entry


class _MustReject:
    """Content of an edit that cannot be computed: validation must refuse it."""


MUST_REJECT = _MustReject()


@dataclass
class Verdict:
    """The outcome of the rule at one head: ``reason`` None means valid."""

    reason: str | None
    current: dict[str, Entry | None]  # each target's entry at that head
    conflicts: list[str]  # targets changed since read (or never read)
    stale: list[str]  # other files of the scope changed since read
