"""The names of a remote clone's own state files under ``<git dir>/storm``.

``git storm doctor`` checks them too. Each is a regular file when present;
anything else there costs a remote write only speed (the queue's record) or makes
it wait or retry, and doctor moves it aside."""
from __future__ import annotations

GATE_FILE = "remote-gate"  # the clone's back-off: storm_git.remote.backoff.Backoff (one line)
REBASED_FILE = "remote-rebased"  # lines "<queued commit> <the same write on a newer head> <time>"
QUEUE_FILE = "remote-queue"  # "<tracked head> <local ref>", then "q <commit>" and "l <commit>" rows

FILES = (GATE_FILE, REBASED_FILE, QUEUE_FILE)
