"""git's pkt-line framing, as ``receive-pack`` speaks it to a ``proc-receive`` hook.

Each packet is four hex digits of length (the four included) and the data; ``0000``
is a flush. Anything else (a short read, a bad length) is a broken stream: the hook
stops, and receive-pack refuses the push.
"""
from __future__ import annotations

from typing import BinaryIO

MAX_DATA = 65516  # git's LARGE_PACKET_DATA_MAX


class Broken(Exception):
    """The stream is not pkt-lines (or ended in the middle of one)."""


def read(stream: BinaryIO) -> bytes | None:
    """One packet's data, newline stripped; None for a flush."""
    head = stream.read(4)
    if len(head) != 4:
        raise Broken("the stream ended" if not head else "a packet length was cut short")
    try:
        n = int(head, 16)
    except ValueError:
        raise Broken(f"bad packet length {head!r}") from None
    if n == 0:
        return None
    if n < 4 or n - 4 > MAX_DATA:
        raise Broken(f"bad packet length {n}")
    data = stream.read(n - 4)
    if len(data) != n - 4:
        raise Broken("a packet was cut short")
    return data[:-1] if data.endswith(b"\n") else data


def until_flush(stream: BinaryIO) -> list[bytes]:
    """The packets up to the next flush."""
    out = []
    while (data := read(stream)) is not None:
        out.append(data)
    return out


def write(stream: BinaryIO, data: bytes) -> None:
    data = data[:MAX_DATA]
    stream.write(b"%04x" % (len(data) + 4) + data)


def flush(stream: BinaryIO) -> None:
    stream.write(b"0000")
    stream.flush()
