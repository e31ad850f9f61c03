"""Commit messages of accepted writes: the intent, then git trailers.

``Storm-Agent``, ``Storm-Op`` and one ``Storm-Path`` per path let ``git log``,
``git interpret-trailers`` and storm's own log read who changed what and why
without any side table. ``Storm-Time`` (epoch seconds, microseconds) places the
write among the rejections and other events of ``refs/storm/log``, which git's
commit time (whole seconds) cannot.
"""
from __future__ import annotations

import re
import time

from .errors import UsageError

_CONTROL = re.compile("[\x00-\x1f\x7f]")  # one C-level scan a value (a write of 2,000 paths)


def _check_fields(agent: str, op: str, paths: list[str]) -> None:
    """Refuse a trailer value that could end its line or start another trailer.

    Agents and paths are validated upstream; this is the last line of defence,
    so no value can ever forge a ``Storm-*`` trailer."""
    for what, value in [("agent", agent), ("op", op)] + [("path", p) for p in paths]:
        if not isinstance(value, str) or _CONTROL.search(value):
            shown = str(value).encode("unicode_escape").decode("ascii")
            raise UsageError(f"{what} {shown!r} contains a newline or control character",
                             hint="storm refuses it: it would forge a commit trailer")


def _safe_intent(intent: str | None) -> str | None:
    """The intent, with lines git takes for a patch divider ("---") indented by one
    space: git interpret-trailers stops reading the message at such a line, so an
    intent holding one could hide storm's trailers behind its own."""
    if intent is None:
        return None
    try:
        intent.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("the intent is not valid UTF-8", hint="pass the message as UTF-8 text") from None
    return re.sub(r"(?m)^(?=---(?:\s|$))", " ", intent)


def format_message(intent: str | None, agent: str, op: str, paths: list[str]) -> str:
    _check_fields(agent, op, paths)
    intent = _safe_intent(intent)
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
