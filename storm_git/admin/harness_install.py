"""Installing storm's harness hooks into Claude Code's or Codex's project settings.

Claude Code reads ``<project>/.claude/settings.json`` and Codex
``<project>/.codex/hooks.json``; both hold ``{"hooks": {EVENT: [{"matcher":
REGEX, "hooks": [{"type": "command", "command": CMD}]}]}}``. ``install``
merges storm's groups into that file, keeping every other key and hook, and is
idempotent (storm's groups are recognised by their command, ``… harness hook
…``). What it found is kept in ``<git dir>/storm/harness/installed-<harness>.json``
so ``uninstall`` removes exactly storm's groups and puts back the file byte for
byte when nothing else changed in it, or deletes it when storm created it.

A file storm creates is added to ``.git/info/exclude`` (so it is not an
unmediated edit in the shared working tree); a *tracked* file that storm
changes is reported (``tracked``): it now differs from the shared head, and
``git storm status`` lists it until someone adopts or reverts it.

What each harness does with these files decides whether the hooks run at all:

* Claude Code reads ``.claude/settings.json`` in the directory it was started
  in, not at the top of the repository: a session started in a subdirectory
  runs without the project's hooks. ``scope="user"`` installs the same hooks in
  the user's settings (``$CLAUDE_CONFIG_DIR`` or ``~/.claude``), which every
  session reads wherever it starts; outside a storm repository the hook says
  nothing.
* Codex finds ``.codex/hooks.json`` from any subdirectory, but runs it only when
  the user's Codex config trusts the project and each hook
  (:mod:`storm_git.admin.codex_trust`); install reports what is missing and
  writes it only with ``trust=True``.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.agents import validate_agent
from ..core.errors import UsageError
from ..core.files import replace_file
from ..core.program import storm_program
from ..core.store import Store, git_env as store_git_env
from . import codex_trust

MARKER = "harness hook"
TARGETS = {"claude": ".claude/settings.json", "codex": ".codex/hooks.json"}
GROUPS = {
    "claude": {
        "PreToolUse": "Edit|MultiEdit|Write|NotebookEdit|Bash",
        "PostToolUse": "Read|Edit|MultiEdit|Write|NotebookEdit|Bash",
        "PostToolUseFailure": "Edit|MultiEdit|Write|NotebookEdit|Bash",
    },
    "codex": {
        "PreToolUse": "apply_patch|Bash",
        "PostToolUse": "apply_patch|Bash",
    },
}


SCOPES = ("project", "user")


@dataclass
class InstallResult:
    harness: str
    file: str  # relative to the working tree's top (project scope), else absolute
    action: str  # installed, updated, unchanged, removed, restored, deleted, nothing
    command: str = ""
    tracked: bool = False
    created: bool = False
    warnings: list[str] = field(default_factory=list)
    scope: str = "project"
    inactive: list[str] = field(default_factory=list)  # why the harness will not run the hooks
    trust_written: str = ""  # the TOML added to the user's Codex config (--trust)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hook_command(harness: str, agent: str | None) -> str:
    """The command the harness runs: this installation's ``git-storm`` (or its Python
    with ``-m storm_git``), so it works whatever PATH the harness gives hooks."""
    cmd = f"{storm_program()} {MARKER} --harness {harness}"
    return cmd + (f" --agent {shlex.quote(agent)}" if agent else "")


def _ours(group: Any) -> bool:
    return isinstance(group, dict) and any(
        isinstance(h, dict) and MARKER in str(h.get("command", "")) for h in group.get("hooks") or [])


def _manifest_path(store: Store, harness: str) -> str:
    return os.path.join(store.commondir, "storm", "harness", f"installed-{harness}.json")


def _load_json(path: str) -> tuple[str | None, dict[str, Any] | None]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None, None
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); nothing was changed",
                         hint="fix the file, then run the command again") from None
    if not isinstance(data, dict) or not isinstance(data.get("hooks", {}), dict):
        raise UsageError(f"{path} does not hold a JSON object with a \"hooks\" object; nothing was changed")
    return text, data


def _write(path: str, data: dict[str, Any]) -> str:
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    replace_file(path, text.encode("utf-8"))
    return text


def _git(store: Store, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=store.top, env=store_git_env(), capture_output=True)


def _tracked(store: Store, rel: str) -> bool:
    return _git(store, "ls-files", "--error-unmatch", "--", rel).returncode == 0


def _exclude_file(store: Store) -> str:
    return os.path.join(store.commondir, "info", "exclude")


def _exclude(store: Store, rel: str, add: bool) -> bool:
    """Add (or remove) ``/rel`` in .git/info/exclude; True when the file changed."""
    path = _exclude_file(store)
    line = f"/{rel}"
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        lines = []
    if add == (line in lines):
        return False
    lines = lines + [line] if add else [x for x in lines if x != line]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + ("\n" if lines else ""))
    return True


def claude_user_settings(env: dict[str, str] | None = None) -> str:
    """Claude Code's user settings file (``$CLAUDE_CONFIG_DIR``, else ``~/.claude``)."""
    env = os.environ if env is None else env
    return os.path.join(env.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude"),
                        "settings.json")


def _merge(data: dict[str, Any], harness: str, command: str) -> None:
    hooks = data.setdefault("hooks", {})
    for event, matcher in GROUPS[harness].items():
        groups = [g for g in hooks.get(event) or [] if not _ours(g)]
        groups.append({"matcher": matcher, "hooks": [{"type": "command", "command": command}]})
        hooks[event] = groups


def _strip(data: dict[str, Any]) -> None:
    hooks = data.get("hooks") or {}
    for event in list(hooks):
        kept = [g for g in hooks[event] or [] if not _ours(g)]
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    if not hooks:
        data.pop("hooks", None)


def _check_args(harness: str, scope: str, agent: str | None) -> None:
    if harness not in TARGETS:
        raise UsageError(f"unknown harness {harness!r}", hint=f"one of {', '.join(TARGETS)}")
    if scope not in SCOPES:
        raise UsageError(f"unknown scope {scope!r}", hint=f"one of {', '.join(SCOPES)}")
    if scope == "user" and harness != "claude":
        raise UsageError("--user is for Claude Code only: Codex finds the project's .codex/hooks.json from any "
                         "subdirectory", hint="git storm harness install codex")
    if agent:
        validate_agent(agent)


def install_user(store: Store, agent: str | None = None, env: dict[str, str] | None = None) -> InstallResult:
    """Storm's hooks in Claude Code's user settings: every session runs them wherever it
    starts (a subdirectory included); outside a storm repository they say nothing."""
    path = claude_user_settings(env)
    text, data = _load_json(path)
    data = {} if data is None else data
    command = hook_command("claude", agent)
    _merge(data, "claude", command)
    new_text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    res = InstallResult("claude", path, "unchanged" if new_text == text else
                        "installed" if text is None or MARKER not in text else "updated", command,
                        created=text is None, scope="user")
    if res.action != "unchanged":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write(path, data)
    if agent:
        res.warnings.append(f"every Claude Code session of this user is now agent {agent}, in every repository: "
                            "leave --agent out with --user")
    proj = os.path.join(store.top, TARGETS["claude"])
    try:
        _, pdata = _load_json(proj)
    except UsageError:
        pdata = None
    if pdata is not None and any(_ours(g) for gs in (pdata.get("hooks") or {}).values() for g in gs or []):
        res.warnings.append(f"{TARGETS['claude']} holds storm's hooks too; Claude Code runs an identical command "
                            "once, a different one (another interpreter, --agent) twice: "
                            "git storm harness uninstall claude removes the project's")
    return res


def uninstall_user(env: dict[str, str] | None = None) -> InstallResult:
    path = claude_user_settings(env)
    text, data = _load_json(path)
    res = InstallResult("claude", path, "nothing", scope="user")
    if data is not None and MARKER in (text or ""):
        _strip(data)
        _write(path, data)
        res.action = "removed"
    return res


def install(store: Store, harness: str, agent: str | None = None, *, scope: str = "project",
            trust: bool = False, env: dict[str, str] | None = None) -> InstallResult:
    """Merge storm's hook groups into the harness's project settings (idempotent);
    ``scope="user"``: Claude Code's user settings. For Codex, ``trust`` also writes the
    entries the user's Codex config needs to run them; without it, what is missing is
    reported (``inactive``)."""
    _check_args(harness, scope, agent)
    if scope == "user":
        return install_user(store, agent, env)
    rel = TARGETS[harness]
    path = os.path.join(store.top, rel)
    text, data = _load_json(path)
    mpath = _manifest_path(store, harness)
    manifest: dict[str, Any] = {}
    if os.path.exists(mpath):
        with open(mpath, encoding="utf-8") as fh:
            manifest = json.load(fh)
    if not manifest:
        created_dirs = []
        d = os.path.dirname(path)
        while not os.path.isdir(d):
            created_dirs.append(os.path.relpath(d, store.top))
            d = os.path.dirname(d)
        manifest = {"file": rel, "created": text is None, "original": text, "created_dirs": created_dirs,
                    "excluded": False}
    data = {} if data is None else data
    command = hook_command(harness, agent)
    _merge(data, harness, command)
    new_text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    res = InstallResult(harness, rel, "unchanged" if new_text == text else
                        "installed" if text is None or MARKER not in text else "updated", command)
    if res.action != "unchanged":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write(path, data)
    res.created = bool(manifest.get("created"))
    res.tracked = _tracked(store, rel)
    if res.created and not res.tracked:
        manifest["excluded"] = _exclude(store, rel, True) or manifest.get("excluded", False)
    if res.tracked and res.action != "unchanged":
        res.warnings.append(f"{rel} is tracked and was changed: it now differs from the committed version "
                            "(in storm mode git storm status lists it until it is adopted or reverted)")
    if agent:
        res.warnings.append(f"every session using {rel} is now agent {agent}: in storm mode, where all agents "
                            "share this directory, leave --agent out and start each session with its own "
                            "STORM_AGENT (or let storm derive the id from the session)")
    os.makedirs(os.path.dirname(mpath), exist_ok=True)
    manifest["command"] = command
    with open(mpath, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
    if harness == "codex":
        tr = codex_state(store, env)
        if trust and tr is not None:
            res.trust_written = codex_trust.write(tr)
            tr = codex_state(store, env)
        res.inactive = tr.missing() if tr is not None else []
    elif not _claude_user_hooks(env):
        res.warnings.append("Claude Code reads .claude/settings.json in the directory it starts in: a session "
                            "started in a subdirectory of the repository runs WITHOUT these hooks (its edits are "
                            "neither validated nor recorded). Start claude at the top of the repository, or add "
                            "git storm harness install claude --user")
    return res


def _claude_user_hooks(env: dict[str, str] | None = None) -> bool:
    try:
        _, data = _load_json(claude_user_settings(env))
    except UsageError:
        return False
    return data is not None and any(_ours(g) for gs in (data.get("hooks") or {}).values() for g in gs or [])


def codex_state(store: Store, env: dict[str, str] | None = None) -> codex_trust.CodexTrust | None:
    """What the user's Codex config trusts of storm's hooks in this project (None: none installed)."""
    path = os.path.join(store.top, TARGETS["codex"])
    try:
        _, data = _load_json(path)
    except UsageError:
        return None
    if data is None or not any(_ours(g) for gs in (data.get("hooks") or {}).values() for g in gs or []):
        return None
    return codex_trust.check(store.top, path, data, _ours, env)


@dataclass
class HarnessStatus:
    """Whether each harness will run storm's hooks here, and what is missing."""

    harness: str
    installed: list[str]  # the files holding storm's hooks
    active: bool  # a session started at the top runs them
    subdirectories: bool  # a session started in a subdirectory runs them too
    missing: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def status(store: Store, env: dict[str, str] | None = None) -> list[HarnessStatus]:
    out = []
    proj = os.path.join(store.top, TARGETS["claude"])
    try:
        _, pdata = _load_json(proj)
    except UsageError as exc:
        pdata, perr = None, str(exc)
    else:
        perr = ""
    in_project = pdata is not None and any(_ours(g) for gs in (pdata.get("hooks") or {}).values() for g in gs or [])
    in_user = _claude_user_hooks(env)
    files = ([TARGETS["claude"]] if in_project else []) + ([claude_user_settings(env)] if in_user else [])
    missing = [perr] if perr else []
    if not files:
        missing.append("no storm hooks in .claude/settings.json nor in the user's Claude Code settings")
    elif not in_user:
        missing.append("a session started in a subdirectory runs without storm's hooks (Claude Code reads "
                       ".claude/settings.json where it starts)")
    out.append(HarnessStatus("claude", files, bool(files), in_user, missing,
                             "git storm harness install claude --user" if not in_user else ""))
    tr = codex_state(store, env)
    if tr is None:
        out.append(HarnessStatus("codex", [], False, False, ["no storm hooks in .codex/hooks.json"],
                                 "git storm harness install codex --trust"))
    else:
        out.append(HarnessStatus("codex", [TARGETS["codex"]], tr.ok, tr.ok, tr.missing(),
                                 "" if tr.ok else "git storm harness install codex --trust (or review the hooks "
                                                  "with /hooks in Codex)"))
    return out


@dataclass
class StaleHooks:
    """An installation whose hook groups call storm for fewer tools than this version
    handles (made by an older git storm, without NotebookEdit, say). The
    harness then runs those tools without storm: their edits are not validated."""

    harness: str
    file: str  # relative to the working tree's top
    missing: list[str]  # tools this version hooks that the installed groups do not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _covered(groups: list[Any]) -> set[str] | None:
    """The tools storm's groups match (None: every tool, a ``*`` or empty matcher)."""
    tools: set[str] = set()
    for g in groups:
        m = str(g.get("matcher") or "")
        if m in ("", "*"):
            return None
        tools |= set(m.split("|"))
    return tools


def stale_installs(store: Store) -> list[StaleHooks]:
    """Installations (recorded by ``install``) whose groups miss tools that
    ``GROUPS`` hooks now. An unreadable settings file is not judged here: the
    harness itself reports it."""
    out = []
    for harness, rel in TARGETS.items():
        if not os.path.exists(_manifest_path(store, harness)):
            continue
        try:
            _, data = _load_json(os.path.join(store.top, rel))
        except UsageError:
            continue
        if data is None:
            continue
        hooks = data.get("hooks") or {}
        missing: set[str] = set()
        for event, matcher in GROUPS[harness].items():
            covered = _covered([g for g in hooks.get(event) or [] if _ours(g)])
            if covered is not None:
                missing |= set(matcher.split("|")) - covered
        if missing:
            out.append(StaleHooks(harness, rel, sorted(missing)))
    return out


def refresh(store: Store, harness: str) -> bool:
    """Bring storm's groups in the harness's settings to this version's matchers,
    keeping their command as installed (its ``--agent``, its interpreter) and every
    other hook. True when the file changed."""
    rel = TARGETS[harness]
    path = os.path.join(store.top, rel)
    _, data = _load_json(path)
    if data is None:
        return False
    hooks = data.setdefault("hooks", {})
    commands = [h["command"] for gs in hooks.values() for g in gs or [] if _ours(g)
                for h in g.get("hooks") or [] if isinstance(h, dict) and MARKER in str(h.get("command", ""))]
    if not commands:
        return False
    changed = False
    for event, matcher in GROUPS[harness].items():
        ours = [g for g in hooks.get(event) or [] if _ours(g)]
        if not ours:
            hooks[event] = [*(hooks.get(event) or []),
                            {"matcher": matcher, "hooks": [{"type": "command", "command": commands[0]}]}]
            changed = True
        want = matcher.split("|")
        for g in ours:
            covered = _covered([g])
            if covered is not None and not set(want) <= covered:  # tools added by hand stay
                g["matcher"], changed = "|".join(want + sorted(covered - set(want))), True
    if changed:
        _write(path, data)
    return changed


def uninstall(store: Store, harness: str, *, scope: str = "project",
              env: dict[str, str] | None = None) -> InstallResult:
    """Remove storm's hook groups; restore the file as it was before install when
    nothing else changed in it, delete it when storm created it (project scope);
    in the user's settings only storm's groups go."""
    _check_args(harness, scope, None)
    if scope == "user":
        return uninstall_user(env)
    rel = TARGETS[harness]
    path = os.path.join(store.top, rel)
    mpath = _manifest_path(store, harness)
    manifest: dict[str, Any] = {}
    if os.path.exists(mpath):
        with open(mpath, encoding="utf-8") as fh:
            manifest = json.load(fh)
    text, data = _load_json(path)
    res = InstallResult(harness, rel, "nothing")
    if data is not None:
        original = manifest.get("original")
        before = json.loads(original) if original and original.strip() else ({} if original is not None else None)
        hooks = data.get("hooks") or {}
        for event in list(hooks):
            kept = [g for g in hooks[event] or [] if not _ours(g)]
            if kept or (before and event in (before.get("hooks") or {})):
                hooks[event] = kept
            else:
                del hooks[event]
        if not hooks and not (before and "hooks" in before):
            data.pop("hooks", None)
        if original is not None and before == data:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(original)
            res.action = "restored" if original != text else "nothing"
        elif manifest.get("created") and not data:
            os.unlink(path)
            for d in manifest.get("created_dirs") or []:
                try:
                    os.rmdir(os.path.join(store.top, d))
                except OSError:
                    pass
            res.action = "deleted"
        elif MARKER in (text or ""):
            _write(path, data)
            res.action = "removed"
    if manifest.get("excluded"):
        _exclude(store, rel, False)
    res.tracked = _tracked(store, rel)
    try:
        os.unlink(mpath)
    except FileNotFoundError:
        pass
    return res
