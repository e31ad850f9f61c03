"""Human-readable text for the library's payloads (all printing lives in cli/)."""
from __future__ import annotations

import datetime as _dt
from typing import Any


def short(oid: str | None) -> str:
    return oid[:10] if oid else "absent"


def _change_line(c: Any, label: str) -> str:
    who = ", ".join(c.changed_by) or "unknown"
    behind = "" if c.versions_behind is None else f", {c.versions_behind} version(s) behind"
    return f"  {label} {c.path}: read {short(c.read_version)}, now {short(c.current_version)} (changed by {who}{behind})"


def rejection(r: Any) -> str:
    out = [f"rejected ({r.reason}): {r.message}"]
    if r.target is not None and r.reason != "unread_target":
        out.append(_change_line(r.target, "target"))
        if r.target.diff:
            out.append(r.target.diff.rstrip("\n"))
    for s in r.stale:
        out.append(_change_line(s, "stale dependency"))
        if s.diff:
            out.append(s.diff.rstrip("\n"))
    if r.current_content is not None:
        out.append(f"--- current content of {r.path} ({short(r.current_version)}) ---")
        out.append(r.current_content.decode("utf-8", "replace").rstrip("\n")
                   if b"\x00" not in r.current_content[:8000] else "(binary)")
    elif r.reason != "reserved":
        out.append(f"{r.path} is absent at the shared head")
    return "\n".join(out)


def write_result(res: Any) -> str:
    if not res.accepted:
        return rejection(res.rejection)
    if res.commit is None and not res.disk:
        return f"accepted: {', '.join(res.paths)} unchanged (same content; no commit)"
    parts = []
    for p in res.paths:
        v = res.versions.get(p)
        disk = res.disk.get(p)
        note = "" if disk in (None, "written", "current") else f" [disk: {disk}]"
        parts.append(f"{p} -> {short(v) if v else 'deleted'}{note}")
    waited = f", waited {res.waited:.1f}s for a reservation" if res.waited >= 0.05 else ""
    where = f"commit {short(res.commit)}" if res.commit else "in the agent's worktree, not committed yet"
    flags = f" [flags: {', '.join(res.flags)}]" if res.flags else ""
    return f"accepted: {'; '.join(parts)} ({where}{waited}){flags}"


def status(st: Any) -> str:
    out = [f"mode: {st.mode}", f"shared head: {short(st.head)}"]
    if st.agents:
        out.append("agents:")
        for a in st.agents:
            stale = f", {len(a.stale)} stale: {', '.join(a.stale[:5])}" if a.stale else ", all fresh"
            out.append(f"  {a.agent}: {a.reads} read(s){stale}")
    else:
        out.append("agents: none yet")
    if st.reservations:
        out.append("reservations:")
        for r in st.reservations:
            out.append(f"  {r.path}: held by {r.holder}, {r.remaining():.1f}s left")
    for key, value in st.extra.items():
        if key == "unmediated":
            out.extend(unmediated(value))
            continue
        if isinstance(value, list):
            out.append(f"{key.replace('_', ' ')}: {len(value)}")
            for v in value:
                if not isinstance(v, dict):
                    out.append(f"  {v}")
                    continue
                out.append(f"  {v.get('path', v)}" + (f" ({v['state']})" if v.get("state") else ""))
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
        out.append(f"  {u['state'] + ':':<14}{u['path']}{note}")
        if u.get("diff"):
            out.extend("    " + line for line in u["diff"].rstrip("\n").split("\n"))
    if len(items) > STATUS_LISTED:
        out.append(f"  ... and {len(items) - STATUS_LISTED} more (git storm status --json lists all)")
    out.append("  record: git storm adopt PATH --agent ID | restore: git storm checkout PATH | diffs: -v")
    return out


def log_entry(e: dict) -> str:
    when = _dt.datetime.fromtimestamp(e.get("time", 0)).strftime("%H:%M:%S")
    kind = e.get("type")
    if kind == "write":
        return f"{when} write    {e['agent']:<14} {e['op']:<5} {', '.join(e['paths'])}  {short(e['commit'])}  {e['intent']}"
    if kind == "rejection":
        extra = f" (held by {e['holder']})" if e.get("holder") else ""
        stale = f" stale: {', '.join(e['stale'])}" if e.get("stale") else ""
        return f"{when} reject   {e.get('agent', '?'):<14} {e.get('reason')}: {e.get('path')}{extra}{stale}"
    if kind == "commit":
        by = ", ".join(e.get("agents") or []) or "no agent"
        what = f"{short(e.get('commit'))} on {e.get('branch')}" if e.get("commit") else f"nothing new on {e.get('branch')}"
        return (f"{when} commit   {e.get('agent', '?'):<14} {what}: {e.get('count', 0)} write(s) by {by} "
                f"(workspace {short(e.get('workspace'))}; writes {', '.join(short(w) for w in e.get('writes', [])[:8])}"
                f"{' …' if len(e.get('writes', [])) > 8 else ''})")
    detail = {k: v for k, v in e.items() if k not in ("type", "agent", "time", "id")}
    return f"{when} {kind:<8} {e.get('agent', '?'):<14} {detail}"
