"""What a hook client and the hook daemon say to each other on the unix socket.

One connection is one hook call:

1. client -> daemon: ``REQUEST`` (magic, length, fields);
2. daemon -> client: ``READY`` (the child has taken on the client's cwd,
   environment and umask and will run the hook on ``GO``) or ``REFUSED`` (it
   will not: the client runs the hook itself);
3. client -> daemon: ``GO`` with the client's standard streams attached
   (SCM_RIGHTS), so the call's child writes to the very pipes the harness
   reads. Until it is sent, nothing has run, so a client that gets no READY (a
   daemon stopped, killed, too slow) runs the hook itself with nothing done
   twice; and no daemon holds the harness's pipes open;
4. daemon -> client: ``RESULT`` (exit code, stdout bytes, stderr bytes). A
   connection that ends after GO without it means the call's process died
   mid-call: the client fails closed.

A command line call (``git storm read``, ``write``...: ``CLI_MAGIC`` instead of
``MAGIC``, no stdin bytes in the request) goes the same way, except that the
child reads and writes the attached streams themselves, the client may send
``INTR`` after GO (its Ctrl-C), and ``RESULT`` carries the exit code alone.

Standard library only, and no module that is slow to import: the client runs
this on every hook call.
"""
from __future__ import annotations

import _signal  # the C module: `import signal` builds its enums, a cost on every hook call

MAGIC = b"STORMHK1"
CLI_MAGIC = b"STORMCL1"  # a command line call (storm_git.integrations.hookd_cli)
READY, REFUSED, GO, RESULT = b"R", b"N", b"G", b"X"
INTR = b"I"  # client -> daemon after GO, on a command line call: Ctrl-C


# the dispositions a call's child takes on from its client: a shell's background job
# and nohup start a process with these ignored, and a command it runs inherits that
INHERITED_SIGNALS = (_signal.SIGINT, _signal.SIGQUIT)


def ignored_field() -> bytes:
    """Which of :data:`INHERITED_SIGNALS` this process ignores, e.g. ``b"2,3"``."""
    return b",".join(str(s).encode() for s in INHERITED_SIGNALS if _signal.getsignal(s) == _signal.SIG_IGN)


def ignored_from(field: bytes) -> frozenset[int]:
    """The signals of :func:`ignored_field`; a number that is not one of them is not taken."""
    wanted = {str(s).encode(): int(s) for s in INHERITED_SIGNALS}
    return frozenset(wanted[n] for n in field.split(b",") if n in wanted)


def pack(fields: list[bytes]) -> bytes:
    """Length-prefixed fields after a length-prefixed whole."""
    body = b"".join(len(f).to_bytes(4, "big") + f for f in fields)
    return len(body).to_bytes(8, "big") + body


def unpack(body: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(body):
        n = int.from_bytes(body[i:i + 4], "big")
        if i + 4 + n > len(body):
            raise ValueError("truncated field")
        out.append(body[i + 4:i + 4 + n])
        i += 4 + n
    return out


def recv_exact(sock, n: int) -> bytes:  # noqa: ANN001 - a socket or _socket.socket
    """``n`` bytes, or fewer when the peer closed first."""
    chunks, got = [], 0
    while got < n:
        b = sock.recv(min(n - got, 1 << 20))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv_packed(sock, limit: int = 1 << 31) -> list[bytes] | None:  # noqa: ANN001
    """The fields of one ``pack``ed message, or None when the peer closed first."""
    head = recv_exact(sock, 8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "big")
    if n > limit:
        raise ValueError("message too long")
    body = recv_exact(sock, n)
    if len(body) < n:
        return None
    return unpack(body)


def env_fields(env: dict[bytes, bytes]) -> bytes:
    return b"\0".join(k + b"=" + v for k, v in env.items())


def env_from(field: bytes) -> dict[bytes, bytes]:
    out = {}
    for item in field.split(b"\0") if field else []:
        k, _, v = item.partition(b"=")
        out[k] = v
    return out
