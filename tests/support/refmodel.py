"""A reference model of storm mode's validity rule: pure Python, no git.

The test oracle for ``tests/storm/test_model.py``. It restates the validity rule and the
verbs (docs/architecture.md) as directly as possible, independently of ``storm_git/storm/shared.py``:

* The workspace is ``{path: content}``; a missing path is *absent*. A version is
  the content itself (storm uses the blob id, which is a function of the content),
  so a file that went A → B → A is at version A again.
* Agent ``a`` keeps a read set ``S_a = {path: version observed}`` (``None`` =
  observed absent). ``read`` records the current version of each path.
* A write by ``a`` to ``f`` (``rm`` writes "absent") is decided, in this order:

  1. ``reserved``: a live reservation on ``f`` held by another agent (nothing
     else changes: no read-set refresh, no new reservation);
  2. ``direct_conflict``: ``f`` is in ``S_a`` with a version other than the
     current one;
  3. ``unread_target``: ``f`` is not in ``S_a`` and exists (a blind overwrite);
     a new file that nobody created meanwhile needs no read;
  4. ``stale_dependency``: some other path in the scope (``S_a``, or only the
     ``deps`` given plus the target) has changed;
  5. otherwise the write is accepted.

* An accepted write sets ``f``'s content, sets ``S_a[f]`` to the written version
  and ends ``a``'s own reservation on ``f``.
* A ``direct_conflict`` or ``stale_dependency`` rejection (a conflict ``a`` must
  re-plan around) reserves ``f`` for ``a`` for ``reservation_seconds``, and so
  does an ``unread_target`` rejection with a stale path in the scope; a plain
  ``unread_target`` reserves nothing (``a`` only lacked the content), and nor does a
  rejection of a target absent at the head (nobody's work there to re-plan around). Every
  rejection other than ``reserved`` refreshes ``S_a`` for ``f`` (the payload
  showed its content in full); stale paths were shown only as diffs and stay
  stale until ``a`` reads them again.
* ``edit`` replaces exactly one occurrence of ``old`` in the version ``a`` last
  read (not the current one); when ``a`` never read ``f`` (or read it absent)
  the edit cannot be computed and is decided like a write that must be
  rejected. ``rm``/``edit`` of an absent file is a usage error.
* ``release`` ends one's own reservation; releasing another's is refused.
* Time only matters for reservations: live while ``now < expires``.
* A writer killed after its write was found valid and journaled, before its
  compare-and-swap: nothing lands (files and reservations as they were), and
  ``S_a[f]`` names the version it was about to write, so its next write of ``f``
  is refused once as a direct conflict (it must not build on a write that is not
  there). Folding a read set, or a fold killed half-way, changes nothing.

Usage errors (exit 2) change nothing and are reported as :class:`ModelError`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

RESERVED = "reserved"
DIRECT_CONFLICT = "direct_conflict"
UNREAD_TARGET = "unread_target"
STALE_DEPENDENCY = "stale_dependency"

Version = "bytes | None"


class ModelError(Exception):
    """The operation is refused as bad usage (exit 2); nothing changed."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class Outcome:
    accepted: bool
    reason: str | None = None
    target: str | None = None
    stale: frozenset[str] = frozenset()
    current: bytes | None = None          # content of the target at decision time
    holder: str | None = None             # reservation named in a rejection


@dataclass
class Model:
    files: dict[str, bytes]
    reservation_seconds: float = 30.0
    now: float = 1_000_000.0
    reads: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    reservations: dict[str, tuple[str, float]] = field(default_factory=dict)  # path -> (holder, expires)

    # -- helpers -------------------------------------------------------------
    def current(self, path: str) -> bytes | None:
        return self.files.get(path)

    def read_set(self, agent: str) -> dict[str, bytes | None]:
        return self.reads.setdefault(agent, {})

    def live_reservation(self, path: str) -> tuple[str, float] | None:
        r = self.reservations.get(path)
        if r is None or not self.now < r[1]:
            return None
        return r

    def live_reservations(self) -> dict[str, str]:
        return {p: r[0] for p in self.reservations if (r := self.live_reservation(p)) is not None}

    # -- verbs ---------------------------------------------------------------
    def read(self, agent: str, paths: list[str]) -> list[bytes | None]:
        rs = self.read_set(agent)
        out = []
        for p in paths:
            rs[p] = self.current(p)
            out.append(rs[p])
        return out

    def forget(self, agent: str, paths: list[str] | None) -> list[str]:
        rs = self.read_set(agent)
        drop = list(rs) if paths is None else [p for p in paths if p in rs]
        for p in drop:
            del rs[p]
        return drop

    def release(self, agent: str, path: str) -> bool:
        r = self.live_reservation(path)
        if r is None:
            return False
        if r[0] != agent:
            raise ModelError("usage")
        del self.reservations[path]
        return True

    def write(self, agent: str, path: str, content: bytes | None, deps: list[str] | None = None) -> Outcome:
        return self._apply(agent, path, content, deps, must_reject=False)

    def rm(self, agent: str, path: str, deps: list[str] | None = None) -> Outcome:
        if self.current(path) is None:
            raise ModelError("not_found")
        return self._apply(agent, path, None, deps, must_reject=False)

    def edit(self, agent: str, path: str, old: bytes, new: bytes, deps: list[str] | None = None) -> Outcome:
        if old == b"":
            raise ModelError("usage")
        seen = self.read_set(agent).get(path)
        if seen is None:  # never read, or read while absent
            if self.current(path) is None:
                raise ModelError("not_found")
            return self._apply(agent, path, None, deps, must_reject=True)
        n = seen.count(old)
        if n != 1:
            raise ModelError("usage")
        return self._apply(agent, path, seen.replace(old, new, 1), deps, must_reject=False)

    def killed_write(self, agent: str, path: str, content: bytes | None) -> None:
        """A write of ``content`` that was valid, killed between its journal and its CAS."""
        self.read_set(agent)[path] = content

    def _apply(self, agent: str, path: str, content: bytes | None, deps: list[str] | None,
               must_reject: bool) -> Outcome:
        rs = self.read_set(agent)
        if deps is not None:
            missing = [d for d in deps if d not in rs and d != path]
            if missing:
                raise ModelError("usage")
            scope = {d: rs[d] for d in deps if d in rs}
        else:
            scope = dict(rs)
        cur = self.current(path)
        r = self.live_reservation(path)
        if r is not None and r[0] != agent:
            return Outcome(False, RESERVED, path, frozenset(), cur, r[0])
        conflict = path in rs and rs[path] != cur
        unread = path not in rs and cur is not None
        stale = frozenset(g for g, v in scope.items() if g != path and self.current(g) != v)
        reason = (DIRECT_CONFLICT if conflict else UNREAD_TARGET if unread
                  else STALE_DEPENDENCY if stale else None)
        if reason is None and must_reject:  # pragma: no cover - edit of an unread file always exists
            raise ModelError("not_found")
        if reason is None:
            if content is None:
                self.files.pop(path, None)
            else:
                self.files[path] = content
            rs[path] = content
            if path in self.reservations and self.reservations[path][0] == agent:
                del self.reservations[path]
            return Outcome(True, None, path, frozenset(), content)
        holder = None
        if (reason in (DIRECT_CONFLICT, STALE_DEPENDENCY) or stale) and cur is not None:
            holder = agent
            if self.reservation_seconds > 0:
                self.reservations[path] = (agent, self.now + self.reservation_seconds)
        rs[path] = self.current(path)
        return Outcome(False, reason, path, stale, cur, holder)
