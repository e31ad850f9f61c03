"""The verbs common to both modes: init, read, write, edit, rm,
release, forget, status, log, and the demo."""
from __future__ import annotations

import os
import stat
import sys
from typing import Any

import click
import pygit2

from storm_git.cli.app import (
    CONTEXT,
    agent_option,
    cli,
    emit_json,
    json_option,
    open_workspace_here,
    report_write,
    write_options,
)
from storm_git.cli.empty_input import holds_content
from storm_git.core.errors import CorruptState
from storm_git.core.objects import blob_at
from storm_git.core.paths import quoted
from storm_git.core.payloads import WriteResult
from storm_git.core.workspace import BaseWorkspace


@cli.command(context_settings=CONTEXT)
@click.option("--base", metavar="REF", default=None, help="Start the shared workspace from REF (default: HEAD).")
@click.option("--remote", metavar="NAME", default=None,
              help="Keep the shared workspace on the git remote NAME (docs/remote.md); joins it if it is there.")
@json_option
def init(base: str | None, remote: str | None, as_json: bool) -> None:
    """Set up storm in this repository (idempotent).

    Creates refs/storm/workspace from HEAD (or --base) and sets storm.mode=storm.
    Installs storm's pre-commit guard in .git/hooks and says so: it refuses a
    plain git commit by an engineer and of content no agent wrote; a person
    commits with 'git storm commit -m MSG' or removes it with 'git storm
    uninstall-hooks'. Tracked or global hooks (core.hooksPath) are never
    written: init prints the line to add to them instead. A dirty working tree
    is listed with the choices (adopt, stash, --base); init still succeeds.

    \b
    Example:
      git storm init
      git storm init --base main
      git storm init --remote origin
    """
    if remote is not None:
        from storm_git.cli.remote_cmds import init_remote

        return init_remote(base, remote, as_json)
    from storm_git.admin.setup import init as do_init
    from storm_git.cli.admin_cmds import echo_lines, init_lines
    from storm_git.core.store import Store

    res = do_init(Store.discover(), base)
    if as_json:
        emit_json(res.to_dict())
    echo_lines(*init_lines(res), as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@agent_option
@json_option
def read(paths: tuple[str, ...], agent: str | None, as_json: bool) -> None:
    """Print files at the shared head and record them in the agent's read set.

    With one PATH the content goes to stdout unchanged and its version to
    stderr; with several, each file gets a '==> PATH @ VERSION <==' header.
    A missing file is reported as not found and recorded as read-while-absent.

    \b
    Example:
      git storm read src/app.py --agent engineer_1
      git storm read src/app.py src/util.py --json
    """
    results = open_workspace_here().read(list(paths), agent=_agent(agent))
    if as_json:
        _stream_read_json(results)
        return
    out = sys.stdout.buffer
    for r in results:
        if len(results) > 1:
            out.write(f"==> {quoted(r.path)} @ {r.version[:10] if r.version else 'absent'} <==\n".encode())
        if r.content is not None:
            out.write(r.content)
            if len(results) > 1 and not r.content.endswith(b"\n"):
                out.write(b"\n")
        out.flush()
        if r.offline and (len(results) == 1 or r is results[0]):
            click.echo(f"storm: {r.offline}", err=True)
        if len(results) == 1:
            click.echo(f"storm: {quoted(r.path)} version {r.version} at {r.head[:10]}" if r.version else
                       f"storm: {quoted(r.path)}: not found in the shared workspace (head {r.head[:10]}); "
                       f"recorded as absent: creating it is validated against its absence, so a file "
                       f"another agent creates first is a conflict", err=True)
        elif r.content is None:
            out.write(b"(not found: recorded as absent)\n")


_CHUNK = 3 << 20  # a multiple of 3: base64 of consecutive chunks concatenates


def _stream_read_json(results: list) -> None:
    """``read --json``, with each file's content written to stdout in chunks.

    The envelope is the one ``emit_json`` prints (same keys, order and layout);
    only the content strings are streamed, so a 200 MB file is not held again
    as base64, as a JSON string and as its encoded bytes (5-6x the file)."""
    import base64
    import codecs
    import dataclasses
    import json
    import uuid

    token = f"@@storm-content-{uuid.uuid4().hex}-"
    files, bodies = [], []
    for i, r in enumerate(results):
        data = r.content
        if data is None:
            files.append(r.to_dict())
            continue
        # payloads.content_fields' rule (git's binary heuristic, then UTF-8), without copies
        key = "content_base64" if b"\x00" in data[:8000] or not _is_utf8(data) else "content"
        d = dataclasses.replace(r, content=None).to_dict()
        if key == "content":
            d["content"] = f"{token}{i}"
        else:
            d = {k: v for k, v in d.items() if k != "content"}
            d["content_base64"] = f"{token}{i}"
            d["content"] = None
        files.append(d)
        bodies.append((i, key, data))
    text = json.dumps({"head": results[0].head, "files": files}, indent=2, sort_keys=False, ensure_ascii=False)
    out = sys.stdout.buffer
    for i, key, data in bodies:
        before, text = text.split(f'"{token}{i}"', 1)
        out.write(before.encode("utf-8"))
        out.write(b'"')
        view = memoryview(data)
        if key == "content":
            dec = codecs.getincrementaldecoder("utf-8")()
            for at in range(0, len(data), _CHUNK):
                piece = dec.decode(view[at:at + _CHUNK], final=at + _CHUNK >= len(data))
                out.write(json.dumps(piece, ensure_ascii=False)[1:-1].encode("utf-8"))
        else:
            for at in range(0, len(data), _CHUNK):
                out.write(base64.b64encode(view[at:at + _CHUNK]))
        out.write(b'"')
    out.write(text.encode("utf-8") + b"\n")
    out.flush()


def _is_utf8(data: bytes) -> bool:
    """Is ``data`` valid UTF-8? Checked in chunks, so no decoded copy of the whole file is made."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    try:
        for at in range(0, len(data), _CHUNK):
            dec.decode(view[at:at + _CHUNK], final=at + _CHUNK >= len(data))
    except UnicodeDecodeError:
        return False
    return True


def _deps(deps: tuple[str, ...]) -> list[str] | str | None:
    from storm_git.storm.write import deps_argument

    return deps_argument(deps)


def _agent(agent: str | None) -> str | None:
    return agent or os.environ.get("STORM_AGENT")


def _content(file: str | None, limit: int) -> bytes:
    """The new content from --file F or stdin, refused once it exceeds ``limit`` bytes.

    At most ``limit + 1`` bytes are ever read, so an endless producer
    (``cat /dev/zero | git storm write z``) is refused at once instead of
    filling memory."""
    from storm_git.core.errors import UsageError

    if file is not None and file != "-":
        try:
            with open(file, "rb") as fh:
                return _read_limited(fh, limit, f"--file {file}")
        except OSError as exc:
            raise UsageError(f"cannot read --file {file}: {exc.strerror}") from None
    if file is None and sys.stdin.isatty():  # would wait for typing that an agent never does
        raise UsageError("no content given: stdin is a terminal", hint="give the content on stdin or with --file F")
    return _read_limited(sys.stdin.buffer, limit, "stdin")


def _read_limited(fh, limit: int, what: str) -> bytes:
    """Read all of ``fh`` if it holds at most ``limit`` bytes, else raise TooLarge.

    One buffer, no copies: a regular file is read with its size known, a pipe with
    one ``read(limit + 1)`` (CPython allocates that buffer lazily-mapped and
    shrinks it in place, so only the bytes received take memory)."""
    from storm_git.core.errors import TooLarge

    want = limit + 1
    try:
        st = os.fstat(fh.fileno())
        if stat.S_ISREG(st.st_mode):
            want = min(want, max(0, st.st_size - fh.tell()) + 1)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        data = fh.read(want)
    except MemoryError:  # a huge storm.maxFileBytes the machine cannot reserve at once
        parts, size = [], 0
        while size <= limit:
            chunk = fh.read(min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
    if len(data) == want <= limit:  # a regular file that grew since its size was taken
        data += fh.read(limit + 1 - want)
    if len(data) <= limit:
        return data
    raise TooLarge(f"{what} holds more than storm.maxFileBytes ({limit} bytes); nothing was written",
                   hint="raise it with git config storm.maxFileBytes N if this is intended")


def wait_kw(ws: object) -> dict:
    """Storm mode: say on stderr, once per wait, that the write waits for a reservation."""
    from storm_git.storm.workspace import SharedWorkspace

    if not isinstance(ws, SharedWorkspace):
        return {}  # worktree mode: no reservations

    def on_wait(r: object) -> None:
        from storm_git import render

        click.echo(render.waiting(r), err=True)

    return {"on_wait": on_wait}


def _sizes(ws: BaseWorkspace, res: WriteResult) -> dict[str, int | None]:
    """Byte size of each written version (for the accepted line)."""
    out: dict[str, int | None] = {}
    for p, v in res.versions.items():
        try:
            out[p] = blob_at(ws.store.repo, pygit2.Oid(hex=v)).size if v else None
        except (KeyError, ValueError, CorruptState):
            pass
    return {p: n for p, n in out.items() if n is not None}


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@click.option("--file", "-f", metavar="F", default=None, help="Take the new content from F ('-' or omitted: stdin).")
@click.option("--rebased", is_flag=True,
              help="Write the rebased change the agent's last direct_conflict rejection of PATH offered "
                   "(its own change re-applied on the current version); no content is read.")
@click.option("--allow-empty", is_flag=True,
              help="Accept an empty stdin for a file that holds content (empties it); without it that is refused.")
@agent_option
@write_options
@json_option
def write(path: str, file: str | None, rebased: bool, allow_empty: bool, agent: str | None, intent: str | None,
          deps: tuple[str, ...], no_wait: bool, as_json: bool) -> None:
    """Write PATH in the shared workspace, validated against what the agent read.

    Accepted (exit 0) only if PATH and every file the agent read are unchanged
    since it read them. Otherwise rejected (exit 1) with the reason
    (direct_conflict, stale_dependency, unread_target, reserved), the current
    content, a unified diff from what the agent had read and the stale
    dependencies. After a direct_conflict or stale_dependency the rejected agent
    holds PATH for storm.reservationSeconds (default 30) to re-plan and retry;
    another writer of PATH waits (saying so on stderr) or, with --no-wait, is
    rejected as reserved. Writing an existing file the agent never read is
    rejected once (unread_target, no reservation).

    What counts as read after a rejection is what it showed in full: PATH's
    current content. Stale dependencies are shown as diffs and stay stale until
    the agent reads them again (or forgets them, or names --deps).

    A direct_conflict on a text file also offers the agent's own change
    re-applied on the current version (clean, or with conflict markers, and the
    other agents' hunks it crosses). --rebased writes that offer after the agent
    has looked at it: a validated write like any other, rejected again if
    anything moved meanwhile; exit 2 when there is none or it has conflict
    markers. Nothing is ever merged without it. An interactive terminal on stdin
    is refused (exit 2): give the content on stdin or with --file. So is an
    empty stdin when PATH holds content (a forgotten ``<`` in an agent's shell,
    whose stdin is not a terminal, would empty the file): --allow-empty says it
    is meant (or give --file with an empty file).

    \b
    Example:
      git storm write src/app.py -m 'engineer_1: add retry' < new_app.py
      git storm write src/app.py --file /tmp/app.py --deps src/util.py --json
      git storm write src/app.py --deps auto < new_app.py   # only what app.py depends on
      git storm write src/app.py --rebased   # accept the offer of the last rejection
      git storm write src/app.py --allow-empty < /dev/null   # empty the file, on purpose
    """
    from storm_git.core.errors import UsageError

    ws = open_workspace_here()
    if rebased:
        if file is not None or deps:
            raise UsageError("--rebased takes no content (--file) and no --deps",
                             hint="git storm write PATH --rebased --agent ID")
        if not hasattr(ws, "write_rebased"):
            raise UsageError("--rebased is for storm mode (a shared workspace)",
                             hint="in worktree mode write the file in your worktree")
        res = ws.write_rebased(path, agent=_agent(agent), intent=intent, wait=not no_wait, **wait_kw(ws))
        report_write(res, as_json)
        return
    data = _content(file, ws.max_file_bytes)
    if not data and file in (None, "-") and not allow_empty:
        held = holds_content(ws, path, _agent(agent))
        if held:
            raise UsageError(f"stdin is empty and {held}: nothing was written",
                             hint="pass --allow-empty to empty it on purpose")
    res = ws.write(path, data, agent=_agent(agent), intent=intent,
                   deps=_deps(deps), wait=not no_wait, **wait_kw(ws))
    if res.accepted and not data:
        click.echo(f"storm: wrote 0 bytes to {res.paths[0]} (the file is now empty)", err=True)
    report_write(res, as_json, {p: len(data) for p in res.paths})


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@click.option("--old", required=True, metavar="TEXT", help="Exact text to replace (must occur exactly once).")
@click.option("--new", required=True, metavar="TEXT", help="Replacement text.")
@agent_option
@write_options
@json_option
def edit(path: str, old: str, new: str, agent: str | None, intent: str | None, deps: tuple[str, ...],
         no_wait: bool, as_json: bool) -> None:
    """Replace one occurrence of --old in the version the agent last read.

    The replacement is applied to the version the agent read, then written with
    the same validation as 'write': if someone changed the file meanwhile, the
    result is a rejection with the diff, never "old text not found".

    \b
    Example:
      git storm edit src/app.py --old 'def f(a):' --new 'def f(a, b):  # engineer_1: b for retries'
    """
    ws = open_workspace_here()
    res = ws.edit(path, old, new, agent=_agent(agent), intent=intent,
                  deps=_deps(deps), wait=not no_wait, **wait_kw(ws))
    report_write(res, as_json, _sizes(ws, res) if res.accepted and not as_json else None)


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@agent_option
@write_options
@json_option
def rm(path: str, agent: str | None, intent: str | None, deps: tuple[str, ...], no_wait: bool,
       as_json: bool) -> None:
    """Delete PATH from the shared workspace, with the same validation as 'write'.

    \b
    Example:
      git storm rm src/old.py -m 'engineer_2: folded into util.py'
    """
    ws = open_workspace_here()
    res = ws.rm(path, agent=_agent(agent), intent=intent,
                deps=_deps(deps), wait=not no_wait, **wait_kw(ws))
    report_write(res, as_json)


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@agent_option
@json_option
def release(path: str, agent: str | None, as_json: bool) -> None:
    """Give up the agent's reservation on PATH before it expires.

    Only the holder can release; a successful write by the holder or expiry
    also ends a reservation.

    \b
    Example:
      git storm release src/app.py --agent engineer_2
    """
    r = open_workspace_here().release(path, agent=_agent(agent))
    if as_json:
        emit_json({"released": r is not None, "reservation": r.to_dict() if r else None})
    else:
        click.echo(f"released {r.path}" if r else f"no reservation on {path}: nothing to release")


@cli.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--all", "all_", is_flag=True, help="Forget the whole read set (the default when no PATH is given).")
@agent_option
@json_option
def forget(paths: tuple[str, ...], all_: bool, agent: str | None, as_json: bool) -> None:
    """Drop PATHs (or everything) from the agent's read set.

    A read set belongs to one task: start a new task with a fresh one so old
    reads do not cause needless stale-dependency rejections.

    \b
    Example:
      git storm forget --agent engineer_1            # new task
      git storm forget docs/notes.md --agent engineer_1
    """
    ws = open_workspace_here()
    who = _agent(agent)
    dropped = ws.forget(None if (all_ or not paths) else list(paths), agent=who)
    known = bool(dropped) or ws.knows_agent(who)
    if as_json:
        emit_json({"forgotten": dropped, "known_agent": known})
    elif not known:
        click.echo(f"{who} has no read set: storm has not seen this agent read or write (nothing forgotten)")
    else:
        click.echo(f"forgot {len(dropped)} path(s)" + (f": {', '.join(dropped[:10])}" if dropped else ""))


@cli.command(context_settings=CONTEXT)
@click.option("--verbose", "-v", count=True,
              help="-v: diffs of unmediated edits to recorded files; -vv: also the content of new files.")
@click.option("--all", "all_agents", is_flag=True,
              help="List every agent storm has seen, also those with an empty read set (--json always does).")
@json_option
def status(verbose: int, all_agents: bool, as_json: bool) -> None:
    """Mode, shared head, agents with read-set size and stale reads, reservations,
    and the files on disk storm did not put there (unmediated edits).

    Unmediated edits are listed one per line, like git status --short:
    modified, added (untracked, not ignored), deleted, mode-changed, reverted (the
    disk holds an OLDER shared version: a git stash or reset; the 'checkout'
    command restores it), not-a-file. 'made on an older version' means the shared file
    changed since the edit's base: adopting it will be rejected with the diff.

    \b
    Example:
      git storm status
      git storm status -v          # with diffs
      git storm status --all       # also the idle agents
      git storm status --json
    """
    from storm_git import render
    from storm_git.testwatch import report

    ws = open_workspace_here()
    st = ws.status(diffs=verbose > 0 or as_json, untracked_content=verbose > 1)
    if as_json:
        emit_json({**st.to_dict(), "tests": report.head_test_state(ws.store.commondir)})
    else:
        click.echo(render.status(st, all_agents=all_agents))
        tests = report.status_text(ws.store.commondir)
        if tests:
            click.echo(tests)


@cli.command(context_settings=CONTEXT)
@click.option("--limit", "-n", type=click.IntRange(min=0), default=50, show_default=True, help="How many entries.")
@json_option
def log(limit: int, as_json: bool) -> None:
    """Accepted writes and recorded rejections (and other events), newest first.

    Writes are the history of refs/storm/workspace; rejections and other events
    are kept in refs/storm/log, both ordinary git history.

    \b
    Example:
      git storm log -n 20
      git log refs/storm/workspace   # each write's trailers say what it was validated against
    """
    from storm_git import render
    from storm_git.testwatch.report import log_entries

    ws = open_workspace_here()
    entries = ws.log(limit)
    found = log_entries(ws.store.commondir)
    if found:
        entries = sorted(entries + found, key=lambda e: -float(e.get("time") or 0))[:limit]
    if as_json:
        emit_json(entries)
    else:
        for e in entries:
            click.echo(render.log_entry(e))


@cli.command(context_settings=CONTEXT)
@click.option("--keep", metavar="DIR", default=None,
              help="Create the demo repositories in DIR (new or empty) and keep them to look around.")
@json_option
def demo(keep: str | None, as_json: bool) -> None:
    """Show, on throw-away repositories, what git storm does when agents collide.

    Three engineers make the same changes twice: in storm mode (three real
    processes), where a write that would undo or break another engineer's
    work is refused with what changed, and the engineer retries; then in
    worktree mode, where each works on its own branch and conflicts appear
    at merge.
    Prints the rejections and the merge report as agents and managers get
    them, and a table of when each conflict was caught. Exit 1 if the demo
    did not go as described (a bug).

    \b
    Example:
      git storm demo
      git storm demo --keep /tmp/storm-demo && git -C /tmp/storm-demo/storm-mode storm log
    """
    from storm_git.admin.demo import run_demo

    report = run_demo(keep)
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_demo(report)
    if not report.ok:
        click.echo(f"git storm demo: it did not go as described: {'; '.join(report.problems)} "
                   "(a bug: please report it with this output)", err=True)
        sys.exit(1)


def _print_demo(report) -> None:
    """Narration wrapped to the terminal; payloads indented, verbatim as agents receive them."""
    import shutil
    import textwrap

    from storm_git import render
    from storm_git.cli.worktree_cmds import render_merge

    width = max(60, min(100, shutil.get_terminal_size((100, 24)).columns))
    wrap: dict[str, Any] = {"width": width, "break_long_words": False, "break_on_hyphens": False}

    def quoted(text: str) -> None:
        for line in text.split("\n"):
            click.echo(("    " + line).rstrip())

    for step in report.steps:
        if step.kind in ("part", "title"):
            click.echo(f"\n{step.text}\n{('=' if step.kind == 'part' else '-') * len(step.text)}")
        elif step.kind == "say":
            click.echo(textwrap.fill(step.text, **wrap))
        elif step.kind == "item":
            click.echo(textwrap.fill(step.text, initial_indent="  - ", subsequent_indent="    ", **wrap))
        elif step.kind == "accepted":
            click.echo(textwrap.fill(step.text, initial_indent="  + ", subsequent_indent="    ", **wrap))
        elif step.kind == "rejected":
            click.echo(textwrap.fill(step.text, initial_indent="  x ", subsequent_indent="    ", **wrap))
            quoted(render.rejection(step.rejection))
        elif step.kind == "merge":
            quoted(render_merge(step.merge))
        elif step.kind == "table":
            click.echo(_table(step.rows, width))
        elif step.kind == "command":
            click.echo(f"  {step.command}\n      # {step.text}" if len(step.command) > 48
                       else f"  {step.command:<48} # {step.text}")
    last = (f"repositories kept at {report.repo} (storm-mode/, worktree-mode/)" if report.kept
            else "the temporary repositories were removed (--keep DIR keeps them)")
    click.echo(f"\ndemo finished in {report.seconds:.1f}s: {last}")


def _table(rows: list[list[str]], width: int) -> str:
    """A plain text table, cells wrapped to fit ``width``."""
    import itertools
    import textwrap

    first = max(len(r[0]) for r in rows)
    other = max(16, (width - first - 3 * len(rows[0])) // (len(rows[0]) - 1))
    widths = [first] + [other] * (len(rows[0]) - 1)
    out = []
    for i, row in enumerate(rows):
        cells = [textwrap.wrap(c, w) or [""] for c, w in zip(row, widths, strict=False)]
        for parts in itertools.zip_longest(*cells, fillvalue=""):
            out.append(" | ".join(p.ljust(w) for p, w in zip(parts, widths, strict=False)).rstrip())
        if i == 0:
            out.append("-+-".join("-" * w for w in widths))
    return "\n".join(out)
