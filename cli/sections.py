"""``git storm``'s command list in sections, by who uses a command and when.

Thirty-odd commands in one alphabetical list hide the handful an agent needs;
``git storm`` / ``git storm -h`` (and the man page, :mod:`.manpage`) list them
by role instead, each section in the order a session uses its commands.
"""
from __future__ import annotations

import click

# (title, what it is for, command names in the order they are shown). A name no
# command registers is skipped; a command no section names is listed under "Other".
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Agent verbs", "an engineer's reads and validated writes",
     ("read", "write", "edit", "rm", "exec", "adopt", "checkout", "forget", "release", "status", "log",
      "intents")),
    ("Manager", "integrates the agents' work",
     ("commit", "assign", "merge", "mode", "team")),
    ("Worktree mode", "a worktree and branch per agent",
     ("spawn", "sync", "radar", "cleanup")),
    ("Remote", "the shared workspace on a git server",
     ("join", "push-reads", "server-hook")),
    ("Setup", "a repository, its hooks and the agents' harnesses",
     ("init", "install-hooks", "uninstall-hooks", "harness", "mcp", "prompt", "hook")),
    ("Diagnostics", "health, upkeep and trying it out",
     ("doctor", "maintenance", "demo", "simulate")),
)
OTHER = ("Other", "")


def sectioned(group: click.Group, ctx: click.Context) -> list[tuple[str, str, list[tuple[str, click.Command]]]]:
    """[(title, purpose, [(name, command)])] of the visible commands, every one once."""
    commands = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            commands[name] = cmd
    out, placed = [], set[str]()
    for title, purpose, names in SECTIONS:
        rows = [(n, commands[n]) for n in names if n in commands]
        placed.update(n for n, _ in rows)
        if rows:
            out.append((title, purpose, rows))
    rest = [(n, c) for n, c in commands.items() if n not in placed]
    if rest:
        out.append((*OTHER, rest))
    return out


class SectionedGroup(click.Group):
    """A click group whose help lists its commands in :data:`SECTIONS`."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections = sectioned(self, ctx)
        if not sections:
            return
        width = max(len(name) for _, _, rows in sections for name, _ in rows)
        limit = formatter.width - 6 - width
        for title, purpose, rows in sections:
            heading = f"{title} ({purpose})" if purpose else title
            with formatter.section(heading):
                # names padded to the longest of all sections: one column, as in one list
                formatter.write_dl([(name.ljust(width), cmd.get_short_help_str(limit)) for name, cmd in rows])
