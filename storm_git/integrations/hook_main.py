"""The process a harness runs around each tool call: ``git storm harness hook``.

It reads one event on stdin, lets :mod:`storm_git.integrations.harness` decide,
and answers in the harness's own format. It fails closed: a hook that cannot
decide must not let the tool run unchecked, since both Claude Code and Codex
treat a hook's exit 1 as "carry on".

* before a tool (``PreToolUse``): allowed is silence and exit 0; everything
  else, an internal error included, is a *deny* whose reason the model reads;
* after a tool (``PostToolUse``): a write storm refused, or could not look at,
  is a *block* whose reason the model reads; a note goes in
  ``additionalContext`` only (once: never both as reason and context), and
  never as the ``reason`` of a shell command, which Codex would show the model
  in place of the command's output;
* an event that is not even JSON: exit 2 with the reason on stderr, which both
  harnesses treat as blocking and show the model.

This module imports neither click nor the rest of the command line, so the
harness pays only for what the hook uses (``git-storm`` dispatches here first).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

ADVICE = {
    "direct_conflict": "Another agent changed this file since you read it. Read it again and redo your change "
                       "on top of theirs (do not paste your old version back).",
    "stale_dependency": "A file you read changed since (the diff is above). Read it again, check your change "
                        "still fits it, then retry.",
    "unread_target": "You had not read this file. Its content is above and now counts as read: base your change "
                     "on it and retry.",
    "reserved": "Another agent is re-planning this file after its own conflict. Retry in a few seconds, or work "
                "on something else first.",
}
AFTER_BLOCK = ("Your change is on disk but not shared. Read the files named above again, then make the change "
               "again with your edit tool (storm records the file as it then is), or run "
               "'git storm checkout PATH' to drop it.")
HOOK_LOCK_SECONDS = 40.0  # a hook's wait for a lock: well inside the harness's 60 s
USAGE = "usage: git storm harness hook [--harness claude|codex] [--agent ID] < event.json"


def _quoted(path: str) -> str:
    from ..core.paths import quoted

    return quoted(path)


def reason_text(res: Any) -> str:
    """What the model reads for a refused call: what happened, the payload, what to do."""
    from .. import render

    r = res.rejection
    tool = res.event.tool if res.event else "the tool"
    paths = ", ".join(map(_quoted, res.paths))
    if res.decision == "deny":
        head = f"git storm refused this {tool} of {paths} (nothing was written)."
    else:
        head = (f"git storm could not record this {tool}: its result is on disk but is NOT part of the shared "
                f"state ({paths}).")
    body = render.rejection(r) if r is not None else ""
    advice = ADVICE.get(r.reason, "") if r is not None else ""
    if res.decision == "block" and r is not None and r.reason != "reserved":
        advice = AFTER_BLOCK
    if r is not None and r.stale and res.event is not None and res.event.harness == "codex":
        # Codex reads through its shell, which storm cannot see: name the read that counts
        import shlex

        from ..core.installation import storm_program

        names = " ".join(shlex.quote(s.path) for s in r.stale)
        advice += (f" Your shell's reads are not seen by git storm: read the changed file(s) with the shell "
                   f"command {storm_program()} read {names} --agent {res.agent} (it prints them and records "
                   "the read).")
    offer = getattr(r, "rebased", None)
    if offer is not None and offer.clean and res.decision == "deny":
        import shlex

        from ..core.installation import storm_program

        advice = (f"Your change re-applies cleanly on the current version (the last diff above). If that is still "
                  f"what you want, accept it with the shell command: {storm_program()} write {shlex.quote(r.path)} "
                  f"--rebased --agent {res.agent}; otherwise read the file again and redo your change.")
    return "\n".join(x for x in (head, body, advice, res.message) if x)


def deny(reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                   "permissionDecisionReason": reason}}


def block(harness: str, tool: str, event: str, reason: str) -> dict[str, Any]:
    """A refusal after the tool ran. Codex puts a block's ``reason`` in place of the
    tool's output: for a shell command that output must stay, so the refusal goes
    as context there."""
    if harness == "codex" and tool == "Bash":
        return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": reason}}
    return {"decision": "block", "reason": reason}


def answer(res: Any, harness: str) -> dict[str, Any] | None:
    """The harness's JSON for one decision (None: nothing to say)."""
    event = res.event.event if res.event else "PreToolUse"
    if res.decision == "deny":
        return deny(reason_text(res))
    if res.decision == "block":
        return block(harness, res.event.tool if res.event else "", event, reason_text(res))
    if res.decision == "note" and res.message:
        return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": res.message}}
    return None


def _sniff(data: bytes) -> tuple[str, str]:
    """(hook_event_name, tool_name) of an event as far as it can be read, for wording
    a refusal when the event could not be handled."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return "", ""
    if not isinstance(obj, dict):
        return "", ""
    name, tool = obj.get("hook_event_name"), obj.get("tool_name")
    return (name if isinstance(name, str) else "", tool if isinstance(tool, str) else "")


def failure(data: bytes, harness: str, what: str) -> tuple[dict[str, Any] | None, str, int]:
    """(stdout JSON, stderr, exit code) for an event storm could not handle: a deny
    before the tool, a block after it, exit 2 when it is not even an event."""
    name, tool = _sniff(data)
    if name == "PreToolUse":
        return deny(f"git storm could not check this {tool or 'tool call'}: {what}. Nothing was written."), "", 0
    if name in ("PostToolUse", "PostToolUseFailure"):
        text = (f"git storm could not record this {tool or 'tool call'}: {what}. Whatever it changed on disk is "
                "NOT part of the shared state ('git storm status' lists it).")
        return block(harness, tool, name, text), "", 0
    return None, f"git storm harness hook: {what}", 2


def _set_wait_policy() -> None:
    """Say who holds a lock the hook waits for, and give up well inside the harness's
    timeout (storm.lockTimeout, at most HOOK_LOCK_SECONDS)."""
    from ..storm.lock_wait import set_lock_wait

    def timeout(commondir: str) -> float | None:
        from ..storm.lock_wait import lock_timeout  # only when a lock is actually waited for

        return lock_timeout(commondir, cap=HOOK_LOCK_SECONDS)

    def on_wait(w: Any) -> None:
        sys.stderr.write(f"git storm: waiting for storm's {w.name} lock, held by {w.who()} for {w.seconds:.0f}s\n")

    set_lock_wait(timeout, on_wait)


def surely_not_storm(cwd: str, env: dict[str, str] | None = None) -> bool:
    """True only when the directory is certainly not in a storm repository, found
    without pygit2: no repository above it, or one whose config (and the user's and
    the system's) names neither storm nor an include. Anything unusual (GIT_DIR,
    config in the environment, an unreadable file) says False: the full check runs.
    With the hooks in Claude Code's user settings, every tool call in every project
    runs the hook; outside storm it should cost little more than starting Python."""
    from . import repo_probe

    environ = os.environ if env is None else env
    if repo_probe.unusual_env(environ):
        return False
    found = repo_probe.git_dirs(cwd)
    if found is None:
        return True  # not in a git repository at all
    if not isinstance(found, tuple):
        return False
    files = repo_probe.config_files(found[0], found[1], environ)
    return not any(repo_probe.config_mentions(f, (b"storm", b"include")) for f in files)


def _cwd_of(data: bytes) -> str | None:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    cwd = obj.get("cwd") if isinstance(obj, dict) else None
    return cwd if isinstance(cwd, str) and cwd else None


def run(data: bytes, harness: str = "claude", agent: str | None = None) -> tuple[dict[str, Any] | None, str, int]:
    """One hook call: (JSON to print, text for stderr, exit code)."""
    cwd = _cwd_of(data)
    if cwd is not None and surely_not_storm(cwd):
        return None, "", 0  # what the full path answers outside a storm repository, without loading it
    from ..core.errors import StormError

    try:
        from . import harness as hh  # inside: an install that cannot import it must still fail closed

        res = hh.hook(data, harness=harness, agent=agent)
    except StormError as exc:
        return failure(data, harness, str(exc).replace("\n", " "))
    except Exception as exc:  # noqa: BLE001 - fail closed: a crash must not let the tool run unchecked
        if os.environ.get("STORM_DEBUG"):
            raise
        what = (f"internal error {type(exc).__name__}: {exc} (a bug in git storm: rerun with STORM_DEBUG=1 and "
                "report it)").replace("\n", " ")
        return failure(data, harness, what)
    if os.environ.get("STORM_HOOK_LOG"):  # for debugging a setup: one line per call
        with open(os.environ["STORM_HOOK_LOG"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": res.event.event if res.event else None, **res.to_dict()},
                                ensure_ascii=False) + "\n")
    return answer(res, harness), "", 0


def parse_args(args: list[str]) -> tuple[str, str | None] | str:
    """(harness, agent) from the hook's arguments, or an error message."""
    which, agent = "claude", None
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        if key in ("--harness", "--agent", "-a"):
            if not eq:
                if i + 1 >= len(args):
                    return f"{a} needs a value"
                i, val = i + 1, args[i + 1]
            if key == "--harness":
                if val not in ("claude", "codex"):
                    return f"--harness must be claude or codex, not {val!r}"
                which = val
            else:
                agent = val
        else:
            return f"unexpected argument {a!r}"
        i += 1
    return which, agent


def emit(out: dict[str, Any] | None, err: str) -> None:
    """Write one answer as the harness reads it: the JSON on stdout, text on stderr."""
    if out is not None:  # a name with a lone surrogate must not break the answer itself
        text = json.dumps(out, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8")
        sys.stdout.write(text + "\n")
    if err:
        sys.stderr.write(err + "\n")
    sys.stdout.flush()


def main(args: list[str], data: bytes | None = None) -> int:
    """Entry point for ``git storm harness hook ARGS``: prints and returns the exit
    code. ``data``: the event when the caller already read stdin."""
    parsed = parse_args(args)
    if data is None:
        data = sys.stdin.buffer.read()
    if isinstance(parsed, str):
        out, err, code = failure(data, "claude", f"bad hook command line: {parsed} ({USAGE})")
    else:
        _set_wait_policy()
        out, err, code = run(data, *parsed)
    emit(out, err)
    return code
