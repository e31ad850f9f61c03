"""``git storm maintenance``: keep loose objects in check on long runs, safely.

Every storm write leaves a handful of loose objects (blob, trees, commit, notes
commits: GIT-FACTS measures ~6 for the write alone), and libgit2 never triggers
``git gc --auto``. Over thousands of writes the object directory would fill with
loose files. This runs git's own maintenance tasks that are designed to run
beside concurrent writers:

* ``loose-objects``: deletes loose objects that are already in a pack, then
  packs a batch of the remaining loose objects (reachable or not) into a new
  pack. Nothing is deleted that is not in a pack, so a writer's freshly written,
  not yet referenced object is never lost;
* ``incremental-repack``: folds small packs together through the
  multi-pack-index (only once a pack exists; git fails the task otherwise);
* ``pack-refs``: packs loose refs (storm's CAS works on packed refs too).

The ``loose-objects`` task runs twice: its first pass packs the loose objects, its
second removes the loose copies the first one packed, so one ``git storm
maintenance`` leaves few loose objects (git's own task needs two runs for that).

**Automatic trigger**, like ``git gc --auto``: after an accepted write whose commit
id ends in a zero nibble (one write in 16, whichever process makes it), storm
estimates the loose objects from ``objects/17`` (as git does) and, above
``storm.autoMaintenance`` (default 6700, git's ``gc.auto``; 0 turns it off), starts
``git storm maintenance --auto`` in the background, detached. One runs at a time
(the ``maintenance`` flock); a writer never waits for it.

It never prunes. ``git gc --prune=now`` (or ``git prune`` with a short
``--expire``) deletes unreferenced objects at once, and a storm writer's commit is
unreferenced between being written and the CAS that publishes it: GIT-FACTS saw
it corrupt a repository under concurrent writers. Storm never runs it and never
advises it; ``git gc`` with the default two-week grace period is safe.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from dataclasses import dataclass, field

from .errors import RepoStateError
from .locks import try_flocked
from .store import Store, git_env

TASKS = ("loose-objects", "loose-objects", "incremental-repack", "pack-refs")
AUTO_DEFAULT = 6700  # git's gc.auto
CHECK_EVERY = 16  # writes, by commit id: one in 16 looks at objects/17


@dataclass
class ObjectCounts:
    loose: int
    packed: int
    packs: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class MaintenanceResult:
    before: ObjectCounts
    after: ObjectCounts
    tasks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"before": self.before.to_dict(), "after": self.after.to_dict(), "tasks": self.tasks}


def _git(store: Store, *args: str) -> subprocess.CompletedProcess:
    # The repository, not the caller's GIT_DIR/GIT_WORK_TREE, is the one to maintain.
    return subprocess.run(["git", "--git-dir", store.commondir, *args], capture_output=True,
                          text=True, env=git_env(), stdin=subprocess.DEVNULL)


def count_objects(store: Store) -> ObjectCounts:
    r = _git(store, "count-objects", "-v")
    if r.returncode != 0:
        raise RepoStateError(f"git count-objects failed: {r.stderr.strip()}", hint="run git fsck")
    kv = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    return ObjectCounts(int(kv.get("count", 0)), int(kv.get("in-pack", 0)), int(kv.get("packs", 0)))


def estimate_loose(store: Store) -> int:
    """Loose objects, estimated from one fan-out directory as ``git gc --auto`` does."""
    try:
        return 256 * len(os.listdir(os.path.join(store.commondir, "objects", "17")))
    except FileNotFoundError:
        return 0


def auto_limit(store: Store) -> int:
    return store.config_int("storm.autoMaintenance", AUTO_DEFAULT)


def due(store: Store) -> bool:
    limit = auto_limit(store)
    return limit > 0 and estimate_loose(store) > limit


def after_write(store: Store, commit: object) -> bool:
    """Called after an accepted write: start background maintenance when it is due
    (cheap: one write in CHECK_EVERY lists one directory). Returns whether it started."""
    raw = getattr(commit, "raw", b"")
    if not raw or raw[-1] % CHECK_EVERY or not due(store):
        return False
    with try_flocked(store.commondir, "maintenance") as free:
        if not free:  # one is running: starting another Python only to find that out costs
            return False  # ~0.1 s of CPU, every 16th write of every writer while a repack runs
    try:
        subprocess.Popen([sys.executable, "-m", "storm_git", "maintenance", "--auto"], cwd=store.top,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        return False  # maintenance is an optimisation: a write never fails for it
    return True


def run_auto(store: Store) -> MaintenanceResult | None:
    """``maintenance --auto``: run when due and nobody else is running it."""
    with try_flocked(store.commondir, "maintenance") as taken:
        if not taken or not due(store):
            return None
        return _run(store)


def run(store: Store) -> MaintenanceResult:
    """Run the safe maintenance tasks; returns loose/packed counts before and after."""
    from .locks import flocked

    with flocked(store.commondir, "maintenance"):
        return _run(store)


def _run(store: Store) -> MaintenanceResult:
    from . import readsets

    readsets.fold_all(store)  # journals into notes first, so the pack holds them
    before = count_objects(store)
    done = []
    for task in TASKS:
        if task == "incremental-repack" and not glob.glob(os.path.join(store.commondir, "objects", "pack", "*.pack")):
            continue
        r = _git(store, "maintenance", "run", f"--task={task}")
        if r.returncode != 0:
            msg = (r.stderr.strip().splitlines() or ["failed"])[-1]
            raise RepoStateError(f"git maintenance run --task={task}: {msg}",
                                 hint="run git fsck; then git storm maintenance again")
        done.append(task)
    return MaintenanceResult(before, count_objects(store), done)
