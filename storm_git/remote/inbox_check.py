"""The pre-receive side of a push to a clone's inbox: refuse what can be refused
while git still holds the push's objects apart.

git receives a push's objects into a quarantine directory and runs the pre-receive
hook with them there; a push the hook refuses is dropped with its quarantine. Once
the hook accepts, git moves the objects into the repository and only then runs the
proc-receive hook (:mod:`.server_order`, which orders the writes): whatever that
hook refuses stays in the object store until ``git gc`` prunes it (a ``.GIT`` tree
that ``git fsck`` warns of, a blob over the size limit, a queue of thousands of
commits). So the checks that depend only on what the push carries
(:func:`.server_order.prepare`: names, the guard's checks of every write) run here
first; the proc-receive hook runs them again (it refuses whatever comes to it
unchecked) and decides the rest, which depends on the order. A write it does not
apply because another landed first (a conflict) keeps its objects: git has moved
them by then, and they are a write's ordinary objects.

Run by storm's pre-receive hook as ``python -m storm_git.remote.inbox_check pre-receive``
with the push's inbox lines on stdin (server_hook.render).
"""
from __future__ import annotations

import os
import sys

from .server_hook import GUARD_NAME, INBOX_PREFIX, Refused, parse_updates
from .server_order import Command, prepare


def run(stdin_text: str, gitdir: str) -> tuple[int, list[str]]:
    """(0 lets the push on to the proc-receive hook, 1 refuses it; the reasons)."""
    commands = [Command(u.old, u.new, u.ref) for u in parse_updates(stdin_text) if u.ref.startswith(INBOX_PREFIX)]
    if not commands:
        return 0, []
    try:
        prepare(gitdir, commands)
    except Refused as exc:
        return 1, [f"{GUARD_NAME}: refused {exc}"]
    except Exception as exc:  # noqa: BLE001 - a hook that cannot check refuses
        return 1, [f"{GUARD_NAME}: cannot check this push ({type(exc).__name__}: {exc}); refused"]
    return 0, []


def main(argv: list[str]) -> int:
    if argv[:1] != ["pre-receive"]:
        sys.stderr.write("usage: python -m storm_git.remote.inbox_check pre-receive < updates\n")
        return 2
    code, lines = run(sys.stdin.read(), os.path.abspath(os.environ.get("GIT_DIR", ".")))
    sys.stderr.write("".join(line + "\n" for line in lines))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
