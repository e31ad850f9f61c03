"""The one place that talks to libgit2: objects, trees, refs and compare-and-swap.

Everything storm keeps is an ordinary git object reachable from a ref under
``refs/storm/`` or ``refs/notes/storm/``, so ``git log``, ``git fsck``, ``git gc``
and remotes all work on it. Refs only move by compare-and-swap
(:meth:`Store.cas`), which libgit2 performs under the ref's lockfile.
"""
from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import pygit2

from . import promisor
from .errors import BadPath, Busy, CorruptState, NotARepository, RepoStateError, UsageError
from .objects import commit_at, odb_retry, tree_at, tree_with

WORKSPACE_REF = "refs/storm/workspace"
RESERVATIONS_REF = "refs/storm/reservations"
# On a server: it exists where storm's proc-receive hook orders the writes clones push
# to their inbox (storm_git.remote.server_order); clones copy it like the others.
ORDERING_REF = "refs/storm/ordering"
EVENTS_REF = "refs/storm/log"
# One notes ref per agent holds its read set and its folded journals (which its
# writes' provenance trailers point into).
AGENTS_PREFIX = "refs/notes/storm/agents/"
DESCENDS_STEPS = 512  # Store.descends: first-parent steps before libgit2 takes over
# A clone of a shared workspace on a git remote keeps the server's storm refs here
# (storm_git.remote), moved only under the REMOTE_LOCK flock.
REMOTE_TRACKING_PREFIX = "refs/storm-remote/"

MODE_BLOB = pygit2.GIT_FILEMODE_BLOB
MODE_EXEC = pygit2.GIT_FILEMODE_BLOB_EXECUTABLE
MODE_LINK = pygit2.GIT_FILEMODE_LINK
MODE_TREE = pygit2.GIT_FILEMODE_TREE

# A `<ref>.lock` older than this, seen while we hold the flock guarding that ref,
# was left by a dead writer. git's own pack-refs/gc hold ref locks for moments.
STALE_REF_LOCK_SECONDS = 2.0
# A lock dated further in the future than this is no live git process's fresh lock
# (its mtime comes from a skewed clock or a restored file): stale as well.
FUTURE_REF_LOCK_SECONDS = 5.0
REF_LOCK_PATIENCE_SECONDS = 10.0
TREE_CACHE_LIMIT = 32 * 1024 * 1024
# Blobs from this size on are read through `git cat-file` (one copy in memory, not three).
BIG_BLOB_BYTES = 16 << 20
# Memoised tree lookups (Store.entry): answers, and the directories on the way. The
# directories held are bounded by their total entries too: a long-running process
# writing in a directory of 100,000 entries would otherwise pin one parsed copy per write.
ENTRY_CACHE_LIMIT = 1 << 16
SUBTREE_CACHE_LIMIT = 256
SUBTREE_ENTRIES_LIMIT = 1 << 20


class _Missing(enum.Enum):
    """The marker of a key the memo tables do not hold (an enum: mypy narrows ``is not``)."""

    MISSING = 0


_MISSING: Final = _Missing.MISSING


@dataclass(frozen=True)
class Entry:
    """A path's version in a tree: blob id and file mode."""

    oid: pygit2.Oid
    mode: int


def _commondir(gitdir: str) -> str:
    f = os.path.join(gitdir, "commondir")
    try:
        with open(f, encoding="utf-8") as fh:
            rel = fh.read().strip()
    except FileNotFoundError:
        return os.path.normpath(gitdir)
    return os.path.normpath(os.path.join(gitdir, rel))


_STRICT_OFF = False


def _relax_object_checks() -> None:
    """Skip libgit2's existence checks on objects a new tree or commit names.

    Storm only ever names objects it has just written or read, so the checks
    (one odb lookup per tree entry and parent) buy nothing on the write path;
    ``create_commit`` drops from ~60 to ~25 µs. The setting is process-wide.
    """
    global _STRICT_OFF
    if not _STRICT_OFF:
        pygit2.settings.enable_strict_object_creation(False)
        # libgit2 caches parsed trees only up to 4 KiB by default, so every path
        # lookup in a directory of 20,000 entries re-read and re-parsed it (15 ms);
        # cached, a lookup is a binary search (2 µs).
        pygit2.settings.cache_object_limit(pygit2.enums.ObjectType.TREE, TREE_CACHE_LIMIT)
        _STRICT_OFF = True


class Store:
    """A repository as storm sees it: git objects plus the working tree roots."""

    def __init__(self, repo: pygit2.Repository, cwd: str | None = None) -> None:
        _relax_object_checks()
        if repo.is_bare:
            raise RepoStateError(
                f"{repo.path.rstrip('/')} is a bare repository",
                hint="storm needs a working tree for the shared workspace",
            )
        self.repo = repo
        _shared_umask(repo)
        # Per-open caches of parsed state, each validated against what it was parsed
        # from before use (storm_git.core.readsets): never shared across repositories.
        self.caches: dict[str, dict] = {}
        self._entries: dict[tuple[pygit2.Oid, str], Entry | None] = {}
        self._trees: dict[tuple[pygit2.Oid, str], pygit2.Tree | None] = {}
        self._tree_entries = 0  # entries of the directories in _trees
        self.gitdir = os.path.normpath(repo.path)
        self.commondir = _commondir(self.gitdir)
        # The working tree that contains the caller (a linked worktree or the main one).
        self.top = os.path.normpath(repo.workdir)
        if self.commondir != self.gitdir:
            main = os.path.dirname(self.commondir)
            self.main_workdir = main if os.path.basename(self.commondir) == ".git" else self.top
        else:
            self.main_workdir = self.top
        cwd = os.path.realpath(cwd or os.getcwd())
        rtop = os.path.realpath(self.top)
        self.prefix = ""
        if cwd == rtop:
            self.prefix = ""
        elif cwd.startswith(rtop + os.sep):
            self.prefix = os.path.relpath(cwd, rtop).replace(os.sep, "/")

    @classmethod
    def discover(cls, start: str | None = None) -> "Store":
        """Open the repository containing ``start`` (default: the current directory)."""
        explicit = os.environ.get("GIT_DIR") if start is None else None
        start = start or os.getcwd()
        if not os.path.isdir(start):
            raise NotARepository(f"{start} is not a directory")
        try:
            # `git --git-dir=X storm` sets GIT_DIR for us; libgit2's discovery ignores it.
            path = os.path.abspath(explicit) if explicit else pygit2.discover_repository(start)
        except pygit2.GitError as exc:  # pragma: no cover - libgit2 refuses odd dirs
            raise NotARepository(f"cannot open a repository at {start}: {exc}") from None
        if path is None:
            raise NotARepository(
                f"not a git repository: {start}",
                hint="run git storm inside a repository (git init first)",
            )
        try:
            # Opened from where it was found, not from its git directory: a working tree
            # whose .git is a file (git init/clone --separate-git-dir) is then the work
            # tree, not the git directory's parent, which libgit2 assumes when opening
            # that directory itself (storm took the parent directory for the repository).
            repo = pygit2.Repository(path if explicit else start)
            if not explicit and os.path.normpath(repo.path) != os.path.normpath(path):
                repo = pygit2.Repository(path)  # pragma: no cover - both searches agree
            if explicit:
                _explicit_work_tree(repo, start)
        except pygit2.GitError as exc:
            raise _unopenable(path, str(exc)) from None
        return cls(repo, cwd=start)

    # -- configuration -------------------------------------------------------
    def config_get(self, key: str, default: str | None = None) -> str | None:
        try:
            return self.repo.config[key]
        except (KeyError, pygit2.GitError):
            return default

    def config_bool(self, key: str, default: bool) -> bool:
        """A boolean setting parsed as git parses it (true/yes/on/1 …); unset or
        unparsable: ``default``."""
        try:
            config = self.repo.config
            return config.get_bool(key) if key in config else default
        except (pygit2.GitError, ValueError):
            return default

    def config_int(self, key: str, default: int) -> int:
        raw = self.config_get(key)
        if raw is None:
            return default
        text = str(raw).strip().lower()
        mult = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}.get(text[-1:], 1)
        try:
            value = int(text[:-1] if mult != 1 else text) * mult
        except ValueError:
            value = -1
        if value < 0:  # every storm count and size is one: a negative one would be misread downstream
            raise CorruptState(f"config {key}={raw!r} is not a number (0 or more)",
                               hint=f"fix it with git config {key} NUMBER") from None
        return value

    def config_float(self, key: str, default: float) -> float:
        raw = self.config_get(key)
        if raw is None:
            return default
        try:
            value = float(str(raw).strip())
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise CorruptState(f"config {key}={raw!r} is not a number of seconds",
                               hint=f"fix it with git config {key} SECONDS")
        return value

    def config_set(self, key: str, value: str) -> None:
        self.repo.config[key] = value

    # -- refs ----------------------------------------------------------------
    def ref(self, name: str) -> pygit2.Reference | None:
        """The reference, kept as the expected value for a later :meth:`cas`."""
        try:
            return self.repo.lookup_reference(name)
        except KeyError:
            return None
        except pygit2.GitError as exc:
            raise CorruptState(f"cannot read {name}: {exc}",
                               hint="run git storm doctor") from None

    def ref_target(self, name: str) -> pygit2.Oid | None:
        ref = self.ref(name)
        return None if ref is None else ref_oid(ref)

    def cas(self, ref: pygit2.Reference | None, name: str, new: pygit2.Oid, message: str) -> bool:
        """Move ``name`` to ``new`` iff it still has the value ``ref`` was read with.

        ``ref is None`` means "create only if absent". Returns False when the ref
        moved (the caller re-validates and retries). A ``<ref>.lock`` left by a
        dead writer is removed once it is older than STALE_REF_LOCK_SECONDS; the
        caller must hold the storm flock that guards ``name``.
        """
        def attempt() -> None:
            if ref is None:
                self.repo.create_reference_direct(name, new, False, message=message)
            else:
                ref.set_target(new, message)

        return self._patiently(name, attempt)

    def force(self, name: str, new: pygit2.Oid) -> None:
        """Set ``name`` to ``new`` whatever it holds (the caller holds the storm flock
        that guards it), waiting out another git process's brief ``<ref>.lock``:
        ``git pack-refs --prune`` (storm's maintenance runs it) locks each loose ref it
        packs, and libgit2 gives up at once where git would wait."""
        self._patiently(name, lambda: self.repo.references.create(name, new, force=True))

    def delete_ref(self, name: str) -> None:
        """Delete ``name`` if it exists, waiting out a brief lock as :meth:`force` does."""
        def attempt() -> None:
            if self.ref(name) is not None:
                self.repo.references.delete(name)

        self._patiently(name, attempt)

    def _patiently(self, name: str, attempt: Callable[[], object]) -> bool:
        """Run the ref update ``attempt`` until it is done (True) or finds the ref moved
        (False), clearing a dead writer's ``<ref>.lock`` and waiting up to
        REF_LOCK_PATIENCE_SECONDS for a live one (then Busy)."""
        deadline = time.monotonic() + REF_LOCK_PATIENCE_SECONDS
        while True:
            try:
                attempt()
                return True
            except pygit2.AlreadyExistsError:
                return False
            except pygit2.GitError as exc:
                if "old reference value does not match" in str(exc) or "does not match" in str(exc):
                    return False
                if _dir_race(exc, deadline):
                    continue
                if "failed to lock" not in str(exc) and "locked" not in str(exc):
                    raise CorruptState(f"cannot update {name}: {exc}", hint="run git storm doctor") from None
            except OSError as exc:
                if _dir_race(exc, deadline):
                    continue
                if "lock" not in str(exc):
                    raise CorruptState(f"cannot update {name}: {exc}", hint="run git storm doctor") from None
            # The ref is locked by someone else.
            if self.clear_stale_ref_lock(name):
                continue
            if time.monotonic() > deadline:
                raise Busy(f"{name} stays locked ({self.ref_lock_path(name)})",
                           hint="another git process holds it; if none runs, run git storm doctor")
            time.sleep(0.005)

    def ref_lock_path(self, name: str) -> str:
        return os.path.join(self.commondir, *name.split("/")) + ".lock"

    def clear_stale_ref_lock(self, name: str, older_than: float = STALE_REF_LOCK_SECONDS) -> bool:
        """Remove ``<ref>.lock`` if it is older than ``older_than`` seconds, or dated
        more than FUTURE_REF_LOCK_SECONDS in the future (it would otherwise block
        every writer until the clock caught up)."""
        path = self.ref_lock_path(name)
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            return True  # gone meanwhile: try again
        if -FUTURE_REF_LOCK_SECONDS <= age < older_than:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return True

    def refs_under(self, prefix: str) -> list[str]:
        return [r for r in self.repo.references if r.startswith(prefix)]

    # -- objects -------------------------------------------------------------
    def descends(self, tip: pygit2.Oid, ancestor: pygit2.Oid) -> bool:
        """Whether ``ancestor`` is a proper ancestor of ``tip`` (libgit2's descendant_of).

        The shared history and each agent's notes are chains of one-parent commits.
        Walking the first parents of ``tip`` and of ``ancestor`` in turn, through the
        repository's object cache, answers where the two chains meet: ``ancestor`` is
        found on ``tip``'s chain (True), or a commit of either chain is found on the
        other first (False: on a chain without merges, ``tip``'s would have passed
        ``ancestor`` before it reached any of its ancestors). libgit2's descendant_of
        reads each commit it walks from the object database again (~15 µs a loose
        one) and walked ~20 even for a parent: ~300 µs a call in a clone aged by a
        few thousand writes, and a remote write made ~6. A merge, a root or a long
        walk hands over to descendant_of."""
        if tip == ancestor:
            return False
        repo = self.repo
        seen_tip = {tip}
        seen_anc = {ancestor}
        at_tip, at_anc = tip, ancestor
        try:
            for _ in range(DESCENDS_STEPS):
                parents = commit_at(repo, at_tip).parent_ids
                if len(parents) != 1:
                    break
                at_tip = parents[0]
                if at_tip == ancestor:
                    return True
                if at_tip in seen_anc:
                    return False
                seen_tip.add(at_tip)
                parents = commit_at(repo, at_anc).parent_ids
                if len(parents) != 1:
                    break
                at_anc = parents[0]
                if at_anc in seen_tip:
                    return False
                seen_anc.add(at_anc)
        except (KeyError, ValueError, CorruptState):
            pass  # a missing object, or not a commit: libgit2 says what it says
        return repo.descendant_of(tip, ancestor)

    def tree(self, oid: pygit2.Oid) -> pygit2.Tree:
        """The tree ``oid`` names (:func:`tree_at`)."""
        return tree_at(self.repo, oid)

    def commit(self, oid: pygit2.Oid) -> pygit2.Commit:
        try:
            obj = self.repo[oid]
        except (KeyError, ValueError):
            raise CorruptState(f"object {oid} is missing", hint="run git fsck") from None
        if not isinstance(obj, pygit2.Commit):
            raise CorruptState(f"{oid} is not a commit")
        return obj

    def blob_bytes(self, oid: pygit2.Oid, *, fetched: bool = False) -> bytes:
        """The content of blob ``oid``, with one copy in memory.

        libgit2 holds the compressed and the inflated object while reading, and
        ``Blob.data`` copies it once more (a 200 MB blob peaked at 3x); a large
        blob is streamed from ``git cat-file`` into one buffer instead. A partial
        clone's blob not fetched yet is fetched first (storm_git.core.promisor)."""
        try:
            size = self.repo.odb.read_header(oid)[1]
            if size >= BIG_BLOB_BYTES:
                data = self._blob_via_git(oid, size)
                if data is not None:
                    return data
            return self.repo.odb.read(oid)[1]
        except ValueError:
            raise CorruptState(f"blob {oid} is missing", hint="run git fsck") from None
        except KeyError:
            if fetched:
                raise CorruptState(f"blob {oid} is missing", hint="run git fsck") from None
        # a partial clone's blob still on its server: fetched as git would (else corrupt)
        promisor.fetch(self.repo, self.gitdir, [oid], git_env())
        return self.blob_bytes(oid, fetched=True)

    def prefetch(self, oids: Iterable[pygit2.Oid]) -> int:
        """Fetch, in one go, those of ``oids`` a partial clone does not have yet
        (storm_git.core.promisor); nothing in a full clone. Returns how many."""
        return promisor.prefetch(self.repo, self.gitdir, oids, git_env())

    def _blob_via_git(self, oid: pygit2.Oid, size: int) -> bytes | None:
        """``git cat-file blob`` read into one buffer of ``size`` bytes (None: fall back)."""
        import subprocess

        try:
            with subprocess.Popen(["git", "--git-dir", self.gitdir, "cat-file", "blob", str(oid)],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=git_env()) as proc:
                out = proc.stdout
                assert out is not None  # stdout=PIPE
                data = out.read(size)
                extra = out.read(1)
        except OSError:
            return None
        return data if proc.returncode == 0 and len(data) == size and not extra else None

    def write_blob(self, data: bytes) -> pygit2.Oid:
        return odb_retry(self.repo.create_blob, data)

    def write_tree(self, tb: pygit2.TreeBuilder) -> pygit2.Oid:
        return odb_retry(tb.write)

    def entry(self, tree: pygit2.Tree, path: str) -> Entry | None:
        """The blob at ``path`` in ``tree``, None if absent.

        Raises BadPath when the path names a directory or goes through a file or
        a symbolic link, so that every verb refuses those before changing anything.

        Trees are immutable, so answers are memoised by (tree id, path): one
        operation on many paths looks each up in the same few trees several times
        (validation, the disk record, the flags), and each first lookup pays for
        libgit2's ``filemode`` (~2 µs, an enum built in Python).
        """
        key = (tree.id, path)
        hit = self._entries.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        cut = path.rfind("/")
        cur = tree if cut < 0 else self._subtree(tree, path[:cut], path)
        if cur is None:
            found = None
        else:
            try:
                obj = cur[path[cut + 1:]]
            except KeyError:
                found = None
            else:
                if type(obj) is not pygit2.Blob:
                    self._not_a_file(path, obj.filemode)
                found = Entry(obj.id, obj.filemode)
        if len(self._entries) >= ENTRY_CACHE_LIMIT:
            self._entries.clear()
        self._entries[key] = found
        return found

    def _subtree(self, tree: pygit2.Tree, dirpath: str, path: str) -> pygit2.Tree | None:
        """The directory ``dirpath`` of ``tree``, None if absent (memoised: see entry).
        Raises BadPath when a component is a file, a link or a submodule."""
        key = (tree.id, dirpath)
        hit = self._trees.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        cut = dirpath.rfind("/")
        parent = tree if cut < 0 else self._subtree(tree, dirpath[:cut], path)
        found = None
        if parent is not None:
            try:
                obj = parent[dirpath[cut + 1:]]
            except KeyError:
                pass
            else:
                if type(obj) is not pygit2.Tree:
                    mode = obj.filemode
                    if mode == pygit2.GIT_FILEMODE_COMMIT:
                        raise BadPath(f"{path!r} is inside the submodule {dirpath!r}; storm does not write inside "
                                      "submodules", hint=f"work in {dirpath} with git itself")
                    what = "a symbolic link" if mode == MODE_LINK else "a file"
                    raise BadPath(f"{dirpath!r} is {what} in the shared workspace, so {path!r} cannot exist")
                found = tree_at(self.repo, obj.id)
        size = len(found) if found is not None else 0
        if len(self._trees) >= SUBTREE_CACHE_LIMIT or self._tree_entries + size > SUBTREE_ENTRIES_LIMIT:
            self._trees.clear()
            self._tree_entries = 0
        self._trees[key] = found
        self._tree_entries += size
        return found

    @staticmethod
    def _not_a_file(path: str, mode: int) -> None:
        if mode == MODE_TREE:
            raise BadPath(f"{path!r} is a directory in the shared workspace, not a file")
        if mode == pygit2.GIT_FILEMODE_COMMIT:
            raise BadPath(f"{path!r} is a submodule; storm does not write inside submodules")

    def tree_with(self, tree: pygit2.Tree, changes: Mapping[str, tuple[pygit2.Oid, int] | None]) -> pygit2.Oid:
        """Write ``tree`` with ``changes`` applied (None deletes): :func:`tree_with`."""
        return tree_with(self.repo, tree, changes)

    def empty_tree(self) -> pygit2.Oid:
        return odb_retry(self.repo.TreeBuilder().write)

    def make_commit(self, tree: pygit2.Oid, parents: list[pygit2.Oid], agent: str, message: str) -> pygit2.Oid:
        sig = signature(agent)
        return odb_retry(self.repo.create_commit, None, sig, sig, message, tree, parents)


def _dir_race(exc: Exception, deadline: float) -> bool:
    """``git pack-refs --prune`` (and gc) delete empty directories under refs/; one can
    vanish while libgit2 creates the path of a ref's lock ("failed to make directory").
    git retries that race itself; so does storm, briefly."""
    if "failed to make directory" in str(exc) and time.monotonic() < deadline:
        time.sleep(0.001)
        return True
    return False


# Variables by which a caller's git (a hook, `git --git-dir=X storm`) names *its*
# repository, index or object store; git commands storm runs name theirs explicitly.
REPO_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR",
             "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE")


# core.sharedRepository (git init --shared): the permission bits the repository's
# users share. git chmods each file it creates to them; storm (and libgit2 in storm's
# process) create files through the umask, so the umask is widened to match.
_SHARED_PERMS = {"group": 0o660, "true": 0o660, "1": 0o660, "all": 0o664, "world": 0o664,
                 "everybody": 0o664, "2": 0o664}


def _shared_umask(repo: pygit2.Repository) -> None:
    """Let the files storm creates be shared as ``core.sharedRepository`` says.

    Created with the process's umask (0644 and 0755 under the usual 022), storm's
    locks, journals, disk record (and libgit2's objects and refs) would keep a second
    user of a ``git init --shared=group`` repository from taking a storm lock or
    writing an object. Like git, nothing changes where the setting is absent or ``umask``."""
    try:
        config = repo.config
        raw = str(config["core.sharedRepository"]).strip().lower() if "core.sharedRepository" in config else ""
    except (pygit2.GitError, ValueError):
        return
    perms = _SHARED_PERMS.get(raw)
    if perms is None and raw.startswith("0") and len(raw) > 1:
        try:
            perms = int(raw, 8) & 0o666
        except ValueError:
            perms = None
    if not perms:
        return
    current = os.umask(0)
    os.umask(current & ~(perms | (perms & 0o444) >> 2) & 0o777)  # and x where readable, for directories


def _explicit_work_tree(repo: pygit2.Repository, cwd: str) -> None:
    """The work tree of ``git --git-dir=X [--work-tree=Y] storm``, by git's rule:
    GIT_WORK_TREE, else core.worktree, else the current directory. libgit2 opens X
    with X's parent as the work tree instead; storm keeps that for a directory named
    ``.git`` (the usual layout, where it is what a person means from a subdirectory)
    and a linked worktree's git directory (whose work tree libgit2 reads from it)."""
    given = os.environ.get("GIT_WORK_TREE")
    if given:
        repo.workdir = os.path.abspath(given)
    elif "core.worktree" not in repo.config and os.path.basename(os.path.normpath(repo.path)) != ".git" \
            and not os.path.exists(os.path.join(repo.path, "commondir")):  # a linked worktree: libgit2 knows it
        repo.workdir = cwd


def _unopenable(path: str, why: str) -> RepoStateError:
    """Why libgit2 would not open ``path``, with what to do about it (exit 3)."""
    top = os.path.dirname(path.rstrip(os.sep)) if path.rstrip(os.sep).endswith(".git") else path
    if "not owned by current user" in why:  # git's own "dubious ownership" refusal
        return RepoStateError(f"{top} belongs to another user: git refuses to work in it too (dubious ownership)",
                              hint=f"if you trust it: git config --global --add safe.directory {top}")
    if "object format" in why:
        return RepoStateError(f"cannot open the repository at {path}: {why}",
                              hint="storm works on SHA-1 repositories (libgit2 cannot open SHA-256 ones yet)")
    return CorruptState(f"cannot open the repository at {path}: {why}")


def git_env(**overrides: str) -> dict[str, str]:
    """The environment for a ``git`` subprocess: the caller's, minus REPO_VARS, plus
    ``overrides`` (e.g. GIT_INDEX_FILE=...). Identity and config variables pass."""
    env = {k: v for k, v in os.environ.items() if k not in REPO_VARS}
    env.update(overrides)
    return env


def signature(agent: str) -> pygit2.Signature:
    """Author/committer for an agent's commits (agent ids are declared, not verified)."""
    return pygit2.Signature(agent, f"{agent}@storm.invalid")


def ref_oid(ref: pygit2.Reference) -> pygit2.Oid:
    """The object a reference names (a symbolic one followed, as git does)."""
    target = ref.target
    if isinstance(target, pygit2.Oid):
        return target
    target = ref.resolve().target
    if isinstance(target, pygit2.Oid):
        return target
    raise CorruptState(f"{ref.name} names no object", hint="run git storm doctor")


def hex_(oid: pygit2.Oid | None) -> str | None:
    return None if oid is None else str(oid)


def resolve_commit(store: Store, rev: str) -> pygit2.Commit:
    """The commit ``rev`` names (branch, tag, id), or a usage error saying so."""
    try:
        obj = store.repo.revparse_single(rev)
        return obj.peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
        raise UsageError(f"{rev!r} does not name a commit", hint="give a branch, tag or commit id") from None
