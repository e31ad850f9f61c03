"""Parsing ``git status --porcelain=v1 -z``: one parser for every caller."""
from __future__ import annotations


def parse_status_z(data: bytes, *, rename_sources: bool = True) -> list[tuple[str, str]]:
    """(XY, path) per entry; a rename's or copy's source path follows it as its own
    entry (same XY) when ``rename_sources``, since that path changed too."""
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    out, i = [], 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if len(f) < 4:
            continue
        xy, p = f[:2], f[3:]
        out.append((xy, p))
        if "R" in xy or "C" in xy:
            if rename_sources and i < len(fields) and fields[i]:
                out.append((xy, fields[i]))
            i += 1
    return out
