"""``git storm watch``: the shared head's tests as writes land, blame by bisection,
notices. Real git, real ``git storm`` processes, the project's tests run by the real
pytest in an export of the head."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import make_repo, rev, storm

PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -q -p no:cacheprovider"
FILES = {
    "lib/__init__.py": "",
    "lib/api.py": "def greet(name, *, loud=False):\n    return name.upper() if loud else name\n",
    "app/__init__.py": "",
    "app/use.py": "def run():\n    return 'run'\n",
    "tests/test_api.py": "from lib.api import greet\n\n\ndef test_greet():\n    assert greet('x', loud=True) == 'X'\n",
    "tests/test_other.py": "def test_other():\n    assert True\n",
}


def write(repo: Path, agent: str, path: str, text: str) -> str:
    r = storm(repo, "read", path, agent=agent)
    assert r.returncode == 0, r.stderr
    r = storm(repo, "write", path, "--json", input=text, agent=agent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["commit"]


def watch(repo: Path, *args: str, cmd: str = PYTEST) -> dict:
    r = storm(repo, "watch", "--test", cmd, "--once", "--json", *args, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stdout
    return lines[0]


def state(repo: Path) -> dict:
    return json.loads((repo / ".git" / "storm" / "tests" / "state.json").read_text())


def notices(repo: Path) -> list[dict]:
    d = repo / ".git" / "storm" / "tests" / "notices"
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", FILES)


def rename_and_call(repo: Path) -> tuple[str, str]:
    """alice renames greet's keyword (and its test); bob, in another file, adds a call
    with the old keyword and a test of it. Each passes alone; together bob's test fails."""
    a = write(repo, "alice", "lib/api.py",
              "def greet(name, *, shout=False):\n    return name.upper() if shout else name\n")
    write(repo, "alice", "tests/test_api.py",
          "from lib.api import greet\n\n\ndef test_greet():\n    assert greet('x', shout=True) == 'X'\n")
    write(repo, "bob", "app/use.py",
          "from lib.api import greet\n\n\ndef run():\n    return greet('x', loud=True)\n")
    b = write(repo, "bob", "tests/test_use.py",
              "from app.use import run\n\n\ndef test_run():\n    assert run() == 'X'\n")
    return a, b


def test_a_semantic_conflict_is_blamed_on_both_writes_and_told_to_both_agents_once(repo):
    a, b = rename_and_call(repo)
    rep = watch(repo)
    assert rep["failed"] == ["tests/test_use.py::test_run"]
    (f,) = rep["findings"]
    assert f["kind"] == "semantic"
    assert [(w["agent"], w["commit"]) for w in f["writes"]] == [("alice", a), ("bob", b)]
    (n,) = notices(repo)
    assert n["agents"] == ["alice", "bob"] and "unexpected keyword argument 'loud'" in n["tail"]
    # bob hears it on his next command (stderr), once; the command's own output is untouched
    r = storm(repo, "status", agent="bob")
    assert r.returncode == 0 and "semantic conflict" in r.stderr and a[:10] in r.stderr and b[:10] in r.stderr
    assert "tests: red" in r.stdout and "tests/test_use.py::test_run" in r.stdout
    again = storm(repo, "status", agent="bob")
    assert "semantic conflict" not in again.stderr
    # alice has not heard it yet; carol is not involved
    assert "semantic conflict" not in storm(repo, "read", "app/use.py", agent="carol").stderr
    assert "semantic conflict" in storm(repo, "read", "app/use.py", agent="alice").stderr
    log = storm(repo, "log", "--json")
    assert any(e.get("type") == "test-notice" and e["notice"]["test"] == "tests/test_use.py::test_run"
               for e in json.loads(log.stdout))
    # the same head again: nothing new, nobody told twice
    assert storm(repo, "watch", "--test", PYTEST, "--once", "--json").stdout.strip() == ""


def test_a_plain_break_is_blamed_on_the_one_write(repo):
    first = watch(repo)  # the base: green
    assert first["failed"] == [] and first["full"]
    write(repo, "bob", "app/use.py", "def run():\n    return 'walk'\n")  # unrelated: stays green
    c = write(repo, "alice", "lib/api.py", "def greet(name, *, loud=False):\n    return name\n")
    rep = watch(repo)
    assert not rep["full"] and rep["why"].endswith("import what changed")
    (f,) = rep["findings"]
    assert f["kind"] == "break" and [w["commit"] for w in f["writes"]] == [c]
    (n,) = notices(repo)
    assert n["agents"] == ["alice"] and n["kind"] == "break"


def test_only_the_tests_that_import_what_changed_run(repo):
    watch(repo)
    write(repo, "bob", "app/use.py", "def run():\n    return 'walk'\n")
    rep = watch(repo)
    assert rep["ran"] == 0 and rep["why"] == "0 test file(s) import what changed"
    write(repo, "bob", "lib/api.py", "def greet(name, *, loud=False):\n    return name.upper() if loud else name\n\n")
    assert watch(repo)["ran"] == 1  # tests/test_api.py, not tests/test_other.py
    write(repo, "bob", "README.md", "hello\n")
    rep = watch(repo)
    assert rep["full"] and "not Python" in rep["why"] and rep["ran"] == 2


def test_a_known_failing_test_is_never_blamed(repo, tmp_path):
    red = make_repo(tmp_path / "red", {**FILES, "tests/test_red.py": "def test_red():\n    assert 1 == 2\n"})
    write(red, "alice", "app/use.py", "def run():\n    return 'walk'\n")
    rep = watch(red)
    assert rep["failed"] == ["tests/test_red.py::test_red"]
    assert [f["kind"] for f in rep["findings"]] == ["known_failing"]
    assert notices(red) == [] and state(red)["known_failing"] == ["tests/test_red.py::test_red"]
    assert "semantic" not in storm(red, "status", agent="alice").stderr


def test_a_flaky_test_is_not_blamed(repo, tmp_path):
    marks = tmp_path / "flaky-runs"
    write(repo, "alice", "tests/test_flaky.py",
          "import os\n\n\ndef test_flaky():\n    p = os.environ['FLAKY_MARKS']\n    first = not os.path.exists(p)\n"
          "    open(p, 'a').close()\n    assert not first\n")
    rep = watch(repo, cmd=f"FLAKY_MARKS={marks} {PYTEST}")
    assert rep["flaky"] == ["tests/test_flaky.py::test_flaky"] and rep["findings"] == []
    assert notices(repo) == [] and state(repo)["results"]["tests/test_flaky.py::test_flaky"]["outcome"] == "flaky"


def test_a_semantic_conflict_across_a_green_round_is_still_blamed_on_both(tmp_path):
    """A test the base has: alice's write is tested green on its own head, then bob's
    makes it fail. Bob's write alone (on the base) passes: a semantic conflict with
    alice's, not a break by bob, though alice's write was already on the last green head."""
    repo = make_repo(tmp_path / "sum", {**FILES, "lib/a.py": "A = 1\n", "lib/b.py": "B = 1\n",
                                        "tests/test_sum.py": "from lib.a import A\nfrom lib.b import B\n\n\n"
                                                             "def test_sum():\n    assert A + B < 4\n"})
    assert watch(repo)["failed"] == []
    a = write(repo, "alice", "lib/a.py", "A = 2\n")
    assert watch(repo)["failed"] == []
    b = write(repo, "bob", "lib/b.py", "B = 2\n")
    rep = watch(repo)
    (f,) = rep["findings"]
    assert f["test"] == "tests/test_sum.py::test_sum" and f["kind"] == "semantic", f
    assert [(w["agent"], w["commit"]) for w in f["writes"]] == [("alice", a), ("bob", b)]


def test_a_runner_tied_to_a_process_ends_with_it_and_stops_its_tests(repo, tmp_path):
    """--while-pid: the process it serves is killed in the middle of a round; the
    runner exits and the round's test command (a session of its own) is ended too."""
    gate = tmp_path / "started"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    parent = subprocess.Popen(["sleep", "120"])
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "watch", "--test", f"touch {gate}; sleep 77",
                          "--once", "--while-pid", str(parent.pid)], cwd=repo, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if gate.exists():
                break
            time.sleep(0.1)
        assert gate.exists(), p.stderr.read() if p.poll() is not None else "the test command never started"
        parent.kill()
        parent.wait()
        assert p.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
    leftover = subprocess.run(["pgrep", "-f", "sleep 77"], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""
    assert not any((repo / ".git" / "storm" / "tests" / "work").iterdir())  # its export removed


def test_the_runner_killed_mid_run_leaves_a_consistent_state_and_a_new_one_finishes(repo, tmp_path):
    watch(repo)  # round 1 on the base
    before = state(repo)
    rename_and_call(repo)
    gate = tmp_path / "started"
    slow = f"touch {gate}; sleep 60; {PYTEST}"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "watch", "--test", slow, "--once"], cwd=repo, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(600):
        if gate.exists():
            break
        time.sleep(0.1)
    assert gate.exists(), p.stderr.read() if p.poll() is not None else "the test command never started"
    assert state(repo)["running"]["pid"] == p.pid  # the round is under way
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    st = state(repo)  # still the last finished round's state, readable
    assert st["head"] == before["head"] and st["rounds"] == 1
    r = storm(repo, "watch", "--status", "--json")
    assert json.loads(r.stdout)["running"] is None  # a dead runner is not "running"
    work = repo / ".git" / "storm" / "tests" / "work"
    assert any(work.iterdir())  # the killed round's export is left behind ...
    rep = watch(repo)  # ... until the next runner repeats the round
    assert [f["kind"] for f in rep["findings"]] == ["semantic"]
    assert not any(work.iterdir())
    st = state(repo)
    assert st["head"] == rev(repo, "refs/storm/workspace") and st["rounds"] == 2 and st["running"] is None
    leftover = subprocess.run(["pgrep", "-f", f"touch {gate}"], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""  # the orphaned test command was killed


def test_one_runner_per_repository(repo, tmp_path):
    gate = tmp_path / "started"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    write(repo, "alice", "app/use.py", "def run():\n    return 'walk'\n")
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "watch", "--test", f"touch {gate}; sleep 30", "--once"],
                         cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if gate.exists():
                break
            time.sleep(0.1)
        r = storm(repo, "watch", "--test", "true", "--once")
        assert r.returncode == 3 and "another git storm watch runs" in r.stderr
    finally:
        p.kill()
        p.wait()


def test_bad_input_is_refused_clearly(repo):
    r = storm(repo, "watch", "--once")
    assert r.returncode == 2 and "no test command" in r.stderr
    r = storm(repo, "watch", "--test", "true", "--every", "0")
    assert r.returncode == 2
    (repo / ".git" / "storm" / "tests").mkdir(parents=True)
    (repo / ".git" / "storm" / "tests" / "state.json").write_text("[1, 2]")
    r = storm(repo, "watch", "--test", "true", "--once")
    assert r.returncode == 3 and "not a test-runner state" in r.stderr
    assert "state unreadable" in storm(repo, "status").stdout
