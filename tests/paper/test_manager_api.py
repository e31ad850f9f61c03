"""The drop-in manager's API beyond read and write, as the STORM paper's reference
manager has it: ``files`` as FileStates, ``execute_command`` with its command log and
missed commands, ``register_context`` and the invalidations it pushes, a version older
than those kept answered as a stale read, and the author of a file named on a create
over it. Real repositories, real git, real processes."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from helpers import git
from manager_agent import Agent
from storm_git.paper.manager import Manager
from storm_git.paper.manager_payloads import CommandRecord, FileState


def run(coro):
    return asyncio.run(coro)


def shared(repo: Path, path: str) -> str:
    return git(repo, "show", f"refs/storm/workspace:{path}").stdout.decode()


def initial_author(repo: Path) -> str:
    return git(repo, "log", "-1", "--format=%an", "main").stdout.decode().strip()


class Context:
    """The paper's AgentContext as the manager uses it: file_views and invalidate_file."""

    def __init__(self) -> None:
        self.file_views: dict[str, object] = {}
        self.invalidated: list[tuple[str, int, str]] = []

    def invalidate_file(self, path: str, new_version: int, changed_by: str) -> None:
        self.invalidated.append((path, new_version, changed_by))


def test_files_are_file_states_of_the_shared_head(repo: Path) -> None:
    m = Manager(repo)
    run(m.write_file("engineer_1", "src/new.py", "x = 1\n", 0))
    files = m.files
    assert files["src/new.py"] == FileState("src/new.py", 1, hashlib.md5(b"x = 1\n").hexdigest(), "engineer_1")
    api = (repo / "src/api.py").read_bytes()
    assert files["src/api.py"] == FileState("src/api.py", 1, hashlib.md5(api).hexdigest(), initial_author(repo))
    assert not any(p.startswith(".") for p in files)
    assert set(files) == set(git(repo, "ls-tree", "-r", "--name-only", "refs/storm/workspace").stdout.decode().split())


def test_a_create_over_an_existing_file_names_its_real_author(repo: Path) -> None:
    m = Manager(repo)
    res = run(m.write_file("engineer_1", "src/api.py", "mine\n", 0))
    assert not res.success and res.reason == "direct_conflict"
    assert res.changed_by == initial_author(repo) and res.changed_by  # not None
    assert res.current_version == 1 and res.current_content == (repo / "src/api.py").read_text()
    run(m.write_file("engineer_2", "src/made.py", "a\n", 0))
    again = run(m.write_file("engineer_3", "src/made.py", "b\n", 0))
    assert not again.success and again.changed_by == "engineer_2"


def test_a_version_older_than_those_kept_is_a_stale_read(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storm_git.paper import versions

    monkeypatch.setattr(versions, "KEEP", 3)  # the window: few versions kept, not 256
    m = Manager(repo, reservation_wait=0.5)
    old = Agent(m, "engineer_1")
    run(old.view("src/api.py"))
    run(old.view("src/util.py"))
    v = 1
    for i in range(5):
        v = run(m.write_file("engineer_2", "src/util.py", f"u{i}\n", v)).new_version
    assert v == 6
    head = git(repo, "rev-parse", "refs/storm/workspace").stdout

    async def go() -> None:
        target = await m.write_file("engineer_1", "src/util.py", "mine\n", 1,
                                    snapshot=old.snapshot(), base_content=old.cache["src/util.py"].content)
        assert not target.success and target.reason == "stale_dependency", target
        assert [(s.path, s.expected_version, s.current_version, s.changed_by) for s in target.stale_files] == \
            [("src/util.py", 1, 6, "engineer_2")]
        assert target.current_content == "u4\n" and target.current_version == 6 and target.changed_by == "engineer_2"
        assert "+u4" in target.diff and "older than the 3 versions kept" in target.message
        # a dependency that old: the same answer about the dependency
        dep = await m.write_file("engineer_1", "src/api.py", "x\n", 1, snapshot={"src/util.py": 1, "src/api.py": 1})
        assert not dep.success and dep.reason == "stale_dependency"
        assert [(s.path, s.expected_version, s.current_version) for s in dep.stale_files] == [("src/util.py", 1, 6)]
        # a number never handed out is still bad input
        with pytest.raises(ValueError, match="no version 7"):
            await m.write_file("engineer_1", "src/util.py", "x\n", 7)

    run(go())
    assert git(repo, "rev-parse", "refs/storm/workspace").stdout == head  # nothing written
    assert shared(repo, "src/util.py") == "u4\n" == (repo / "src/util.py").read_text()


def test_execute_command_tracks_commands_as_the_reference_does(repo: Path) -> None:
    m = Manager(repo)
    ctx1, ctx2 = Context(), Context()
    m.register_context("engineer_1", ctx1)
    m.register_context("engineer_2", ctx2)
    ctx1.file_views["src/util.py"] = object()
    ctx2.file_views["src/util.py"] = object()

    async def go() -> None:
        first = await m.execute_command("engineer_2", "sed -i 's/clamp/clip/' src/util.py && echo out; echo err >&2; "
                                                      "printf 'y = 1\\n' > src/made.py; rm src/api.py; exit 3")
        assert (first.stdout, first.stderr, first.exit_code) == ("out\n", "err\n", 3)
        assert first.missed_commands == [] and first.rejected is None
        assert first.affected_files == ["src/api.py", "src/made.py", "src/util.py"]
        # engineer_1 ran nothing yet: engineer_2's command is what it missed
        second = await m.execute_command("engineer_1", "cat src/made.py")
        assert second.stdout == "y = 1\n" and second.affected_files == []
        assert [(c.seq, c.agent_id, c.exit_code, c.affected_files) for c in second.missed_commands] == \
            [(1, "engineer_2", 3, ["src/api.py", "src/made.py", "src/util.py"])]
        third = await m.execute_command("engineer_1", "true")
        assert third.missed_commands == []  # it has seen everything since its last command
        again = await m.execute_command("engineer_2", "true")
        assert [c.seq for c in again.missed_commands] == [2, 3]
        assert (await m.read_file("engineer_3", "src/util.py")).version == 2
        assert (await m.read_file("engineer_3", "src/made.py")).version == 1
        with pytest.raises(FileNotFoundError):
            await m.read_file("engineer_3", "src/api.py")
        # a write through the manager pushes the invalidation too
        w = await m.write_file("engineer_1", "src/util.py", "z\n", 2)
        assert w.success and w.new_version == 3

    run(go())
    assert [type(c) for c in m.command_log] == [CommandRecord] * 4 and m.command_seq == 4
    rec = m.command_log[0]
    assert (rec.seq, rec.agent_id, rec.stdout, rec.stderr, rec.exit_code) == (1, "engineer_2", "out\n", "err\n", 3)
    assert rec.timestamp > 0 and m.agent_last_cmd_seq == {"engineer_2": 4, "engineer_1": 3}
    assert ctx1.invalidated == [("src/util.py", 2, "engineer_2")]  # not its own write
    assert ctx2.invalidated == [("src/util.py", 3, "engineer_1")]
    assert shared(repo, "src/util.py") == "z\n" == (repo / "src/util.py").read_text()
    assert not (repo / "src/api.py").exists()
    log = git(repo, "log", "--format=%(trailers:key=Storm-Agent,valueonly)", "-1", "refs/storm/workspace", "--",
              "src/made.py").stdout.decode().strip()
    assert log == "engineer_2"


def test_execute_command_past_its_limit_is_killed_and_raises(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storm_git.paper import manager as storm_manager

    monkeypatch.setattr(storm_manager, "EXECUTE_TIMEOUT", 1.0)
    m = Manager(repo)
    with pytest.raises(TimeoutError):
        run(m.execute_command("engineer_1", "sleep 30"))
    assert m.command_log[0].command == "sleep 30"
