"""Commit messages of accepted writes: the intent, then git trailers.

``Storm-Agent``, ``Storm-Op`` and one ``Storm-Path`` per path let ``git log``,
``git interpret-trailers`` and storm's own log read who changed what and why
without any side table. ``Storm-Time`` (epoch seconds, microseconds) places the
write among the rejections and other events of ``refs/storm/log``, which git's
commit time (whole seconds) cannot.
"""
from __future__ import annotations

import time


def format_message(intent: str | None, agent: str, op: str, paths: list[str]) -> str:
    subject = (intent or "").strip() or f"storm: {agent} {op} {', '.join(paths[:3])}"
    lines = [subject, "", f"Storm-Agent: {agent}", f"Storm-Op: {op}"]
    lines += [f"Storm-Path: {p}" for p in paths]
    lines.append(f"Storm-Time: {time.time():.6f}")
    return "\n".join(lines) + "\n"


def parse(message: str) -> dict[str, list[str]]:
    """Trailers of the last paragraph, as {key: [values]}."""
    out: dict[str, list[str]] = {}
    para = message.rstrip("\n").rsplit("\n\n", 1)[-1]
    for line in para.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key:
            out.setdefault(key, []).append(value)
    return out


def precise_time(message: str, fallback: float) -> float:
    """The write's ``Storm-Time`` trailer, else ``fallback`` (its commit time)."""
    try:
        return float(parse(message)["Storm-Time"][-1])
    except (KeyError, ValueError):
        return float(fallback)


def subject(message: str) -> str:
    return message.split("\n", 1)[0]
