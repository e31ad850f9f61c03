"""``commit.gpgSign``: the commits storm puts on a person's branch are signed as
git's are (storm_git.core.signing). Real keys (ssh-keygen: git's ``gpg.format=ssh``),
real ``git verify-commit``."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import git, make_repo, rev, snapshot_refs, storm, storm_json

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="git's ssh signing needs ssh-keygen")


def signing_repo(tmp_path: Path) -> Path:
    """A repository whose commits must be signed, with an ssh key git verifies."""
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "t", "-f", str(key)], check=True)
    r = make_repo(tmp_path / "repo")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'signer@example.org namespaces="git" {(tmp_path / "key.pub").read_text()}')
    for k, v in (("gpg.format", "ssh"), ("user.signingKey", str(tmp_path / "key.pub")),
                 ("gpg.ssh.allowedSignersFile", str(allowed)), ("commit.gpgSign", "true")):
        git(r, "config", k, v)
    return r


def verified(repo: Path, commit: str = "HEAD") -> bool:
    return git(repo, "verify-commit", commit, check=False).returncode == 0


def test_the_managers_commit_is_signed_when_commit_gpgsign_says_so(tmp_path):
    r = signing_repo(tmp_path)
    assert storm(r, "read", "README.md", agent="e1").returncode == 0
    assert storm(r, "write", "README.md", input="# signed\n", agent="e1").returncode == 0
    c = storm(r, "commit", "-m", "integrate")
    assert c.returncode == 0, c.stderr
    assert verified(r), "the manager's commit landed unsigned on a branch that asks for signatures"

    assert storm(r, "write", "README.md", input="# once unsigned\n", agent="e1").returncode == 0
    assert storm(r, "commit", "-m", "unsigned", "--no-gpg-sign").returncode == 0
    assert not verified(r) and b"gpgsig" not in git(r, "cat-file", "commit", "HEAD").stdout


def test_a_signature_that_cannot_be_made_leaves_the_branch_where_it_was(tmp_path):
    r = signing_repo(tmp_path)
    git(r, "config", "user.signingKey", str(tmp_path / "no-such-key.pub"))
    assert storm(r, "read", "README.md", agent="e1").returncode == 0
    assert storm(r, "write", "README.md", input="# x\n", agent="e1").returncode == 0
    before = snapshot_refs(r)
    res = storm(r, "commit", "-m", "integrate")
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "cannot sign the commit" in res.stderr and "Traceback" not in res.stderr
    code, out = storm_json(r, "commit", "-m", "integrate")
    assert code == 3 and out["error"]["kind"] == "signing_failed", out
    assert snapshot_refs(r) == before  # neither the branch nor storm's record of what it committed
    assert git(r, "status", "--porcelain").stdout.strip() != b""  # the index was not reset either


def test_worktree_mode_merge_commits_are_signed_too(tmp_path):
    r = signing_repo(tmp_path)
    assert storm(r, "mode", "worktree").returncode == 0
    for agent, path in (("e1", "src/a.py"), ("e2", "src/b.py")):
        assert storm(r, "spawn", agent).returncode == 0
        assert storm(r, "write", path, input=f"# {agent}\n", agent=agent).returncode == 0
        c = storm(r, "commit", "--agent", agent, "-m", f"{agent} work")
        assert c.returncode == 0, c.stderr
    res = storm(r, "merge")
    assert res.returncode == 0, res.stderr
    head = rev(r, "refs/heads/main")
    merges = git(r, "rev-list", "--merges", "main").stdout.decode().split()
    assert len(merges) == 2 and head == merges[0]
    assert all(verified(r, m) for m in merges), "merge commits landed unsigned"
    dry = storm(r, "merge", "--dry-run")
    assert dry.returncode == 0, dry.stderr
