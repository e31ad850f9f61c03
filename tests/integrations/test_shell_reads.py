"""Shell reads are reads (storm_git.integrations.shell_reads): the files a command
shows, from its bash syntax, on real command lines of agents (Codex reads through its
shell), and through the harness's Bash door in real hook processes."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import claude_event, codex_event, decision, hook, storm
from storm_git.integrations.shell_reads import MAX_COMMAND_CHARS, raw_reads, read_paths

NAMES = ["src/api.py", "src/util.py", "README.md", "log.txt", "a.py", "b.py", "a file.py", "b file.py", "-odd.py",
         "out.txt"]


def reads(command, top: Path) -> list[str]:
    """The files ``command`` reads, run from ``top`` (which holds NAMES), as shown there."""
    for n in NAMES:
        (top / n).parent.mkdir(parents=True, exist_ok=True)
        (top / n).write_text("x\n")
    return [os.path.relpath(os.path.join(where, raw), top) if not raw.startswith("/etc") else raw
            for raw, where in raw_reads(command, str(top))]


@pytest.mark.parametrize("command, expected", [
    ("cat src/api.py", ["src/api.py"]),
    ("cat -n src/api.py src/util.py", ["src/api.py", "src/util.py"]),
    ("sed -n '1,200p' src/api.py", ["src/api.py"]),
    ("sed -n -e '5,9p' src/api.py", ["src/api.py"]),
    ("sed 's/a/b/' src/api.py", ["src/api.py"]),  # printed, changed on the way: shown
    ("nl -ba src/util.py | sed -n '10,40p'", ["src/util.py"]),
    ("head -n 40 src/api.py", ["src/api.py"]),
    ("head -40 README.md && tail -n +3 src/util.py", ["README.md", "src/util.py"]),
    ("tail -f -n 5 log.txt", ["log.txt"]),
    ("less -N src/api.py", ["src/api.py"]),
    ("grep -n 'def ' src/api.py src/util.py", ["src/api.py", "src/util.py"]),
    ("grep -e fetch -e get src/api.py", ["src/api.py"]),
    ("rg -n 'fetch' src/api.py", ["src/api.py"]),
    ("rg -n -A 3 fetch README.md", ["README.md"]),
    ("wc -l < src/api.py", ["src/api.py"]),
    ("while read l; do echo $l; done < src/util.py", ["src/util.py"]),
    ("cd src && cat util.py; cd .. && cat README.md", ["src/util.py", "README.md"]),
    ("cat 'a file.py' \"b file.py\"", ["a file.py", "b file.py"]),
    ("echo \"$(cat src/api.py)\" | wc -l", ["src/api.py"]),
    ("diff <(cat a.py) b.py", ["a.py"]),
    ("bash -lc 'sed -n 1,80p src/api.py'", ["src/api.py"]),
    (["bash", "-lc", "cat src/api.py && nl -ba src/util.py"], ["src/api.py", "src/util.py"]),
    (["cat", "src/api.py"], ["src/api.py"]),
    ("sudo cat /etc/hostname", ["/etc/hostname"]),
    ("env LC_ALL=C cat src/api.py", ["src/api.py"]),
    ("cat -- -odd.py", ["-odd.py"]),
    ("cat src/api.py > out.txt 2>&1", ["src/api.py"]),
    ("(cat a.py; cat b.py) | sort", ["a.py", "b.py"]),
    ("if true; then cat a.py; fi", ["a.py"]),
    ("cat a.py || head b.py", ["a.py", "b.py"]),
])
def test_reads_of_real_command_lines(command, expected, tmp_path: Path) -> None:
    assert reads(command, tmp_path) == expected


@pytest.mark.parametrize("command", [
    "ls -la src", "find . -name '*.py'", "rg -n fetch", "rg --files", "grep -l fetch src/api.py",
    "grep -c fetch src/api.py", "grep -q fetch src/api.py && echo yes", "sed -i 's/a/b/' src/api.py",
    "sed -i.bak -n 1p src/api.py", "echo hi > src/api.py", "cat $FILE", "cat \"$(git ls-files | head -1)\"",
    "cat <<EOF\nhello\nEOF", "python -m pytest -q", "git diff", "touch a.py", "rm src/api.py",
    "for f in *.nothing; do cat $f; done", "", "cat missing.py", "cat src", "head -n 5 src/",
])
def test_listing_searching_writing_or_unknowable_names_are_not_reads(command, tmp_path: Path) -> None:
    assert reads(command, tmp_path) == []


def test_grep_recursive_over_a_directory_is_a_search_a_file_argument_a_read(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src/api.py").write_text("x\n")
    (tmp_path / "a.py").write_text("x\n")
    got = raw_reads("grep -rn fetch src a.py && rg fetch src", str(tmp_path))
    assert got == [("a.py", str(tmp_path))]
    got = raw_reads("cat src/*.py", str(tmp_path))  # a glob, as bash expands it
    assert got == [(str(tmp_path / "src/api.py"), str(tmp_path))]


@pytest.mark.parametrize("command", ["cat 'unterminated", "((", "cat $(", "if then fi", "x" * (MAX_COMMAND_CHARS + 1),
                                     None, 42, ["bash"], {"cmd": "cat a"}, "cat a\0b"])
def test_what_does_not_parse_records_nothing_and_never_raises(command) -> None:
    assert read_paths(command, "/r", lambda raw, cwd: raw) == []


def test_a_path_the_door_refuses_is_dropped_not_raised(tmp_path: Path) -> None:
    def resolve(raw: str, cwd: str) -> str | None:
        if raw == "bad":
            raise ValueError("refused")
        return None if raw.startswith("/") else raw

    for n in ("bad", "good.py"):
        (tmp_path / n).write_text("x\n")
    assert read_paths("cat bad /etc/hostname good.py good.py", str(tmp_path), resolve) == ["good.py"]


# -- the harness's Bash door ----------------------------------------------------------------------
def test_a_read_through_the_bash_door_guards_the_agents_later_write(repo: Path) -> None:
    """engineer_1 reads src/util.py with `sed -n` (and lists src/ with ls: no read);
    engineer_2 changes src/util.py; engineer_1's edit of src/api.py, which depends on
    the file it read, is a stale dependency."""
    cmd = {"command": "ls src && sed -n '1,80p' src/util.py | nl -ba", "description": "look"}
    assert decision(hook(repo, claude_event(repo, "s1", "PreToolUse", "Bash", cmd, "b1"), "-a", "engineer_1")) is None
    post = claude_event(repo, "s1", "PostToolUse", "Bash", cmd, "b1",
                        {"stdout": "", "stderr": "", "interrupted": False, "isImage": False})
    assert decision(hook(repo, post, "-a", "engineer_1")) is None
    from storm_git.core import readsets
    from storm_git.core.store import Store

    seen = readsets.load(Store.discover(str(repo)), "engineer_1")
    assert set(seen) == {"src/util.py"}  # read; the listed directory and its other files are not
    assert storm(repo, "read", "src/util.py", agent="engineer_2").returncode == 0
    assert storm(repo, "write", "src/util.py", agent="engineer_2", input="changed\n").returncode == 0
    assert storm(repo, "read", "src/api.py", agent="engineer_1").returncode == 0
    r = storm(repo, "write", "src/api.py", "--deps", "src/util.py", "--json", agent="engineer_1", input="x\n")
    assert r.returncode == 1 and json.loads(r.stdout)["rejection"]["reason"] == "stale_dependency", r.stdout


def test_codex_shell_reads_through_the_door_with_its_argv(repo: Path) -> None:
    cmd = {"command": ["bash", "-lc", f"cat {repo / 'README.md'} && rg -n fetch src"]}
    pre = codex_event(repo, "019a-codex", "PreToolUse", "Bash", "", "c1")
    pre["tool_input"] = cmd
    assert decision(hook(repo, pre, "--harness", "codex")) is None
    from storm_git.core import readsets
    from storm_git.core.store import Store

    assert set(readsets.load(Store.discover(str(repo)), "codex-019acodex")) == {"README.md"}


def test_a_hostile_or_outside_path_in_a_command_records_nothing_and_the_hook_passes(repo: Path) -> None:
    cmd = {"command": "cat /etc/hostname .git/config ../outside 'bad\\x00' && cat 'cat $(' \"((\"", "description": "x"}
    assert decision(hook(repo, claude_event(repo, "s9", "PreToolUse", "Bash", cmd, "b9"), "-a", "engineer_9")) is None
    from storm_git.core import readsets
    from storm_git.core.store import Store

    assert readsets.load(Store.discover(str(repo)), "engineer_9") == {}
    broken = {"command": "cat 'unterminated", "description": "x"}
    e = claude_event(repo, "s9", "PreToolUse", "Bash", broken, "b10")
    assert decision(hook(repo, e, "-a", "engineer_9")) is None
