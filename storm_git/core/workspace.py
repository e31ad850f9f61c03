"""What both modes' workspaces share: settings, size limit, read sets.

``SharedWorkspace`` (storm mode) and ``WorktreeWorkspace`` (worktree mode) give
the same verbs different meanings; the parts that mean the same in both live
here so they cannot drift apart.
"""
from __future__ import annotations

from collections.abc import Iterable

from . import readsets
from .agents import validate_agent
from .errors import TooLarge, UsageError
from .paths import normalize
from .readsets import ReadEntry
from .store import Store

MODES = ("storm", "worktree")  # the values of storm.mode
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024


class BaseWorkspace:
    """Stateless apart from the repository: every call re-reads the refs, so
    many processes can hold one of these at once."""

    mode = ""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def max_file_bytes(self) -> int:
        return self.store.config_int("storm.maxFileBytes", DEFAULT_MAX_FILE_BYTES)

    def check_size(self, path: str, content: bytes) -> None:
        limit = self.max_file_bytes
        if len(content) > limit:
            raise TooLarge(f"{path}: {len(content)} bytes is over storm.maxFileBytes ({limit})",
                           hint="raise it with git config storm.maxFileBytes N if this is intended")

    def read_set(self, agent: str | None) -> dict[str, ReadEntry]:
        return readsets.load(self.store, validate_agent(agent))

    def forget(self, paths: Iterable[str] | None, *, agent: str | None) -> list[str]:
        """Drop paths (all when None) from the agent's read set: a new task starts fresh."""
        agent = validate_agent(agent)
        norm = None if paths is None else [normalize(p, self.store.prefix, self.store.top) for p in paths]
        return readsets.forget(self.store, agent, norm)

    def begin_task(self, agent: str | None, task: str) -> list[str]:
        """Start ``task`` for the agent: a task other than its last one (a new harness
        session, a new team subtask) starts with an empty read set."""
        return readsets.begin_task(self.store, validate_agent(agent), task)

    def knows_agent(self, agent: str | None) -> bool:
        """Whether storm has seen ``agent`` (it has read or written): a forget or an
        agent filter naming one it has not is most likely a typo."""
        return readsets.known(self.store, validate_agent(agent))


def replace_once(base: bytes, old: str, new: str, where: str) -> bytes:
    """``base`` with the one occurrence of ``old`` replaced by ``new`` (an ``edit``, in
    both modes); none or several is a usage error naming ``where`` the text was looked for."""
    old_b = old.encode("utf-8")
    n = base.count(old_b)
    if n == 0:
        raise UsageError(f"--old text not found in {where}", hint="read the file again and copy the text exactly")
    if n > 1:
        raise UsageError(f"--old text occurs {n} times in {where}",
                         hint="include more surrounding text so it matches once")
    return base.replace(old_b, new.encode("utf-8"), 1)
