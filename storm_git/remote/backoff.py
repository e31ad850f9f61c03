"""A clone's back-off after stale leases: a jittered window that doubles with each loss in a row.

Kept in ``.git/storm/remote-gate`` and changed only with the clone's remote lock held
(:mod:`.client`), so every process of the clone backs off together: the clone, not each
writer, lost the race. A push that lands resets it.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

from ..core.files import NotRegularFile, read_own, replace_file
from ..core.store import Store
from .state_files import GATE_FILE

BACKOFF_BASE = 0.1  # seconds: the window after the first stale lease is up to twice this
BACKOFF_CAP = 2.0  # no window is longer


@dataclass(frozen=True)
class Backoff:
    """Stale leases in a row, and the ``time.monotonic()`` of this machine before which
    the clone pushes nothing."""

    streak: int = 0
    until: float = 0.0

    def encode(self) -> bytes:
        return f"{self.streak} {self.until}\n".encode("ascii")

    @classmethod
    def decode(cls, raw: bytes) -> Backoff:
        """The first two fields of the file; anything unreadable is no back-off."""
        try:
            p = raw.decode("ascii").split()
            return cls(int(p[0]), float(p[1]))
        except (UnicodeDecodeError, ValueError, IndexError):
            return cls()


def path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", GATE_FILE)


def read(store: Store) -> Backoff:
    """The clone's back-off (none when absent or not a regular file: doctor names that)."""
    try:
        raw = read_own(path(store))
    except (NotRegularFile, OSError):
        return Backoff()
    return Backoff() if raw is None else Backoff.decode(raw)


def write(store: Store, state: Backoff) -> None:
    p = path(store)
    if state == Backoff() and not os.path.exists(p):
        return
    replace_file(p, state.encode(), tmp=f"{p}.{os.getpid()}")


def after_push(state: Backoff, *, stale: bool) -> Backoff:
    """The back-off after a push: reset when it landed; after a stale lease, a random
    wait in a window that doubles with each loss in a row, up to BACKOFF_CAP."""
    if not stale:
        return Backoff()
    streak = state.streak + 1
    window = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(streak, 16))
    return Backoff(streak, time.monotonic() + random.uniform(0, window))


def wait(store: Store) -> None:
    """Sleep until the clone's back-off is over (remote lock held)."""
    delay = read(store).until - time.monotonic()
    if delay > 0:
        time.sleep(min(delay, BACKOFF_CAP))
