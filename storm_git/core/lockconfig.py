"""``storm.lockTimeout``: how long a command waits for one of storm's locks.

Read only when a lock is actually waited for (the fast path never reads it), by
the command line and by the harness hook alike (the hook caps it well inside the
harness's own timeout)."""
from __future__ import annotations

import subprocess

from .errors import UsageError
from .store import git_env

DEFAULT_LOCK_TIMEOUT = 300.0


def lock_timeout(commondir: str, *, cap: float | None = None) -> float | None:
    """``storm.lockTimeout`` in seconds (None: wait as long as it takes), at most ``cap``."""
    r = subprocess.run(["git", "--git-dir", commondir, "config", "--get", "storm.lockTimeout"],
                       capture_output=True, env=git_env())
    raw = r.stdout.decode("utf-8", "replace").strip()
    try:
        value = float(raw) if raw else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        value = -1.0
    if value < 0 or value != value:
        raise UsageError(f"storm.lockTimeout is {raw!r}, not a number of seconds",
                         hint="git config storm.lockTimeout 300 (0: wait as long as it takes)")
    out = None if value == 0 else value
    return out if cap is None else min(out if out is not None else cap, cap)
