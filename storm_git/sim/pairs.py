"""Feature pairs (CooperBench's layout) replayed by two agents in each mode.

A pairs directory holds task folders; a task folder has ``setup.sh`` naming
``BASE_COMMIT=<sha>`` (a commit of ``--repo``) and ``feature<K>/feature.patch``
(the feature's implementation) with ``feature<K>/tests.patch`` (its tests). Each
pair of features of a task is one workload: two agents start from the base
commit, feature i's agent writes first, feature j's second. It runs in three
modes, every agent step a ``git storm`` command (:mod:`storm_git.sim.cli_agent`):

* ``worktree``: each agent commits on its branch, the manager merges; a
  conflicting pair is caught at merge.
* ``storm``: the second writer of a shared file is rejected (caught at write)
  and re-plans: re-reads and re-applies its change.
* ``storm+rebased``: the same rejection, cleared by accepting the rebased change
  the rejection offers when it has no conflict markers (one call).

With tests, each feature's tests (its tests.patch applied on an export of the
integrated result) run on every result; a feature whose tests pass on its own
but fail on a result that integrated without a conflicting hunk is a semantic
conflict. In every file where git merges the two changes cleanly (or only one
feature changes it) both must keep each line they added: one missing is a lost
update, as is anything :func:`metrics.lost_updates` finds.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import UsageError
from . import pairs_report, runner
from .metrics import RunMetrics, added_lines
from .workload import Change, Files, Workload, merge3, tree_files

MODES = ("worktree", "storm", "storm+rebased")
CAUGHT = ("write", "merge", "tests", "never", "none")
TEST_TIMEOUT = 900
DEFAULT_TEST_CMD = "python -m pytest -q -p no:cacheprovider $STORM_TEST_FILES"
_BASE = re.compile(r"""^\s*BASE_COMMIT\s*=\s*["']?([0-9a-fA-F]{7,40})["']?\s*$""", re.M)
_FEATURE = re.compile(r"^feature(\d+)$")


@dataclass
class Feature:
    task: str
    number: int
    patch: str  # feature.patch
    tests: str | None  # tests.patch (None: the feature has no tests)
    change: Change
    tree: str  # the base tree with the feature applied (for its tests alone)


@dataclass
class Task:
    name: str
    base: str
    features: list[Feature]


@dataclass
class ModeResult:
    mode: str
    caught: str  # one of CAUGHT
    rejections: int = 0
    rebased_accepted: int = 0
    rebased_refused: int = 0
    rereads: int = 0
    merge_conflicts: int = 0
    judgement: int = 0
    lost_updates: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)
    agent_calls: int = 0
    wall_s: float = 0.0
    tests: dict[str, bool | None] = field(default_factory=dict)  # feature -> its tests pass on the result
    tests_s: float = 0.0
    semantic: bool = False
    errors: list[str] = field(default_factory=list)
    watch: dict[str, Any] | None = None  # storm modes with tests: the runner on the shared head (watch_chain)


@dataclass
class PairResult:
    task: str
    f1: int
    f2: int
    shared: list[str]  # files both features change
    gold_conflict: bool | None  # the dataset's verdict (git merge of the two patches), when given
    modes: dict[str, ModeResult] = field(default_factory=dict)


# -- loading -------------------------------------------------------------------------
def _git(repo: str, *args: str, env: dict[str, str] | None = None) -> bytes:
    r = subprocess.run(["git", *args], cwd=repo, capture_output=True, env=env)
    if r.returncode != 0:
        msg = r.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"git {' '.join(args[:2])} failed in {repo}: {msg[-1] if msg else r.returncode}")
    return r.stdout


def base_commit(setup_sh: str) -> str:
    """The ``BASE_COMMIT=...`` a task's setup.sh names."""
    with open(setup_sh, encoding="utf-8", errors="replace") as fh:
        m = _BASE.search(fh.read())
    if not m:
        raise UsageError(f"{setup_sh} names no BASE_COMMIT=<sha>")
    return m.group(1)


def _apply(repo: str, base: str, patch: str) -> str:
    """The tree of ``base`` with ``patch`` applied (a temporary index; nothing else changes)."""
    with tempfile.TemporaryDirectory(prefix="storm-pairs-") as d:
        env = dict(os.environ, GIT_INDEX_FILE=os.path.join(d, "index"))
        _git(repo, "read-tree", base, env=env)
        for extra in ((), ("--ignore-whitespace",), ("--3way",)):
            r = subprocess.run(["git", "apply", "--cached", *extra, os.path.abspath(patch)], cwd=repo,
                               capture_output=True, env=env)
            if r.returncode == 0:
                return _git(repo, "write-tree", env=env).decode().strip()
            _git(repo, "read-tree", base, env=env)
        err = r.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"{patch} does not apply to {base[:10]}: {err[-1] if err else ''}")


def _show(repo: str, rev: str, path: str) -> bytes | None:
    r = subprocess.run(["git", "cat-file", "blob", f"{rev}:{path}"], cwd=repo, capture_output=True)
    return r.stdout if r.returncode == 0 else None


def _feature(repo: str, task: str, base: str, number: int, folder: str) -> Feature:
    patch = os.path.join(folder, "feature.patch")
    tree = _apply(repo, base, patch)
    paths = [p for p in _git(repo, "diff-tree", "-r", "-z", "--no-renames", "--name-only", base, tree)
             .decode("utf-8", "surrogateescape").split("\0") if p]
    tests = os.path.join(folder, "tests.patch")
    change = Change(f"{task} feature {number}", paths, parent={p: _show(repo, base, p) for p in paths},
                    post={p: _show(repo, tree, p) for p in paths})
    return Feature(task, number, patch, tests if os.path.isfile(tests) else None, change, tree)


def load(pairs_dir: str, repo: str, tasks: tuple[str, ...] = (), features: tuple[int, ...] = ()) -> list[Task]:
    """The tasks of ``pairs_dir`` (all, or those named: ``task2800`` or ``2800``) with
    their features (all, or those numbered in ``features``)."""
    if not os.path.isdir(pairs_dir):
        raise UsageError(f"--pairs {pairs_dir}: not a directory")
    _git(repo, "rev-parse", "--git-dir")
    want = {t if not t.isdigit() else f"task{t}" for t in tasks}
    out = []
    for name in sorted(os.listdir(pairs_dir)):
        folder = os.path.join(pairs_dir, name)
        if not os.path.isfile(os.path.join(folder, "setup.sh")) or (want and name not in want):
            continue
        base = _git(repo, "rev-parse", "--verify", base_commit(os.path.join(folder, "setup.sh")) + "^{commit}",
                    ).decode().strip()
        numbered = sorted((int(m.group(1)), f) for f in os.listdir(folder) if (m := _FEATURE.match(f))
                          and os.path.isfile(os.path.join(folder, f, "feature.patch")))
        feats = [_feature(repo, name, base, k, os.path.join(folder, f)) for k, f in numbered
                 if not features or k in features]
        out.append(Task(name, base, feats))
    missing = want - {t.name for t in out}
    if missing:
        raise UsageError(f"--tasks: no task folder {sorted(missing)[0]} (with setup.sh) in {pairs_dir}")
    if not out:
        raise UsageError(f"--pairs {pairs_dir}: no task folder with setup.sh")
    return out


def workload(task: Task, a: Feature, b: Feature, base: Files) -> Workload:
    """Two agents, one feature each; ``a`` writes first."""
    first, second = (Change.from_json(f.change.to_json()) for f in (a, b))
    first.args["_order"], second.args["_order"] = 0, 1
    return Workload(f"{task.name} f{a.number}+f{b.number}", "pairs", base, [[first], [second]],
                    params={"task": task.name, "base": task.base, "features": [a.number, b.number]})


# -- tests -----------------------------------------------------------------------------
def test_files(patch: str) -> list[str]:
    """The files a tests.patch creates or changes."""
    with open(patch, encoding="utf-8", errors="replace") as fh:
        return list(dict.fromkeys(ln[6:].strip() for ln in fh if ln.startswith("+++ b/")))


class Tests:
    """Runs a feature's tests on a tree, once per (tree, feature): the same result
    reached in two modes is tested once."""

    def __init__(self, cmd: str | None) -> None:
        self.cmd = cmd or DEFAULT_TEST_CMD
        self.cache: dict[tuple[str, str], tuple[bool, str]] = {}
        self.seconds = 0.0
        self.watch_cache: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})  # the runner's results, by tree

    def run(self, repo: str, tree: str, f: Feature) -> tuple[bool, str] | None:
        """(passed, tail of the output); None when the feature has no tests."""
        if f.tests is None:
            return None
        key = (tree, hashlib.sha256(open(f.tests, "rb").read() + self.cmd.encode()).hexdigest())
        if key not in self.cache:
            t0 = time.monotonic()
            self.cache[key] = self._run(repo, tree, f.tests)
            self.seconds += time.monotonic() - t0
        return self.cache[key]

    def _run(self, repo: str, tree: str, patch: str) -> tuple[bool, str]:
        out = tempfile.mkdtemp(prefix="storm-pairs-test-")
        try:
            subprocess.run(["tar", "-x", "-C", out], input=_git(repo, "archive", "--format=tar", tree), check=True)
            r = subprocess.run(["git", "apply", "--ignore-whitespace", os.path.abspath(patch)], cwd=out,
                               capture_output=True)
            if r.returncode != 0:
                return False, "tests.patch does not apply: " + r.stderr.decode(errors="replace").strip()[-300:]
            src = [d for d in ("src",) if os.path.isdir(os.path.join(out, d))]
            env = dict(os.environ, STORM_TEST_FILES=" ".join(test_files(patch)),
                       PYTHONPATH=os.pathsep.join([os.path.join(out, d) for d in src] + [out]),
                       PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                       PYTHONDONTWRITEBYTECODE="1")
            try:
                r = subprocess.run(self.cmd, shell=True, cwd=out, capture_output=True, env=env, timeout=TEST_TIMEOUT)
            except subprocess.TimeoutExpired:
                return False, f"timed out after {TEST_TIMEOUT}s"
            return r.returncode == 0, (r.stdout + r.stderr).decode(errors="replace").strip()[-400:]
        finally:
            shutil.rmtree(out, ignore_errors=True)


# -- the test runner on the shared head -----------------------------------------------------
WATCH_GLOB = "tests/test_*__f*.py"


def _shadow_name(path: str, number: int) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}__f{number}{ext}"


class ShadowTests:
    """Each feature's tests as files of their own (``tests/test_x__f2.py``: the test file
    as its tests.patch makes it), so that both features' tests live in one tree and a
    feature's tests arrive with its agent's first write, as tests an agent writes do."""

    def __init__(self, source: str, task: Task) -> None:
        self.files: dict[int, dict[str, bytes]] = {}
        for f in task.features:
            if f.tests is None:
                continue
            try:
                tree = _apply(source, task.base, f.tests)
            except UsageError:
                continue
            self.files[f.number] = {_shadow_name(p, f.number): data for p in test_files(f.tests)
                                    if p.endswith(".py") and (data := _show(source, tree, p)) is not None}


def false_alarms(found: list[dict[str, Any]], tests: dict[str, bool | None], failing: list[str]) -> int:
    """The runner's findings the integrated result does not bear out: a semantic
    conflict on a pair that is none (no feature's tests fail on the result that pass
    on the feature alone), a break by a feature whose tests pass on the result. A
    break by a feature that fails its own tests alone is borne out: the result fails
    them too."""
    def borne_out(f: dict[str, Any]) -> bool:
        if f["kind"] == "semantic":
            return bool(failing)
        return any(tests.get(str(k)) is False for k in f.get("features") or [])

    return sum(1 for f in found if not borne_out(f))


def watch_chain(repo: str, a: Feature, b: Feature, shadow: ShadowTests, cache: Any) -> dict[str, Any]:
    """Run ``git storm watch``'s rounds on the chain of writes the storm run left on
    refs/storm/workspace, each write with its feature's tests (:class:`ShadowTests`),
    one round after each agent's burst of writes (writes quiet: the debounce), before
    the manager's commit; what it blamed, after which write, and what it cost."""
    import pygit2

    from ..core.objects import tree_with
    from ..testwatch import blame
    from ..testwatch.run import TestCommand
    from ..testwatch.watcher import WatchConfig, Watcher

    r = pygit2.Repository(repo)
    top = r.references["refs/storm/workspace"].resolve().target
    assert isinstance(top, pygit2.Oid)
    links = blame.chain(r, top)
    feature_of = {"agent_1": a.number, "agent_2": b.number}  # runner.py's names, in the workload's order
    sig = pygit2.Signature("storm sim", "sim@storm.invalid")
    parent, present = pygit2.Oid(hex=links[0].commit), set()
    heads: list[tuple[str | None, pygit2.Oid]] = []
    for lk in links[1:]:
        present.add(feature_of.get(lk.agent or "", 0))
        changes: dict[str, tuple[pygit2.Oid, int] | None] = {
            path: (r.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
            for n in sorted(present) for path, data in shadow.files.get(n, {}).items()}
        c = r[pygit2.Oid(hex=lk.commit)]
        assert isinstance(c, pygit2.Commit)
        tree = tree_with(r, c.tree, changes) if changes else c.tree_id
        parent = r.create_commit(None, c.author, sig, c.message, tree, [parent])
        heads.append((lk.agent, parent))
    ref = "refs/storm-sim/watch"
    cmd = (f"PYTHONPATH=src:$PYTHONPATH {shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider "
           "-W ignore::ResourceWarning")
    cfg = WatchConfig(cmd, tests=(WATCH_GLOB,), universe=True, ref=ref, timeout=TEST_TIMEOUT)
    w = Watcher(r, r.path.rstrip("/"), cfg)
    w.tests = TestCommand(w.commondir, cmd, timeout=TEST_TIMEOUT, cache=cache[0], full=cache[1])
    out: dict[str, Any] = {"writes": len(heads), "rounds": 0, "found": [], "blamed_pair": False,
                           "false_alarms": 0}
    t0 = time.monotonic()
    for i, (agent, oid) in enumerate(heads):
        if i + 1 < len(heads) and heads[i + 1][0] == agent:
            continue  # the agent's next write follows at once: the runner is still waiting for quiet
        r.references.create(ref, oid, force=True)
        rep = w.round(oid)
        out["rounds"] += 1
        for f in rep.findings:
            if f["kind"] not in ("semantic", "break"):
                continue
            feats = sorted({feature_of.get(x["agent"] or "", 0) for x in f["writes"]})
            out["found"].append({"test": f["test"], "kind": f["kind"], "after_write": i + 1, "features": feats})
            if f["kind"] == "semantic" and feats == sorted((a.number, b.number)):
                out["blamed_pair"] = True
    out["test_runs"], out["cpu_s"] = w.tests.stats.runs, round(w.tests.stats.cpu_s, 2)
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


# -- one pair --------------------------------------------------------------------------
def survivors(f: Feature, final: Files, paths: list[str] | None = None) -> list[dict[str, Any]]:
    """The lines ``f`` added that ``final`` lacks, per file of ``paths`` (default: all
    it changes); empty: its change survived."""
    lost = []
    for p in f.change.targets if paths is None else paths:
        have = set((final.get(p) or b"").splitlines())
        gone = [ln for ln in added_lines(f.change.parent.get(p), f.change.post.get(p)) if ln not in have]
        if gone:
            lost.append({"feature": f.number, "path": p, "lines": [g.decode("utf-8", "replace") for g in gone[:5]]})
    return lost


def clean_files(a: Feature, b: Feature) -> list[str]:
    """The files where both features' changes must be in any correct result: each file
    only one of them changes, and each both change where git merges them cleanly."""
    out = []
    for p in sorted(set(a.change.targets) | set(b.change.targets)):
        if p in a.change.targets and p in b.change.targets:
            if merge3(a.change.parent.get(p), a.change.post.get(p), b.change.post.get(p)).conflicts:
                continue
        out.append(p)
    return out


def _agent_opts(mode: str) -> tuple[str, dict[str, Any]]:
    return ("worktree", {"via": "cli"}) if mode == "worktree" else (
        "storm", {"via": "cli", "rebased": mode == "storm+rebased"})


def run_pair(task: Task, a: Feature, b: Feature, base: Files, modes: tuple[str, ...], tests: Tests | None,
             alone: dict[int, bool | None], gold: bool | None, source: str,
             shadow: ShadowTests | None = None) -> PairResult:
    """Replay the pair in each mode; classify how each mode caught it. ``alone`` gains
    whether each feature tested on a result passes its tests on its own (its tree is
    in ``source``, the repository the tasks come from)."""
    w = workload(task, a, b, base)
    shared = sorted(set(a.change.targets) & set(b.change.targets))
    pr = PairResult(task.name, a.number, b.number, shared, gold)
    must = clean_files(a, b)
    for mode in modes:
        kind, opts = _agent_opts(mode)
        res = ModeResult(mode, "none")

        def inspect(repo: str, rev: str, m: RunMetrics, res: ModeResult = res, kind: str = kind) -> None:
            final = {p: _show(repo, rev, p) for p in set(a.change.targets) | set(b.change.targets)}
            # in the files git merges cleanly both changes must be there, whatever the mode did
            res.lost = [x for f in (a, b) for x in survivors(f, final, [p for p in must if p in f.change.targets])]
            if tests is None or m.judgement:
                return  # a hunk resolved by the scripted agent's rule (its own side) is no real agent's result
            tree = _git(repo, "rev-parse", f"{rev}^{{tree}}").decode().strip()
            t0 = time.monotonic()
            for f in (a, b):
                got = tests.run(repo, tree, f)
                res.tests[str(f.number)] = None if got is None else got[0]
                if f.number not in alone:  # the feature on its own: are its tests a fair judge?
                    got = tests.run(source, f.tree, f)
                    alone[f.number] = None if got is None else got[0]
            res.tests_s = time.monotonic() - t0
            if shadow is not None and kind == "storm":
                try:
                    res.watch = watch_chain(repo, a, b, shadow, tests.watch_cache)
                except Exception as exc:  # noqa: BLE001 - the runner failing must not lose the pair
                    res.watch = {"error": f"{type(exc).__name__}: {exc}"}

        try:
            m = runner.run(w, kind, agent_opts=opts, on_final=inspect)
        except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
            if isinstance(exc, UsageError):
                raise
            m = runner.failed_run(w, kind, "full", f"{type(exc).__name__}: {exc}")
        res.rejections, res.rereads, res.judgement = m.rejections, m.rereads, m.judgement
        res.rebased_accepted, res.rebased_refused = m.rebased_accepted, m.rebased_refused
        res.merge_conflicts, res.agent_calls, res.wall_s = m.caught_at_merge, m.agent_calls, round(m.wall_s, 3)
        res.lost_updates = m.lost_updates + len(res.lost)
        res.errors = m.agent_errors + m.notes
        failing = [k for k, ok in res.tests.items() if ok is False and alone.get(int(k)) is not False]
        res.semantic = bool(failing) and m.judgement == 0 and not res.errors
        if res.watch is not None and "error" not in res.watch:
            res.watch["false_alarms"] = false_alarms(res.watch["found"], res.tests, failing)
        if kind == "storm" and m.rejections:
            res.caught = "write"
        elif kind == "worktree" and m.caught_at_merge:
            res.caught = "merge"
        elif failing:
            res.caught = "tests"
        elif res.lost_updates:
            res.caught = "never"
        pr.modes[mode] = res
    return pr


# -- the whole workload ----------------------------------------------------------------
@dataclass
class PairsReport:
    plan: dict[str, Any]
    pairs: list[PairResult] = field(default_factory=list)
    alone: dict[str, dict[str, bool | None]] = field(default_factory=dict)  # task -> feature -> tests pass alone
    started: str = ""
    seconds: float = 0.0
    tests_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return pairs_report.summarize({"plan": self.plan, "started": self.started, "seconds": round(self.seconds, 2),
                                       "tests_s": round(self.tests_s, 2), "definitions": DEFINITIONS,
                                       "alone": self.alone, "pairs": [asdict(p) for p in self.pairs]})


DEFINITIONS = {
    "caught": "how a mode caught the pair: write (storm: a rejection), merge (worktree: the merge conflicted), "
              "tests (integrated without either, a feature's tests fail), never (a feature's change is missing "
              "from the result and no test failed), none (nothing to catch)",
    "rebased_accepted": "rejections cleared by accepting the rebased change (one call each)",
    "rebased_refused": "rejections whose rebased change had conflict markers: the agent re-planned",
    "lost_updates": "lines a feature added missing from the result in a file where git merges the two changes cleanly, "
                    "plus accepted writes undone unseen (must be 0)",
    "semantic": "integrated without a conflicting hunk, yet a feature's tests fail that pass on the feature alone",
    "agent_calls": "git storm commands and file reads/writes of both agents, merge resolution included",
    "wall_s": "agents' processes and the integration, tests not included",
}


def gold_verdicts(pairs_dir: str) -> dict[tuple[str, int, int], bool]:
    """``gold_conflicts.json`` of the pairs directory, when there is one: (task, f1, f2) -> conflict."""
    import json

    path = os.path.join(pairs_dir, "gold_conflicts.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as fh:
        rows = json.load(fh).get("pairs", [])
    out: dict[tuple[str, int, int], bool] = {}
    for r in rows:
        a, b = sorted((int(r["f1"]), int(r["f2"])))
        out[(f"task{r['task_id']}", a, b)] = bool(r["has_conflict"])
    return out


def simulate(pairs_dir: str, repo: str, *, tasks: tuple[str, ...] = (), features: tuple[int, ...] = (),
             modes: tuple[str, ...] = MODES, run_tests: bool = False, test_cmd: str | None = None,
             shard: tuple[int, int] = (1, 1), on_pair: Callable[[PairResult], None] | None = None,
             watch: bool = False) -> PairsReport:
    """Every pair of every task of ``pairs_dir`` in each of ``modes``; ``shard`` (I, N):
    only the I-th of every N pairs (long runs split over processes, their reports
    joined with :func:`pairs_report.combine`)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"unknown pair mode {unknown[0]!r}", hint=f"choose from {', '.join(MODES)}")
    if not 1 <= shard[0] <= shard[1]:
        raise UsageError(f"--shard {shard[0]}/{shard[1]}: give I/N with 1 <= I <= N")
    repo = os.path.abspath(repo)
    loaded = load(pairs_dir, repo, tasks, features)
    gold = gold_verdicts(pairs_dir)
    tests = Tests(test_cmd) if run_tests or test_cmd else None
    report = PairsReport({"pairs": os.path.abspath(pairs_dir), "repo": repo, "tasks": list(tasks),
                          "features": list(features), "modes": list(modes), "tests": tests.cmd if tests else None,
                          "shard": list(shard), "watch": watch and tests is not None},
                         started=time.strftime("%Y-%m-%d %H:%M:%S"))
    t0, n = time.monotonic(), 0
    for task in loaded:
        base = tree_files(repo, task.base)
        alone: dict[int, bool | None] = {}
        shadow = ShadowTests(repo, task) if watch and tests is not None else None
        for a, b in itertools.combinations(task.features, 2):
            n += 1
            if (n - 1) % shard[1] != shard[0] - 1:
                continue
            pr = run_pair(task, a, b, base, modes, tests, alone, gold.get((task.name, a.number, b.number)), repo,
                          shadow)
            report.pairs.append(pr)
            if on_pair:
                on_pair(pr)
        report.alone[task.name] = {str(k): v for k, v in sorted(alone.items())}
    report.seconds = time.monotonic() - t0
    report.tests_s = tests.seconds if tests else 0.0
    return report
