"""Model-based test: the real storm mode against the reference model (tests/support/refmodel.py).

A hypothesis state machine drives several agents through random interleavings
of read, write, edit, rm, release, forget, time passing, folds of the read-set
journal (some killed after their notes commit) and writers killed between their
journal append and their compare-and-swap (the reservation
clock is pinned with $STORM_TEST_NOW, see reservations.clock). Every step goes
through the library, and a sample (about 1 in 25) through the real CLI in a
subprocess. After every step: each accept/reject decision, the rejection
reason, the payload's target, current content, stale list and reservation
holder, and each usage refusal match the model; and the shared ref's tree, the
working tree on disk, every agent's read-set notes and the live reservations
equal the model's state.

CI size: about 2,000 steps (80 runs of up to 40 rules). ``STORM_LONG=1`` (or
``-m slow`` for the long test) runs about 14,000 (400 runs of up to 50).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pygit2
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from figures import long_run, record
from helpers import git, make_repo, storm
from refmodel import Model, ModelError

AGENTS = ["e1", "e2", "e3"]
PATHS = ["a.txt", "b.txt", "d/c.txt", "d/e/f.txt"]
INITIAL = {"a.txt": b"x\n", "d/c.txt": b"x\ny\n"}
CONTENTS = [b"", b"x\n", b"y\n", b"x\ny\n", b"x x\n", b"y\r\nx\r\n", b"\x00\x01bin", b"\xff\xfe not utf-8 x"]
OLD = ["x", "y", "\n", "x\n"]
NEW = ["", "y", "x", "zz\n"]
RESERVATION_SECONDS = 30
T0 = 1_000_000.0

STEPS = {"library": 0, "cli": 0, "examples": 0}
OUTCOMES: dict[str, int] = {}

agents = st.sampled_from(AGENTS)
paths = st.sampled_from(PATHS)
cli_sample = st.integers(0, 24).map(lambda i: i == 0)
deps_st = st.one_of(st.none(), st.none(), st.lists(paths, max_size=2, unique=True))


def hexv(content: bytes | None) -> str | None:
    return None if content is None else str(pygit2.hash(content))


class StormMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        from storm_git import open_workspace

        self.tmp = tempfile.mkdtemp(prefix="storm-model-")
        self.repo = make_repo(Path(self.tmp) / "r", INITIAL, init_storm=False)
        git(self.repo, "config", "storm.reservationSeconds", str(RESERVATION_SECONDS))
        from storm_git.admin.setup import init
        from storm_git.core.store import Store

        init(Store.discover(str(self.repo)))
        self.model = Model(dict(INITIAL), RESERVATION_SECONDS, T0)
        os.environ["STORM_TEST_NOW"] = repr(T0)
        self.ws = open_workspace(str(self.repo))
        STEPS["examples"] += 1

    def teardown(self) -> None:
        os.environ.pop("STORM_TEST_NOW", None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- running one verb through the library or the CLI ------------------------
    def _cli(self, agent: str, *args: str, input: bytes | None = None):
        STEPS["cli"] += 1
        r = storm(self.repo, *args, "--json", agent=agent, input=input)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode in (0, 1, 2), (args, r.returncode, r.stderr)
        if r.returncode == 2:
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None

    def _expect_error(self, model_call, real_call, via_cli: bool):
        """Run both; if the model refuses, the implementation must refuse the same way."""
        before = git(self.repo, "for-each-ref").stdout
        try:
            expected = model_call()
            err = None
        except ModelError as exc:
            expected, err = None, exc.kind
        if via_cli:
            code, out = real_call(True)
            if err is not None:
                assert code == 2, (err, code, out)
                assert out["error"]["kind"] == err, (err, out)
                assert git(self.repo, "for-each-ref").stdout == before
                return None, None
            assert code in (0, 1), (code, out)
            return expected, out
        from storm_git.core.errors import NotFound, UsageError

        STEPS["library"] += 1
        try:
            got = real_call(False)
        except UsageError as exc:
            assert err is not None, f"implementation refused ({exc}) where the model accepts"
            assert isinstance(exc, NotFound) == (err == "not_found"), (err, exc)
            assert git(self.repo, "for-each-ref").stdout == before
            OUTCOMES["refused " + err] = OUTCOMES.get("refused " + err, 0) + 1
            return None, None
        assert err is None, f"model refuses ({err}) where the implementation did not: {got}"
        return expected, got

    def _check_outcome(self, expected, got, via_cli: bool) -> None:
        if expected is None:
            return
        if via_cli:
            accepted = got["accepted"]
            rej = got.get("rejection")
            if rej:
                reason, target, holder = rej["reason"], rej["path"], (rej["reservation"] or {}).get("holder")
                stale = frozenset(s["path"] for s in rej["stale"])
                current = rej.get("current_content")
                current = current.encode() if current is not None else None
                if "current_content_base64" in rej:
                    import base64

                    current = base64.b64decode(rej["current_content_base64"])
        else:
            accepted = got.accepted
            rej = got.rejection
            if rej:
                reason, target = rej.reason, rej.path
                holder = rej.reservation.holder if rej.reservation else None
                stale, current = frozenset(s.path for s in rej.stale), rej.current_content
        assert accepted == expected.accepted, (expected, got)
        key = "accepted" if accepted else expected.reason
        OUTCOMES[key] = OUTCOMES.get(key, 0) + 1
        if not accepted:
            assert reason == expected.reason, (expected, got)
            assert target == expected.target
            assert stale == expected.stale, (expected.stale, stale)
            assert current == expected.current
            assert holder == expected.holder

    # -- rules -------------------------------------------------------------------
    @rule(agent=agents, ps=st.lists(paths, min_size=1, max_size=3, unique=True), via_cli=cli_sample)
    def read(self, agent, ps, via_cli):
        want = self.model.read(agent, ps)
        if via_cli:
            code, out = self._cli(agent, "read", *ps)
            assert code == 0
            got = []
            for f in out["files"]:
                if "content_base64" in f:
                    import base64

                    got.append(base64.b64decode(f["content_base64"]))
                else:
                    got.append(None if f["content"] is None else f["content"].encode())
        else:
            STEPS["library"] += 1
            got = [r.content for r in self.ws.read(ps, agent=agent)]
        assert got == want

    @rule(agent=agents, path=paths, content=st.sampled_from(CONTENTS), deps=deps_st, via_cli=cli_sample)
    def write(self, agent, path, content, deps, via_cli):
        via_cli = via_cli and deps != []

        def real(cli):
            if cli:
                extra = [a for d in (deps or []) for a in ("--deps", d)]
                empty = ["--allow-empty"] if content == b"" else []  # an empty stdin empties a file only when told
                return self._cli(agent, "write", path, "--no-wait", *extra, *empty, input=content)
            return self.ws.write(path, content, agent=agent, deps=deps, wait=False)

        expected, got = self._expect_error(lambda: self.model.write(agent, path, content, deps), real, via_cli)
        self._check_outcome(expected, got, via_cli)

    @rule(agent=agents, path=paths, old=st.sampled_from(OLD), new=st.sampled_from(NEW), deps=deps_st,
          via_cli=cli_sample)
    def edit(self, agent, path, old, new, deps, via_cli):
        via_cli = via_cli and deps != []

        def real(cli):
            if cli:
                extra = [a for d in (deps or []) for a in ("--deps", d)]
                return self._cli(agent, "edit", path, "--old", old, "--new", new, "--no-wait", *extra)
            return self.ws.edit(path, old, new, agent=agent, deps=deps, wait=False)

        expected, got = self._expect_error(
            lambda: self.model.edit(agent, path, old.encode(), new.encode(), deps), real, via_cli)
        self._check_outcome(expected, got, via_cli)

    @rule(agent=agents, path=paths, via_cli=cli_sample)
    def rm(self, agent, path, via_cli):
        def real(cli):
            if cli:
                return self._cli(agent, "rm", path, "--no-wait")
            return self.ws.rm(path, agent=agent, wait=False)

        expected, got = self._expect_error(lambda: self.model.rm(agent, path), real, via_cli)
        self._check_outcome(expected, got, via_cli)

    @rule(agent=agents, path=paths, via_cli=cli_sample)
    def release(self, agent, path, via_cli):
        def real(cli):
            if cli:
                return self._cli(agent, "release", path)
            return self.ws.release(path, agent=agent)

        expected, got = self._expect_error(lambda: self.model.release(agent, path), real, via_cli)
        if got is None and expected is None:
            return
        released = got["released"] if via_cli else got is not None
        assert released == expected

    @rule(agent=agents, ps=st.one_of(st.none(), st.lists(paths, min_size=1, max_size=2, unique=True)),
          via_cli=cli_sample)
    def forget(self, agent, ps, via_cli):
        want = self.model.forget(agent, ps)
        if via_cli:
            code, out = self._cli(agent, "forget", *(ps or []))
            assert code == 0
            got = out["forgotten"]
        else:
            STEPS["library"] += 1
            got = self.ws.forget(ps, agent=agent)
        assert sorted(got) == sorted(want)

    @rule(dt=st.sampled_from([0.5, 1.0, 10.0, RESERVATION_SECONDS - 0.001, RESERVATION_SECONDS, 61.0]))
    def time_passes(self, dt):
        self.model.now += dt
        os.environ["STORM_TEST_NOW"] = repr(self.model.now)

    @precondition(lambda self: self.model.live_reservations())
    @rule(agent=agents, data=st.data())
    def write_reserved_path(self, agent, data):
        """Aim at reserved paths more often than chance would."""
        path = data.draw(st.sampled_from(sorted(self.model.live_reservations())))
        expected, got = self._expect_error(lambda: self.model.write(agent, path, b"r\n"),
                                           lambda cli: self.ws.write(path, b"r\n", agent=agent, wait=False), False)
        self._check_outcome(expected, got, False)

    # -- the read-set journal: folds, and kills around a fold and around the CAS ----------
    def _journal(self, agent: str) -> Path:
        return self.repo / ".git" / "storm" / "journal" / agent

    @rule(agent=agents, via_cli=cli_sample)
    def fold(self, agent, via_cli):
        """The journal folded into the agent's notes ref (``status`` folds every agent's):
        the read set must stay what it was."""
        from storm_git.core import readsets

        if via_cli:
            code, _ = self._cli(agent, "status")
            assert code == 0
        else:
            STEPS["library"] += 1
            readsets.fold(self.ws.store, agent)
        OUTCOMES["fold"] = OUTCOMES.get("fold", 0) + 1

    @rule(agent=agents)
    def fold_killed_after_its_notes_commit(self, agent):
        """What a fold killed between its notes commit and the journal's restart leaves:
        the new note, and the old journal still there (which must then be ignored)."""
        from storm_git.core import readsets

        STEPS["library"] += 1
        j = self._journal(agent)
        left = j.read_bytes() if j.exists() else None
        folded = readsets.fold(self.ws.store, agent)
        if left is not None and folded:
            j.write_bytes(left)
            OUTCOMES["fold killed"] = OUTCOMES.get("fold killed", 0) + 1

    @rule(agent=agents, path=paths, content=st.sampled_from(CONTENTS))
    def write_killed_before_its_cas(self, agent, path, content):
        """A writer killed between its journal append and its CAS: a process forked from
        this one writes while a ``<ref>.lock`` on the shared ref holds its CAS back, and
        is SIGKILLed once the journal names its new version. Only a write the model
        accepts and that changes the file gets that far (the others never CAS)."""
        trial = copy.deepcopy(self.model)
        if not trial.write(agent, path, content).accepted or self.model.current(path) == content:
            return
        STEPS["library"] += 1
        j = self._journal(agent)
        before = j.read_bytes() if j.exists() else b""
        head_before = git(self.repo, "rev-parse", "refs/storm/workspace").stdout
        lock = self.repo / ".git" / "refs" / "storm" / "workspace.lock"
        lock.write_text("held by the model test\n")
        pid = os.fork()
        if pid == 0:  # the writer: it blocks on the ref lock after journaling, until killed
            code = 0
            try:
                self.ws.write(path, content, agent=agent, wait=False)
            except BaseException:
                code = 2
            os._exit(code)
        reaped = False
        try:
            entry = f"r {hexv(content)} ".encode()
            deadline = time.monotonic() + 30
            while True:
                # a lock older than STALE_REF_LOCK_SECONDS would be cleared as left by a dead
                # writer: kept fresh, it holds the writer however slow this machine is
                os.utime(lock)
                data = j.read_bytes() if j.exists() else b""
                last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
                if data != before and last.startswith(entry) and last.endswith(f" {path}".encode()):
                    break
                done, status = os.waitpid(pid, os.WNOHANG)
                reaped = done != 0
                assert not reaped, f"the writer ended (exit {status >> 8}) without journaling its write first"
                assert time.monotonic() < deadline, "the writer never journaled its write"
                time.sleep(0.001)
        finally:
            if not reaped:  # also when an assertion above failed: never leave it to land later
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            lock.unlink(missing_ok=True)
        assert git(self.repo, "rev-parse", "refs/storm/workspace").stdout == head_before  # nothing landed
        self.model.killed_write(agent, path, content)
        OUTCOMES["write killed before its CAS"] = OUTCOMES.get("write killed before its CAS", 0) + 1

    # -- the state must equal the model after every step ---------------------------------
    @invariant()
    def state_matches_model(self):
        from storm_git.core import readsets, reservations
        from storm_git.core.store import WORKSPACE_REF

        store = self.ws.store
        head = store.ref_target(WORKSPACE_REF)
        tree = store.commit(head).tree
        shared = {}
        for p in PATHS:
            e = store.entry(tree, p)
            if e is not None:
                shared[p] = store.blob_bytes(e.oid)
        assert shared == self.model.files
        for p in PATHS:
            full = self.repo / p
            on_disk = full.read_bytes() if full.exists() else None
            assert on_disk == self.model.files.get(p), p
        for a in AGENTS:
            got = {p: e.blob for p, e in readsets.load(store, a).items()}
            assert got == {p: hexv(v) for p, v in self.model.read_set(a).items()}, a
        live = {r.path: r.holder for r in reservations.active(store)}
        assert live == self.model.live_reservations()


def _run(examples: int, steps: int, name: str) -> None:
    for k in STEPS:
        STEPS[k] = 0
    OUTCOMES.clear()
    run_state_machine_as_test(StormMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=False,
        suppress_health_check=list(HealthCheck), database=None))
    record(name, examples=STEPS["examples"], library_steps=STEPS["library"], cli_steps=STEPS["cli"],
           model_steps=STEPS["library"] + STEPS["cli"], outcomes=dict(sorted(OUTCOMES.items())))


def test_model_based_storm_mode():
    if long_run():
        _run(400, 50, "model (STORM_LONG)")
    else:
        _run(40, 40, "model")  # 400 x 50 with the slow tests (STORM_LONG)


@pytest.mark.slow
def test_model_based_storm_mode_long():
    _run(400, 50, "model long")
