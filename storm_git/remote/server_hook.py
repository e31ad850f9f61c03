"""The server-side guard: a ``pre-receive`` hook in the bare repository.

The server's authentication decides who may push; this hook decides what a push
may contain. ``refs/storm/workspace`` only moves forward, one validated write per
commit: each new commit has one parent, storm's trailers (``Storm-Agent``,
``Storm-Op``, ``Storm-Path``), changes only the paths its trailers name, and
carries its provenance (``Storm-Validated-At``, ``Storm-Scope``,
``Storm-Read-Set``, ``Storm-Dep``: storm_git.core.trailers), validated at the
parent and agreeing with the parent's tree: every path of the read set it names
has, in the parent, the blob it recorded. The read set is resolved from the
agent's notes ref as pushed in the same push (or already there): the read-set
note blob plus the first reads of the journal folded under that blob's key (the
client folds before it queues a write, so both travel with it). An agent's
notes ref only moves forward (its journals are never rewritten). A client
that skips validation, rewrites history or pushes a hand-made commit is refused.

Run by git as ``python -m storm_git.remote.server_hook pre-receive`` with the
interpreter that installed it (:func:`install`); the objects of the push are in
git's quarantine directory, which is added to the object database here.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

import pygit2

from ..core import reservations, tree_rules
from ..core.agents import validate_agent
from ..core.errors import BadAgent, RepoStateError, UsageError
from ..core.files import replace_file
from ..core.gitcmd import run_git
from ..core.objects import blob_at
from ..core.provenance import ProvenanceNotFound, entries as provenance_entries
from ..core.readsets import CorruptReadSet, ReadEntry
from ..core.store import AGENTS_PREFIX, ORDERING_REF, RESERVATIONS_REF, WORKSPACE_REF
from ..core.trailers import parse as parse_trailers, provenance as parse_provenance_trailers
from ..core.workspace import DEFAULT_MAX_FILE_BYTES
from ..storm.validate import moved
from . import ref_locks

ZERO = "0" * 40
MARKER = "git-storm-server-hook"
GUARD_NAME = "git storm guard"
HOOK = "pre-receive"
# Ops whose targets are validated against the base an edit was made on (exec, adopt),
# not against the read set: their targets' read-set entries may differ from the parent.
EXPECTED_OPS = ("exec", "adopt")


class Refused(Exception):
    """A push the guard refuses; the message goes to the pusher."""


class _Repo:
    """What storm_git.core.notes needs of a Store: ``.repo`` and ``blob_bytes``."""

    def __init__(self, repo: pygit2.Repository) -> None:
        self.repo = repo

    def blob_bytes(self, oid: pygit2.Oid) -> bytes:
        return blob_at(self.repo, oid).data  # a server's blob is there (or the push is refused)


def open_repo(path: str) -> pygit2.Repository:
    """The repository, with the push's quarantined objects visible."""
    repo = pygit2.Repository(path)
    extra = [os.environ.get("GIT_OBJECT_DIRECTORY", "")]
    extra += os.environ.get("GIT_ALTERNATE_OBJECT_DIRECTORIES", "").split(os.pathsep)
    for d in extra:
        if d and os.path.isdir(d):
            repo.odb.add_disk_alternate(os.path.abspath(d))
    return repo


@dataclass
class Update:
    old: str
    new: str
    ref: str


@dataclass
class Verdict:
    refused: list[str] = field(default_factory=list)
    checked: int = 0  # commits checked

    @property
    def ok(self) -> bool:
        return not self.refused


def parse_updates(text: str) -> list[Update]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append(Update(*parts))
    return out


# storm's namespaces on a server: a push may touch only the refs storm defines there
STORM_NAMESPACES = ("refs/storm/", "refs/notes/storm/")
# A clone's inbox (storm_git.remote.server_order, the proc-receive hook, orders what is
# pushed there) and the ref that tells clones the server has one.
INBOX_PREFIX = "refs/storm/inbox/"
PROC_RECEIVE = "proc-receive"
NO_ORDERING = ("this server does not order writes (no storm proc-receive hook, or receive.procReceiveRefs "
               "does not name refs/storm/inbox): git storm server-hook install")


def ordering_configured(repo: pygit2.Repository) -> bool:
    """Whether git hands pushes to the inbox to storm's proc-receive hook."""
    try:
        names = list(repo.config.get_multivar("receive.procReceiveRefs"))
    except (KeyError, pygit2.GitError):
        names = []
    return INBOX_PREFIX.rstrip("/") in names and _is_ours(os.path.join(hooks_dir(repo.path), PROC_RECEIVE))


def check(repo: pygit2.Repository, updates: list[Update]) -> Verdict:
    """The guard's verdict on one push (every refused ref, with why). Refs outside
    storm's namespaces (branches, tags) are the server's own business."""
    post = {u.ref: u.new for u in updates}
    v = Verdict()
    for u in updates:
        try:
            if u.ref == WORKSPACE_REF:
                v.checked += _check_workspace(repo, u, post)
            elif u.ref == RESERVATIONS_REF:
                _check_reservations(repo, u)
            elif u.ref.startswith(AGENTS_PREFIX):
                _check_agent_ref(u)
                _check_forward(repo, u, "the journals provenance points into are never rewritten")
            elif u.ref.startswith(INBOX_PREFIX):
                if not ordering_configured(repo):  # else the proc-receive hook takes it, and checks it
                    raise Refused(NO_ORDERING)
            elif u.ref == ORDERING_REF:
                raise Refused("it says this server orders writes: git storm server-hook install sets it")
            elif u.ref.startswith(STORM_NAMESPACES) and u.new != ZERO:  # deleting leftovers is allowed
                raise Refused(f"not a ref storm defines (a server takes {WORKSPACE_REF}, {RESERVATIONS_REF} "
                              f"and {AGENTS_PREFIX}<agent> under storm's names)")
        except Refused as exc:
            v.refused.append(f"{u.ref}: {exc}")
    return v


def _check_agent_ref(u: Update) -> None:
    try:
        validate_agent(u.ref[len(AGENTS_PREFIX):])
    except BadAgent as exc:
        raise Refused(f"not an agent's notes ref: {exc.message}") from None


def _check_reservations(repo: pygit2.Repository, u: Update) -> None:
    """Reservations are a commit whose tree holds one storm JSON blob per reserved path
    (storm_git.core.reservations); any clone may replace them (they are advice, and
    every clone's push is leased), but nothing else may stand there."""
    if u.new == ZERO:
        raise Refused("deleting it is not allowed (every clone reads it)")
    obj = repo.get(u.new)
    if not isinstance(obj, pygit2.Commit):
        raise Refused(f"{u.new[:10]} is not a commit")
    for e in obj.tree:
        if e.type_str != "blob" or not reservations.readable_blob(repo[e.id].data):
            raise Refused(f"entry {e.name!r} of {u.new[:10]} is not a storm reservation")


def _check_forward(repo: pygit2.Repository, u: Update, why: str) -> None:
    if u.new == ZERO:
        raise Refused(f"deleting it is not allowed ({why})")
    if u.old != ZERO and u.old != u.new and not repo.descendant_of(pygit2.Oid(hex=u.new), pygit2.Oid(hex=u.old)):
        raise Refused(f"non-fast-forward update {u.old[:10]} -> {u.new[:10]} ({why})")


def _check_workspace(repo: pygit2.Repository, u: Update, post: dict[str, str]) -> int:
    _check_forward(repo, u, "the shared workspace only moves forward by validated writes")
    if u.old == ZERO:  # creation: the shared workspace starts from a project's commit
        check_tree_paths(repo, repo[pygit2.Oid(hex=u.new)].peel(pygit2.Commit), None)
        return 0
    walker = repo.walk(pygit2.Oid(hex=u.new), pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(pygit2.Oid(hex=u.old))
    n = 0
    for c in walker:
        check_commit(repo, c, post)
        n += 1
    return n


def check_commit(repo: pygit2.Repository, c: pygit2.Commit, post: dict[str, str]) -> None:
    """One write: trailers, paths, and provenance consistent with the parent."""
    short = str(c.id)[:10]
    if len(c.parent_ids) != 1:
        raise Refused(f"{short} has {len(c.parent_ids)} parents: a write has exactly one (its head)")
    t = parse_trailers(c.message)
    agent = (t.get("Storm-Agent") or [""])[0]
    op = (t.get("Storm-Op") or [""])[0]
    paths = t.get("Storm-Path", [])
    if not agent or not op or not paths:
        raise Refused(f"{short} lacks storm's trailers (Storm-Agent, Storm-Op, Storm-Path): not a storm write")
    try:
        validate_agent(agent)
    except (BadAgent, UsageError):
        raise Refused(f"{short} names an invalid agent {agent!r}") from None
    parent = repo[c.parent_ids[0]]
    check_tree_paths(repo, c, parent.tree)
    changed = _changed(repo, parent.tree, c.tree)
    extra = sorted(set(changed) - set(paths))
    if extra:
        raise Refused(f"{short} changes {', '.join(extra[:3])}, which its Storm-Path trailers do not name")
    entries, header = _provenance(repo, agent, c, t, post)
    if header.get("validated-at") != str(parent.id):
        raise Refused(f"{short}: its provenance was validated at {header.get('validated-at', '?')[:10]}, "
                      f"not at its parent {str(parent.id)[:10]}")
    read = {e.path: e.blob for e in entries if not (e.path in paths and op in EXPECTED_OPS)}
    stale = moved(read.items(), lambda p: _blob_at(repo, parent.tree, p))  # the rule writers apply
    if stale:
        p = stale[0]
        have = _blob_at(repo, parent.tree, p)
        raise Refused(f"{short}: its provenance says {agent} read {p} as {(read[p] or 'absent')[:10]}, "
                      f"but the parent has {(have or 'absent')[:10]}: the write was not validated")


def check_tree_paths(repo: pygit2.Repository, c: pygit2.Commit, parent: pygit2.Tree | None) -> None:
    """Every path ``c`` adds or changes (every path of its tree when ``parent`` is None)
    obeys the rules a local write obeys (storm_git.core.tree_rules: git's fsck rules for
    names, no link leading out of the tree or into .git, no link for a file git reads)
    and, for a write, the server's own ``storm.maxFileBytes``: a client's limit is the
    client's word, the server's config is what it enforces. (A clone refuses such an
    entry too, for servers without this guard: storm_git.disk.sync.refused_entry.)"""
    if parent is None:
        found = tree_rules.refusals(repo, c.tree)
    else:
        changed = [(d.new_file.raw_path.decode("utf-8", "surrogateescape"), d.new_file.id, d.new_file.mode)
                   for d in parent.diff_to_tree(c.tree).deltas if d.status_char() != "D"]
        found = tree_rules.refusals(repo, c.tree, changed, _server_limit(repo))
    why = next(found, None)
    if why is not None:
        raise Refused(f"{str(c.id)[:10]}: {why}")


def _server_limit(repo: pygit2.Repository) -> int:
    """storm.maxFileBytes in the server repository's config (k, m, g suffixes as git's)."""
    try:
        return repo.config.get_int("storm.maxFileBytes")
    except (KeyError, ValueError, pygit2.GitError):
        return DEFAULT_MAX_FILE_BYTES


def _changed(repo: pygit2.Repository, a: pygit2.Tree, b: pygit2.Tree) -> list[str]:
    diff = a.diff_to_tree(b)
    out = []
    for d in diff.deltas:
        out += [d.old_file.path, d.new_file.path]
    return list(dict.fromkeys(out))


def _blob_at(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> str | None:
    """The blob at ``path`` (None: absent, a directory, or under a file)."""
    try:
        obj = tree[path]
    except (KeyError, ValueError):
        return None
    return None if obj.filemode == pygit2.GIT_FILEMODE_TREE else str(obj.id)


def _provenance(repo: pygit2.Repository, agent: str, c: pygit2.Commit, t: dict[str, list[str]],
                post: dict[str, str]) -> tuple[list[ReadEntry], dict[str, str]]:
    """(the read set the write says it was validated against, its header): from the
    commit's provenance trailers."""
    commit = str(c.id)
    try:
        prov = parse_provenance_trailers(t)
    except ValueError as exc:
        raise Refused(f"{commit[:10]}: its provenance trailers cannot be read ({exc})") from None
    ref = AGENTS_PREFIX + agent
    tip = post.get(ref)
    if tip is None:
        try:
            tip = str(repo.lookup_reference(ref).target)
        except KeyError:
            tip = None
    tree = None if tip is None or tip == ZERO else repo[pygit2.Oid(hex=tip)].tree
    if prov is not None:
        if prov.reads and tree is None:
            raise Refused(f"{commit[:10]}: its provenance points into {ref}, which is not in the push "
                          "nor on the server: push the agent's notes with the write")
        try:
            entries = provenance_entries(repo, tree, agent, prov)
        except ProvenanceNotFound as exc:
            raise Refused(f"{commit[:10]}: {exc.message}: push the agent's notes (folded) with the write") from None
        except (CorruptReadSet, RepoStateError, KeyError, ValueError, AttributeError, TypeError) as exc:
            raise Refused(f"{commit[:10]}: the read set its provenance names cannot be read ({exc})") from None
        return entries, {"validated-at": prov.validated_at, "scope": prov.scope}
    raise Refused(f"{commit[:10]} has no provenance: no Storm-Read-Set trailer")


def run(stdin_text: str, path: str = ".") -> tuple[int, list[str]]:
    """The hook's verdict: (0 accepts the push, 1 refuses it; the reasons, for the pusher)."""
    try:
        repo = open_repo(path)
        updates = parse_updates(stdin_text)
        verdict = check(repo, updates)
    except Exception as exc:  # noqa: BLE001 - a guard that cannot check refuses
        return 1, [f"git storm guard: cannot check this push ({type(exc).__name__}: {exc}); refused"]
    if verdict.ok:  # git locks the refs next: a lock a dead update left would refuse the push
        ref_locks.clear_stale(path, [u.ref for u in updates if u.ref.startswith(STORM_NAMESPACES)
                                     and not u.ref.startswith(INBOX_PREFIX)])
    return (0 if verdict.ok else 1), [f"git storm guard: refused {r}" for r in verdict.refused]


# -- installing it ----------------------------------------------------------------------
@dataclass
class InstallResult:
    repository: str
    hook: str
    chained: str | None
    python: str
    # storm's modules compiled to bytecode for that interpreter: the hook starts a
    # Python for every push, and one that compiles storm from source doubles its cost
    precompiled: bool = False
    # core.hooksPath names a directory outside the repository (several repositories'
    # hooks): the guard runs for their pushes too (it acts only on storm's refs)
    shared: bool = False
    ordering: bool = False  # the proc-receive hook orders clones' writes (server_order)
    ordering_skipped: str | None = None  # why it does not

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def render(python: str) -> str:
    return (f"#!/bin/sh\n# {MARKER}: storm's guard on refs/storm/* (git storm server-hook install).\n"
            "# It refuses non-fast-forward moves of refs/storm/workspace, commits without storm's\n"
            "# trailers or provenance, and provenance that contradicts the parent. See docs/remote.md.\n"
            f"STORM_PYTHON={_sh_quote(python)}\n"
            'input=$(cat)\n'
            "# a push to a clone's inbox is checked by the proc-receive hook; without it, refused\n"
            'case "$input" in\n'
            f'*" {INBOX_PREFIX}"*)\n'
            f'    if ! git config --get-all receive.procReceiveRefs | grep -qx {INBOX_PREFIX.rstrip("/")} ||\n'
            f'       ! grep -q {MARKER} "$(dirname "$0")/{PROC_RECEIVE}" 2>/dev/null; then\n'
            f'        echo "{GUARD_NAME}: refused {INBOX_PREFIX}: {NO_ORDERING}" >&2; exit 1\n'
            '    fi\n'
            "    # what the push carries is checked now, while git can still drop its objects\n"
            f'    printf "%s\\n" "$input" | grep " {INBOX_PREFIX}" |\n'
            '        "$STORM_PYTHON" -m storm_git.remote.inbox_check pre-receive || exit 1 ;;\n'
            'esac\n'
            "# only pushes that move storm's refs (but for the inbox) pay for the interpreter\n"
            f'if printf "%s\\n" "$input" | grep -v " {INBOX_PREFIX}"'
            ' | grep -q " refs/storm/\\| refs/notes/storm/"; then\n'
            '    printf "%s\\n" "$input" | "$STORM_PYTHON" -m storm_git.remote.server_hook pre-receive || exit 1\n'
            'fi\n'
            'if [ -x "$0.storm-chained" ]; then\n'
            '    printf "%s\\n" "$input" | "$0.storm-chained" "$@" || exit 1\n'
            "fi\n"
            "exit 0\n")


def install(path: str, ordering: bool = True) -> InstallResult:
    """Write the pre-receive hook into the bare repository at ``path`` (idempotent;
    a hook that was there is kept as ``pre-receive.storm-chained`` and still runs);
    with ``ordering``, the proc-receive hook that orders clones' writes too
    (storm_git.remote.server_order)."""
    repo = _bare(path)
    hooks = hooks_dir(repo.path)
    os.makedirs(hooks, exist_ok=True)
    target = os.path.join(hooks, HOOK)
    chained = None
    if os.path.lexists(target) and not _is_ours(target):
        chained = target + ".storm-chained"
        if os.path.lexists(chained):
            raise RepoStateError(f"{target} is not storm's and {chained} already exists",
                                 hint="move one of them away, then install again")
        os.rename(target, chained)
    replace_file(target, render(sys.executable).encode("utf-8"), mode=0o755)
    gitdir = os.path.realpath(repo.path)
    shared = os.path.commonpath([gitdir, os.path.realpath(hooks)]) != gitdir
    res = InstallResult(os.path.normpath(repo.path), target, chained, sys.executable, _precompile(), shared)
    if ordering:
        res.ordering_skipped = _install_ordering(repo, hooks)
        res.ordering = res.ordering_skipped is None
    else:
        _delete_ref(repo, ORDERING_REF)  # clones push to the workspace with a lease again
    return res


def render_proc_receive(python: str) -> str:
    return (f"#!/bin/sh\n# {MARKER}: storm's ordering of the writes clones push to {INBOX_PREFIX}<clone>/\n"
            "# (git storm server-hook install): applied in arrival order, checked as the guard checks.\n"
            f"exec {_sh_quote(python)} -m storm_git.remote.server_order proc-receive\n")


def _install_ordering(repo: pygit2.Repository, hooks: str) -> str | None:
    """The proc-receive hook, ``receive.procReceiveRefs`` and the ref that tells clones
    (their inbox); why not, when a proc-receive hook of another tool is there (one
    hook speaks git's protocol for all of a push's refs: it cannot be chained)."""
    target = os.path.join(hooks, PROC_RECEIVE)
    if os.path.lexists(target) and not _is_ours(target):
        _delete_ref(repo, ORDERING_REF)
        return (f"{target} is another tool's: clones push to {WORKSPACE_REF} with a lease (storm orders "
                "writes only with its own proc-receive hook)")
    replace_file(target, render_proc_receive(sys.executable).encode("utf-8"), mode=0o755)
    if INBOX_PREFIX.rstrip("/") not in list(repo.config.get_multivar("receive.procReceiveRefs")):
        run_git(["config", "--add", "receive.procReceiveRefs", INBOX_PREFIX.rstrip("/")], repo.path,
                env={"GIT_DIR": repo.path})
    for sub in ("order", "locks"):  # made here, by the repository's owner (the hooks may run as others)
        os.makedirs(os.path.join(repo.path, "storm", sub), exist_ok=True)
    if repo.references.get(ORDERING_REF) is None:
        sig = pygit2.Signature("git storm", "storm@storm.invalid")
        tree = repo.TreeBuilder().write()
        note = (f"git storm: this server orders writes\n\nClones push their queued writes to "
                f"{INBOX_PREFIX}<clone>/workspace; storm's proc-receive hook applies them in arrival order.\n")
        repo.references.create(ORDERING_REF, repo.create_commit(None, sig, sig, note, tree, []))
    return None


def _delete_ref(repo: pygit2.Repository, name: str) -> None:
    if repo.references.get(name) is not None:
        repo.references.delete(name)


def _bare(path: str) -> pygit2.Repository:
    try:
        repo = pygit2.Repository(path)
    except (pygit2.GitError, KeyError):
        raise UsageError(f"{path} is not a git repository",
                         hint="run git storm server-hook install inside the server's bare repository") from None
    if not repo.is_bare:
        raise UsageError(f"{path} is not a bare repository",
                         hint="install the guard in the server's bare repository (git init --bare), not a clone")
    return repo


class GuardInactive(RepoStateError):
    kind = "guard_inactive"


class StaleRefLock(RepoStateError):
    """A storm ref's ``<ref>.lock`` left on the server by an update that died."""

    kind = "stale_ref_lock"


@dataclass
class GuardStatus:
    """Whether git will run storm's guard on the next push (``check``)."""

    repository: str
    hook: str  # where git runs the pre-receive hook from
    python: str | None  # the interpreter the hook names
    ordering: bool = False  # clones' writes are ordered here (refs/storm/ordering, the proc-receive hook)
    removed_locks: list[str] = field(default_factory=list)  # stale ref locks removed (--fix)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_installed(path: str, fix: bool = False) -> GuardStatus:
    """Storm's guard is where git runs the repository's pre-receive hook, executable,
    and its interpreter imports storm; else GuardInactive (exit 3) saying what is not.
    A storm ref's lock left by a dead update is StaleRefLock (exit 3), or with ``fix``
    removed (:mod:`.ref_locks`).
    A hook can stop running without a word: ``core.hooksPath`` set after install, the
    interpreter's virtualenv removed (the hook then refuses every push to storm's refs)."""
    repo = _bare(path)
    target = os.path.join(hooks_dir(repo.path), HOOK)
    hint = f"git storm server-hook install {path}"
    if not _is_ours(target):
        stray = os.path.join(repo.path, "hooks", HOOK)
        where = (f"; the one in {stray} is not run: core.hooksPath sends hooks to {os.path.dirname(target)}"
                 if stray != target and _is_ours(stray) else "")
        raise GuardInactive(f"storm's guard is not installed where git runs this repository's hooks "
                            f"({target}){where}", hint=hint)
    if not os.access(target, os.X_OK):
        raise GuardInactive(f"{target} is not executable: git skips it", hint=f"chmod +x {target}")
    with open(target, encoding="utf-8", errors="replace") as fh:
        python = next((shlex.split(ln.split("=", 1)[1])[0] for ln in fh if ln.startswith("STORM_PYTHON=")), None)
    if python is None or not os.access(python, os.X_OK):
        raise GuardInactive(f"the guard's interpreter {python} is gone: every push to storm's refs is refused",
                            hint=hint + " (with the Python that has git storm)")
    r = subprocess.run([python, "-c", "import storm_git.remote.server_hook"], capture_output=True,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise GuardInactive(f"the guard's interpreter {python} cannot import git storm: every push to storm's refs "
                            "is refused", hint=hint + " (with the Python that has git storm)")
    ordering = repo.references.get(ORDERING_REF) is not None
    if ordering and not ordering_configured(repo):
        raise GuardInactive(f"{ORDERING_REF} tells clones this server orders writes, but {NO_ORDERING.split(': ')[0]}: "
                            "every write then pushes twice (the inbox refused, then the lease)", hint=hint)
    if ordering and not os.access(os.path.join(hooks_dir(repo.path), PROC_RECEIVE), os.X_OK):
        raise GuardInactive(f"{os.path.join(hooks_dir(repo.path), PROC_RECEIVE)} is not executable: git cannot run it",
                            hint=hint)
    status = GuardStatus(os.path.normpath(repo.path), target, python, ordering)
    left = ref_locks.stale(repo.path)
    if left and fix:
        status.removed_locks = [s.path for s in ref_locks.clear_stale(repo.path, [s.ref for s in left])]
    elif left:
        raise StaleRefLock(f"{left[0].describe()}: every push that moves {left[0].ref} fails until it goes"
                           + (f" (and {len(left) - 1} more)" if len(left) > 1 else ""),
                           hint=f"git storm server-hook check --fix {path} removes it (the ordering hook "
                                "also does at the next push to an inbox)")
    return status


def hooks_dir(gitdir: str) -> str:
    """Where git runs this repository's hooks from: ``core.hooksPath`` when set (in
    the repository's, the server user's or the system's config; relative to the
    git directory of a bare repository, where git runs hooks), else ``hooks/``: a
    guard written to ``hooks/pre-receive`` under a ``core.hooksPath`` would never
    run, and forged pushes would be accepted."""
    r = run_git(["rev-parse", "--git-path", "hooks"], gitdir, env={"GIT_DIR": gitdir})
    out = r.stdout.decode("utf-8", "surrogateescape").rstrip("\n")
    return os.path.normpath(os.path.join(gitdir, out))


def _precompile() -> bool:
    """Write the bytecode of storm's modules for this interpreter now, once, so that the
    hook's Python, started for every push, never compiles them from source (it would
    each time where bytecode is not written: PYTHONDONTWRITEBYTECODE, a read-only
    install). False when some could not be written (the hook still works, slower)."""
    import compileall

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return bool(compileall.compile_dir(package, quiet=2))
    except OSError:
        return False


def _is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return MARKER.encode() in fh.read(512)
    except (FileNotFoundError, IsADirectoryError):
        return False


def main(argv: list[str]) -> int:
    """What git runs: the reasons go to stderr, which git shows the pusher."""
    if argv[:1] != [HOOK]:
        sys.stderr.write("usage: python -m storm_git.remote.server_hook pre-receive < updates\n")
        return 2
    code, lines = run(sys.stdin.read())
    sys.stderr.write("".join(line + "\n" for line in lines))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
