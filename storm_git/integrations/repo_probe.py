"""Where a directory's git repository keeps its files, found without pygit2.

The harness hook's cheapest answers (not a storm repository at all; which hook
daemon serves this repository) must come before pygit2 is imported, which costs
several times a bare Python start. Only the standard library is used here, and
anything unusual (GIT_DIR or config in the environment, an unreadable ``.git``
file) answers "cannot tell" so that the caller takes the full path.
"""
from __future__ import annotations

import os


def unusual_env(env: "os._Environ[str] | dict[str, str]") -> bool:
    """True when git would not find the repository by walking up from a directory."""
    return any(k.startswith("GIT_CONFIG") or k in ("GIT_DIR", "GIT_COMMON_DIR") for k in env)


def git_dirs(cwd: str) -> tuple[str, str] | None | bool:
    """``(git dir, common dir)`` of the repository holding ``cwd``; ``None`` when
    there is surely none; ``False`` when it cannot be told without git."""
    d = os.path.abspath(cwd)
    while True:
        dot = os.path.join(d, ".git")
        if os.path.isdir(dot):
            gitdir = dot
            break
        if os.path.isfile(dot):
            try:
                with open(dot, encoding="utf-8") as fh:
                    line = fh.read().strip()
            except (OSError, UnicodeDecodeError):
                return False
            if not line.startswith("gitdir:"):
                return False
            gitdir = os.path.join(d, line[7:].strip())
            break
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    common = gitdir
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as fh:
            common = os.path.join(gitdir, fh.read().strip())
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError):
        return False
    return gitdir, os.path.normpath(common)


def config_files(gitdir: str, common: str, env: "os._Environ[str] | dict[str, str]") -> list[str]:
    """The config files git reads for this repository, includes aside (honouring
    GIT_CONFIG_GLOBAL, GIT_CONFIG_SYSTEM and GIT_CONFIG_NOSYSTEM)."""
    home = env.get("HOME") or os.path.expanduser("~")
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.path.join(common, "config"), os.path.join(gitdir, "config.worktree")]
    files += [env["GIT_CONFIG_GLOBAL"]] if env.get("GIT_CONFIG_GLOBAL") else [
        os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")]
    if env.get("GIT_CONFIG_NOSYSTEM", "").lower() not in ("1", "true", "yes", "on"):
        files.append(env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig")
    return files


def config_mentions(path: str, words: tuple[bytes, ...]) -> bool:
    """True unless the config file at ``path`` surely contains none of ``words``
    (lower case; absent file: none)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().lower()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return any(w in text for w in words)
