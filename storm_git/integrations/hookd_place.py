"""Which hook daemon serves a call, and where its socket and lock live.

A daemon is named by the *fingerprint* of the storm it runs (the interpreter,
storm's version and the size and modification time of every file of the
installed package) and by the confinement of the callers it serves
(:mod:`hookd_peer`). A client computes the fingerprint of the storm it was started
from, so after an upgrade (or an edit of an editable install) it looks for a
daemon under another name and never reaches the old one, which exits when it
notices its files changed or when it is idle. Standard library only: the client
runs this before anything else.

Layout, under ``<git common dir>/storm/hookd/`` (mode 0700):

* ``<name>.lock``: held by the daemon for its whole life (only one per name);
* ``<name>.sock``: its unix socket (mode 0600). When that path would pass the
  kernel's limit for socket paths (107 bytes), the socket goes in a directory of
  the user's own instead: ``$XDG_RUNTIME_DIR/storm-hookd/`` or else (unset, or
  too long too) ``/tmp/storm-hookd-<uid>/``, which must be the user's and mode
  0700.
"""
from __future__ import annotations

import os
import sys
import zlib

SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with its terminating NUL
DIR = "hookd"


def fingerprint(package_dir: str, version: str) -> str:
    """The identity of the storm in ``package_dir``: changes when any of its files
    does, or the interpreter."""
    rows = [f"storm {version}", sys.prefix, os.path.realpath(sys.executable), sys.version, package_dir]
    stack = [package_dir]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            rows.append(f"? {d}")
            continue
        for e in entries:
            if e.name == "__pycache__":
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    continue
                st = e.stat()
            except OSError:
                rows.append(f"? {e.path}")
                continue
            rows.append(f"{e.path} {st.st_size} {st.st_mtime_ns} {st.st_ino}")
    return "\n".join(rows)


def name(fp: str, env: "dict[bytes, bytes] | os._Environ[bytes]") -> str:
    """The daemon's name for callers of storm ``fp`` confined as this process is,
    with ``env``'s programs and configuration (hookd_peer.key)."""
    from . import hookd_peer

    return fp + "\n" + hookd_peer.key(env)


def _short(text: str) -> str:
    data = text.encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def hookd_dir(common: str) -> str:
    return os.path.join(common, "storm", DIR)


def lock_path(common: str, fp: str) -> str:
    return os.path.join(hookd_dir(common), _short(fp) + ".lock")


def pages_path(common: str, fp: str) -> str:
    """The pages the running daemon's calls wrote to (integrations.hookd_spare)."""
    return os.path.join(hookd_dir(common), _short(fp) + ".pages")


def private_dirs(env: "os._Environ[str] | dict[str, str]") -> list[str]:
    """The user's own directories for sockets whose path in the git dir is too long."""
    runtime = env.get("XDG_RUNTIME_DIR")
    fallback = f"/tmp/storm-hookd-{os.getuid()}"
    return [os.path.join(runtime, "storm-hookd"), fallback] if runtime and os.path.isabs(runtime) else [fallback]


def socket_path(common: str, fp: str, env: "os._Environ[str] | dict[str, str]") -> str:
    path = os.path.join(hookd_dir(common), _short(fp) + ".sock")
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path
    name = _short(common + "\n" + fp) + ".sock"
    for d in private_dirs(env):
        path = os.path.join(d, name)
        if len(os.fsencode(path)) <= SUN_PATH_MAX:
            break
    return path  # (too long even there: connecting fails, and every call runs in its own process)


def dir_is_private(path: str) -> bool:
    """True when ``path`` is a real directory (no symlink) of this user that no one
    else may enter or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
