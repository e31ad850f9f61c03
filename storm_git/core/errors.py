"""Typed errors, each with its exit code (0 ok, 1 rejected, 2 bad input, 3 repository state, 4 internal).

The library raises these and never prints; the CLI turns them into one line on
stderr and the exit code. Every error says what was wrong and what to do, and is
raised before anything is changed.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_REPO_STATE = 3


class StormError(Exception):
    """Base class: a refusal that changed nothing."""

    exit_code = EXIT_USAGE
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(StormError):
    """Bad arguments: exit 2."""

    kind = "usage"


class BadPath(UsageError):
    """A path storm refuses to read or write."""

    kind = "bad_path"


class BadAgent(UsageError):
    """An agent id that is not a safe ref-name component."""

    kind = "bad_agent"


class TooLarge(UsageError):
    """Content over storm.maxFileBytes."""

    kind = "too_large"


class NotFound(UsageError):
    """A path that is not in the shared workspace where one is needed."""

    kind = "not_found"


class RepoStateError(StormError):
    """Repository state: not a repository, not initialised, corrupt: exit 3."""

    exit_code = EXIT_REPO_STATE
    kind = "repo_state"


class NotARepository(RepoStateError):
    kind = "not_a_repository"


class NotInitialised(RepoStateError):
    kind = "not_initialised"


class CorruptState(RepoStateError):
    kind = "corrupt_state"


class UnmediatedEdit(RepoStateError):
    """A command changed a file that already held an edit made outside storm: its
    change cannot be told apart from that edit, so nothing is credited to the agent."""

    kind = "unmediated_edit"


class Busy(RepoStateError):
    """A lock could not be taken in time (another process is stuck holding it)."""

    kind = "busy"


class OperationInProgress(RepoStateError):
    """A git merge, rebase, cherry-pick, revert or bisect is under way in the working tree."""

    kind = "operation_in_progress"


class Unreachable(RepoStateError):
    """A remote (the shared workspace's, a partial clone's promisor) could not be
    reached or would not answer: nothing was changed (exit 3)."""

    kind = "remote_unreachable"


class NoSpace(RepoStateError):
    """The disk (a quota, a file size limit) refused to store more."""

    kind = "no_space"
    HINT = ("free space (or raise the quota or the file size limit), then run the command again; "
            "git storm doctor finds anything left half-done")

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or self.HINT)


def classify(exc: BaseException) -> tuple[int, str, str, str | None] | None:
    """(exit code, kind, message, hint) of a failure a user can act on: a storm
    refusal, or git or the operating system refusing (a full disk is ``no_space``).
    None for anything else: a bug, which each front end reports its own way."""
    import errno
    import os

    import pygit2

    from .files import no_space

    if isinstance(exc, StormError):
        return exc.exit_code, exc.kind, exc.message, exc.hint
    from .files import NotRegularFile

    if isinstance(exc, NotRegularFile):  # a FIFO, a directory … where a file was expected
        if exc.own:
            return EXIT_REPO_STATE, CorruptState.kind, exc.message, "git storm doctor --fix moves it aside"
        return EXIT_USAGE, BadPath.kind, exc.message, "storm reads and writes regular files"
    if isinstance(exc, OSError) and exc.errno in (errno.EISDIR, errno.ENOTDIR) and exc.filename \
            and f"{os.sep}storm{os.sep}" in str(exc.filename):
        # one of storm's own files replaced by a directory (or the reverse): corrupt state
        return (EXIT_REPO_STATE, CorruptState.kind, f"storm's {exc.filename} is not what storm keeps there "
                f"({exc.strerror})", "git storm doctor --fix moves it aside")
    if _read_only(exc):
        where = getattr(exc, "filename", None)
        if not where and "'" in str(exc):  # libgit2 names the file in quotes
            where = str(exc).split("'")[1]
        return (EXIT_REPO_STATE, "read_only", f"the file system is read-only{f' at {where}' if where else ''}: "
                "storm records each read and write in the repository (.git/storm, .git/objects)",
                "make the repository writable here (a read-only mount, a container volume); "
                "git storm log and plain git can still read it")
    if isinstance(exc, (pygit2.GitError, OSError)):
        if no_space(exc):
            why = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror and exc.filename \
                else getattr(exc, "strerror", None) or str(exc)
            return EXIT_REPO_STATE, NoSpace.kind, f"the disk refused to store more: {why}", NoSpace.HINT
        return EXIT_REPO_STATE, "repo_state", f"{type(exc).__name__}: {exc}", "run git storm doctor"
    return None


def _read_only(exc: BaseException) -> bool:
    """A write refused because the file system is mounted read-only (EROFS), as
    Python or libgit2 words it."""
    import errno

    import pygit2

    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return True
    return isinstance(exc, (OSError, pygit2.GitError)) and "Read-only file system" in str(exc)
