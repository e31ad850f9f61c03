"""The STORM paper's manager interface on git storm (storm_git.paper.manager).

Driven the way the paper's harness drives it: ``view`` (read_file) caches the
content and version; ``str_replace`` is applied to the cached view and sent with
the expected version and the snapshot of the agent's cached versions; ``create``
sends version 0. Real repositories, real git, real processes, several agents as
asyncio tasks on one event loop.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import SUPPORT, git, make_repo, storm
from manager_agent import Agent, increment
from storm_git.core.errors import BadAgent, BadPath, RepoStateError
from storm_git.paper.manager import Manager, ReadResponse, StaleFile
from storm_git.paper.manager_payloads import FileState


def run(coro):
    return asyncio.run(coro)


def shared(repo: Path, path: str) -> str:
    return git(repo, "show", f"refs/storm/workspace:{path}").stdout.decode()


def authors(repo: Path, path: str | None = None) -> list[str]:
    """The Storm-Agent of each write on the shared ref (newest first)."""
    args = ["log", "--format=%(trailers:key=Storm-Agent,valueonly)", "refs/storm/workspace"]
    out = git(repo, *args, *(["--", path] if path else [])).stdout.decode()
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


@pytest.fixture
def manager(repo: Path) -> Manager:
    return Manager(repo, reservation_wait=5)


# -- view, str_replace on the cached view, create ------------------------------------------------
def test_view_then_str_replace_on_the_cached_view(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a = Agent(manager, "engineer_1")
        r = await a.view(str(repo / "src/api.py"))  # the harness passes absolute paths
        assert r == ReadResponse("def fetch(url):\n    return http_get(url)\n", 1)
        res = await a.str_replace(str(repo / "src/api.py"), "http_get(url)", "http_get(url, timeout=10)")
        assert res.success and res.new_version == 2 and res.current_version == 2
        assert res.stale_files == [] and not res.has_reservation
        b = await manager.read_file("engineer_2", "src/api.py")
        assert b == ReadResponse("def fetch(url):\n    return http_get(url, timeout=10)\n", 2)

    run(go())
    assert "timeout=10" in shared(repo, "src/api.py")
    assert authors(repo, "src/api.py")[0] == "engineer_1"  # an attributed commit, not `git add -A`
    assert "timeout=10" in (repo / "src/api.py").read_text()  # and on disk


def test_create_is_version_0_and_a_second_create_is_a_conflict(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a, b = Agent(manager, "engineer_1"), Agent(manager, "engineer_2")
        with pytest.raises(FileNotFoundError):
            await a.view("src/new.py")
        res = await a.create("src/new.py", "X = 1\n")
        assert res.success and res.new_version == 1
        again = await b.create("src/new.py", "X = 2\n")
        assert not again.success and again.reason == "direct_conflict"
        assert again.current_version == 1 and again.current_content == "X = 1\n"
        assert again.changed_by == "engineer_1" and "+X = 1" in again.diff
        assert (await manager.read_file("engineer_2", "src/new.py")).content == "X = 1\n"

    run(go())
    assert shared(repo, "src/new.py") == "X = 1\n"


def test_direct_conflict_gives_diff_current_content_and_a_reservation(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a, b = Agent(manager, "engineer_1"), Agent(manager, "engineer_2")
        await a.view("src/api.py")
        await b.view("src/api.py")
        assert (await a.str_replace("src/api.py", "http_get(url)", "http_get(url, timeout=10)")).success
        res = await b.str_replace("src/api.py", "http_get(url)", "http_get(url, retries=3)")
        assert not res.success and res.reason == "direct_conflict"
        assert res.new_version is None and res.current_version == 2 and res.changed_by == "engineer_1"
        assert "-    return http_get(url)\n+    return http_get(url, timeout=10)" in res.diff
        assert res.current_content == "def fetch(url):\n    return http_get(url, timeout=10)\n"
        assert res.has_reservation  # engineer_2 holds the file to redo its edit
        # the harness retries on the current content it was given
        b.cache["src/api.py"] = ReadResponse(res.current_content, res.current_version)
        again = await b.str_replace("src/api.py", "timeout=10)", "timeout=10, retries=3)")
        assert again.success and again.new_version == 3

    run(go())
    assert shared(repo, "src/api.py").endswith("http_get(url, timeout=10, retries=3)\n")
    assert authors(repo, "src/api.py")[:2] == ["engineer_2", "engineer_1"]


def test_stale_dependency_lists_the_files_from_the_snapshot(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a, b = Agent(manager, "engineer_1"), Agent(manager, "engineer_2")
        await a.view(str(repo / "src/api.py"))
        await a.view(str(repo / "src/client.py"))
        await b.view("src/api.py")
        assert (await b.str_replace("src/api.py", "def fetch(", "def fetch_url(")).success
        res = await a.str_replace(str(repo / "src/client.py"), "return fetch(url)", "return fetch(url) or b''")
        assert not res.success and res.reason == "stale_dependency"
        # the path as the harness keyed it in its snapshot, versions as integers, and who changed it
        assert res.stale_files == [StaleFile(str(repo / "src/api.py"), 1, 2, "engineer_2")]
        assert res.current_version == 1 and res.has_reservation

    run(go())
    assert "or b''" not in shared(repo, "src/client.py")


def test_the_snapshot_is_the_read_set_of_the_write(repo: Path, manager: Manager) -> None:
    """An older version in the snapshot is validated even though the agent has read the
    newer one since (the edit was made on the snapshot); a file read but left out of the
    snapshot is no dependency of that write."""
    async def go() -> None:
        a, b = Agent(manager, "engineer_1"), Agent(manager, "engineer_2")
        await a.view("src/api.py")
        await a.view("src/client.py")
        await b.view("src/api.py")
        assert (await b.str_replace("src/api.py", "def fetch(", "def fetch_url(")).success
        await manager.read_file("engineer_1", "src/api.py")  # recorded: version 2; the cache still says 1
        res = await a.str_replace("src/client.py", "return fetch(url)", "return fetch(url)  # ok")
        assert res.reason == "stale_dependency" and res.stale_files[0].expected_version == 1
        await manager.release_reservation("engineer_1", "src/client.py")
        res = await manager.write_file("engineer_1", "src/client.py", "x = 1\n", 1,
                                       snapshot={"src/client.py": 1, "src/": 0})  # a viewed directory: no content
        assert res.success and res.new_version == 2  # src/api.py moved, but this write did not use it

    run(go())


def test_a_to_b_to_a_is_numbered_as_three_changes_without_a_false_conflict(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a, b = Agent(manager, "engineer_1"), Agent(manager, "engineer_2")
        await a.view("src/util.py")
        await b.view("src/util.py")
        assert (await b.str_replace("src/util.py", "max(lo", "max(  lo")).new_version == 2
        assert (await b.str_replace("src/util.py", "max(  lo", "max(lo")).new_version == 3
        assert (await manager.read_file("engineer_3", "src/util.py")).version == 3
        # engineer_1 holds version 1: the same content as version 3, so its edit stands
        res = await a.str_replace("src/util.py", "min(x, hi)", "min(x, hi)  # clamp")
        assert res.success and res.new_version == 4

    run(go())


def test_an_unknown_version_is_refused_and_nothing_is_written(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        await manager.read_file("engineer_1", "src/api.py")
        before = git(repo, "rev-parse", "refs/storm/workspace").stdout
        for bad in (7, -1, "1", None):
            with pytest.raises(ValueError):
                await manager.write_file("engineer_1", "src/api.py", "x\n", bad)
        assert git(repo, "rev-parse", "refs/storm/workspace").stdout == before

    run(go())


def test_read_and_list_errors(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        with pytest.raises(FileNotFoundError):
            await manager.read_file("engineer_1", "src/nope.py")
        for directory in ("src", "src/", str(repo / "src")):
            with pytest.raises(IsADirectoryError):
                await manager.read_file("engineer_1", directory)
            with pytest.raises(IsADirectoryError):
                await manager.write_file("engineer_1", directory, "x", 0)
        with pytest.raises(FileNotFoundError):
            await manager.list_dir("nope")
        with pytest.raises(NotADirectoryError):
            await manager.list_dir("README.md")
        with pytest.raises(BadAgent):
            await manager.read_file("bad agent", "README.md")
        for outside in ("../x", "/etc/passwd", ".git/config", "src/\x00x"):
            with pytest.raises(BadPath):
                await manager.read_file("engineer_1", outside)
            with pytest.raises(BadPath):
                await manager.write_file("engineer_1", outside, "x", 0)
        with pytest.raises(BadPath):
            await manager.list_dir("../")
        with pytest.raises(BadPath):
            await manager.write_file("engineer_1", "README.md", "x", 1, snapshot={"../x": 1})

    run(go())


def test_list_dir_format(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"a.py": "", "pkg/b.py": "", "pkg/sub/c.py": "", "pkg/sub/deep/d.py": "",
                                      ".hidden/x": "", "pkg/.env": ""})
    m = Manager(repo)

    async def go() -> None:
        assert await m.list_dir(str(repo)) == [f"{repo}/a.py", f"{repo}/pkg/", f"{repo}/pkg/b.py", f"{repo}/pkg/sub/"]
        assert await m.list_dir(".") == ["a.py", "pkg/", "pkg/b.py", "pkg/sub/"]
        assert await m.list_dir("pkg", max_depth=3) == ["pkg/b.py", "pkg/sub/", "pkg/sub/c.py", "pkg/sub/deep/",
                                                        "pkg/sub/deep/d.py"]
        assert await m.list_dir("pkg/", max_depth=1) == ["pkg/b.py", "pkg/sub/"]
        # a file created through the manager is listed at once
        assert (await m.write_file("engineer_1", "pkg/new.py", "", 0)).success
        assert "pkg/new.py" in await m.list_dir("pkg")

    run(go())


def test_not_in_storm_mode_is_refused(tmp_path: Path) -> None:
    plain = make_repo(tmp_path / "plain", init_storm=False)
    with pytest.raises(RepoStateError):
        Manager(plain)
    wt = make_repo(tmp_path / "wt")
    assert storm(wt, "mode", "worktree").returncode == 0
    with pytest.raises(RepoStateError, match="storm mode"):
        Manager(wt)


# -- reservations --------------------------------------------------------------------------------
def _conflict(manager: Manager, holder: str, other: str) -> None:
    """``holder`` is rejected on src/api.py (a direct conflict) and so holds it."""
    async def go() -> None:
        a, b = Agent(manager, holder), Agent(manager, other)
        await a.view("src/api.py")
        await b.view("src/api.py")
        assert (await b.str_replace("src/api.py", "def fetch(", "def fetch_url(")).success
        res = await a.str_replace("src/api.py", "(url)\n", "(url)  # a\n")
        assert res.reason == "direct_conflict" and res.has_reservation

    run(go())


def refused_as_reserved(repo: Path) -> int:
    """Writes refused as reserved, as storm's event log has them."""
    log = git(repo, "log", "--format=%s", "refs/storm/log", check=False).stdout.decode()
    return sum(1 for ln in log.splitlines() if ln.endswith(": reserved"))


def test_a_writer_waits_for_another_agents_reservation_until_it_is_released(repo: Path) -> None:
    manager = Manager(repo, reservation_wait=20)
    _conflict(manager, "engineer_1", "engineer_2")

    async def go() -> None:
        c = Agent(manager, "engineer_3")
        await c.view("src/api.py")
        write = asyncio.create_task(c.str_replace("src/api.py", "def fetch_url(", "def fetch_url2("))
        await asyncio.sleep(1.0)
        assert not write.done()  # waiting for engineer_1's reservation...
        assert refused_as_reserved(repo) == 0  # ...by looking, not by writes refused again and again
        # ...on the event loop: other agents go on meanwhile
        assert (await manager.read_file("engineer_4", "README.md")).version == 1
        assert (await manager.write_file("engineer_4", "README.md", "# s\n", 1)).success
        assert not write.done()
        assert not await manager.release_reservation("engineer_3", "src/api.py")  # not its reservation
        released = time.monotonic()
        assert await manager.release_reservation("engineer_1", "src/api.py")
        res = await asyncio.wait_for(write, 10)
        assert res.success and res.new_version == 3
        assert time.monotonic() - released < 10  # woke at the release, not when the 30 s were over
        assert not await manager.release_reservation("engineer_1", "src/api.py")  # nothing left to release

    run(go())
    assert "def fetch_url2(" in shared(repo, "src/api.py")


def test_a_writer_gives_up_after_the_reservation_wait(repo: Path) -> None:
    manager = Manager(repo, reservation_wait=0.5)
    _conflict(manager, "engineer_1", "engineer_2")

    async def go() -> None:
        c = Agent(manager, "engineer_3")
        await c.view("src/api.py")
        t0 = time.monotonic()
        res = await c.str_replace("src/api.py", "def fetch_url(", "def fetch_url2(")
        assert 0.5 <= time.monotonic() - t0 < 15  # gave up after its wait, well before the 30 s reservation
        assert not res.success and res.reason == "reserved" and not res.has_reservation
        assert "engineer_1" in res.message and res.current_version == 2
        assert refused_as_reserved(repo) == 1
        # the holder itself is not kept waiting by its own reservation
        own = await Agent(manager, "engineer_1").view("src/api.py")
        ok = await manager.write_file("engineer_1", "src/api.py", own.content + "# a\n", own.version,
                                      snapshot={"src/api.py": own.version})
        assert ok.success and ok.new_version == 3

    run(go())


# -- many agents, processes, restarts ------------------------------------------------------------
@pytest.mark.slow
def test_many_agents_as_tasks_on_one_event_loop(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"log.txt": "", **{f"own/{i}.txt": "" for i in range(8)}})
    manager = Manager(repo)
    agents = [f"engineer_{i}" for i in range(8)]

    async def go() -> list[list[int]]:
        shared_work = [increment(manager, a, "log.txt", 3) for a in agents]
        own_work = [increment(manager, a, f"own/{i}.txt", 2) for i, a in enumerate(agents)]
        return await asyncio.gather(*shared_work, *own_work)

    results = run(go())
    versions = sorted(v for got in results[:8] for v in got)
    assert versions == list(range(2, 26))  # 24 accepted writes, each a new version, none lost
    lines = shared(repo, "log.txt").splitlines()
    assert sorted(lines) == sorted(f"{a} {i}" for a in agents for i in range(3))
    assert all(got == [2, 3] for got in results[8:])
    assert len(authors(repo, "log.txt")) == 24
    assert len(manager.files) == 9
    assert manager.files["log.txt"].version == 25 and manager.files["own/0.txt"].version == 3


WORKER = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[4])
    from manager_agent import increment
    from storm_git.paper.manager import Manager

    async def main():
        m = Manager(sys.argv[1])
        agents = sys.argv[2].split(",")
        got = await asyncio.gather(*[increment(m, a, "log.txt", int(sys.argv[3])) for a in agents])
        print(json.dumps(got))

    asyncio.run(main())
""")


def test_several_processes_on_one_repository_agree_on_versions(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"log.txt": ""})
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(repo), f"p{n}_a,p{n}_b", "4", str(SUPPORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    versions = sorted(v for out, _ in outs for got in json.loads(out) for v in got)
    assert versions == list(range(2, 26))  # every process handed out distinct numbers, in one sequence
    assert len(shared(repo, "log.txt").splitlines()) == 24
    assert run(Manager(repo).read_file("observer", "log.txt")).version == 25


def test_a_process_killed_mid_session_leaves_numbers_that_match_the_history(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"log.txt": ""})
    git(repo, "config", "storm.reservationSeconds", "2")  # one the killed agents held ends soon
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(repo), "k_a,k_b", "1000", str(SUPPORT)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(shared(repo, "log.txt").splitlines()) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()  # wherever it is: mid-write, mid-numbering, holding a lock
    proc.wait()
    lines = len(shared(repo, "log.txt").splitlines())
    assert lines >= 20
    m = Manager(repo)
    r = run(m.read_file("after", "log.txt"))
    assert r.version == lines + 1  # one number per accepted write, none skipped or reused
    res = run(m.write_file("after", "log.txt", r.content + "after\n", r.version, snapshot={"log.txt": r.version}))
    assert res.success and res.new_version == lines + 2


def test_a_restart_mid_session_keeps_versions(repo: Path, tmp_path: Path) -> None:
    first = Manager(repo)

    async def before(m: Manager) -> tuple[ReadResponse, ReadResponse]:
        a, b = Agent(m, "engineer_1"), Agent(m, "engineer_2")
        await a.view("src/api.py")
        await b.view("src/api.py")
        assert (await a.str_replace("src/api.py", "def fetch(", "def fetch_url(")).new_version == 2
        return a.cache["src/api.py"], b.cache["src/api.py"]

    a_view, b_view = run(before(first))
    del first
    # a new Manager object in this process: the versions handed out before still hold
    second = Manager(repo)
    stale = run(second.write_file("engineer_2", "src/api.py", b_view.content + "# b\n", b_view.version,
                                  snapshot={"src/api.py": b_view.version}))
    assert not stale.success and stale.current_version == 2 and stale.changed_by == "engineer_1"
    assert run(second.release_reservation("engineer_2", "src/api.py"))  # its reservation too survived
    ok = run(second.write_file("engineer_1", "src/api.py", a_view.content + "# a\n", a_view.version,
                               snapshot={"src/api.py": a_view.version}))
    assert ok.success and ok.new_version == 3
    # a new process, with the version engineer_1 got before: it agrees and goes on
    code = textwrap.dedent(f"""
        import asyncio, json
        from storm_git.paper.manager import Manager
        m = Manager({str(repo)!r})
        async def main():
            r = await m.read_file("engineer_3", "src/api.py")
            w = await m.write_file("engineer_1", "src/api.py", r.content + "# again\\n", 3,
                                   snapshot={{"src/api.py": 3}})
            print(json.dumps([r.version, w.success, w.new_version]))
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout) == [3, True, 4]
    third = Manager(repo)
    assert run(third.read_file("engineer_2", "src/api.py")).version == 4
    assert third.files["src/api.py"].version == second.files["src/api.py"].version == 4
    assert third.files == second.files


def test_versions_are_kept_in_git(repo: Path) -> None:
    m = Manager(repo)
    run(m.write_file("engineer_1", "src/new.py", "x = 1\n", 0))
    notes = git(repo, "log", "--format=%s", "refs/notes/storm/versions").stdout.decode()
    assert "versions up to" in notes
    assert m.files["src/new.py"] == FileState("src/new.py", 1, hashlib.md5(b"x = 1\n").hexdigest(), "engineer_1")
    # storm's own verbs move the shared ref too: their writes are numbered as well
    assert storm(repo, "write", "src/new.py", "--agent", "engineer_1", input="x = 2\n").returncode == 0
    assert run(m.read_file("engineer_1", "src/new.py")).version == 2


def test_the_table_is_written_every_few_commits_not_at_every_write(repo: Path) -> None:
    from storm_git.paper.versions import PERSIST_EVERY

    m = Manager(repo)
    v = run(m.read_file("engineer_1", "README.md")).version
    for i in range(2 * PERSIST_EVERY + 3):
        v = run(m.write_file("engineer_1", "README.md", f"{i}\n", v)).new_version
    assert v == 2 * PERSIST_EVERY + 4
    commits = git(repo, "rev-list", "--count", "refs/notes/storm/versions").stdout.decode().strip()
    assert int(commits) <= 4  # started, README's version 1, two catch-ups
    # what was not written yet is numbered the same by a process that never saw it
    out = subprocess.run([sys.executable, "-c", "import asyncio; from storm_git.paper.manager import "
                          f"Manager; print(asyncio.run(Manager({str(repo)!r}).read_file('x', 'README.md')).version)"],
                         capture_output=True, timeout=120)
    assert out.stdout.decode().strip() == str(v), out.stderr.decode()


# -- the terminal ----------------------------------------------------------------------------------
def test_a_shell_command_through_exec_bumps_versions_and_is_attributed(repo: Path, manager: Manager) -> None:
    async def go() -> None:
        a = Agent(manager, "engineer_1")
        await a.view("src/util.py")
        res = await manager.run_command("engineer_2", "sed -i 's/clamp/clip/' src/util.py && echo done; "
                                                      "printf 'y = 1\\n' > src/made.py; exit 3")
        assert res.exit_code == 3 and res.output == "done\n" and not res.timed_out
        assert res.versions == {"src/util.py": 2, "src/made.py": 1} and res.rejected is None
        assert (await manager.read_file("engineer_3", "src/made.py")) == ReadResponse("y = 1\n", 1)
        # an agent that viewed the file before the command is told who changed it
        stale = await a.str_replace("src/util.py", "max(lo", "max(  lo")
        assert not stale.success and stale.changed_by == "engineer_2" and stale.current_version == 2
        assert "+def clip(" in stale.diff
        nothing = await manager.run_command("engineer_2", "true")
        assert nothing.versions == {} and nothing.commit is None

    run(go())
    assert authors(repo, "src/util.py")[0] == "engineer_2"
    assert authors(repo, "src/made.py") == ["engineer_2"]
    assert "engineer_2 terminal: sed" in git(repo, "log", "-1", "--format=%s", "refs/storm/workspace").stdout.decode()


# -- the numbering itself ----------------------------------------------------------------------------
def test_a_state_seen_at_an_older_head_keeps_the_number_it_had_there(repo: Path) -> None:
    from storm_git.core.store import Store
    from storm_git.paper import versions

    m = Manager(repo)
    old_head = git(repo, "rev-parse", "refs/storm/workspace").stdout.decode().strip()
    blob_a = git(repo, "rev-parse", f"{old_head}:src/util.py").stdout.decode().strip()
    text = (repo / "src/util.py").read_text()
    for content, version in ((text + "# b\n", 1), (text, 2)):
        assert run(m.write_file("engineer_1", "src/util.py", content, version)).success
    store = Store.discover(str(repo))
    head = git(repo, "rev-parse", "refs/storm/workspace").stdout.decode().strip()
    assert versions.number(store, "src/util.py", head, blob_a) == 3
    assert versions.number(store, "src/util.py", old_head, blob_a) == 1  # what a read there was told
    assert versions.lookup(store, "src/util.py", 2).blob != blob_a
    assert versions.lookup(store, "src/util.py", 4) is None


def test_a_reset_shared_ref_never_reuses_a_number(repo: Path) -> None:
    m = Manager(repo)
    assert run(m.read_file("engineer_1", "README.md")).version == 1
    assert run(m.write_file("engineer_1", "src/util.py", "v2\n", 1)).new_version == 2
    # the shared ref is set, with plain git, to a history that does not contain that write
    blob = git(repo, "hash-object", "-w", "--stdin", input=b"other\n").stdout.decode().strip()
    tree = git(repo, "mktree", input=f"100644 blob {blob}\tREADME.md\n".encode()).stdout.decode().strip()
    root = git(repo, "commit-tree", tree, "-m", "elsewhere").stdout.decode().strip()
    git(repo, "update-ref", "refs/storm/workspace", root)
    r = run(m.read_file("engineer_2", "README.md"))
    assert r.content == "other\n" and r.version > 2  # changed: a number never handed out for it
    with pytest.raises(FileNotFoundError):
        run(m.read_file("engineer_2", "src/util.py"))
    # version 2 still names the content the shared ref no longer holds: a conflict with its removal
    before = git(repo, "rev-parse", "refs/storm/workspace").stdout
    gone = run(m.write_file("engineer_1", "src/util.py", "again\n", 2))
    assert not gone.success and gone.reason == "direct_conflict" and gone.current_content is None, gone
    assert git(repo, "rev-parse", "refs/storm/workspace").stdout == before
    res = run(m.write_file("engineer_2", "src/util.py", "again\n", 0))
    assert res.success and res.new_version > 2
    assert run(Manager(repo).read_file("engineer_3", "src/util.py")).version == res.new_version


@pytest.mark.parametrize("row", ["2 zzzz 0000", "2 absent ../../x", "-1 absent ", "2 absent deadbeef"])
def test_a_forged_path_note_is_refused_and_reaches_no_read_set(repo: Path, row: str) -> None:
    from storm_git.core.errors import CorruptState
    from storm_git.core.readsets import path_key
    from storm_git.paper.versions import STATE_KEY

    m = Manager(repo)
    run(m.read_file("engineer_1", "README.md"))
    key = path_key("README.md")
    entries = []
    for k, data in ((STATE_KEY, git(repo, "cat-file", "blob",
                                    f"refs/notes/storm/versions:{STATE_KEY[:2]}/{STATE_KEY[2:]}").stdout),
                    (key, f"storm versions 1 README.md\n1 {'0' * 40} \n{row}\n".encode())):
        blob = git(repo, "hash-object", "-w", "--stdin", input=data).stdout.decode().strip()
        sub = git(repo, "mktree", input=f"100644 blob {blob}\t{k[2:]}\n".encode()).stdout.decode().strip()
        entries.append(f"040000 tree {sub}\t{k[:2]}\n")
    tree = git(repo, "mktree", input="".join(entries).encode()).stdout.decode().strip()
    forged = git(repo, "commit-tree", tree, "-m", "forged").stdout.decode().strip()
    git(repo, "update-ref", "refs/notes/storm/versions", forged)
    with pytest.raises(CorruptState, match="versions"):
        run(m.write_file("engineer_1", "README.md", "x\n", 2))
    assert run(m.read_file("engineer_1", "src/api.py")).version == 1  # its read set took nothing from it
    assert "corrupt" not in storm(repo, "status", "--json").stdout


def test_an_unreadable_versions_ref_is_refused_with_a_hint(repo: Path) -> None:
    from storm_git.core.errors import CorruptState
    from storm_git.paper.versions import STATE_KEY

    m = Manager(repo)
    run(m.read_file("engineer_1", "README.md"))
    blob = git(repo, "hash-object", "-w", "--stdin", input=b"not a state\n").stdout.decode().strip()
    sub = git(repo, "mktree", input=f"100644 blob {blob}\t{STATE_KEY[2:]}\n".encode()).stdout.decode().strip()
    tree = git(repo, "mktree", input=f"040000 tree {sub}\t{STATE_KEY[:2]}\n".encode()).stdout.decode().strip()
    commit = git(repo, "commit-tree", tree, "-m", "forged").stdout.decode().strip()
    git(repo, "update-ref", "refs/notes/storm/versions", commit)
    before = git(repo, "rev-parse", "refs/storm/workspace").stdout
    with pytest.raises(CorruptState, match="update-ref -d refs/notes/storm/versions"):
        run(m.write_file("engineer_1", "README.md", "x\n", 1))
    assert git(repo, "rev-parse", "refs/storm/workspace").stdout == before
    git(repo, "update-ref", "-d", "refs/notes/storm/versions")  # what the hint says: numbering starts afresh
    assert run(m.read_file("engineer_1", "README.md")).version == 1
