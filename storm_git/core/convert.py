"""git's conversions between a file in the repository and the same file on disk.

``.gitattributes`` (``text``, ``eol``, ``ident``, ``filter=<driver>``,
``working-tree-encoding``) and ``core.autocrlf`` make ``git add`` store something
other than the bytes on disk, and ``git checkout`` write something other than the
blob. Storm crosses that line in three places, and at each does what git does:

* an agent's content becoming a blob is converted as ``git add`` would (``to_odb``):
  CRLF written to a ``text`` file is stored with LF, an LFS file as its pointer;
* a blob written to the working tree is converted as ``git checkout`` would
  (``to_worktree``): a ``*.bat text eol=crlf`` file gets its CRLF back;
* a file on disk is compared with a version by the id ``git add`` would give it
  (``odb_id``), so a checked-out CRLF file is the version it came from, not an edit;
* what an agent is given is what ``write`` takes back (``for_agent``): the stored
  form, or under a filter driver the checked-out file.

libgit2 applies the built-in conversions (line endings, ``ident``) in-process. A
path whose attributes name a filter driver that git config defines (git-lfs is
one) or a ``working-tree-encoding`` goes through git itself, which runs them.

Most repositories have no conversions at all, and storm looks at a path's disk
state on every write: whether a path *may* be converted is first decided from
the attribute files that exist (``info/attributes``, the global and system files,
``core.autocrlf``, a ``.gitattributes`` on disk in one of the path's directories):
a few cached ``stat`` calls, before asking libgit2.
"""
from __future__ import annotations

import os

import pygit2
from pygit2.enums import ConfigLevel, FilterMode

from .errors import RepoStateError
from .files import stamp
from .store import Store

ATTRIBUTES = ".gitattributes"
_AUTOCRLF_ON = {"true", "yes", "on", "1", "input"}  # core.autocrlf: a boolean, or "input"
EXTERNAL = "external"  # the path's conversion is done by git: a filter driver
ENCODING = "encoding"  # ... a working-tree-encoding (the stored form is UTF-8, what read returns)


class ConversionFailed(RepoStateError):
    """A filter that git config defines failed (or git refused an unsafe conversion)."""

    kind = "conversion_failed"


class Conversions:
    """The conversions of one repository, for the span of one operation.

    What it learns about attribute files is cached for its lifetime: make one per
    command or write, so a ``.gitattributes`` added meanwhile is seen by the next."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._global: bool | None = None
        self._exec_bit: bool | None = None
        self._symlinks: bool | None = None
        self._drivers: bool | None = None
        self._defined: dict[str, bool] = {}
        self._dirs: dict[str, bool] = {}
        self._may_dir: dict[str, bool] = {}
        self._kinds: dict[tuple[str, FilterMode], pygit2.filter.FilterList | str | None] = {}

    # -- which paths -----------------------------------------------------------
    def applies(self, path: str) -> bool:
        """Whether ``path`` has any conversion (the common answer, no, costs a few stats)."""
        return self._kind(path, FilterMode.TO_ODB) is not None

    def _kind(self, path: str, mode: FilterMode) -> pygit2.filter.FilterList | str | None:
        if not self._may(path):
            return None
        key = (path, mode)
        if key not in self._kinds:
            self._kinds[key] = self._lookup(path, mode)
        return self._kinds[key]

    def _lookup(self, path: str, mode: FilterMode) -> pygit2.filter.FilterList | str | None:
        repo = self.store.repo
        try:
            driver = repo.get_attr(path, "filter")
            if isinstance(driver, str) and self._driver_defined(driver):
                return EXTERNAL
            if isinstance(repo.get_attr(path, "working-tree-encoding"), str):
                return ENCODING
            return repo.load_filter_list(path, mode)
        except pygit2.GitError as exc:
            raise ConversionFailed(f"cannot read the attributes of {path}: {exc}",
                                   hint="check .gitattributes (git check-attr -a -- PATH)") from None

    def _driver_defined(self, name: str) -> bool:
        got = self._defined.get(name)
        if got is None:  # three config lookups, once per driver name and operation
            got = self._defined[name] = any(self.store.config_get(f"filter.{name}.{k}") is not None
                                            for k in ("clean", "smudge", "process"))
        return got

    @property
    def exec_bit(self) -> bool:
        """core.fileMode: whether the file system's exec bit means anything. ``git init``
        sets it false where it does not (vfat, exFAT, some mounts of another OS's
        disk); git then takes a file's mode from the index, never from the disk."""
        if self._exec_bit is None:
            self._exec_bit = self._settings()["exec_bit"]
        return self._exec_bit

    @property
    def symlinks(self) -> bool:
        """core.symlinks: whether the file system takes symbolic links. ``git init`` sets
        it false where it does not; git then checks a link out as a plain file holding
        its target, and keeps such a file a link in the index."""
        if self._symlinks is None:
            self._symlinks = self._settings()["symlinks"]
        return self._symlinks

    def _may(self, path: str) -> bool:
        if self._global is None:
            self._global = self._settings()["global"]
        if self._global:
            return True
        d = path.rpartition("/")[0]
        got = self._may_dir.get(d)
        if got is None:  # once per directory: a read of 2,000 paths asks for a few dozen
            parts = d.split("/") if d else []
            got = self._may_dir[d] = any(self._dir_has("/".join(parts[:i])) for i in range(len(parts) + 1))
        return got

    def _settings(self) -> dict[str, bool]:
        """_any_global and core.fileMode, kept on the Store while the repository's own
        config and info/attributes are unchanged (their stat stamps, two ``stat`` calls).

        Looking afresh costs two config lookups (libgit2 re-checks every config file
        on each) and a few ``stat`` calls: ~0.12 ms of a ~3 ms write, measured by
        benchmarks/bench_conversions.py. Files outside the repository (the global and
        system git config and attribute files) are then read once per opened
        repository, as git reads them once per command: a long-lived process (the
        MCP server) sees a change there when it opens the repository again."""
        stamps = tuple(stamp(os.path.join(self.store.commondir, *p)) for p in (("config",), ("info", "attributes")))
        cache = self.store.caches.setdefault("conversions", {})
        if cache.get("stamp") != stamps:
            cache["global"] = self._any_global()
            cache["exec_bit"] = self.store.config_bool("core.fileMode", True)
            cache["symlinks"] = self.store.config_bool("core.symlinks", True)
            cache["drivers"] = self._any_driver()
            cache["stamp"] = stamps
        return cache

    def _any_driver(self) -> bool:
        """Whether git config defines any filter driver (``filter.<name>.clean``,
        ``smudge`` or ``process``: git-lfs installs one in the global config)."""
        try:
            return any(e.name.startswith("filter.") and e.name.rsplit(".", 1)[-1] in ("clean", "smudge", "process")
                       for e in self.store.repo.config)
        except pygit2.GitError:
            return True  # unknown: look at each path

    def _any_global(self) -> bool:
        """core.autocrlf, or an attribute file that applies to every path."""
        store = self.store
        try:
            config = store.repo.config  # one object, each lookup re-checks the files: two lookups when unset
            autocrlf = config["core.autocrlf"] if "core.autocrlf" in config else "false"
            configured = config["core.attributesFile"] if "core.attributesFile" in config else None
        except pygit2.GitError:
            autocrlf, configured = "false", None
        if str(autocrlf).strip().lower() in _AUTOCRLF_ON:
            return True
        files = [os.path.join(store.commondir, "info", "attributes")]
        if configured:
            files.append(os.path.expanduser(str(configured)))
        else:
            xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
            files.append(os.path.join(xdg, "git", "attributes"))
        if not os.environ.get("GIT_ATTR_NOSYSTEM"):
            files += _system_files()
        return any(_nonempty(f) for f in files)

    def _dir_has(self, d: str) -> bool:
        """A .gitattributes in directory ``d`` of the working tree.

        git falls back to the index's copy of a .gitattributes missing from disk;
        storm does not look there (reading the index costs more than the write):
        a .gitattributes deleted on disk is an unmediated deletion, and until it is
        restored (git storm checkout) its rules are not applied to storm's writes."""
        got = self._dirs.get(d)
        if got is None:
            rel = f"{d}/{ATTRIBUTES}" if d else ATTRIBUTES
            got = self._dirs[d] = os.path.lexists(os.path.join(self.store.main_workdir, rel))
        return got

    # -- the conversions -------------------------------------------------------------
    def to_odb(self, path: str, data: bytes, *, from_disk: bool = True) -> bytes:
        """What ``git add`` would store for ``data`` at ``path``.

        ``from_disk=False``: ``data`` is an agent's content (``write``, ``edit``), which
        may already be in the stored form: line endings are normalised and a filter
        driver runs (an agent writes the file, not an LFS pointer), but a
        working-tree-encoding file is taken as the UTF-8 that ``read`` returned."""
        kind = self._kind(path, FilterMode.TO_ODB)
        if kind is None or (kind == ENCODING and not from_disk):
            return data
        if isinstance(kind, str):  # EXTERNAL or ENCODING
            oid = self._git_hash(path, data, write=True)
            return self.store.blob_bytes(oid)
        return self._apply(kind, path, data)

    def odb_id(self, path: str, data: bytes) -> pygit2.Oid:
        """The blob id ``git add`` would give ``data`` at ``path``."""
        kind = self._kind(path, FilterMode.TO_ODB)
        if kind is None:
            return pygit2.hash(data)
        if isinstance(kind, str):  # EXTERNAL or ENCODING
            return self._git_hash(path, data, write=False)
        return pygit2.hash(self._apply(kind, path, data))

    def to_worktree(self, path: str, data: bytes, oid: pygit2.Oid | None = None) -> bytes:
        """What ``git checkout`` would write at ``path`` for the blob ``data`` (id ``oid``)."""
        kind = self._kind(path, FilterMode.TO_WORKTREE)
        if kind is None:
            return data
        if isinstance(kind, str):  # EXTERNAL or ENCODING
            if oid is None:
                oid = self.store.write_blob(data)
            r = self._git(["cat-file", "--filters", f"--path={path}", str(oid)], path)
            return r.stdout
        return self._apply(kind, path, data)

    def for_agent(self, path: str, data: bytes, oid: pygit2.Oid | None = None) -> bytes:
        """The blob ``data`` at ``path`` as an agent is given it (``read``, ``edit``'s
        base, a rejection's content and diff): the form ``write`` takes back. That is
        the stored form (LF; UTF-8 for a working-tree-encoding), except under a filter
        driver, whose clean filter ``write`` runs on what it is sent: there it is the
        file ``git checkout`` writes. Given the stored form (an LFS pointer, git-crypt
        ciphertext), an agent that wrote it back unchanged, or ``edit``ed it, would have
        it cleaned a second time: the file changed, or destroyed."""
        if self._drivers is None:
            self._drivers = self._settings()["drivers"]
        if not self._drivers or not self._external(path):
            return data  # no filter driver in git config: a read of 2,000 paths pays one lookup
        return self.to_worktree(path, data, oid)

    def _external(self, path: str) -> bool:
        """Whether a filter driver that git config defines converts ``path``: one
        attribute lookup (``_kind`` makes three, for every conversion git has)."""
        if not self._may(path):
            return False
        known = self._kinds.get((path, FilterMode.TO_WORKTREE), False)
        if known is not False:
            return known == EXTERNAL
        try:
            driver = self.store.repo.get_attr(path, "filter")
        except pygit2.GitError as exc:
            raise ConversionFailed(f"cannot read the attributes of {path}: {exc}",
                                   hint="check .gitattributes (git check-attr -a -- PATH)") from None
        return isinstance(driver, str) and self._driver_defined(driver)

    def _apply(self, filters: pygit2.filter.FilterList, path: str, data: bytes) -> bytes:
        try:
            return filters.apply_to_buffer(data)
        except pygit2.GitError as exc:  # core.safecrlf=true and an irreversible conversion, say
            raise ConversionFailed(f"git's conversion of {path} failed: {exc}",
                                   hint="see core.safecrlf and the path's attributes (git check-attr -a)") from None

    def _git_hash(self, path: str, data: bytes, *, write: bool) -> pygit2.Oid:
        args = ["hash-object", "--stdin", f"--path={path}"] + (["-w"] if write else [])
        out = self._git(args, path, data).stdout.decode("ascii", "replace").strip()
        try:
            return pygit2.Oid(hex=out)
        except ValueError:
            raise ConversionFailed(f"git hash-object gave no id for {path}: {out[:80]!r}") from None

    def _git(self, args: list[str], path: str, data: bytes | None = None):
        from .gitcmd import run_git  # git itself runs the filter drivers that its config defines

        try:
            r = run_git(args, self.store.main_workdir, check=False, input=data)
        except OSError as exc:
            raise ConversionFailed(f"cannot run git to convert {path}: {exc}") from None
        if r.returncode != 0:
            msg = (r.stderr or b"").decode("utf-8", "replace").strip().splitlines()
            raise ConversionFailed(f"git's filter for {path} failed: {msg[-1] if msg else 'exit ' + str(r.returncode)}",
                                   hint="check the filter driver that .gitattributes names "
                                        "(git check-attr filter -- PATH)")
        return r


_SYSTEM: list[str] = []


def _system_files() -> list[str]:
    """The system attribute files git and libgit2 read (libgit2's search path is set
    once per process)."""
    if not _SYSTEM:
        found = {"/etc/gitattributes"}
        try:
            found.update(os.path.join(d, "gitattributes")
                         for d in pygit2.settings.search_path[ConfigLevel.SYSTEM].split(os.pathsep) if d)
        except (AttributeError, KeyError, ValueError, pygit2.GitError):
            pass
        _SYSTEM.extend(sorted(found))
    return _SYSTEM


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False
