"""The verbs of DESIGN §3 common to both modes: init, read, write, edit, rm,
release, forget, status, log, and the demo."""
from __future__ import annotations

import os
import sys

import click

from .main import CONTEXT, _emit_json, _report, _workspace, agent_option, cli, json_option, write_options


@cli.command(context_settings=CONTEXT)
@click.option("--base", metavar="REF", default=None, help="Start the shared workspace from REF (default: HEAD).")
@json_option
def init(base: str | None, as_json: bool) -> None:
    """Set up storm in this repository (idempotent).

    Creates refs/storm/workspace from HEAD (or --base) and sets storm.mode=storm.

    \b
    Example:
      git storm init
      git storm init --base main
    """
    from storm_git.setup import init as do_init
    from storm_git.store import Store

    res = do_init(Store.discover(), base)
    if as_json:
        _emit_json(res.to_dict())
    else:
        what = "initialised" if res.created else "already initialised"
        click.echo(f"storm {what}: mode {res.mode}, shared head {res.head[:10]} (refs/storm/workspace)")


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
    results = _workspace().read(list(paths), agent=_agent(agent))
    if as_json:
        _emit_json({"head": results[0].head, "files": [r.to_dict() for r in results]})
        return
    out = sys.stdout.buffer
    for r in results:
        if len(results) > 1:
            out.write(f"==> {r.path} @ {r.version[:10] if r.version else 'absent'} <==\n".encode())
        if r.content is not None:
            out.write(r.content)
            if len(results) > 1 and not r.content.endswith(b"\n"):
                out.write(b"\n")
        out.flush()
        if len(results) == 1:
            click.echo(f"storm: {r.path} version {r.version} at {r.head[:10]}" if r.version else
                       f"storm: {r.path}: not found in the shared workspace (recorded as absent, "
                       f"head {r.head[:10]})", err=True)
        elif r.content is None:
            out.write(b"(not found: recorded as absent)\n")


def _agent(agent: str | None) -> str | None:
    return agent or os.environ.get("STORM_AGENT")


def _content(file: str | None) -> bytes:
    from storm_git.errors import UsageError

    if file is not None and file != "-":
        try:
            with open(file, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read --file {file}: {exc.strerror}") from None
    if file is None and sys.stdin.isatty():  # would wait for typing that an agent never does
        raise UsageError("no content given: stdin is a terminal", hint="give the content on stdin or with --file F")
    return sys.stdin.buffer.read()


def _wait_kw(ws: object) -> dict:
    """Storm mode: say on stderr, once per wait, that the write waits for a reservation."""
    from storm_git.shared import SharedWorkspace

    if not isinstance(ws, SharedWorkspace):
        return {}  # worktree mode: no reservations

    def on_wait(r: object) -> None:
        from . import render

        click.echo(render.waiting(r), err=True)

    return {"on_wait": on_wait}


def _sizes(ws: object, res: object) -> dict[str, int]:
    """Byte size of each written version (for the accepted line)."""
    out: dict[str, int] = {}
    for p, v in getattr(res, "versions", {}).items():
        try:
            out[p] = ws.store.repo[v].size if v else None  # type: ignore[attr-defined]
        except (KeyError, ValueError, AttributeError):
            pass
    return {p: n for p, n in out.items() if n is not None}


@cli.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@click.option("--file", "-f", metavar="F", default=None, help="Take the new content from F ('-' or omitted: stdin).")
@agent_option
@write_options
@json_option
def write(path: str, file: str | None, agent: str | None, intent: str | None, deps: tuple[str, ...],
          no_wait: bool, as_json: bool) -> None:
    """Write PATH in the shared workspace, validated against what the agent read.

    Accepted (exit 0) only if PATH and every file the agent read are unchanged
    since it read them. Otherwise rejected (exit 1) with the reason
    (direct_conflict, stale_dependency, unread_target, reserved), the current
    content, a unified diff from what the agent had read and the stale
    dependencies. After a direct_conflict or stale_dependency the rejected agent
    holds PATH for storm.reservationSeconds (default 30) to re-plan and retry;
    another writer of PATH waits (saying so on stderr) or, with --no-wait, is
    rejected as reserved. Writing an existing file the agent never read is
    rejected once (unread_target, no reservation), and that rejection counts as
    the read. An interactive terminal on stdin is refused (exit 2): give the
    content on stdin or with --file.

    \b
    Example:
      git storm write src/app.py -m 'engineer_1: add retry' < new_app.py
      git storm write src/app.py --file /tmp/app.py --deps src/util.py --json
    """
    ws = _workspace()
    data = _content(file)
    res = ws.write(path, data, agent=_agent(agent), intent=intent,
                   deps=list(deps) if deps else None, wait=not no_wait, **_wait_kw(ws))
    if res.accepted and not data:
        click.echo(f"storm: wrote 0 bytes to {res.paths[0]} (the file is now empty)", err=True)
    _report(res, as_json, {p: len(data) for p in res.paths})


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
    ws = _workspace()
    res = ws.edit(path, old, new, agent=_agent(agent), intent=intent,
                  deps=list(deps) if deps else None, wait=not no_wait, **_wait_kw(ws))
    _report(res, as_json, _sizes(ws, res) if res.accepted and not as_json else None)


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
    ws = _workspace()
    res = ws.rm(path, agent=_agent(agent), intent=intent,
                deps=list(deps) if deps else None, wait=not no_wait, **_wait_kw(ws))
    _report(res, as_json)


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
    r = _workspace().release(path, agent=_agent(agent))
    if as_json:
        _emit_json({"released": r is not None, "reservation": r.to_dict() if r else None})
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
    dropped = _workspace().forget(None if (all_ or not paths) else list(paths), agent=_agent(agent))
    if as_json:
        _emit_json({"forgotten": dropped})
    else:
        click.echo(f"forgot {len(dropped)} path(s)" + (f": {', '.join(dropped[:10])}" if dropped else ""))


@cli.command(context_settings=CONTEXT)
@json_option
def status(as_json: bool) -> None:
    """Mode, shared head, agents with read-set size and stale reads, reservations.

    \b
    Example:
      git storm status --json
    """
    from . import render

    st = _workspace().status()
    if as_json:
        _emit_json(st.to_dict())
    else:
        click.echo(render.status(st))


@cli.command(context_settings=CONTEXT)
@click.option("--limit", "-n", default=50, show_default=True, help="How many entries.")
@json_option
def log(limit: int, as_json: bool) -> None:
    """Accepted writes and recorded rejections (and other events), newest first.

    Writes are the history of refs/storm/workspace; rejections and other events
    are kept in refs/storm/log, both ordinary git history.

    \b
    Example:
      git storm log -n 20
      git log --notes='storm/agents/*' refs/storm/workspace   # what each write was based on
    """
    from . import render

    entries = _workspace().log(limit)
    if as_json:
        _emit_json(entries)
    else:
        for e in entries:
            click.echo(render.log_entry(e))


@cli.command(context_settings=CONTEXT)
@click.option("--keep", metavar="DIR", default=None, help="Create the demo repository in DIR and keep it.")
@json_option
def demo(keep: str | None, as_json: bool) -> None:
    """Run three scripted agents as concurrent processes on a throw-away repository.

    Shows disjoint writes that all succeed, a direct conflict and a stale
    dependency that are rejected with their payloads, then succeed on retry.

    \b
    Example:
      git storm demo
      git storm demo --keep /tmp/storm-demo && git -C /tmp/storm-demo storm log
    """
    from storm_git.demo import run_demo

    report = run_demo(keep)
    if as_json:
        _emit_json(report.to_dict())
    else:
        for line in report.lines:
            click.echo(line)
    if not report.ok:
        sys.exit(1)


