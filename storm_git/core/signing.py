"""``commit.gpgSign``: the commits storm puts on a person's branch are signed as git's are.

The manager's commit (storm mode) and the merge commits of ``git storm merge``
(worktree mode) land on the user's branch. libgit2 makes them unsigned whatever
``commit.gpgSign`` says, and a repository that requires signed commits (a host's
branch protection, ``git verify-commit`` in CI) would refuse the branch. When
signing is asked for, such a commit is made by ``git commit-tree -S``, so git's
own signing settings hold (``gpg.format`` openpgp, ssh or x509, ``gpg.program``,
``user.signingKey``, an agent holding the key), and a signature
that cannot be made is an error before the branch moves. The shared workspace's
own commits (one per accepted write, on ``refs/storm/workspace``) are storm's
record, not a person's branch, and stay unsigned: a signing process per write
would cost more than the write.
"""
from __future__ import annotations

import pygit2

from .errors import RepoStateError
from .gitcmd import run_git
from .objects import odb_retry
from .store import Store


class SigningFailed(RepoStateError):
    kind = "signing_failed"


def wanted(store: Store, override: bool | None = None) -> bool:
    """Whether to sign: ``override`` (--gpg-sign / --no-gpg-sign), else ``commit.gpgSign``."""
    return store.config_bool("commit.gpgSign", False) if override is None else override


def _date(sig: pygit2.Signature) -> str:
    off = sig.offset
    return f"@{sig.time} {'-' if off < 0 else '+'}{abs(off) // 60:02d}{abs(off) % 60:02d}"


def make_commit(store: Store, tree: pygit2.Oid, parents: list[pygit2.Oid], author: pygit2.Signature,
                committer: pygit2.Signature, message: str, *, sign: bool) -> pygit2.Oid:
    """A commit object (no ref moves), signed by git when ``sign``."""
    if not sign:
        return odb_retry(store.repo.create_commit, None, author, committer, message, tree, parents)
    env = {"GIT_AUTHOR_NAME": author.name, "GIT_AUTHOR_EMAIL": author.email, "GIT_AUTHOR_DATE": _date(author),
           "GIT_COMMITTER_NAME": committer.name, "GIT_COMMITTER_EMAIL": committer.email,
           "GIT_COMMITTER_DATE": _date(committer)}
    args = ["--git-dir", store.commondir, "commit-tree", "-S", str(tree)]
    for p in parents:
        args += ["-p", str(p)]
    r = run_git(args, store.top, env=env, input=message.encode("utf-8"), check=False)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith(("fatal:", "error:"))), lines[0] if lines else "failed")
        raise SigningFailed(f"cannot sign the commit: {why}",
                            hint="check user.signingKey and gpg.format (git commit -S fails the same way), "
                                 "or commit unsigned once with --no-gpg-sign; nothing was changed")
    return pygit2.Oid(hex=r.stdout.decode().strip())
