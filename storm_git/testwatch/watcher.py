"""The runner's rounds and its loop (``git storm watch``).

It reads the shared ref and the repository's objects and never takes one of storm's
locks: writers never wait for it. One runner per repository (its own lock file,
``storm/locks/testwatch``). A round tests one head:

* which tests: those the changed files can affect (:mod:`.graph`), the ones failing
  so far, and everything every ``full_every`` rounds, on the first round, and
  whenever the graph does not apply;
* a test that fails and had not failed before is run again on the same head: one
  that passes then is flaky and blamed on nobody; the others are blamed
  (:mod:`.blame`) and a notice left for the agents (:mod:`.notices`);
* the state is saved whole at the end (:mod:`.state`); a runner killed in a round
  leaves the previous state, and the next runner repeats the round.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pygit2

from ..core.errors import Busy, UsageError
from ..core.locks import pid_alive, try_flocked
from . import blame, graph, notices, state
from .run import WHOLE, Outcome, TestCommand, clear_dead_work

WORKSPACE_REF = "refs/storm/workspace"


@dataclass
class WatchConfig:
    test_cmd: str
    quiet_s: float = 3.0  # writes quiet this long: a round
    every: int = 10  # or this many writes since the last round
    full_every: int = 10  # every N-th round runs everything
    tests: tuple[str, ...] = graph.DEFAULT_TESTS  # which files are tests
    universe: bool = False  # a full run names every test file (else: the command as given)
    poll_s: float = 0.5
    ref: str = WORKSPACE_REF
    timeout: float = 900.0

    @classmethod
    def from_git(cls, repo: pygit2.Repository, test_cmd: str | None, **given: Any) -> WatchConfig:
        """Flags over ``storm.watch.*`` git config over the defaults."""
        cfg = repo.config

        def get(key: str) -> str | None:
            try:
                return cfg[f"storm.watch.{key}"]
            except KeyError:
                return None

        cmd = test_cmd or get("test")
        if not cmd:
            raise UsageError("no test command", hint="git storm watch --test 'python -m pytest -q' (or git config "
                             "storm.watch.test)")
        out = cls(cmd)
        for key, attr, conv in (("quietSeconds", "quiet_s", float), ("every", "every", int),
                                ("fullEvery", "full_every", int), ("pollSeconds", "poll_s", float)):
            raw = get(key)
            if raw is not None:
                try:
                    setattr(out, attr, conv(raw))
                except ValueError:
                    raise UsageError(f"storm.watch.{key} = {raw!r} is not a number") from None
        raw = get("tests")
        if raw:
            out.tests, out.universe = tuple(raw.split()), True
        for attr, value in given.items():
            if value is not None:
                setattr(out, attr, value)
        if out.every < 1 or out.full_every < 1 or out.quiet_s < 0 or out.poll_s <= 0:
            raise UsageError("--every and --full-every must be at least 1, --quiet and --poll positive")
        return out


@dataclass
class RoundReport:
    head: str
    round: int
    full: bool
    why: str
    ran: int
    failed: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Watcher:
    """Rounds on one repository's shared head."""

    def __init__(self, repo: pygit2.Repository, commondir: str, cfg: WatchConfig,
                 on_notice: Callable[[notices.Notice], None] | None = None) -> None:
        self.repo, self.commondir, self.cfg = repo, commondir, cfg
        self.tests = TestCommand(commondir, cfg.test_cmd, timeout=cfg.timeout)
        self.on_notice = on_notice

    def head(self) -> pygit2.Oid | None:
        try:
            return self.repo.references[self.cfg.ref].resolve().target  # type: ignore[return-value]
        except (KeyError, pygit2.GitError):
            return None

    def writes_since(self, old: str | None, new: pygit2.Oid) -> int:
        """Writes from ``old`` to ``new`` (first parents; past 1000, or ``old`` not below: 1000)."""
        n, c = 0, self.repo[new]
        while isinstance(c, pygit2.Commit) and str(c.id) != old and n < 1000:
            n += 1
            if not c.parents:
                return 1000 if old else n
            c = c.parents[0]
        return n

    # -- one round ------------------------------------------------------------------------
    def _universe(self, tree: pygit2.Tree) -> list[str] | None:
        if not self.cfg.universe:
            return None
        return sorted(p for p in graph.python_files(self.repo, tree) if graph.is_test(p, self.cfg.tests))

    def _selection(self, st: state.WatchState, head: pygit2.Commit) -> graph.Selection:
        if st.head is None:
            return graph.Selection(None, "first round")
        if (st.rounds + 1) % self.cfg.full_every == 0:
            return graph.Selection(None, f"every {self.cfg.full_every}th round runs everything")
        try:
            old = self.repo[st.head]
        except (KeyError, ValueError):
            return graph.Selection(None, "the last tested head is gone")
        assert isinstance(old, pygit2.Commit)
        diff = self.repo.diff(old.tree, head.tree)
        changed = [d.delta.new_file.path for d in diff if d.delta.status_char() != "D"]
        deleted = [d.delta.old_file.path for d in diff if d.delta.status_char() == "D"]
        return graph.affected(self.repo, head.tree, changed, deleted, self.cfg.tests)

    def round(self, head_oid: pygit2.Oid) -> RoundReport:
        t0 = time.monotonic()
        st = state.load(self.commondir)
        head = self.repo[head_oid]
        assert isinstance(head, pygit2.Commit)
        hexhead, tree = str(head.id), str(head.tree_id)
        st.running = {"head": hexhead, "pid": os.getpid(), "started": state.now()}
        state.save(self.commondir, st)
        sel = self._selection(st, head)
        full = sel.tests is None
        todo = self._universe(head.tree) if full else sorted(set(sel.tests or []) | set(st.failing()))
        if full and todo is None:
            got = self.tests.run(tree, None)
        else:
            got = self.tests.run(tree, todo) if todo else {}
        before = {t: r.outcome for t, r in st.results.items()}
        new_fail = [t for t, o in got.items() if o.failed and before.get(t) != "failed"]
        rep = RoundReport(hexhead, st.rounds + 1, full, sel.why, len(got))
        flaky: list[str] = []
        if new_fail:
            again = self.tests.run(tree, [t for t in new_fail if t != WHOLE] or None) \
                if WHOLE not in new_fail else self.tests.run(tree, None)
            flaky = [t for t in new_fail if not again.get(t, Outcome("absent")).failed]
            for t in flaky:
                got[t] = Outcome("flaky", got[t].tail)
        confirmed = [t for t in new_fail if t not in flaky]
        if confirmed:
            self._blame(st, head_oid, confirmed, got, rep)
        for t, o in got.items():
            st.results[t] = state.TestResult(o.outcome, hexhead, o.tail[-2000:] if o.failed else "")
            if o.outcome == "passed":
                st.last_green[t] = hexhead
        st.flaky = sorted(set(st.flaky) | set(flaky))
        rep.failed, rep.flaky = sorted(t for t, o in got.items() if o.failed), flaky
        rep.seconds = round(time.monotonic() - t0, 3)
        st.head, st.rounds, st.running = hexhead, st.rounds + 1, None
        entry = {"time": state.now(), **rep.to_dict()}
        st.recent = (st.recent + [{k: entry[k] for k in ("time", "head", "round", "full", "ran", "failed")}]
                     )[-state.KEEP_HISTORY_IN_STATE:]
        state.append_history(self.commondir, entry)
        state.save(self.commondir, st)
        return rep

    def _blame(self, st: state.WatchState, head: pygit2.Oid, tests: list[str], got: dict[str, Outcome],
               rep: RoundReport) -> None:
        links = blame.chain(self.repo, head)
        group = list(tests)

        def fails(tree: str, test: str) -> tuple[bool, str]:
            o = self.tests.outcomes(tree, group)[test]
            return o.failed, o.tail

        for t in tests:
            f = blame.blame(self.repo, links, t, fails, st.last_green.get(t))
            rep.findings.append({"test": t, "kind": f.kind, "why": f.why,
                                 "writes": [{"commit": w.commit, "agent": w.agent} for w in f.writes]})
            if f.kind == "known_failing":
                st.known_failing = sorted(set(st.known_failing) | {t})
            if f.kind in notices.KINDS:
                n = notices.add(self.commondir, t, f.kind, str(head), got[t].tail or f.tail,
                                [notices.BlamedWrite(w.commit, w.agent or "", w.subject, w.paths) for w in f.writes])
                rep.notices.append(n.id)
                if self.on_notice:
                    self.on_notice(n)

    # -- the loop ----------------------------------------------------------------------
    def due(self, st: state.WatchState, head: pygit2.Oid, quiet_for: float) -> bool:
        if str(head) == st.head:
            return False
        return quiet_for >= self.cfg.quiet_s or self.writes_since(st.head, head) >= self.cfg.every

    def loop(self, *, once: bool = False, rounds: int | None = None,
             on_round: Callable[[RoundReport], None] | None = None) -> int:
        """Rounds as writes land (``once``: at most one round, now, then return)."""
        with try_flocked(self.commondir, "testwatch") as mine:
            if not mine:
                raise Busy("another git storm watch runs on this repository",
                           hint="one runner per repository; its state is in .git/storm/tests/")
            clear_dead_work(self.commondir)
            done, seen, changed_at = 0, None, time.monotonic()
            while True:
                head = self.head()
                if head is not None and head != seen:
                    seen, changed_at = head, time.monotonic()
                st = state.load(self.commondir)
                quiet = time.monotonic() - changed_at
                if head is not None and (once and str(head) != st.head or self.due(st, head, quiet)):
                    rep = self.round(head)
                    done += 1
                    if on_round:
                        on_round(rep)
                if once or (rounds is not None and done >= rounds):
                    return done
                time.sleep(self.cfg.poll_s)


def tether(pid: int, on_gone: Callable[[], None], poll_s: float = 0.5) -> threading.Thread:
    """Call ``on_gone`` once process ``pid`` has ended (from a daemon thread, so even in
    the middle of a round): a runner started for another process, a team run, ends
    with it however it ended. When ``pid`` is the parent, its end is the parent
    changing (a killed parent left as a zombie has ended too)."""
    parent = os.getppid() == pid

    def gone() -> bool:
        return os.getppid() != pid if parent else not pid_alive(pid)

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        on_gone()

    t = threading.Thread(target=watch, name="storm-watch-tether", daemon=True)
    t.start()
    return t
