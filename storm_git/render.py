"""Human-readable text for the library's payloads, shared by the command line and the
MCP server's tool results (the library returns strings here; printing lives in cli/)."""
from __future__ import annotations

import datetime as _dt
import math
import shlex
from typing import Any

from .core import secret_files
from .core.diffs import unified
from .core.paths import quoted


def short(oid: str | None) -> str:
    return oid[:10] if oid else "absent"


def _change_line(c: Any, label: str) -> str:
    who = ", ".join(c.changed_by) or "unknown"
    behind = "" if c.versions_behind is None else f", {c.versions_behind} version(s) behind"
    return (f"  {label} {quoted(c.path)}: read {short(c.read_version)}, now {short(c.current_version)}"
            f" (changed by {who}{behind})")


def _changed(c: Any) -> bool:
    """A real change since the agent read the file (never read: nothing to diff from)."""
    return not getattr(c, "never_read", False) and c.read_version != c.current_version


def _content(data: bytes) -> str:
    return data.decode("utf-8", "replace").rstrip("\n") if b"\x00" not in data[:8000] else "(binary)"


def rejection(r: Any) -> str:
    out = [f"rejected ({r.reason}): {r.message}"]
    if r.target is not None and _changed(r.target):
        out.append(_change_line(r.target, "target"))
        if r.target.diff:
            out.append(r.target.diff.rstrip("\n"))
    moved = ((getattr(r, "scope", None) or {}).get("moved")) or {}
    for s in r.stale:
        out.append(_change_line(s, "stale dependency"))
        if s.path in moved:  # --deps auto looked inside it
            out.append(f"    still a dependency: {moved[s.path]}")
        if s.diff:
            out.append(s.diff.rstrip("\n"))
    notes = getattr(r, "intents_in_diff", None) or []
    if notes:
        listed = "; ".join(f"{i['change']} {i['path']}:{i['line']} ({i['agent']}: {i['why']})" for i in notes[:6])
        more = f" (+{len(notes) - 6} more)" if len(notes) > 6 else ""
        out.append(f"  intent annotations in this diff: {listed}{more}"
                   " -- keep or answer them; do not silently drop another agent's reason")
    never = r.target is not None and getattr(r.target, "never_read", False)
    if r.current_content is not None:
        if never:
            out.append(f"--- you never read {quoted(r.path)}; here it is ({short(r.current_version)}) ---")
        else:
            out.append(f"--- current content of {quoted(r.path)} ({short(r.current_version)}) ---")
        out.append(_content(r.current_content))
    elif r.reason != "reserved":
        out.append(f"{quoted(r.path)} is absent at the shared head")
    out.extend(rebased_offer(r))
    return "\n".join(out)


def rebased_offer(r: Any) -> list[str]:
    """The agent's change re-applied on the current version, and how to accept it."""
    offer = getattr(r, "rebased", None)
    if offer is None:
        return []
    crossing = [f"--- the other agents' change crosses yours here ({len(offer.crossed)} hunk(s)) ---",
                *offer.crossed] if offer.crossed else []
    if offer.clean:
        return [*crossing,
                f"--- your change re-applies cleanly on the current version; accepting it "
                f"(git storm write {shlex.quote(r.path)} --rebased) makes this change to it ---",
                unified(r.path, r.current_content, offer.content).rstrip("\n")]
    return [*crossing,
            f"--- your change re-applied on the current version, {offer.conflicts} conflict(s): resolve the "
            "markers and write the result ---", _content(offer.content)]


def _size(n: int | None) -> str:
    if n is None:
        return ""
    return f", {n} byte{'s' if n != 1 else ''}" + (" (now empty)" if n == 0 else "")


def write_result(res: Any, sizes: dict[str, int | None] | None = None) -> str:
    """One line for an accepted write (paths, versions, sizes, where, waits); the payload otherwise."""
    if not res.accepted:
        return rejection(res.rejection)
    if res.commit is None and not res.disk:
        return f"accepted: {', '.join(map(quoted, res.paths))} unchanged (same content; no commit)"
    sizes = sizes or {}
    parts = []
    for p in res.paths:
        v = res.versions.get(p)
        disk = res.disk.get(p)
        why = getattr(res, "disk_errors", {}).get(p)
        note = "" if disk in (None, "written", "current") else f" [disk: {disk}{f' ({why})' if why else ''}]"
        parts.append(f"{quoted(p)} -> {short(v) + _size(sizes.get(p)) if v else 'deleted'}{note}")
    waits = []
    rw = getattr(res, "reservation_wait", None)
    if rw is not None and rw.seconds >= 0.05:
        waits.append(f"waited {rw.seconds:.1f}s for {rw.holder}'s reservation on {quoted(rw.path)}")
    where = f"commit {short(res.commit)}" if res.commit else "in the agent's worktree, not committed yet"
    flags = f" [flags: {', '.join(res.flags)}]" if res.flags else ""
    spared = getattr(res, "unaffected", None)
    if spared:  # --deps auto: moved dependencies whose change the write does not use
        flags += f" [moved, unused by this write: {', '.join(spared)}]"
    tail = ""
    if "failed" in res.disk.values():
        tail += ("; the write stands in the shared workspace, the file on disk is behind it: "
                 "once the disk takes it, any storm command (git storm status) writes it")
    for w in getattr(res, "warnings", []):
        tail += f"; warning: {w} (the write stands)"
    return f"accepted: {'; '.join(parts)} ({', '.join([where] + waits)}){flags}{tail}"


def waiting(r: Any) -> str:
    """The stderr line when a write starts waiting for another agent's reservation."""
    return (f"storm: {r.path} is reserved by {r.holder} (re-planning after a conflict); "
            f"waiting at most {math.ceil(r.remaining())}s (--no-wait: be rejected at once)")


def status(st: Any, *, all_agents: bool = False) -> str:
    """``git storm status``: agents with an empty read set and no reservation (done,
    or forgotten) are counted, not listed, unless ``all_agents``."""
    out = [f"mode: {st.mode}", f"shared head: {short(st.head)}"]
    holders = {r.holder for r in st.reservations}
    shown = [a for a in st.agents if all_agents or a.reads or a.agent in holders]
    idle = len(st.agents) - len(shown)
    if shown:
        out.append("agents:")
        for a in shown:
            stale = f", {len(a.stale)} stale: {', '.join(map(quoted, a.stale[:5]))}" if a.stale else ", all fresh"
            out.append(f"  {a.agent}: {a.reads} read(s){stale}")
        if idle:
            out.append(f"  (+{idle} idle: an empty read set; --all lists them)")
    elif idle:
        out.append(f"agents: {idle} idle (an empty read set; --all lists them)")
    else:
        out.append("agents: none yet")
    if st.reservations:
        out.append("reservations:")
        for r in st.reservations:
            out.append(f"  {quoted(r.path)}: held by {r.holder}, {r.remaining():.1f}s left")
    for key, value in st.extra.items():
        if key == "unmediated":
            out.extend(unmediated(value))
            continue
        if key == "branch_news":
            out.append(f"branch {value['branch']}: {value['count']} commit(s) made outside storm, not in the shared "
                       f"workspace yet ({value['commits'][0]}{', …' if value['count'] > 1 else ''}); the manager's "
                       "next git storm commit merges them in first")
            continue
        if key == "nested_repositories":
            out.append(f"not recorded, git repositories of their own: {', '.join(quoted(p + '/') for p in value[:10])}"
                       + (f" and {len(value) - 10} more" if len(value) > 10 else "")
                       + " (storm records files: make one a submodule with git, or list it in .gitignore)")
            continue
        if isinstance(value, list):
            out.append(f"{key.replace('_', ' ')}: {len(value)}")
            for v in value:
                if not isinstance(v, dict):
                    out.append(f"  {v}")
                    continue
                out.append(f"  {quoted(str(v.get('path', v)))}" + (f" ({v['state']})" if v.get("state") else ""))
                if v.get("diff"):
                    out.extend("    " + line for line in v["diff"].rstrip("\n").split("\n"))
    return "\n".join(out)


STATUS_LISTED = 50


def unmediated(items: list[dict]) -> list[str]:
    """Edits on disk storm did not record, one line each (diffs only when present)."""
    if not items:
        return ["unmediated edits: none (the disk holds the shared state)"]
    out = [f"unmediated edits (on disk, not recorded by storm): {len(items)}"]
    for u in items[:STATUS_LISTED]:
        note = "  (made on an older version)" if u.get("behind") and u["state"] not in ("added", "reverted") else ""
        if u.get("likely_secret"):
            note = f"  (looks like a secret: add {secret_files.gitignore_line(u['path'])} to .gitignore)"
        out.append(f"  {u['state'] + ':':<14}{quoted(u['path'])}{note}")
        if u.get("diff"):
            out.extend("    " + line for line in u["diff"].rstrip("\n").split("\n"))
    if len(items) > STATUS_LISTED:
        out.append(f"  ... and {len(items) - STATUS_LISTED} more (git storm status --json lists all)")
    out.append("  record: git storm adopt PATH --agent ID | restore: git storm checkout PATH | diffs: -v")
    return out


def left_on_disk(items: list[dict], *, adopt_: bool) -> str:
    """``commit``'s warning about the edits it left on disk. Untracked files named like
    secrets (.env, keys) get .gitignore, never ``--adopt``, which would commit them."""
    secrets = [u for u in items if u.get("likely_secret")]
    others = [u for u in items if not u.get("likely_secret")]
    out = []
    if others:
        names = ", ".join(f"{quoted(u['path'])} ({u['state']})" for u in others[:10])
        more = f" and {len(others) - 10} more" if len(others) > 10 else ""
        how = "git storm status" + ("" if adopt_ else "; --adopt records them")
        out.append(f"warning: not committed, still on disk only: {names}{more} ({how})")
    if secrets:
        names = ", ".join(quoted(u["path"]) for u in secrets[:10])
        more = f" and {len(secrets) - 10} more" if len(secrets) > 10 else ""
        lines = " ".join(secret_files.gitignore_line(u["path"]) for u in secrets[:10])
        out.append(f"warning: not committed: {names}{more}: untracked and named like a secret "
                   f"(credentials, keys); add it to .gitignore ({lines}) so git and storm leave it alone")
    return "\n".join(out)


def _when(e: dict) -> str:
    """Local date and time to the second (the entry's exact time is in --json)."""
    try:
        return _dt.datetime.fromtimestamp(float(e.get("time") or 0)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "????-??-?? ??:??:??"


def _names(items: Any, n: int = 5) -> str:
    items = [quoted(str(i)) for i in items or []]
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def _ev_write(e: dict) -> str:
    where = short(e.get("commit")) if e.get("commit") else "in its worktree"
    flags = f" [flags: {', '.join(e['flags'])}]" if e.get("flags") else ""
    intent = str(e.get('intent') or '').split('\n', 1)[0]  # its first line: one entry, one line
    return f"{e.get('op', 'write'):<5} {_names(e.get('paths'))}  {where}  {intent}{flags}"


def _ev_rejection(e: dict) -> str:
    extra = f" (held by {e['holder']})" if e.get("holder") else ""
    stale = f" stale: {_names(e['stale'])}" if e.get("stale") else ""
    return f"{e.get('reason')}: {quoted(str(e.get('path')))}{extra}{stale}"


def _ev_commit(e: dict) -> str:
    writes = e.get("writes")
    if e.get("mode") == "worktree" or not isinstance(writes, list):  # an engineer's commit in its worktree
        n = writes if isinstance(writes, int) else len(writes or [])
        return f"{short(e.get('commit'))} on {e.get('branch')}: {n} write(s), paths {_names(e.get('paths'))}"
    by = ", ".join(e.get("agents") or []) or "no agent"
    what = f"{short(e.get('commit'))} on {e.get('branch')}" if e.get("commit") else f"nothing new on {e.get('branch')}"
    listed = ", ".join(short(w) for w in writes[:8]) + (" …" if len(writes) > 8 else "")
    return (f"{what}: {e.get('count', len(writes))} write(s) by {by} "
            f"(workspace {short(e.get('workspace'))}; writes {listed or 'none'})")


def _ev_mode(e: dict) -> str:
    forced = f" (forced; not integrated: {'; '.join(e['unintegrated'])})" if e.get("forced") else ""
    synced = f", shared head continues from {e.get('target')} at {short(e['synced'])}" if e.get("synced") else ""
    return f"{e.get('from')} -> {e.get('to')} (target {e.get('target')}){synced}{forced}"


def _ev_merge(e: dict) -> str:
    conflicts = e.get("conflicts") or []
    c = (f", {len(conflicts)} conflicting path(s) ({e.get('conflict_hunks', 0)} hunk(s), "
         f"{e.get('overridden_hunks', 0)} overridden): {_names(conflicts)}") if conflicts else ""
    made = f" -> {short(e['commit'])}" if e.get("commit") else ""
    return f"{e.get('branch')} into {e.get('target')}: {e.get('status')}{made}{c}{_merge_test(e.get('test'))}"


def _merge_test(t: Any) -> str:
    """merge --test: how the candidate's test went (its output's last line; --json has the tail)."""
    if not isinstance(t, dict):
        return ""
    if t.get("passed"):
        return f", test passed ({t.get('command')})"
    how = "timed out" if t.get("timed_out") else f"exit {t.get('returncode')}"
    last = (str(t.get("tail") or "").strip().splitlines() or [""])[-1][:120]
    return f", test failed ({t.get('command')}: {how}){': ' + last if last else ''}"


def _ev_assign(e: dict) -> str:
    files = _names(e.get("files")) or "cleared"
    task = f" task: {e['task']}" if e.get("task") else ""
    overlaps = f" (overlaps {len(e['overlaps'])})" if e.get("overlaps") else ""
    return f"{e.get('assignee')}: {files}{overlaps}{task}"


def _ev_spawn(e: dict) -> str:
    how = "created" if e.get("created") else "reused" if e.get("reused") else "existing"
    copied = f", copied {_names(e['copied'])}" if e.get("copied") else ""
    return f"{e.get('branch')} at {e.get('path')} ({how}, base {short(e.get('base'))}){copied}"


def _ev_cleanup(e: dict) -> str:
    removed = ", ".join(str(r.get("agent")) for r in e.get("removed") or [] if isinstance(r, dict))
    return (f"removed {len(e.get('removed') or [])}" + (f" ({removed})" if removed else "")
            + f", pruned {len(e.get('pruned') or [])}, leftovers {len(e.get('leftovers') or [])}")


_EVENTS = {
    "write": _ev_write,
    "rejection": _ev_rejection,
    "commit": _ev_commit,
    "mode": _ev_mode,
    "merge": _ev_merge,
    "assign": _ev_assign,
    "spawn": _ev_spawn,
    "cleanup": _ev_cleanup,
    "release": lambda e: quoted(str(e.get('path'))),
    "boundary": lambda e: (f"wrote outside its assignment: {_names(e.get('paths'))}"
                           + (f" ({short(e['commit'])})" if e.get("commit") else "")),
    "intent_overwritten": lambda e: (f"overwrote intent annotation(s) of {_names(e.get('owners'))} in "
                                     f"{_names(e.get('paths'))}"
                                     + (f" ({short(e['commit'])})" if e.get("commit") else "")),
    "commit_refused": lambda e: f"{'; '.join(e.get('problems') or [])} (paths {_names(e.get('paths'))})",
}
_LABELS = {"rejection": "reject", "commit_refused": "refused", "intent_overwritten": "intent"}


def log_entry(e: dict) -> str:
    """One line per log entry: date and time, what, who, then the details of its type."""
    kind = str(e.get("type") or "event")
    render = _EVENTS.get(kind)
    try:
        detail = render(e) if render else str(e.get("summary") or "")
    except (KeyError, TypeError, ValueError, AttributeError):
        detail = str(e.get("summary") or "")  # an entry from another storm version: never crash the log
    return f"{_when(e)} {_LABELS.get(kind, kind):<8} {str(e.get('agent', '?')):<14} {detail}".rstrip()


def reverted_by_command(paths: list[str]) -> str:
    """Why a command's write that set files back to older shared versions was
    refused, and both ways on (exec, and the harness's Bash hook)."""
    names = ", ".join(map(quoted, paths[:5])) + (" …" if len(paths) > 5 else "")
    first = shlex.quote(paths[0])
    return (f"the command put back an older shared version of {names} (a git checkout, stash or reset?) over "
            "work you had not read; it is left on disk, unrecorded, with the command's other changes. "
            f"git storm checkout {first} restores the shared version; having now seen it, run the command "
            f"again or git storm adopt --allow-revert {first} to undo it on purpose")
