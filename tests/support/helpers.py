"""Helpers shared by the tests: real repositories in temporary directories and
the real ``git storm`` command line in subprocesses (no mocks of git)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent  # this folder: the helpers and the writer scripts
ROOT = SUPPORT.parent.parent  # the project: README.md, docs/, man/, storm_git/

DEFAULT_FILES = {
    "src/api.py": "def fetch(url):\n    return http_get(url)\n",
    "src/client.py": "from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n",
    "src/util.py": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "README.md": "# service\n",
}


def shared_data(name: str) -> Path | None:
    """``shared/data/NAME`` beside the checkout (or beside the main checkout of a git
    worktree), or None when it is not there: the real data some tests replay."""
    common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    for top in (ROOT, Path(common).parent if common else ROOT):
        d = top.parent / "shared" / "data" / name
        if d.exists():
            return d
    return None


def git(repo: str | Path, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, input=input)


@contextlib.contextmanager
def no_maintenance(repo: str | Path) -> Iterator[None]:
    """Hold off storm's maintenance (waiting for a running one): a write may have
    started a detached ``maintenance --auto`` whose repack moves objects and packs refs."""
    from storm_git.core.maintenance import quiesced

    with quiesced(str(Path(repo) / ".git")):
        yield


def fsck(repo: str | Path) -> subprocess.CompletedProcess:
    """``git fsck`` once no storm maintenance runs: fsck beside a running repack reports
    objects that move from loose to a pack as missing (git's race, not a lost object)."""
    with no_maintenance(repo):
        return git(repo, "fsck", "--no-progress", "--no-dangling", check=False)


def make_repo(path: str | Path, files: dict[str, str | bytes] | None = None, *, init_storm: bool = True) -> Path:
    """A git repository with ``files`` committed on main (and ``git storm init`` run).

    Built once per worker for each set of files and git environment, then copied: a
    build is seven git and storm processes (~85 ms of CPU) and a copy ~10 ms, over
    more than a thousand repositories a run. The copy's index is refreshed, so git
    sees its files as committed here. A directory that already holds files is built
    in place, as before (its files are committed with the rest)."""
    path = Path(path)
    files = DEFAULT_FILES if files is None else files
    if path.exists() and any(path.iterdir()):
        return _build_repo(path, files, init_storm)
    key = setup_key(files, init_storm)
    template = _TEMPLATES.get(key)
    if template is None:
        template = _build_repo(setup_dir("repo-") / "repo", files, init_storm)  # made with the umask, as a test's
        _TEMPLATES[key] = template
    shutil.copytree(template, path, symlinks=True, dirs_exist_ok=True)
    git(path, "update-index", "-q", "--refresh")
    return path


_TEMPLATES: dict[tuple, Path] = {}


def setup_dir(prefix: str) -> Path:
    """A new folder (mode 0700) to keep a set-up in for copying, removed when the worker
    ends. Make the set-up below it: a copy takes its top folder's mode."""
    import atexit
    import tempfile

    global _SETUPS
    if _SETUPS is None:
        _SETUPS = Path(tempfile.mkdtemp(prefix="storm-test-setups-"))
        atexit.register(shutil.rmtree, _SETUPS, True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_SETUPS))


_SETUPS: Path | None = None


def setup_key(files: dict[str, str | bytes], init_storm: bool) -> tuple:
    """Everything a build reads: the files, storm or not, git's and storm's environment,
    the user's git config files and the umask."""
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith(("GIT_", "STORM_", "XDG_")) or k in ("HOME", "PATH")))
    home = os.environ.get("HOME", "")
    configs = []
    for name in (os.environ.get("GIT_CONFIG_GLOBAL") or os.path.join(home, ".gitconfig"),
                 os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "git", "config")):
        try:
            configs.append(Path(name).read_bytes())
        except OSError:
            configs.append(None)
    mask = os.umask(0)
    os.umask(mask)
    content = tuple(sorted((rel, c.encode() if isinstance(c, str) else c) for rel, c in files.items()))
    return content, init_storm, env, tuple(configs), mask, sys.executable


def _build_repo(path: Path, files: dict[str, str | bytes], init_storm: bool) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for rel, content in files.items():
        full = path / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(content.encode() if isinstance(content, str) else content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    if init_storm:
        r = storm(path, "init")
        assert r.returncode == 0, r.stderr
    return path


# STORM_TEST_FRESH=1: every storm() call starts a new interpreter (python -m storm_git),
# as a user's `git storm` does. By default a call is a process forked from this one,
# which has already imported storm, pygit2 and click: the same command line, its own
# pid, cwd, environment, stdin, stdout, stderr and exit status, without the ~0.2 s of
# CPU an interpreter start and those imports cost (most of the suite's time: it makes
# thousands of calls). Tests of start-up itself (python -m storm_git, git's dispatch to
# git-storm, the hooks) run real new processes, and tests/test_fresh_process.py runs a
# sample of commands both ways and compares them.
FRESH = os.environ.get("STORM_TEST_FRESH") == "1"


def storm(cwd: str | Path, *args: str, input: bytes | str | None = None, agent: str | None = None,
          env: dict[str, str] | None = None, timeout: float = 120, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run ``git storm ARGS`` in ``cwd`` as its own process; text output.
    ``fresh``: a new interpreter (``python -m storm_git``) even when forking is the default."""
    e = dict(os.environ)
    e.pop("STORM_AGENT", None)
    if agent is not None:
        e["STORM_AGENT"] = agent
    if env:
        e.update(env)
    data = input.encode() if isinstance(input, str) else input
    if fresh or FRESH:
        r = subprocess.run([sys.executable, "-m", "storm_git", *args], cwd=cwd, input=data,
                           capture_output=True, env=e, timeout=timeout)
    else:
        r = _forked([*args], str(cwd), data, e, timeout)
    r.stdout = r.stdout.decode("utf-8", "replace")
    r.stderr = r.stderr.decode("utf-8", "replace")
    return r


def _forked(args: list[str], cwd: str, data: bytes | None, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
    """``git storm ARGS`` in a child forked from this process (see FRESH)."""
    from storm_git.cli.main import main  # imported here, before the fork, once per worker

    fds = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    pid = os.fork()
    if pid == 0:  # the child: become `git storm ARGS` and never return into pytest
        code = 1
        try:
            os.dup2(fds[0][0], 0)
            os.dup2(fds[1][1], 1)
            os.dup2(fds[2][1], 2)
            for r, w in fds:
                os.close(r)
                os.close(w)
            _become_fresh(cwd, env)
            code = 0
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # what a fresh interpreter does with an uncaught exception
                import traceback

                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(fds[0][0])
    os.close(fds[1][1])
    os.close(fds[2][1])
    status, out, err = _wait_forked(pid, fds[0][1], fds[1][0], fds[2][0], data, time.monotonic() + timeout)
    if status is None:
        raise subprocess.TimeoutExpired(["git", "storm", *args], timeout)
    return subprocess.CompletedProcess(["git", "storm", *args], os.waitstatus_to_exitcode(status), out, err)


def _wait_forked(pid: int, stdin: int, stdout: int, stderr: int, data: bytes | None,
                 deadline: float) -> tuple[int | None, bytes, bytes]:
    """Feed ``data`` to the child, read its two streams to their end and reap it, in one
    loop that sleeps until one of them is ready (a pidfd for the exit): no thread and no
    polling per call, which thousands of calls paid in the worker's CPU. The status is
    None when the deadline came first (the child, if still running, is killed and reaped)."""
    import selectors

    chunks: dict[int, list[bytes]] = {stdout: [], stderr: []}
    pending = memoryview(data or b"")
    pidfd = os.pidfd_open(pid)
    status: int | None = None
    timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        sel.register(stderr, selectors.EVENT_READ)
        sel.register(pidfd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(stdin, False)
            sel.register(stdin, selectors.EVENT_WRITE)
        else:
            os.close(stdin)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:  # as subprocess.run's timeout: the child, or what holds its pipes, is late
                    timed_out = True
                    break
                for key, _ in sel.select(left):
                    fd = key.fd
                    if fd == pidfd:
                        sel.unregister(fd)
                        status = os.waitpid(pid, 0)[1]
                    elif fd == stdin:
                        try:
                            pending = pending[os.write(fd, pending[:1 << 16]):]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # the child stopped reading: as a pipe's writer sees it
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(fd)
                            os.close(fd)
                    else:
                        b = os.read(fd, 1 << 16)
                        if b:
                            chunks[fd].append(b)
                        else:
                            sel.unregister(fd)
                            os.close(fd)
        finally:
            for key in list(sel.get_map().values()):
                if key.fd != pidfd:
                    os.close(key.fd)
            os.close(pidfd)
            if status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    if timed_out:
        status = None
    return status, b"".join(chunks[stdout]), b"".join(chunks[stderr])


def _become_fresh(cwd: str, env: dict[str, str]) -> None:
    """What a new ``git storm`` process would start with: its directory, environment,
    standard streams, argv and libgit2's config search paths (read from HOME and
    XDG_CONFIG_HOME at libgit2's start, which in this worker was before the tests
    set them), and no signal handler of pytest's."""
    import io

    import pygit2
    from pygit2.enums import ConfigLevel

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    enc = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc,
                                 errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding=enc,
                                  errors="surrogateescape")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding=enc,
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = ["git-storm"]
    home = env.get("HOME", "")
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    pygit2.settings.search_path[ConfigLevel.GLOBAL] = home
    pygit2.settings.search_path[ConfigLevel.XDG] = os.path.join(xdg, "git")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN if sig == signal.SIGPIPE else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def storm_json(cwd: str | Path, *args: str, **kw: Any) -> tuple[int, Any]:
    r = storm(cwd, *args, "--json", **kw)
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None


def rev(repo: str | Path, ref: str) -> str:
    return git(repo, "rev-parse", ref).stdout.decode().strip()


def show(repo: str | Path, ref: str, path: str) -> bytes:
    return git(repo, "show", f"{ref}:{path}").stdout


def snapshot_refs(repo: str | Path) -> str:
    """Every ref and its value: to assert that a refused command changed nothing."""
    return git(repo, "for-each-ref", "--format=%(refname) %(objectname)").stdout.decode()


STORM_LOCKS = Path(".git/storm/locks")


def hold(repo: str | Path, *names: str, seconds: float = 120) -> subprocess.Popen:
    """Hold storm's flocks ``names`` (in that order) from another process, as a storm
    process would; returns once the last is held. ``release`` ends it early."""
    paths = [Path(repo) / STORM_LOCKS / n for n in names]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    cmd: list[str] = []
    for p in paths:  # -o: held by flock itself, not inherited by sleep: killing the group frees it
        cmd += ["flock", "-o", str(p)]
    proc = subprocess.Popen(cmd + ["sleep", str(seconds)], start_new_session=True)
    deadline = time.monotonic() + 10
    while subprocess.run(["flock", "-n", str(paths[-1]), "true"]).returncode == 0:
        assert time.monotonic() < deadline, "could not take the lock"
        time.sleep(0.01)
    return proc


def flock_waiters(path: str | Path, pid: int | None = None) -> int:
    """Processes (or only ``pid``) blocked in flock() on ``path``, from /proc/locks,
    matched on the whole device:inode field (an inode number alone also matches files
    of other filesystems: with the suite's workers locking files on several, a waiter
    counted that way was another test's)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    n = 0
    with open("/proc/locks") as fh:
        for line in fh:
            parts = line.split()  # "N: -> FLOCK ADVISORY WRITE <pid> <maj:min:ino> 0 EOF"
            if len(parts) >= 7 and parts[1] == "->" and parts[2] == "FLOCK" and parts[6] == dev:
                n += pid is None or parts[5] == str(pid)
    return n


def start_write(repo: str | Path, agent: str, path: str, content: str | bytes, *args: str) -> subprocess.Popen:
    """``git storm write PATH ARGS…`` started in the background with ``content`` on its
    stdin (already closed): a writer to race, kill or hold at a lock."""
    env = dict(os.environ, STORM_AGENT=agent)
    p = subprocess.Popen([sys.executable, "-m", "storm_git", "write", path, *args], cwd=repo, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None
    p.stdin.write(content.encode() if isinstance(content, str) else content)
    p.stdin.close()
    p.stdin = None  # communicate() must not flush it again
    return p


PY_PROJECT = {  # a small Python package: imports, a re-export, a class, a caller
    "pkg/__init__.py": "from .core import helper\n",
    "pkg/core.py": "def helper():\n    return 1\n",
    "pkg/models.py": "class User:\n    name = ''\n",
    "app.py": "from pkg import helper\nfrom pkg.models import User\n\n\ndef run():\n    return helper(), User()\n",
    "notes.py": "X = 1\n",
    "README.md": "# demo\n",
}


def release(holder: subprocess.Popen) -> None:
    """End a ``hold`` early (the whole process group: the flocks and the sleep)."""
    try:
        os.killpg(holder.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    holder.wait()


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``r``, asserted to have exited 0 (its output in the message otherwise)."""
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def start_storm(repo: str | Path, *args: str, agent: str | None = None,
                input: bytes | None = None) -> subprocess.Popen:
    """``git storm ARGS…`` started in the background (stdin given, then closed): a
    command to race, kill or hold at a lock."""
    env = dict(os.environ)
    env.pop("STORM_AGENT", None)
    if agent:
        env["STORM_AGENT"] = agent
    p = subprocess.Popen([sys.executable, "-m", "storm_git", *args], cwd=repo, env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None
    if input is not None:
        p.stdin.write(input)
    p.stdin.close()
    p.stdin = None  # communicate() must not flush it again
    return p


# -- agents reading, changing and writing through the command line (the --deps tests)
def read_as(repo: str | Path, agent: str, *paths: str) -> None:
    r = storm(repo, "read", *paths, agent=agent)
    assert r.returncode == 0, r.stderr


def change_as(repo: str | Path, path: str, old: str, new: str, agent: str = "b") -> None:
    """``agent`` reads ``path`` and replaces ``old`` by ``new`` in it."""
    read_as(repo, agent, path)
    r = storm(repo, "edit", path, "--old", old, "--new", new, agent=agent)
    assert r.returncode == 0, r.stderr


def accepted_write(repo: str | Path, agent: str, path: str, text: str) -> None:
    """``agent`` reads ``path`` and writes ``text`` over it; the write must be accepted."""
    read_as(repo, agent, path)
    r = storm(repo, "write", path, input=text, agent=agent)
    assert r.returncode == 0, r.stderr


def write_as(repo: str | Path, path: str, content: str | bytes, *args: str, agent: str = "a") -> tuple[int, Any]:
    return storm_json(repo, "write", path, *args, input=content, agent=agent)


# -- the events agent harnesses send to `git storm harness hook`
def claude_event(repo: Path, session: str, event: str, tool: str, tool_input: dict, use_id: str,
                 response: dict | None = None) -> dict:
    """An event as Claude Code sends it (hooks reference)."""
    e = {
        "session_id": session,
        "transcript_path": f"/home/u/.claude/projects/repo/{session}.jsonl",
        "cwd": str(repo),
        "permission_mode": "default",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": use_id,
    }
    if event == "PostToolUse":
        e["tool_response"] = response if response is not None else {"filePath": tool_input.get("file_path"),
                                                                      "success": True}
    return e


def codex_event(repo: Path, session: str, event: str, tool: str, command: str, use_id: str) -> dict:
    """An event as Codex sends it (hooks page: Claude's envelope plus model and turn_id)."""
    e = {
        "session_id": session,
        "transcript_path": None,
        "cwd": str(repo),
        "hook_event_name": event,
        "model": "gpt-5-codex",
        "turn_id": "turn-1",
        "tool_name": tool,
        "tool_use_id": use_id,
        "tool_input": {"command": command},
    }
    if event == "PostToolUse":
        e["tool_response"] = {"output": "Success. Updated the following files", "exit_code": 0}
    return e


def hook(repo: Path, event: dict | str, *args: str, env: dict | None = None):
    data = event if isinstance(event, str) else json.dumps(event)
    return storm(repo, "harness", "hook", *args, input=data, env=env)


def decision(r) -> dict | None:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout) if r.stdout.strip() else None


def commit_env(agent: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a plain ``git commit``: STORM_AGENT only when ``agent`` is given."""
    env = {k: v for k, v in os.environ.items() if k != "STORM_AGENT"}
    if agent:
        env["STORM_AGENT"] = agent
    env.update(extra)
    return env


def git_commit(cwd: str | Path, *args: str, agent: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    """A plain ``git commit`` (text output), through storm's pre-commit guard when init installed it."""
    return subprocess.run(["git", "commit", *args], cwd=cwd, capture_output=True, text=True,
                          env=commit_env(agent, **extra))


def journal(repo: Path, agent: str) -> Path:
    """The agent's read-set journal file (storm_git.core.readsets)."""
    return repo / ".git" / "storm" / "journal" / agent


def strace_works() -> bool:
    """strace is installed and may trace (and inject into) this user's processes."""
    if not shutil.which("strace"):
        return False
    r = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "inject=renameat2:delay_enter=1", "true"],
                       capture_output=True)
    return r.returncode == 0
