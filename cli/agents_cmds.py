"""Commands that connect agents to storm: ``prompt`` (the agent's brief),
``intents`` (annotations and who wrote them) and ``harness`` (Claude Code and
Codex hooks)."""
from __future__ import annotations

import os
import sys

import click

from storm_git.cli.app import CONTEXT, cli, emit_json, json_option


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
        emit_json({"role": role, "mode": mode_, "text": text})
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
        emit_json([a.to_dict() for a in found])
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
    (Claude Code; --user: the user's settings, read wherever a session starts)
    or .codex/hooks.json (Codex; --trust also writes the trust Codex needs to
    run them), merged with what is there; 'status' says whether each harness
    will run them and what is missing; 'uninstall' removes exactly them. The
    harness then runs 'git storm harness hook' around each tool call: after
    Read the version seen is recorded (with what changed since a previous
    read); before Edit/MultiEdit/Write (Codex: apply_patch) the agent's read
    set is validated and the file leased for storm.leaseSeconds (default 10),
    or the call is denied with the diff; after it the file on disk is recorded
    as the agent's write, validated again; Bash calls are recorded as exec
    records commands. Agent id: --agent, else $STORM_AGENT, else derived from
    the session id. See docs/agents.md.

    \b
    Example:
      git storm harness install claude --user
      git storm harness install codex --trust
      git storm harness status
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
@click.option("--user", "user", is_flag=True,
              help="Claude Code: install in the user's settings (~/.claude/settings.json), which a session "
                   "started anywhere reads, a subdirectory included.")
@click.option("--trust", is_flag=True,
              help="Codex: also write the trust entries Codex needs to run the hooks into the user's Codex "
                   "config (the project's trust_level and each hook's trusted_hash), and show them.")
@json_option
def harness_install(which: str, agent: str | None, user: bool, trust: bool, as_json: bool) -> None:
    """Write storm's hooks into the project's Claude Code or Codex settings.

    Merges into .claude/settings.json (claude) or .codex/hooks.json (codex),
    keeping the other keys and hooks; running it again changes nothing. A file
    storm creates is added to .git/info/exclude; a tracked file that changes is
    reported.

    Claude Code reads .claude/settings.json where it starts: a session started
    in a subdirectory runs without these hooks unless they are also in the
    user's settings (--user). Codex runs a project's hooks only when the
    user's Codex config trusts the project and each hook by its hash: install
    says what is missing; --trust writes it (and prints what it wrote).
    Exit 3 when the harness will not run the hooks as installed.

    \b
    Example:
      git storm harness install claude
      git storm harness install claude --user
      git storm harness install codex --trust
    """
    from storm_git.admin.harness_install import install
    from storm_git.core.errors import UsageError
    from storm_git.core.store import Store

    if trust and which != "codex":
        raise UsageError("--trust is for Codex only", hint="git storm harness install codex --trust")
    res = install(Store.discover(), which, agent, scope="user" if user else "project", trust=trust)
    if as_json:
        emit_json(res.to_dict())
    else:
        for line in _install_lines(res, "installed"):
            click.echo(line)
        if res.trust_written:
            click.echo(f"wrote to the user's Codex config:\n{res.trust_written.rstrip()}")
        for w in res.warnings:
            click.echo(f"warning: {w}", err=True)
        if res.inactive:
            click.echo("Codex will NOT run these hooks: " + "; ".join(res.inactive), err=True)
            click.echo("  fix: git storm harness install codex --trust (writes the entries and shows them), or "
                       "review the hooks with /hooks in Codex", err=True)
    if res.inactive:
        sys.exit(3)


@harness.command("uninstall", context_settings=CONTEXT)
@click.argument("which", type=click.Choice(["claude", "codex"]), metavar="claude|codex")
@click.option("--user", "user", is_flag=True, help="Claude Code: remove storm's hooks from the user's settings.")
@json_option
def harness_uninstall(which: str, user: bool, as_json: bool) -> None:
    """Remove storm's hooks from the project's Claude Code or Codex settings.

    Only storm's own entries go; the file is put back byte for byte when
    nothing else changed in it, and deleted when storm created it. Codex trust
    entries in the user's config are left as they are (they name a hash only).

    \b
    Example:
      git storm harness uninstall claude
      git storm harness uninstall claude --user
    """
    from storm_git.admin.harness_install import uninstall
    from storm_git.core.store import Store

    res = uninstall(Store.discover(), which, scope="user" if user else "project")
    if as_json:
        emit_json(res.to_dict())
        return
    for line in _install_lines(res, "installed"):
        click.echo(line)


@harness.command("status", context_settings=CONTEXT)
@json_option
def harness_status(as_json: bool) -> None:
    """Say whether Claude Code and Codex will run storm's hooks here, and what is missing.

    Claude Code: installed in the project's settings and/or the user's (only
    the user's cover a session started in a subdirectory). Codex: installed in
    .codex/hooks.json, the project trusted and each hook trusted by its current
    hash in the user's Codex config. Exit 0 when every installed harness runs
    them, 3 when one is installed but will not (the line says how to fix it).

    \b
    Example:
      git storm harness status
      git storm harness status --json
    """
    from storm_git.admin.harness_install import status
    from storm_git.core.store import Store

    rows = status(Store.discover())
    if as_json:
        emit_json([r.to_dict() for r in rows])
    else:
        for r in rows:
            where = ", ".join(r.installed) or "not installed"
            state = ("active, from any directory" if r.active and r.subdirectories else
                     "active when started at the top only" if r.active else "NOT active")
            click.echo(f"{r.harness}: {state} ({where})")
            for m in r.missing:
                click.echo(f"  missing: {m}")
            if r.fix:
                click.echo(f"  fix: {r.fix}")
    if any(r.installed and not r.active for r in rows):
        sys.exit(3)


@harness.command("hook", context_settings=CONTEXT)
@click.option("--harness", "which", type=click.Choice(["claude", "codex"]), default="claude", show_default=True,
              help="Which harness sends the event.")
@click.option("--agent", "-a", metavar="ID", default=None,
              help="Agent id (default: $STORM_AGENT, else derived from the event's session_id).")
def harness_hook(which: str, agent: str | None) -> None:
    """The hook the harness runs: one event as JSON on stdin.

    Prints nothing when the call may go on (it never grants a permission
    itself); a denial as {"hookSpecificOutput": {"permissionDecision":
    "deny", "permissionDecisionReason": ...}} with exit 0; a write that
    storm refused after the tool ran as {"decision": "block", "reason": ...}
    (Codex, after a shell command: as additionalContext, so the command's
    output stays). It fails closed: a problem before a tool is a denial, after
    it a block, both read by the model; an event that is not JSON is exit 2
    with the reason on stderr (blocking in both harnesses). Outside a storm
    repository, and in worktree mode, it does nothing.

    \b
    Example:
      git storm harness hook --harness claude < event.json
    """
    from storm_git.integrations.hook_main import main as hook_main

    sys.exit(hook_main(["--harness", which] + (["--agent", agent] if agent is not None else [])))
