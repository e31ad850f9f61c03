"""Starting the real Claude Code and Codex against the scripted model, with nothing
leaving the machine: the model is on 127.0.0.1, every proxy variable points at a
closed port on 127.0.0.1 (127.0.0.1 itself excluded), telemetry, updates and
Codex's plugins and apps are off, and each run has its own HOME and CODEX_HOME."""
from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CODEX_MODEL = "gpt-5.5"  # a slug codex 0.171 knows: with an unknown one it offers no apply_patch


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def base_env(home: Path, hook_log: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()  # the hooks run as a user's do: through the hook daemon
           if not k.startswith(("ANTHROPIC", "CLAUDE", "OPENAI", "CODEX", "STORM_AGENT", "STORM_NO_DAEMON"))}
    env["STORM_HOOKD_IDLE"] = "60"  # not ten minutes after the suite
    if os.environ.get("STORM_E2E_NO_DAEMON") == "1":  # each hook call in its own process, to compare
        env["STORM_NO_DAEMON"] = "1"
    proxy = f"http://127.0.0.1:{closed_port()}"
    env.update(HOME=str(home), HTTP_PROXY=proxy, HTTPS_PROXY=proxy, ALL_PROXY=proxy, http_proxy=proxy,
               https_proxy=proxy, all_proxy=proxy, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               STORM_HOOK_LOG=str(hook_log))
    return env


@dataclass
class Run:
    proc: subprocess.Popen
    name: str

    def wait(self, timeout: float = 90) -> subprocess.CompletedProcess:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"{self.name} did not finish in {timeout}s:\n{err[-2000:]}") from None
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def claude(bin_dir: Path, cwd: Path, prompt: str, port: int, home: Path, hook_log: Path,
           extra_env: dict[str, str] | None = None, skip_permissions: bool = True) -> Run:
    """``claude -p`` as root in a sandbox (IS_SANDBOX=1 allows skipping permissions);
    ``skip_permissions=False``: the default permission mode, in which ``-p`` refuses
    every edit it would have to ask about."""
    env = base_env(home, hook_log)
    env.update(ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}", ANTHROPIC_API_KEY="sk-storm-test", IS_SANDBOX="1",
               DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CONFIG_DIR=str(home / ".claude"))
    env.update(extra_env or {})
    proc = subprocess.Popen([str(bin_dir / "claude"), "-p", prompt, "--output-format", "json",
                             *(["--dangerously-skip-permissions"] if skip_permissions else []),
                             "--debug-file", str(home / "claude-debug.log")],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return Run(proc, f"claude {prompt!r}")


@functools.cache
def claude_version(bin_dir: Path) -> tuple[int, ...]:
    """``claude --version`` as numbers (2, 1, 197), run with a scratch HOME."""
    with tempfile.TemporaryDirectory() as home:
        r = subprocess.run([str(bin_dir / "claude"), "--version"], capture_output=True, text=True, timeout=60,
                           env={**base_env(Path(home), Path(home) / "hooks.jsonl"), "DISABLE_AUTOUPDATER": "1"},
                           stdin=subprocess.DEVNULL, check=True)
    return tuple(int(x) for x in r.stdout.split()[0].split("."))


def hooks_before_read_checks(bin_dir: Path) -> bool:
    """Whether Claude Code runs the PreToolUse hook before its own check that an
    Edit's file was read and not modified since: 2.1.197 checks first ("has not been
    read yet", "modified since read") and storm's hook never sees such an edit;
    2.1.332 runs the hook first, so storm refuses it (unread_target,
    direct_conflict) with the current content. The change lies between the two."""
    return claude_version(bin_dir) > (2, 1, 197)


def codex_home(home: Path, port: int, extra_toml: str = "") -> Path:
    """A CODEX_HOME whose config uses the scripted model and turns off what reaches out."""
    ch = home / ".codex"
    ch.mkdir(parents=True, exist_ok=True)
    (ch / "config.toml").write_text(f'''model = "{CODEX_MODEL}"
model_provider = "storm_test"

[model_providers.storm_test]
name = "storm test model"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "STORM_TEST_KEY"

[features]
plugins = false
remote_plugin = false
apps = false
daemon_auto_start = false
in_app_updates = false
browser_use = false
computer_use = false

''' + extra_toml)
    return ch


def codex(bin_dir: Path, cwd: Path, prompt: str, home: Path, hook_log: Path,
          extra_env: dict[str, str] | None = None) -> Run:
    env = base_env(home, hook_log)
    env.update(CODEX_HOME=str(home / ".codex"), STORM_TEST_KEY="sk-storm-test")
    env.update(extra_env or {})
    proc = subprocess.Popen([str(bin_dir / "codex"), "exec", "--json", "--dangerously-bypass-approvals-and-sandbox",
                             "--skip-git-repo-check", prompt],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return Run(proc, f"codex {prompt!r}")


def hook_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def use_other_build(settings: Path) -> bool:
    """Point storm's hook command in a settings file at another build's ``git-storm``
    (``STORM_E2E_HOOK``), to show a scenario failing before a fix; False when unset.
    Codex then needs trust entries for the new command: see trust_codex_hooks."""
    other = os.environ.get("STORM_E2E_HOOK")
    if not other or not settings.exists():
        return False
    data = json.loads(settings.read_text())
    for groups in (data.get("hooks") or {}).values():
        for g in groups or []:
            for h in g.get("hooks") or []:
                cmd = h.get("command", "")
                if " harness hook" in cmd:
                    h["command"] = other + cmd[cmd.index(" harness hook"):]
    settings.write_text(json.dumps(data, indent=2))
    return True


def trust_codex_hooks(repo: Path, codex_home_dir: Path) -> None:
    """Trust whatever storm hook commands .codex/hooks.json holds (for use_other_build)."""
    from storm_git.admin import codex_trust

    hooks_file = repo / ".codex/hooks.json"
    data = json.loads(hooks_file.read_text())
    state = codex_trust.check(str(repo), str(hooks_file), data, lambda g: " harness hook" in json.dumps(g),
                              {"CODEX_HOME": str(codex_home_dir)})
    codex_trust.write(state)


def finish(runs: list[Run], server: Any, script: Any) -> None:
    """Wait for every session (each must end well), stop the model, and keep what each
    session's model saw in STORM_E2E_DUMP (a directory) when it is set."""
    try:
        for r in [run.wait() for run in runs]:
            assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
    finally:
        server.shutdown()
    dump = os.environ.get("STORM_E2E_DUMP")
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_CURRENT_TEST", "run").split(" ")[0].split("::")[-1]
        (Path(dump) / f"{name}.json").write_text(json.dumps(script.results, indent=1))


def writers(log: Path, path: str) -> list[str]:
    """The agents whose writes of ``path`` the hooks recorded, in order."""
    return [e["agent"] for e in hook_log(log) if e.get("action") == "recorded-write" and path in e["paths"]]


def workspace(repo: Path, path: str) -> bytes:
    """``path`` at the shared head, as git has it."""
    return subprocess.run(["git", "show", f"refs/storm/workspace:{path}"], cwd=repo, check=True,
                          capture_output=True).stdout
