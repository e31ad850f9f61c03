"""Commit messages of accepted writes: the intent, then git trailers.

``Storm-Agent``, ``Storm-Op`` and one ``Storm-Path`` per path let ``git log``,
``git interpret-trailers`` and storm's own log read who changed what and why
without any side table. ``Storm-Time`` (epoch seconds, microseconds) places the
write among the rejections and other events of ``refs/storm/log``, which git's
commit time (whole seconds) cannot.

A storm-mode write then says what it was validated against (its *provenance*;
the commit carries it, so a write costs no note of its own):

* ``Storm-Validated-At: <commit>``: the shared head it was validated at (its parent);
* ``Storm-Scope: all|deps|auto|auto:all``: which part of the read set counted
  (``auto:all``: ``--deps auto`` fell back to the whole read set);
* ``Storm-Read-Set: <blob|none> <n>``: the agent's read set at that moment, by
  reference: the read-set note blob it extends (``none``: no fold yet) plus the
  first ``n`` reads of the journal that extends it (``storm_git.core.readsets``
  keeps every folded journal as a note keyed by that blob, so this resolves for good);
* one ``Storm-Dep: <path>`` per path of a ``deps``/``auto`` scope (the scope is then
  those entries of the read set; with none, the whole read set), encoded like
  ``Storm-Path``.

``storm_git.core.provenance.load`` expands them into the read set.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from .errors import UsageError

_CONTROL = re.compile("[\x00-\x1f\x7f]")  # one C-level scan a value (a write of 2,000 paths)


@dataclass(frozen=True)
class Provenance:
    """What a write was validated against, as its commit's trailers carry it."""

    validated_at: str  # the head (the commit's parent)
    scope: str  # all, deps, auto, auto:all (storm_git.deps.scope.FALLBACK)
    base: str  # the read-set note blob the agent's journal extended, or "none"
    reads: int  # how many of that journal's reads counted
    deps: list[str] | None = field(default=None)  # the scope's paths (deps, auto); None: the whole read set

    def lines(self) -> list[str]:
        out = [f"Storm-Validated-At: {self.validated_at}", f"Storm-Scope: {self.scope}",
               f"Storm-Read-Set: {self.base} {self.reads}"]
        return out + [f"Storm-Dep: {d}" for d in self.deps or ()]


PROVENANCE_KEYS = ("Storm-Validated-At", "Storm-Scope", "Storm-Read-Set")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def provenance(found: dict[str, list[str]]) -> Provenance | None:
    """The provenance in parsed trailers; None when the commit carries none (written
    before provenance moved into the commit). Raises ValueError when it is there but
    malformed (some keys missing, repeated, or values that do not parse)."""
    if not any(k in found for k in PROVENANCE_KEYS) and "Storm-Dep" not in found:
        return None
    missing = [k for k in PROVENANCE_KEYS if len(found.get(k, [])) != 1]
    if missing:
        raise ValueError(f"trailer {missing[0]} missing or repeated")
    at, scope = found["Storm-Validated-At"][0], found["Storm-Scope"][0]
    base, _sp, n = found["Storm-Read-Set"][0].partition(" ")
    if not _HEX.fullmatch(at):
        raise ValueError(f"Storm-Validated-At {at[:60]!r} is not a commit id")
    if not (base == "none" or _HEX.fullmatch(base)) or not n.isdigit() or not n.isascii():
        raise ValueError(f"Storm-Read-Set {found['Storm-Read-Set'][0][:60]!r} is not '<blob|none> <count>'")
    if not scope or " " in scope:
        raise ValueError(f"Storm-Scope {scope[:60]!r} is not a scope name")
    deps = found.get("Storm-Dep")
    return Provenance(at, scope, base, int(n), list(deps) if deps is not None else None)


def _check_fields(agent: str, op: str, paths: list[str]) -> None:
    """Refuse a trailer value that could end its line or start another trailer.

    Agents and paths are validated upstream; this is the last line of defence,
    so no value can ever forge a ``Storm-*`` trailer."""
    for what, value in [("agent", agent), ("op", op)] + [("path", p) for p in paths]:
        if not isinstance(value, str) or _CONTROL.search(value):
            shown = str(value).encode("unicode_escape").decode("ascii")
            raise UsageError(f"{what} {shown!r} contains a newline or control character",
                             hint="storm refuses it: it would forge a commit trailer")


# A line of an intent that git or a reader could take for one of storm's trailers
# (any ``Storm-*:`` key, in any case, as git compares keys) or for a patch divider
# (``---``: git interpret-trailers stops reading the message there, so an intent
# holding one could hide storm's trailers behind its own).
_LOOKS_OURS = re.compile(r"(?im)^(?=---(?:\s|$)|storm-[a-z0-9-]*[ \t]*:)")


def safe_intent(intent: str | None) -> str | None:
    """The intent, with every line that looks like storm's own trailer or like a
    patch divider indented by one space. Storm's readers take trailers only from the
    message's last paragraph (:func:`parse`), which is always storm's own; the
    indent keeps an intent's text from passing for one anywhere else as well (git
    log --grep, a reader that scans the whole message). Escaped, not refused: the
    Bash door's intent is a command line that already ran."""
    if intent is None:
        return None
    try:
        intent.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("the intent is not valid UTF-8", hint="pass the message as UTF-8 text") from None
    return _LOOKS_OURS.sub(" ", intent)


def format_message(intent: str | None, agent: str, op: str, paths: list[str],
                   provenance: Provenance | None = None) -> str:
    """The commit message: the intent as subject, then the trailers (module docstring)."""
    _check_fields(agent, op, paths + list(provenance.deps or ()) if provenance else paths)
    intent = safe_intent(intent)
    subject = (intent or "").strip() or f"storm: {agent} {op} {', '.join(paths[:3])}"
    lines = [subject, "", f"Storm-Agent: {agent}", f"Storm-Op: {op}"]
    lines += [f"Storm-Path: {p}" for p in paths]
    lines.append(f"Storm-Time: {time.time():.6f}")
    if provenance is not None:
        lines += provenance.lines()
    return "\n".join(lines) + "\n"


def split(message: str) -> tuple[str, list[str]]:
    """(the message before its trailer block, the block's lines). The block is the
    last paragraph: storm writes its trailers there, after the intent and a blank
    line, so no line of the intent is ever in it. Every reader of storm's trailers
    (the guard, the queue's move, history) reads them from here and nowhere else."""
    text = message.rstrip("\n")
    head, sep, para = text.rpartition("\n\n")
    return (head if sep else ""), para.splitlines()


def parse(message: str) -> dict[str, list[str]]:
    """Trailers of the last paragraph, as {key: [values]}."""
    out: dict[str, list[str]] = {}
    for line in split(message)[1]:
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key:
            out.setdefault(key, []).append(value)
    return out


def rewrite(message: str, replace: dict[str, str], add: dict[str, str]) -> str:
    """``message`` with the trailer block's ``replace`` keys given their new value and
    the ``add`` keys it lacks appended; the text before the block is kept as it is."""
    head, block = split(message)
    lines = []
    for line in block:
        key, sep, _value = line.partition(": ")
        lines.append(f"{key}: {replace[key]}" if sep and key in replace else line)
    have = {ln.partition(": ")[0] for ln in block}
    lines += [f"{k}: {v}" for k, v in add.items() if k not in have]
    return (head + "\n\n" if head else "") + "\n".join(lines) + "\n"


def precise_time(message: str, fallback: float) -> float:
    """The write's ``Storm-Time`` trailer, else ``fallback`` (its commit time)."""
    try:
        return float(parse(message)["Storm-Time"][-1])
    except (KeyError, ValueError):
        return float(fallback)


def subject(message: str) -> str:
    return message.split("\n", 1)[0]
