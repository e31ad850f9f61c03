"""Starting and ending engineer sessions: any harness is a process group.

Each session runs in its own session and process group (its pid is the group's
id), with stdin closed and stdout/stderr going to its transcript files, wrapped in
``sh`` that writes the command's exit status to a file when it ends. That file,
not a pipe to ``team run``, is how a session's end is known, so a ``team run``
killed and resumed (or ``team status`` in another terminal) still tells a session
that finished from one that was killed. A pid is trusted only together with its
start time from ``/proc`` (a pid the kernel reused is not the session).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..core.errors import UsageError

# "$@" runs the session; its status goes to $0 (the exit file) when it ends on its own
WRAPPER = '"$@"; s=$?; echo "$s" > "$0.tmp" && mv "$0.tmp" "$0"; exit "$s"'
HARNESS_BINS = {"claude": "STORM_TEAM_CLAUDE", "codex": "STORM_TEAM_CODEX"}


@dataclass
class Started:
    pid: int
    pstart: int | None
    proc: subprocess.Popen[bytes]


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone
    (or a zombie: it has ended, only its parent has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    if not rest or rest[0] in (b"Z", b"X"):
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int | None, pstart: int | None) -> bool:
    if not pid:
        return False
    now = proc_start(pid)
    return now is not None and (pstart is None or now == pstart)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(argv: list[str], *, cwd: str, env: dict[str, str], out: str, err: str, exit_file: str) -> Started:
    """Start ``argv`` as the leader of a new process group; transcripts appended."""
    try:
        os.unlink(exit_file)
    except FileNotFoundError:
        pass
    with open(out, "ab") as fo, open(err, "ab") as fe:
        try:
            proc = subprocess.Popen(["sh", "-c", WRAPPER, exit_file, *argv], cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True)
        except OSError as exc:
            raise UsageError(f"cannot start {argv[0]}: {exc}", hint="check the harness command") from None
    return Started(proc.pid, proc_start(proc.pid), proc)


def exit_status(exit_file: str) -> int | None:
    try:
        with open(exit_file, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def end(pid: int, pstart: int | None, grace: float = 5.0) -> bool:
    """End the session's whole process group: SIGTERM, then SIGKILL after ``grace``
    seconds. False when the pid is not (any longer) that session."""
    if not alive(pid, pstart) and not group_alive(pid):
        return False
    if alive(pid, pstart) or group_alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(pid):
        time.sleep(0.05)
    if group_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


# -- what each harness is started with ------------------------------------------------------
def harness_bin(name: str) -> str:
    """The harness's program: ``$STORM_TEAM_CLAUDE`` / ``$STORM_TEAM_CODEX``, else on PATH."""
    found = os.environ.get(HARNESS_BINS[name]) or shutil.which(name)
    if not found:
        raise UsageError(f"{name} is not installed (not on PATH)",
                         hint=f"install it, or set {HARNESS_BINS[name]} to its path, or use --harness-cmd")
    return found


def argv_for(harness: str, prompt: str, *, cmd: str | None = None, extra: list[str] | None = None,
             read_only: bool = False) -> list[str]:
    """The session's command line. ``read_only``: the harness's own read-only mode
    (the manager's planning session), besides storm's refusal of its writes."""
    extra = list(extra or [])
    if harness == "cmd":
        if not cmd:
            raise UsageError("the cmd harness needs --harness-cmd 'SHELL COMMAND'")
        return ["sh", "-c", cmd]
    if harness == "claude":
        perm = ["--permission-mode", "plan"] if read_only else ["--dangerously-skip-permissions"]
        return [harness_bin("claude"), "-p", prompt, "--output-format", "stream-json", "--verbose", *perm, *extra]
    if harness == "codex":
        perm = ["--sandbox", "read-only"] if read_only else ["--dangerously-bypass-approvals-and-sandbox"]
        return [harness_bin("codex"), "exec", "--json", *perm, "--skip-git-repo-check", *extra, prompt]
    raise UsageError(f"unknown harness {harness!r}", hint="use claude, codex or --harness-cmd")


def storm_cli(args: list[str], *, cwd: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``git storm ARGS`` through its public command line (the team uses the verbs as a
    user would: assign, harness install/status, merge, commit)."""
    return subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def install_hooks(harness: str, top: str, env: dict[str, str]) -> str | None:
    """Install storm's hooks for ``harness`` at project scope (Codex: with its trust)
    and check that a session started at ``top`` will run them; None when it will,
    else why not (the session is then not started)."""
    args = ["harness", "install", harness, "--json"] + (["--trust"] if harness == "codex" else [])
    r = storm_cli(args, cwd=top, env=env)
    if r.returncode != 0:
        return f"git storm harness install {harness} failed: {(r.stderr or r.stdout).strip()[:300]}"
    r = storm_cli(["harness", "status", "--json"], cwd=top, env=env)
    try:
        rows = json.loads(r.stdout)
    except ValueError:
        return f"git storm harness status gave no answer: {r.stderr.strip()[:300]}"
    rows = rows.get("harnesses", rows) if isinstance(rows, dict) else rows
    mine = next((h for h in rows if isinstance(h, dict) and h.get("harness") == harness), None)
    if mine is None or not mine.get("active"):
        missing = "; ".join(mine.get("missing", [])) if mine else "no answer for it"
        return f"storm's {harness} hooks would not run in a session here: {missing}"
    return None


def usage(harness: str, transcript: str) -> tuple[int | None, float | None]:
    """Tokens and cost a session's JSON output reports (Claude Code's ``result``
    event; Codex's ``turn.completed`` usage, which carries no cost)."""
    tokens: int | None = None
    cost: float | None = None
    try:
        with open(transcript, "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        if not line.startswith(b"{"):
            continue
        try:
            ev: Any = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        u = ev.get("usage")
        if harness == "claude" and ev.get("type") == "result":
            if isinstance(ev.get("total_cost_usd"), (int, float)):
                cost = (cost or 0.0) + float(ev["total_cost_usd"])
            if isinstance(u, dict):
                tokens = (tokens or 0) + sum(int(v) for k, v in u.items()
                                             if k.endswith("tokens") and isinstance(v, int))
        elif harness == "codex" and ev.get("type") == "turn.completed" and isinstance(u, dict):
            tokens = (tokens or 0) + sum(int(v) for k, v in u.items()
                                         if k in ("input_tokens", "output_tokens") and isinstance(v, int))
    return tokens, cost
