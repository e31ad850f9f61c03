"""Running a command in the shared working tree as a shell would: exit codes 126/127,
signals forwarded, a timeout ending the whole process group."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Any

from ..core.errors import UsageError

KILL_GRACE_SECONDS = 2.0


class CommandNotFound(UsageError):
    """``exec`` of a program that does not exist: exit 127, as a shell does."""

    kind = "command_not_found"
    exit_code = 127


class CommandNotExecutable(UsageError):
    """``exec`` of a file that cannot be run: exit 126, as a shell does."""

    kind = "command_not_executable"
    exit_code = 126


def resolve(argv0: str, cwd: str) -> str:
    if "/" in argv0:
        full = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if not os.path.exists(full):
            raise CommandNotFound(f"command not found: {argv0}")
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            raise CommandNotExecutable(f"{argv0} is not executable",
                                       hint="chmod +x it, or run it through its interpreter")
        return full
    found = shutil.which(argv0)
    if found is None:
        raise CommandNotFound(f"command not found: {argv0}",
                              hint="check the name and PATH; git storm exec -- CMD ARGS...")
    return found


def run(argv: list[str], cwd: str, timeout: float | None) -> tuple[int, bool]:
    """Run with inherited stdio; (returncode, timed_out).

    On a terminal the command stays in storm's (foreground) process group, so it
    can read the terminal and Ctrl-C reaches it directly; storm ignores SIGINT
    and SIGQUIT meanwhile and records nothing if the command dies of a signal.
    Otherwise the command gets its own process group, so a timeout or a signal to
    storm ends all of it."""
    foreground = _on_terminal()
    proc: subprocess.Popen | None = None
    pending: list[int] = []  # signals that came before the command existed

    def kill(sig: int) -> None:
        if proc is None:
            pending.append(sig)
            return
        try:
            if foreground:
                proc.send_signal(sig)
            else:
                os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def forward(signum: int, _frame: Any) -> None:
        kill(signum)

    # installed before the spawn: a Ctrl-C in the window between the two would
    # otherwise stop storm itself while the command goes on
    old = {}
    handlers: dict[signal.Signals, Any] = (
        {signal.SIGINT: signal.SIG_IGN, signal.SIGQUIT: signal.SIG_IGN, signal.SIGTERM: forward,
         signal.SIGHUP: forward} if foreground else
        {signal.SIGINT: forward, signal.SIGTERM: forward, signal.SIGHUP: forward})
    for s, h in handlers.items():
        try:
            old[s] = signal.signal(s, h)
        except ValueError:  # not the main thread
            break
    # the command gets the dispositions storm was started with (ignored stays ignored,
    # as a shell keeps it; a handler becomes the default), not the ignore set just now
    inherit = [(s, signal.SIG_IGN if h == signal.SIG_IGN else signal.SIG_DFL)
               for s, h in old.items() if s in (signal.SIGINT, signal.SIGQUIT)]

    def restore() -> None:
        for s, h in inherit:
            signal.signal(s, h)

    try:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, process_group=None if foreground else 0,
                                    preexec_fn=restore if inherit else None)
        except PermissionError:
            raise CommandNotExecutable(f"{argv[0]} is not executable") from None
        except FileNotFoundError:
            raise CommandNotFound(f"command not found: {argv[0]}") from None
        for sig in pending:
            kill(sig)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
                kill(sig)
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            proc.wait()
            return proc.returncode, True
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _on_terminal() -> bool:
    """stdin is a terminal and storm is in its foreground process group."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False
