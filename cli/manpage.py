"""Generate ``git-storm.1`` from the click commands, so ``git storm --help``
(which git turns into ``man git-storm``) shows the same text as ``-h``.

Regenerate after changing the CLI::

    python3 -m storm_git.cli.manpage > man/git-storm.1

``tests/cli/test_manpage.py`` fails when the shipped page is out of date.
"""
from __future__ import annotations

import inspect
import sys
import textwrap

import click

from storm_git.cli.sections import sectioned


def _roff(text: str) -> str:
    out = []
    for line in text.replace("\\", "\\\\").splitlines():
        line = line.replace("\b", "").rstrip()
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line.replace("-", "\\-"))
    return "\n".join(out)


def _help(cmd: click.Command) -> str:
    text = inspect.cleandoc(cmd.help or "")
    # click's \b marks a paragraph to keep unwrapped: render as .nf/.fi blocks.
    blocks = []
    for para in text.strip().split("\n\n"):
        if para.lstrip().startswith("\b"):
            body = "\n".join(ln for ln in para.splitlines() if ln.strip() != "\b")
            blocks.append(".nf\n" + _roff(textwrap.dedent(body)) + "\n.fi")
        else:
            blocks.append(_roff(" ".join(ln.strip() for ln in para.splitlines())))
    return "\n.PP\n".join(blocks)


def _command(ctx: click.Context, name: str, cmd: click.Command) -> list[str]:
    # with the command's own settings (help_option_names), as click builds it: otherwise
    # the help option's record depends on whether the command was parsed before
    sub = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
    usage = " ".join(cmd.collect_usage_pieces(sub))
    lines = [".SS " + _roff(f"git storm {name} {usage}"), _help(cmd)]
    for param in cmd.get_params(sub):
        # Options only: whether arguments get a help record depends on the click version.
        if not isinstance(param, click.Option):
            continue
        rec = param.get_help_record(sub)
        if rec and not rec[0].startswith("-h, --help"):
            lines += [".TP", "\\fB" + _roff(rec[0]) + "\\fR", _roff(rec[1])]
    return lines


def render(group: click.Group) -> str:
    ctx = click.Context(group, info_name="git storm")
    lines = [
        '.TH GIT\\-STORM 1 "" "git storm" "Git Manual"',
        ".SH NAME",
        "git\\-storm \\- several coding agents on one git repository, without silently breaking each other's work",
        ".SH SYNOPSIS",
        ".B git storm",
        "\\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]",
        ".SH DESCRIPTION",
        _help(group),
    ]
    for title, purpose, rows in sectioned(group, ctx):  # as `git storm -h` lists them
        lines += [".SH " + _roff(title.upper())] + ([_roff(purpose[0].upper() + purpose[1:] + ".")] if purpose else [])
        for name, cmd in rows:
            lines += _command(ctx, name, cmd)
    lines += [
        ".SH EXIT STATUS",
        "0 success; 1 write rejected (conflict or reservation: re\\-plan and retry); "
        "2 bad input or usage; 3 repository state (not a repository, not initialised, corrupt); "
        "4 internal error (a bug in git storm: rerun with STORM_DEBUG=1 and report it). "
        "\\fBexec\\fR passes through the command's own status.",
        ".SH SEE ALSO",
        "\\fBgit\\-worktree\\fR(1), \\fBgit\\-notes\\fR(1), \\fBgit\\-update\\-ref\\fR(1)",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    from storm_git.cli.main import cli

    sys.stdout.write(render(cli))


if __name__ == "__main__":
    main()
