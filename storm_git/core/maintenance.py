"""``git storm maintenance``: keep loose objects in check on long runs, safely.

Every storm write leaves a handful of loose objects (blob, trees, commit, notes
commits: ~6 for the write alone), and libgit2 never triggers
``git gc --auto``. Over thousands of writes the object directory would fill with
loose files. This runs what git designed to run beside concurrent writers:

* git maintenance's ``loose-objects`` task, twice (the loose step): it deletes
  the loose objects already in a pack, then packs the remaining loose objects,
  reachable or not, into one new pack, fed their ids directly (no walk of the
  history); the second pass deletes the loose copies the first one packed. It
  deletes no pack, and its time grows with the loose objects only.
* ``git repack -d --geometric=2`` (the roll-up), once there are more than
  ROLLUP_AT packs: rolls the small packs together so that each pack holds at
  least twice the objects of the next smaller one (a few packs however long the
  run), and deletes only the packs it rolled up, whose objects are in its new
  pack. Its time grows with the packs it rolls up, which now and then is the
  whole repository, so it runs under its own lock: a loose step may run while a
  roll-up does (the loose step deletes no pack; a roll-up deletes only the packs
  it chose when it started), and the loose objects stay bounded during a long
  roll-up. git 2.39 cannot run it in a partial clone; there storm rolls the
  clone's own packs up itself, by git's rule, and leaves the fetched (promisor)
  packs as they are (storm_git.core.packs).
* ``pack-refs``: packs loose refs (storm's CAS works on packed refs too).

Nothing is deleted that is not in a pack, so a writer's freshly written, not yet
referenced object is never lost. (The roll-up replaced git maintenance's
``incremental-repack``, which through the multi-pack-index left a new pack per
run: 13 after 10,000 writes, and every object lookup, storm's and git's, slowed
with them. Plain ``git repack -d`` does not replace the loose step: it walks the
whole history to find unpacked objects, and packs only the reachable ones.)

**Automatic trigger**, like ``git gc --auto``: after an accepted write whose commit
id ends in a zero nibble (one write in 16, whichever process makes it), storm
estimates the loose objects from four of the 256 fan-out directories (git looks
at ``objects/17`` alone; four make the estimate half as noisy) and, above
``storm.autoMaintenance`` (default 6700, git's ``gc.auto``; 0 turns it off), starts
``git storm maintenance --auto`` in the background, detached. One loose step runs
at a time (the ``maintenance`` flock) and one roll-up (``maintenance-rollup``); a
writer never waits for either. While a run takes its ~0.6 s, writers go on: the
loose count passes the bound by what they write meanwhile (~1,400 objects for one
writer on 2 cores, ``benchmarks/bench_longrun.py``). Starting at half the bound
kept it under the bound, but ran twice as many maintenance processes and made
10,000 writes take 55-62 s instead of 45 s on 2 cores, so the trigger stays at
the bound, as git's does.

Each task run is recorded (``.git/storm/maintenance-runs``, a JSON line per run:
when, how long, git's CPU in it, the counts before and after), so that
``git storm maintenance --history`` and the benchmarks say when maintenance ran
instead of inferring it from falling loose counts.

It never prunes. ``git gc --prune=now`` (or ``git prune`` with a short
``--expire``) deletes unreferenced objects at once, and a storm writer's commit is
unreferenced between being written and the CAS that publishes it, so it can
corrupt a repository under concurrent writers. Storm never runs it and never
advises it; ``git gc`` with the default two-week grace period is safe.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import packs, promisor
from .errors import RepoStateError
from .files import append_log_line
from .locks import flocked, is_locked, try_flocked
from .store import Store, git_env

LOOSE, ROLLUP, PACK_REFS = "loose-objects", "geometric-rollup", "pack-refs"
LOCK, ROLLUP_LOCK = "maintenance", "maintenance-rollup"  # flocks; taken in this order, never the other
ROLLUP_AT = 4  # packs: more, and the next run rolls them up (geometric, factor 2)
AUTO_DEFAULT = 6700  # git's gc.auto
CHECK_EVERY = 16  # writes, by commit id: one in 16 looks at the fan-out sample
SAMPLE = ("17", "5a", "9c", "e3")  # fan-out directories the estimate counts (1/64 of all)


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


RECORD = "maintenance-runs"  # in .git/storm: one JSON line per task run
RECORD_MAX = 256 * 1024  # bytes: past it the record moves to RECORD.1 (one generation kept)


@dataclass
class RunRecord:
    """One run of a task (the loose step or the roll-up), as recorded."""

    task: str  # LOOSE or ROLLUP
    started: float  # unix time
    seconds: float
    cpu_s: float  # git's CPU in it (its processes' user + system time)
    auto: bool  # started by a write (maintenance --auto), not by hand
    before: ObjectCounts
    after: ObjectCounts
    pid: int = 0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["before"], d["after"] = self.before.to_dict(), self.after.to_dict()
        return d


def _record_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", RECORD)


def _record(store: Store, rec: RunRecord) -> None:
    """Append ``rec`` (one line, one ``write`` with O_APPEND: the loose step and a
    roll-up may append at once). A failure to record never fails the maintenance."""
    line = (json.dumps(rec.to_dict(), separators=(",", ":")) + "\n").encode()
    append_log_line(_record_path(store), line, RECORD_MAX)


def history(store: Store, since: float = 0.0) -> list[RunRecord]:
    """The recorded runs that started at or after ``since``, oldest first (a line
    that does not parse, such as one cut by a full disk, is skipped)."""
    out: list[RunRecord] = []
    for path in (_record_path(store) + ".1", _record_path(store)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue
        for line in lines:
            try:
                d = json.loads(line)
                rec = RunRecord(str(d["task"]), float(d["started"]), float(d["seconds"]), float(d["cpu_s"]),
                                bool(d["auto"]), ObjectCounts(**d["before"]), ObjectCounts(**d["after"]),
                                int(d.get("pid", 0)))
            except (ValueError, KeyError, TypeError):
                continue
            if rec.started >= since:
                out.append(rec)
    return sorted(out, key=lambda r: r.started)


@contextlib.contextmanager
def _recorded(store: Store, task: str, auto: bool) -> Iterator[None]:
    """Time the task's block and record it (not when it raised: nothing was done)."""
    before = count_objects(store)
    t0, wall, cpu0 = time.time(), time.monotonic(), _children_cpu()
    yield
    _record(store, RunRecord(task, t0, round(time.monotonic() - wall, 3), round(_children_cpu() - cpu0, 3),
                             auto, before, count_objects(store), os.getpid()))


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


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
    """Loose objects, estimated from a sample of fan-out directories (object ids are
    uniform, so 4 of 256 directories hold 1/64 of them)."""
    n = 0
    for d in SAMPLE:
        try:
            n += len(os.listdir(os.path.join(store.commondir, "objects", d)))
        except FileNotFoundError:
            pass
    return n * (256 // len(SAMPLE))


def auto_limit(store: Store) -> int:
    return store.config_int("storm.autoMaintenance", AUTO_DEFAULT)


def due(store: Store) -> bool:
    limit = auto_limit(store)
    return limit > 0 and estimate_loose(store) > limit


def after_write(store: Store, commit: object) -> bool:
    """Called after an accepted write: start background maintenance when it is due
    (cheap: one write in CHECK_EVERY lists one directory). Returns whether it started."""
    raw = getattr(commit, "raw", b"")
    if not raw or raw[-1] % CHECK_EVERY:
        return False
    try:
        if not due(store):
            return False
        with try_flocked(store.commondir, LOCK) as free:
            if not free:  # one is running: starting another Python only to find that out costs
                return False  # ~0.1 s of CPU, every 16th write of every writer while a repack runs
    except (RepoStateError, OSError):  # a bad storm.autoMaintenance, a full disk: the write has
        return False  # landed and stands; git storm maintenance --auto (and doctor) name the cause
    try:
        subprocess.Popen([sys.executable, "-m", "storm_git", "maintenance", "--auto"], cwd=store.top,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        return False  # maintenance is an optimisation: a write never fails for it
    return True


def run_auto(store: Store) -> MaintenanceResult | None:
    """``maintenance --auto``: run when due and nobody else is running the loose step;
    the roll-up only if no other roll-up runs (module docstring)."""
    with try_flocked(store.commondir, LOCK) as taken:
        if not taken or not due(store):
            return None
        before = count_objects(store)
        done = _loose(store, auto=True)
    done += _rollup(store, wait=False, auto=True)
    return MaintenanceResult(before, count_objects(store), done)


def run(store: Store) -> MaintenanceResult:
    """Run the safe maintenance tasks; returns loose/packed counts before and after."""
    with flocked(store.commondir, LOCK, patient=True):  # behind a background run, however long
        before = count_objects(store)
        done = _loose(store, auto=False)
    done += _rollup(store, wait=True, auto=False)
    return MaintenanceResult(before, count_objects(store), done)


def _loose(store: Store, *, auto: bool) -> list[str]:
    """The loose step and pack-refs (the ``maintenance`` lock held)."""
    from . import readsets

    with _recorded(store, LOOSE, auto):
        readsets.fold_all(store)  # journals into notes first, so the pack holds them
        for _ in range(2):  # the first pass packs them, the second deletes the loose copies
            _check(_git(store, "maintenance", "run", f"--task={LOOSE}"), LOOSE)
        _check(_git(store, "maintenance", "run", f"--task={PACK_REFS}"), PACK_REFS)
    return [LOOSE, LOOSE, PACK_REFS]


def _rollup(store: Store, *, wait: bool, auto: bool) -> list[str]:
    """The geometric roll-up, under its own lock, once there are more than ROLLUP_AT
    packs (always for an explicit run, which waits for a running roll-up)."""
    partial = promisor.remote_of(store.repo) is not None  # its fetched packs stay (storm_git.core.packs)
    if not wait and (sum(not p.fixed for p in packs.listing(store.commondir)) if partial
                     else count_objects(store).packs) <= ROLLUP_AT:
        return []
    with (flocked(store.commondir, ROLLUP_LOCK, patient=True) if wait else
          try_flocked(store.commondir, ROLLUP_LOCK)) as taken:
        if taken is False:
            return []
        with _recorded(store, ROLLUP, auto):
            if partial:
                packs.rollup(store.commondir, git_env())
            else:
                _check(_git(store, "repack", "-d", "-q", "--geometric=2", "--no-write-bitmap-index"), ROLLUP)
    return [ROLLUP]


@contextlib.contextmanager
def quiesced(commondir: str) -> Iterator[None]:
    """Hold off storm's maintenance (both steps) for the block, waiting for a running
    one to finish: for what must not see objects move between packs (``git fsck``
    lists packs, then loose objects, and calls an object that moved between the two
    missing)."""
    with flocked(commondir, LOCK, patient=True), flocked(commondir, ROLLUP_LOCK, patient=True):
        yield


def running(store: Store) -> bool:
    """Whether a storm maintenance (either step) runs now."""
    return is_locked(store.commondir, LOCK) or is_locked(store.commondir, ROLLUP_LOCK)


def _check(r: subprocess.CompletedProcess, task: str) -> None:
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["failed"])[-1]
        raise RepoStateError(f"{task}: {msg}", hint="run git fsck; then git storm maintenance again")
