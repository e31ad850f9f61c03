"""The agent's brief (storm_git.integrations.brief): ``git storm prompt`` for each
role and mode, and every command it names exists."""
from __future__ import annotations

import re

from helpers import storm
from storm_git.integrations.brief import MODES, ROLES, brief

GROUPS = {"harness"}  # commands whose first argument is a subcommand


def mentioned_commands() -> set[tuple[str, ...]]:
    """Every 'git storm CMD' (and 'git storm GROUP SUB') the briefs name."""
    found: set[tuple[str, ...]] = set()
    for role in ROLES:
        for mode in MODES:
            for m in re.finditer(r"git storm ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", brief(role, mode)):
                found.add((m.group(1), m.group(2)) if m.group(1) in GROUPS and m.group(2) else (m.group(1),))
    return found


def test_every_command_the_brief_names_exists(tmp_path):
    """'git storm CMD -h' succeeds for each: in one process through the same click
    group ``git storm`` runs (a process per command would cost ~20 start-ups),
    and once for real."""
    from click.testing import CliRunner

    from storm_git.cli.main import cli

    cmds = mentioned_commands()
    assert {("read",), ("edit",), ("write",), ("exec",), ("assign",), ("commit",), ("merge",), ("intents",),
            ("release",), ("forget",), ("sync",), ("spawn",)} <= cmds, cmds
    for cmd in sorted(cmds):
        r = CliRunner().invoke(cli, [*cmd, "-h"], prog_name="git storm")
        assert r.exit_code == 0 and "Usage: git storm" in r.output, (cmd, r.output)
    r = storm(tmp_path, "intents", "-h")
    assert r.returncode == 0 and "Usage: git storm intents" in r.stdout


def test_prompt_prints_each_role_and_mode(repo):
    r = storm(repo, "prompt", agent="engineer_2")
    assert r.returncode == 0
    text = r.stdout
    for reason in ("direct_conflict", "stale_dependency", "unread_target", "reserved"):
        assert reason in text
    assert "# engineer_2: why" in text and "view, create" in text and "str_replace" in text
    r = storm(repo, "prompt", "--role", "manager")
    assert "git storm assign" in r.stdout and "storm.restricted" in r.stdout and "git storm commit" in r.stdout
    r = storm(repo, "prompt", "--role", "manager", "--mode", "worktree")
    assert "git storm merge" in r.stdout and "git storm spawn" in r.stdout
    assert storm(repo, "prompt", "--role", "boss").returncode == 2
