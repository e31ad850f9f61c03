"""Whether Codex will run the hooks in a project's ``.codex/hooks.json``, and, on
request only, the trust entries that make it.

Codex runs a project's hooks only when both are in the user's Codex config
(``$CODEX_HOME/config.toml``, default ``~/.codex/config.toml``):

* the project is trusted: ``[projects."<top>"]`` with ``trust_level = "trusted"``
  (otherwise the project's ``.codex`` layer is loaded disabled);
* each hook is trusted: ``[hooks.state."<abs path of hooks.json>:<event>:<group>:<handler>"]``
  with ``trusted_hash = "sha256:<hex>"``, the SHA-256 of the compact, key-sorted
  JSON of the hook's identity (event, matcher, the handler with Codex's defaults:
  ``async`` false, ``timeout`` 600). Codex's ``/hooks`` review writes them.

The hash covers the command, so a hook command that changes (another
interpreter, ``--agent``) is untrusted again. Without the entries ``codex exec``
says nothing and the hooks silently never run: storm reports exactly what is
missing, and writes it only when asked (``git storm harness install codex --trust``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import UsageError
from ..core.files import replace_file

EVENT_LABELS = {"PreToolUse": "pre_tool_use", "PostToolUse": "post_tool_use"}
DEFAULT_TIMEOUT = 600


@dataclass
class HookTrust:
    key: str
    want: str  # the hash Codex computes for the hook as installed
    have: str | None  # the trusted_hash in the user's config, if any

    @property
    def ok(self) -> bool:
        return self.have == self.want


@dataclass
class CodexTrust:
    config: str  # the user's Codex config file
    project: str  # the project path Codex must trust
    project_trusted: bool
    hooks: list[HookTrust] = field(default_factory=list)
    error: str = ""  # the config could not be read

    @property
    def ok(self) -> bool:
        return not self.error and self.project_trusted and all(h.ok for h in self.hooks)

    def missing(self) -> list[str]:
        """What keeps Codex from running storm's hooks, one line each."""
        out = [self.error] if self.error else []
        if not self.project_trusted:
            out.append(f"the project {self.project} is not trusted in {self.config}")
        for h in self.hooks:
            if not h.ok:
                out.append(f"hook {h.key} is {'not trusted' if h.have is None else 'trusted with an old hash'} "
                           f"in {self.config}")
        return out

    def lines(self) -> str:
        """The TOML that makes Codex run the hooks."""
        out = [] if self.project_trusted else [f"[projects.{_toml_str(self.project)}]", 'trust_level = "trusted"', ""]
        for h in self.hooks:
            if not h.ok:
                out += [f"[hooks.state.{_toml_str(h.key)}]", f"trusted_hash = {_toml_str(h.want)}", ""]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, missing=self.missing())
        return d


def config_path(env: Mapping[str, str] | None = None) -> str:
    environ = os.environ if env is None else env
    home = environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    return os.path.join(home, "config.toml")


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a TOML basic string


def hook_hash(event: str, matcher: str | None, handler: dict[str, Any]) -> str:
    """The hash Codex trusts a hook by (see the module docstring)."""
    h = {"type": handler.get("type", "command"), "command": handler.get("command", ""),
         "timeout": handler.get("timeout", DEFAULT_TIMEOUT), "async": bool(handler.get("async", False))}
    identity: dict[str, Any] = {"event_name": event, "hooks": [h]}
    if matcher is not None:
        identity["matcher"] = matcher
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def wanted(hooks_file: str, data: dict[str, Any], ours: Any) -> list[tuple[str, str]]:
    """(key, hash) of each of storm's handlers in a hooks.json (``ours(group)`` tells storm's groups)."""
    out = []
    for event, label in EVENT_LABELS.items():
        for gi, group in enumerate((data.get("hooks") or {}).get(event) or []):
            if not ours(group):
                continue
            for hi, handler in enumerate(group.get("hooks") or []):
                if isinstance(handler, dict):
                    out.append((f"{hooks_file}:{label}:{gi}:{hi}", hook_hash(label, group.get("matcher"), handler)))
    return out


_HEADER = re.compile(r"^\s*\[(.+)\]\s*(#.*)?$")


def _read_config(path: str) -> tuple[str, dict[str, Any]]:
    """(text, parsed) of the user's config; parsed by tomllib where Python has it,
    else the two tables storm needs, read line by line."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return "", {}
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        return text, _scan(text)
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML ({exc})", hint="fix it, then run the command again") from None


def _scan(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"projects": {}, "hooks": {"state": {}}}
    table: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            inner = m.group(1).strip()
            table = None
            for prefix, where in (("projects.", out["projects"]), ("hooks.state.", out["hooks"]["state"])):
                if inner.startswith(prefix) and inner[len(prefix):].startswith('"'):
                    try:
                        key = json.loads(inner[len(prefix):])
                    except ValueError:
                        continue
                    table = where.setdefault(key, {})
            continue
        if table is not None and "=" in line:
            k, _, v = line.partition("=")
            try:
                table[k.strip()] = json.loads(v.strip())
            except ValueError:
                pass
    return out


def check(top: str, hooks_file: str, data: dict[str, Any], ours: Any,
          env: dict[str, str] | None = None) -> CodexTrust:
    """What the user's Codex config trusts of storm's hooks in ``hooks_file``."""
    path = config_path(env)
    try:
        _, cfg = _read_config(path)
    except UsageError as exc:
        return CodexTrust(path, top, False, [], str(exc))
    projects = cfg.get("projects")
    projects = projects if isinstance(projects, dict) else {}
    proj = projects.get(top)
    proj = proj if isinstance(proj, dict) else {}
    state = (cfg.get("hooks") or {}).get("state") if isinstance(cfg.get("hooks"), dict) else None
    state = state if isinstance(state, dict) else {}
    hooks = []
    for key, want in wanted(hooks_file, data, ours):
        entry = state.get(key)
        have = entry.get("trusted_hash") if isinstance(entry, dict) else None
        hooks.append(HookTrust(key, want, have if isinstance(have, str) else None))
    return CodexTrust(path, top, proj.get("trust_level") == "trusted", hooks)


def write(trust: CodexTrust) -> str:
    """Add (or correct) the entries ``trust`` lacks in the user's Codex config; return
    the TOML written ("" when nothing was missing). Other content is kept as it is."""
    if trust.error:
        raise UsageError(trust.error, hint="fix the file, then run the command again")
    if trust.ok:
        return ""
    text, _ = _read_config(trust.config)
    stale = {h.key for h in trust.hooks if h.have is not None and not h.ok}
    if stale:  # drop the old hashes' tables; the new ones are appended
        text = _drop_tables(text, {f"hooks.state.{_toml_str(k)}" for k in stale})
    added = trust.lines()
    new = text + ("" if not text or text.endswith("\n") else "\n") + ("\n" if text.strip() else "") + added
    try:
        import tomllib

        tomllib.loads(new)  # never leave the user's config unreadable
    except ImportError:  # pragma: no cover
        pass
    os.makedirs(os.path.dirname(trust.config), exist_ok=True)
    replace_file(trust.config, new.encode("utf-8"))
    return added


def _drop_tables(text: str, headers: set[str]) -> str:
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        m = _HEADER.match(line)
        if m:
            skipping = m.group(1).strip() in headers
        if not skipping:
            out.append(line)
    return "".join(out)
