"""Commands that connect agents to storm: ``prompt`` (the agent's brief),
``intents`` (annotations and who wrote them) and ``harness`` (Claude Code and
Codex hooks)."""
from __future__ import annotations

import json
import os
import sys

import shlex

import click

from storm_git.core.paths import quoted
from storm_git.cli.main import CONTEXT, _emit_json, cli, json_option


@cli.command(context_settings=CONTEXT)
@click.option("--role", type=click.Choice(["engineer", "manager"]), default="engineer", show_default=True,
              help="Who reads it.")
@click.option("--mode", "mode_", type=click.Choice(["storm", "worktree"]), default=None,
              help="Which mode it describes (default: the repository's storm.mode, else storm).")
@click.option("--agent", "-a", metavar="ID", default=None,
              help="The id the text addresses (default: $STORM_AGENT, else engineer_1 / manager).")
@json_option
def prompt(role: str, mode_: str | None, agent: str | None, as_json: bool) -> None:
    """Print the instructions an agent needs in its system prompt.

    How to read and write (the CLI, or the storm MCP server's tools when the
    harness has it), what each rejection reason means and how to re-plan,
    reservations, intent annotations, and for the manager: disjoint primary
    files, restricted files and integration.

    \b
    Example:
      git storm prompt --role engineer --agent engineer_2 > brief.md
      git storm prompt --role manager --mode worktree
    """
    from storm_git.integrations.brief import brief

    if mode_ is None:
        mode_ = "storm"
        try:
            from storm_git.core.store import Store

            mode_ = Store.discover().config_get("storm.mode") or "storm"
        except Exception:  # noqa: BLE001 - outside a repository the brief is still useful
            pass
    mode_ = mode_ if mode_ in ("storm", "worktree") else "storm"
    text = brief(role, mode_, agent or os.environ.get("STORM_AGENT"))
    if as_json:
        _emit_json({"role": role, "mode": mode_, "text": text})
    else:
        click.echo(text, nl=False)


@cli.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--rev", metavar="REV", default=None,
              help="Look in REV instead (default: the shared head in storm mode, HEAD in worktree mode).")
@json_option
def intents(paths: tuple[str, ...], rev: str | None, as_json: bool) -> None:
    """List intent annotations ('# AGENT: why', '// AGENT: why') in the shared tree.

    Each with the agent it names and the agent whose write last changed the
    line (git blame on refs/storm/workspace, each commit's Storm-Agent). Only
    ids storm knows count (agents with a read set or writes, and the manager),
    so '# TODO: ...' is never one. A write that deletes or rewrites another
    agent's annotation is accepted but flagged intent_overwritten and logged.

    \b
    Example:
      git storm intents
      git storm intents src/ --json
      git storm intents --rev main
    """
    from storm_git.core.intents import list_intents
    from storm_git.core.paths import normalize
    from storm_git.core.store import WORKSPACE_REF, Store

    store = Store.discover()
    if rev is None:
        rev = "HEAD" if store.config_get("storm.mode") == "worktree" else WORKSPACE_REF
    found = list_intents(store, [normalize(p, store.prefix, store.top) for p in paths], rev)
    if as_json:
        _emit_json([a.to_dict() for a in found])
        return
    if not found:
        click.echo("no intent annotations" + (f" under {', '.join(paths)}" if paths else ""))
    for a in found:
        by = "" if a.written_by in (None, a.agent) else f"  [written by {a.written_by}]"
        click.echo(f"{a.path}:{a.line}: {a.agent}: {a.why}{by}")


@cli.group(context_settings=CONTEXT)
def harness() -> None:
    """Claude Code and Codex hooks: agents keep their own file tools, storm validates.

    'install' writes the hooks into the project's .claude/settings.json
    (Claude Code) or .codex/hooks.json (Codex), merged with what is there;
    'uninstall' removes exactly them. The harness then runs 'git storm harness
    hook' around each tool call: after Read the version seen is recorded;
    before Edit/MultiEdit/Write (Codex: apply_patch) the agent's read set is
    validated and the file leased for storm.leaseSeconds (default 10), or the
    call is denied with the diff as the reason; after it the file on disk is
    recorded as the agent's write; Bash calls are recorded as exec records
    commands. Agent id: --agent, else $STORM_AGENT, else derived from the
    session id. See docs/agents.md.

    \b
    Example:
      git storm harness install claude
      STORM_AGENT=engineer_1 claude     # each session its own agent
      git storm harness uninstall claude
    """


def _install_lines(res, verb: str) -> list[str]:
    what = {"installed": f"{verb} storm's hooks in", "updated": "updated storm's hooks in",
            "unchanged": "storm's hooks already in", "removed": "removed storm's hooks from",
            "restored": "restored as it was before install:", "deleted": "deleted (storm had created it):",
            "nothing": "no storm hooks in"}[res.action]
    out = [f"{what} {res.file}"]
    if res.command and res.action in ("installed", "updated"):
        out.append(f"  hook command: {res.command}")
    return out


@harness.command("install", context_settings=CONTEXT)
@click.argument("which", type=click.Choice(["claude", "codex"]), metavar="claude|codex")
@click.option("--agent", "-a", metavar="ID", default=None,
              help="Bake this agent id into the hook command (only when one session uses these settings).")
@json_option
def harness_install(which: str, agent: str | None, as_json: bool) -> None:
    """Write storm's hooks into the project's Claude Code or Codex settings.

    Merges into .claude/settings.json (claude) or .codex/hooks.json (codex),
    keeping the other keys and hooks; running it again changes nothing. A file
    storm creates is added to .git/info/exclude; a tracked file that changes is
    reported. Codex loads project hooks only from a trusted project.

    \b
    Example:
      git storm harness install claude
      git storm harness install codex --agent engineer_2
    """
    from storm_git.admin.harness_install import install
    from storm_git.core.store import Store

    res = install(Store.discover(), which, agent)
    if as_json:
        _emit_json(res.to_dict())
        return
    for line in _install_lines(res, "installed"):
        click.echo(line)
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)


@harness.command("uninstall", context_settings=CONTEXT)
@click.argument("which", type=click.Choice(["claude", "codex"]), metavar="claude|codex")
@json_option
def harness_uninstall(which: str, as_json: bool) -> None:
    """Remove storm's hooks from the project's Claude Code or Codex settings.

    Only storm's own entries go; the file is put back byte for byte when
    nothing else changed in it, and deleted when storm created it.

    \b
    Example:
      git storm harness uninstall claude
    """
    from storm_git.admin.harness_install import uninstall
    from storm_git.core.store import Store

    res = uninstall(Store.discover(), which)
    if as_json:
        _emit_json(res.to_dict())
        return
    for line in _install_lines(res, "installed"):
        click.echo(line)


ADVICE = {
    "direct_conflict": "Another agent changed this file since you read it. Read it again and redo your change "
                       "on top of theirs (do not paste your old version back).",
    "stale_dependency": "A file you read changed since. Check your change still fits it (the diff is above), "
                        "then retry.",
    "unread_target": "You had not read this file. Its content is above and now counts as read: base your change "
                     "on it and retry.",
    "reserved": "Another agent is re-planning this file after its own conflict. Retry in a few seconds, or work "
                "on something else first.",
}


def _reason(res) -> str:
    """The text the model reads: what happened, the payload, what to do."""
    from storm_git.core import render

    r = res.rejection
    tool = res.event.tool if res.event else "the tool"
    if res.decision == "deny":
        head = f"git storm refused this {tool} of {', '.join(map(quoted, res.paths))} (nothing was written)."
    else:
        head = (f"git storm could not record this {tool}: its result is on disk but is NOT part of the shared "
                f"state ({', '.join(map(quoted, res.paths))}).")
    advice = ADVICE.get(r.reason, "")
    offer = getattr(r, "rebased", None)
    if offer is not None and offer.clean and res.decision == "deny":
        advice = (f"Your change re-applies cleanly on the current version (the last diff above). If that is still "
                  f"what you want, accept it with the shell command: git storm write {shlex.quote(r.path)} "
                  f"--rebased --agent {res.agent}; otherwise read the file again and redo your change.")
    return "\n".join(x for x in (head, render.rejection(r), advice, res.message) if x)


HOOK_LOCK_SECONDS = 40.0  # a hook's wait for a lock: well inside the harness's 60 s


def _is_pre_write(hh, data: bytes, which: str) -> bool:
    try:
        e = hh.parse_event(data, which)
    except Exception:  # noqa: BLE001 - only asked to word a refusal
        return False
    return e.pre and e.tool in hh.EDIT_TOOLS + hh.PATCH_TOOLS


@harness.command("hook", context_settings=CONTEXT)
@click.option("--harness", "which", type=click.Choice(["claude", "codex"]), default="claude", show_default=True,
              help="Which harness sends the event.")
@click.option("--agent", "-a", metavar="ID", default=None,
              help="Agent id (default: $STORM_AGENT, else derived from the event's session_id).")
def harness_hook(which: str, agent: str | None) -> None:
    """The hook the harness runs: one event as JSON on stdin.

    Prints nothing when the call may go on (it never grants a permission
    itself); a denial as {"hookSpecificOutput": {"permissionDecision":
    "deny", "permissionDecisionReason": ...}} with exit 0; a recorded write
    that storm refused after the tool ran as {"decision": "block", "reason":
    ...}. A bad event or an internal problem is one line on stderr and exit 1,
    which the harness shows but does not treat as a denial. Outside a storm
    repository, and in worktree mode, it does nothing.

    \b
    Example:
      git storm harness hook --harness claude < event.json
    """
    from storm_git.cli.main import wait_with_a_deadline
    from storm_git.core.errors import Busy, StormError
    from storm_git.integrations import harness as hh

    wait_with_a_deadline(cap=HOOK_LOCK_SECONDS)  # the harness kills a hook after 60 s
    data = sys.stdin.buffer.read()
    try:
        res = hh.hook(data, harness=which, agent=agent)
    except StormError as exc:
        if isinstance(exc, Busy) and _is_pre_write(hh, data, which):
            # an edit storm could not check must not go on unchecked: deny it, the model retries
            reason = f"git storm could not check this edit now: {exc}. Nothing was written; retry in a moment."
            click.echo(json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                                          "permissionDecisionReason": reason}}, ensure_ascii=False))
            sys.exit(0)
        click.echo(f"git storm harness hook: {exc}".replace("\n", " "), err=True)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - never wedge the harness: exit 1 is non-blocking
        if os.environ.get("STORM_DEBUG"):
            raise
        click.echo(f"git storm harness hook: internal error {type(exc).__name__}: {exc} "
                   "(a bug: rerun with STORM_DEBUG=1 and report it)".replace("\n", " "), err=True)
        sys.exit(1)
    event = res.event.event if res.event else "PreToolUse"
    if res.decision == "deny":
        out = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                      "permissionDecisionReason": _reason(res)}}
    elif res.decision == "block":
        text = _reason(res)
        out = {"decision": "block", "reason": text,
               "hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}
    elif res.decision == "note" and res.message:
        out = {"hookSpecificOutput": {"hookEventName": event, "additionalContext": res.message}}
    else:
        out = None
    if out is not None:
        click.echo(json.dumps(out, ensure_ascii=False))
    if os.environ.get("STORM_HOOK_LOG"):  # for debugging a setup: one line per call
        with open(os.environ["STORM_HOOK_LOG"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": event, **res.to_dict()}, ensure_ascii=False) + "\n")
