"""The docs run as written: every ``git storm …`` line in the fenced shell blocks of
README.md and docs/*.md (and every example in ``-h``) names commands and options
that exist, and the documented sequences run for real in a fresh repository
without a usage error or a crash."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click
import pytest

from helpers import git, make_repo, storm

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SPLIT = {";", "&&", "||", "|", "(", ")", "&"}
REDIRECT = {"<", ">", ">>", "2>", "2>&1"}
KEYWORDS = {"do", "then", "else", "time", "!"}
MODE_PER_BLOCK = {"worktree-mode.md": "worktree"}
# click's own parse errors: a documented line that names a command or option wrongly
USAGE_ERRORS = ("No such option", "unexpected extra argument", "No such command", "Missing argument",
                "Missing option", "requires an argument", "Invalid value")


def _blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of every fenced code block."""
    blocks, cur, lang, first = [], None, "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if cur is None:
            if stripped.startswith("```"):
                cur, lang, first = [], stripped[3:].strip().split(" ")[0], n + 1
        elif stripped.startswith("```"):
            blocks.append((first, lang, cur))
            cur = None
        else:
            cur.append(stripped)
    return blocks


def _lines(text: str, *, with_block: bool = False) -> list:
    """(line number, logical line) of shell code blocks; continuations joined, prompts
    dropped. ``with_block``: (block number, line number, line)."""
    out = []
    for b, (first, lang, lines) in enumerate(_blocks(text)):
        if lang not in SHELL_LANGS:
            continue
        pending, start = "", 0
        for i, line in enumerate(lines):
            if not pending:
                start = first + i
                if line.startswith("$ "):
                    line = line[2:]
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append((b, start, pending + line) if with_block else (start, pending + line))
            pending = ""
    return out


def _segments(line: str) -> list[dict]:
    """The simple commands of a shell line: {"env", "argv", "stdin"}, comments dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return []
    segs, cur = [], []
    for t in tokens + [";"]:
        if t in SPLIT:
            if cur:
                segs.append(cur)
            cur = []
        else:
            cur.append(t)
    out = []
    for seg in segs:
        while seg and seg[0] in KEYWORDS:
            seg = seg[1:]
        env = {}
        while seg and ASSIGN.match(seg[0]) and seg[0] != "export":
            k, _, v = seg[0].partition("=")
            env[k] = v
            seg = seg[1:]
        stdin = None
        argv = []
        it = iter(seg)
        for t in it:
            if t in REDIRECT:
                target = next(it, None)
                if t == "<":
                    stdin = target
            else:
                argv.append(t)
        out.append({"env": env, "argv": argv, "stdin": stdin})
    return out


def _storm_args(argv: list[str]) -> list[str] | None:
    """The arguments of a 'git storm …' or 'git-storm …' command, else None."""
    if argv[:2] == ["git", "storm"]:
        return argv[2:]
    if argv[:1] == ["git-storm"]:
        return argv[1:]
    return None


def documented() -> list[tuple[str, list[str], dict]]:
    """(where, argv after 'git storm', segment) for every documented storm command."""
    found = []
    for doc in DOCS:
        for n, line in _lines(doc.read_text(encoding="utf-8")):
            for seg in _segments(line):
                args = _storm_args(seg["argv"])
                if args is not None:
                    found.append((f"{doc.relative_to(ROOT)}:{n}", args, seg))
    return found


def help_examples() -> list[tuple[str, list[str]]]:
    """Every 'git storm …' line of the Example sections of -h."""
    from storm_git.cli.main import cli

    out = []
    for name in cli.list_commands(None):
        cmd = cli.get_command(None, name)
        for line in (cmd.help or "").splitlines():
            for seg in _segments(line.strip()):
                if seg["argv"][:2] == ["git", "storm"]:
                    out.append((f"git storm {name} -h", seg["argv"][2:]))
    return out


def parse(argv: list[str]) -> None:
    """Parse like ``git storm ARGV`` would, without running the command: raises click's
    usage errors (unknown command or option, extra or missing argument)."""
    from storm_git.cli.main import cli

    if not argv:
        return
    cmd = cli.get_command(None, argv[0])
    if cmd is None:
        raise click.UsageError(f"No such command {argv[0]!r}")
    parent = click.Context(cli, info_name="git storm")
    with cmd.make_context(argv[0], list(argv[1:]), parent=parent):
        pass


def test_the_docs_have_storm_commands():
    where = {w.split(":")[0] for w, _, _ in documented()}
    assert {"README.md", "docs/worktree-mode.md", "docs/storm-mode.md"} <= where, where
    assert any(a == ["hook", "pre-commit"] for _, a, _ in documented())  # git-storm … counts too
    assert len(documented()) > 40 and len(help_examples()) > 20


@pytest.mark.parametrize("where,argv", [(w, a) for w, a, _ in documented()] + help_examples(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_documented_command_parses(where, argv):
    try:
        parse(argv)
    except click.exceptions.Exit:
        pass  # -h
    except click.ClickException as exc:
        pytest.fail(f"{where}: git storm {shlex.join(argv)}: {exc.format_message()}")


def test_parse_catches_what_was_broken():
    """The checker itself fails on the kinds of broken line it exists to find."""
    with pytest.raises(click.UsageError, match="unexpected extra argument"):
        parse(["spawn", "engineer_1", "engineer_2"])
    with pytest.raises(click.NoSuchOption):
        parse(["cleanup", "--onto", "main"])
    with pytest.raises(click.UsageError, match="No such command"):
        parse(["rebase", "engineer_1"])


# -- the documented sequences, for real -----------------------------------------------------
def _run_doc(doc: Path, tmp_path: Path) -> list[tuple[str, int, str]]:
    """Run a doc's storm commands in order in a fresh repository (DEFAULT_FILES: the
    src/api.py the docs edit). README.md starts from scratch (its quick start runs
    init); the reference docs in docs/ assume an initialised repository."""
    repo = make_repo(tmp_path / "repo", init_storm=doc.name != "README.md")
    git(repo, "tag", "v1.2")
    files = tmp_path / "files"
    files.mkdir()
    env: dict[str, str] = {}
    results = []
    block = None
    for b, n, line in _lines(doc.read_text(encoding="utf-8"), with_block=True):
        if b != block and doc.name in MODE_PER_BLOCK:
            # a reference doc's blocks are separate illustrations of one mode
            assert storm(repo, "mode", MODE_PER_BLOCK[doc.name], "--force").returncode == 0
        block = b
        for seg in _segments(line):
            argv = seg["argv"]
            if argv[:1] == ["export"]:
                for a in argv[1:]:
                    k, _, v = a.partition("=")
                    env[k] = v
                continue
            if argv[:2] == ["git", "config"]:
                git(repo, *argv[1:], check=False)
                continue
            args = _storm_args(argv)
            if args is None or not _runs_here(args):
                continue
            stdin = None
            if seg["stdin"]:
                p = files / os.path.basename(seg["stdin"])
                if not p.exists():
                    p.write_text("def helper():\n    return 1\n")
                stdin = p.read_bytes()
            e = dict(env, **seg["env"])
            r = storm(repo, *args, input=stdin, agent=e.pop("STORM_AGENT", None), env=e, timeout=120)
            results.append((f"{doc.name}:{n} git storm {shlex.join(args)}", r.returncode, r.stderr))
    return results


def _runs_here(args: list[str]) -> bool:
    """A documented storm command this test runs: all but `simulate` (minutes of runs)
    and `team` (it starts Claude Code or Codex sessions; tests/team and tests/e2e run
    it), whose lines the option checks above still parse."""
    return args[:1] not in (["simulate"], ["team"])


# the docs with storm commands to run; one with only `simulate` lines is parsed, not run
_RUN_WHERE = {where.rsplit(":", 1)[0] for where, args, _ in documented() if _runs_here(args)}
RUN_DOCS = [doc for doc in DOCS if str(doc.relative_to(ROOT)) in _RUN_WHERE]


@pytest.mark.parametrize("doc", RUN_DOCS, ids=lambda d: d.name)
def test_documented_sequence_runs(doc, tmp_path):
    results = _run_doc(doc, tmp_path)
    assert results, f"{doc.name} documents storm commands, and none ran"
    bad = [(w, code, err.strip()[:300]) for w, code, err in results
           if code == 4 or any(u in err for u in USAGE_ERRORS)]
    assert not bad, "\n".join(f"{w}: exit {c}: {e}" for w, c, e in bad)
    if doc.name == "README.md":
        # the quick starts are one story: every step succeeds as written (exec passes
        # its command's status through; doctor exits 3 when it has findings to report)
        failed = [(w, code, err.strip()[:300]) for w, code, err in results
                  if code != 0 and not re.search(r"git storm (exec|doctor)\b", w)]
        assert not failed, "\n".join(f"{w}: exit {c}: {e}" for w, c, e in failed)


def test_worktree_doc_assign_lines_run_as_written(tmp_path):
    """An assign line that once failed ('Got unexpected extra argument') records both globs."""
    repo = make_repo(tmp_path / "repo")
    lines = [seg for _, argv, seg in documented() if argv[:1] == ["assign"] and "engineer_2" in argv]
    assert lines
    for seg in lines:
        r = storm(repo, *seg["argv"][2:])
        assert r.returncode == 0, (seg["argv"], r.stderr)
    r = storm(repo, "assign", "--json")
    assert r.returncode == 0
    assert '"tests/test_client*.py"' in r.stdout and '"src/client.py"' in r.stdout
    # the repeatable option still works, alone or with GLOB arguments
    r = storm(repo, "assign", "engineer_3", "-f", "docs/", "README.md", "--files", "setup.cfg")
    assert r.returncode == 0 and all(g in r.stdout for g in ("docs/", "README.md", "setup.cfg")), r.stdout


def test_detached_head_names_an_option_that_exists(tmp_path):
    repo = make_repo(tmp_path / "r")
    assert storm(repo, "mode", "worktree").returncode == 0
    git(repo, "checkout", "-q", "--detach")
    r = storm(repo, "mode")
    assert r.returncode == 2 and "--into BRANCH" in r.stderr and "detached" in r.stderr
    r = storm(repo, "mode", "--into", "main")
    assert r.returncode == 0 and "target branch main" in r.stdout, r.stderr
    r = storm(repo, "spawn", "e1")
    assert r.returncode == 2 and "--base REF" in r.stderr and "--into" not in r.stderr
    assert storm(repo, "spawn", "e1", "--base", "main").returncode == 0
    r = storm(repo, "sync", "e1")
    assert r.returncode == 2 and "--onto BRANCH" in r.stderr
    r = storm(repo, "sync", "e1", "--onto", "main")
    assert r.returncode == 0, r.stderr


def documented_pip_installs() -> list[tuple[str, list[str]]]:
    """(where, argv) of every ``pip install`` in the docs' shell blocks."""
    found = []
    for doc in DOCS:
        for n, line in _lines(doc.read_text(encoding="utf-8")):
            for seg in _segments(line):
                argv = seg["argv"]
                at = next((i for i in range(len(argv) - 1) if argv[i:i + 2] == ["pip", "install"]), None)
                if at is not None:
                    found.append((f"{doc.relative_to(ROOT)}:{n}", argv[at + 2:]))
    return found


def test_documented_pip_installs_install_from_the_repository():
    """git storm installs from its clone: a documented `pip install` names the clone
    ('.' with its extras), never a package on an index, and each extra exists."""
    from importlib import metadata

    extras = set(metadata.metadata("git-storm").get_all("Provides-Extra"))
    found = documented_pip_installs()
    assert found
    for where, args in found:
        targets = [a for a in args if not a.startswith("-")]
        assert targets, where
        for target in targets:
            path, _, extra = target.partition("[")
            assert path == ".", f"{where}: pip install {target}: not the clone"
            assert not extra or set(extra.rstrip("]").split(",")) <= extras, f"{where}: {target}"
