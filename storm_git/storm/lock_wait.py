"""How long a door's process waits for one of storm's locks, and what it says meanwhile.

A door (the CLI, a harness hook) sets its own policy before any storm verb runs.
Standard library only: a hook sets it before it imports the rest of storm, so a
broken install still reaches the hook's own error answer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.locks import WaitPolicy, set_wait_policy


def set_lock_wait(timeout: Callable[[str], float | None], on_wait: Callable[[Any], None]) -> None:
    """``timeout``: seconds to wait by common git dir (None: as long as it takes);
    ``on_wait``: told once a wait starts."""
    set_wait_policy(WaitPolicy(timeout=timeout, on_wait=on_wait))


def lock_timeout(commondir: str, *, cap: float | None = None) -> float | None:
    """``storm.lockTimeout`` in seconds (None: as long as it takes), at most ``cap``."""
    from ..core.locks import lock_timeout as configured

    return configured(commondir, cap=cap)
