"""Every bad input gets one clear line, exit 2 (3 for repository
state), and changes nothing — refs, notes and the working tree stay as they were."""
from __future__ import annotations

import os
import subprocess

import pytest

from helpers import git, snapshot_refs, storm


def _assert_refused(repo, r, code: int, words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert words in lines[0], lines[0]


def _tree_state(repo) -> str:
    return git(repo, "status", "--porcelain", "--ignored").stdout.decode()


@pytest.mark.parametrize("path,words", [
    ("/etc/passwd", "outside the repository"),  # absolute paths inside the tree are accepted
    ("../escape.txt", "outside the repository"),
    ("src/../../escape.txt", "outside the repository"),
    (".git/config", "inside .git"),
    ("src/.git/hooks/x", "inside .git"),
    (".GIT/config", "inside .git"),
    ("src", "directory"),
    ("src/", "directory"),
    (".", "top of the repository"),
    ("bad\nname", "newline"),
    ("x" * 300, "longer than"),
    ("src/api.py/inner", "is a file"),
])
def test_bad_paths_for_write(repo, path, words):
    before, disk = snapshot_refs(repo), _tree_state(repo)
    r = storm(repo, "write", path, input="x\n", agent="e1")
    _assert_refused(repo, r, 2, words)
    assert snapshot_refs(repo) == before and _tree_state(repo) == disk


def test_nul_in_path_is_refused_by_the_library(ws, repo):
    # argv cannot carry NUL, so check the library boundary directly
    from storm_git.core.errors import BadPath

    before = snapshot_refs(repo)
    with pytest.raises(BadPath, match="NUL"):
        ws.write("a\x00b", b"x", agent="e1")
    assert snapshot_refs(repo) == before


def test_symlink_leading_out_is_refused(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside, repo / "link_dir")
    os.symlink(outside / "secret.txt", repo / "link_file")
    before = snapshot_refs(repo)
    for path in ("link_dir/secret.txt", "link_dir/new.txt", "link_file"):
        r = storm(repo, "write", path, input="pwned\n", agent="e1")
        _assert_refused(repo, r, 2, "symbolic link")
        r = storm(repo, "read", path, agent="e1")
        _assert_refused(repo, r, 2, "symbolic link")
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert not (outside / "new.txt").exists()
    assert snapshot_refs(repo) == before


def test_symlink_inside_is_readable_not_writable(repo):
    os.symlink("src/api.py", repo / "alias.py")
    git(repo, "add", "alias.py")
    git(repo, "commit", "--no-verify", "-qm", "alias")
    git(repo, "update-ref", "refs/storm/workspace", "HEAD")
    r = storm(repo, "read", "alias.py", agent="e1")
    assert r.returncode == 0 and r.stdout == "src/api.py"  # the link text, as git stores it
    _assert_refused(repo, storm(repo, "write", "alias.py", input="x", agent="e1"), 2, "symbolic link")
    _assert_refused(repo, storm(repo, "write", "alias.py/x", input="x", agent="e1"), 2, "symbolic link")


@pytest.mark.parametrize("agent", ["bad agent", "-leading", "a..b", "x.lock", "a/b", "trailing.", "ü", "x" * 65,
                                   "a:b", "a~1", "a^", "a*"])
def test_bad_agent_ids(repo, agent):
    before = snapshot_refs(repo)
    r = storm(repo, "read", "README.md", "--agent", agent)
    _assert_refused(repo, r, 2, "invalid agent id")
    assert snapshot_refs(repo) == before


def test_missing_agent(repo):
    _assert_refused(repo, storm(repo, "read", "README.md"), 2, "no agent id")


def test_agent_from_environment(repo):
    r = storm(repo, "read", "README.md", agent="env_agent")
    assert r.returncode == 0
    assert storm(repo, "status").returncode == 0  # folds the agent's journal into its notes ref
    assert git(repo, "rev-parse", "-q", "--verify", "refs/notes/storm/agents/env_agent").returncode == 0


def test_content_over_size_limit(repo):
    git(repo, "config", "storm.maxFileBytes", "1k")
    before, disk = snapshot_refs(repo), _tree_state(repo)
    r = storm(repo, "write", "big.bin", input=b"x" * 1025, agent="e1")
    _assert_refused(repo, r, 2, "storm.maxFileBytes")
    assert snapshot_refs(repo) == before and _tree_state(repo) == disk and not (repo / "big.bin").exists()
    assert storm(repo, "write", "ok.bin", input=b"x" * 1024, agent="e1").returncode == 0


def test_directory_on_disk_where_file_expected(repo):
    (repo / "newdir").mkdir()
    (repo / "newdir" / "f").write_text("untracked\n")
    _assert_refused(repo, storm(repo, "write", "newdir", input="x", agent="e1"), 2, "directory")


def test_corrupt_config_is_repo_state(repo):
    git(repo, "config", "storm.mode", "sideways")
    before = snapshot_refs(repo)
    _assert_refused(repo, storm(repo, "read", "README.md", agent="e1"), 3, "storm.mode")
    assert snapshot_refs(repo) == before


@pytest.mark.parametrize("key,value,argv", [
    ("storm.maxFileBytes", "-5", ("write", "README.md")),  # was an internal error (a negative read length)
    ("storm.maxFileBytes", "12q", ("write", "README.md")),
    ("storm.autoMaintenance", "-1k", ("maintenance", "--auto")),
    ("storm.autoMaintenance", "often", ("maintenance", "--auto")),
])
def test_config_count_that_is_not_a_count_is_repo_state(repo, key, value, argv):
    git(repo, "config", key, value)
    before, disk = snapshot_refs(repo), _tree_state(repo)
    r = storm(repo, *argv, input="changed\n", agent="e1")
    _assert_refused(repo, r, 3, key)
    assert "0 or more" in r.stderr
    assert snapshot_refs(repo) == before and _tree_state(repo) == disk


def test_bad_auto_maintenance_setting_never_fails_a_landed_write(repo):
    """The trigger is looked at after the CAS (one write in 16): a setting it cannot
    read turns it off for that write instead of reporting a landed write as failed."""
    import pygit2

    from storm_git import open_workspace
    from storm_git.core import maintenance

    git(repo, "config", "storm.autoMaintenance", "often")
    ws = open_workspace(str(repo))

    class Due:  # a commit whose last byte makes this the write in 16 that looks
        raw = b"\x00"

    assert maintenance.after_write(ws.store, Due()) is False
    looked = 0
    for i in range(400):  # until two real writes were ones that look (1 in 16 each)
        ws.read(["README.md"], agent="e1")
        res = ws.write("README.md", b"v%d\n" % i, agent="e1")
        assert res.accepted
        looked += pygit2.Oid(hex=res.commit).raw[-1] % maintenance.CHECK_EVERY == 0  # as after_write decides
        if looked == 2:
            break
    assert looked == 2


@pytest.mark.parametrize("n,code", [("-1", 2), ("abc", 2), ("0", 0), ("99999999999999999999", 0)])
def test_log_limit_out_of_range(repo, n, code):
    """-n -1 and -n 1e20 were internal errors (islice's stop argument)."""
    r = storm(repo, "log", "-n", n)
    assert r.returncode == code and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if code:
        assert len(r.stderr.strip().splitlines()) == 1 and "--limit" in r.stderr
    from storm_git import open_workspace
    from storm_git.core.errors import UsageError

    with pytest.raises(UsageError, match="0 or more"):
        open_workspace(str(repo)).log(-1)


def test_shared_ref_pointing_at_garbage_is_repo_state(repo):
    blob = git(repo, "hash-object", "-w", "--stdin", input=b"not a commit").stdout.decode().strip()
    git(repo, "update-ref", "refs/storm/workspace", blob)
    r = storm(repo, "read", "README.md", agent="e1")
    _assert_refused(repo, r, 3, "not a commit")


def test_binary_files_are_allowed(repo):
    data = bytes(range(256))
    assert storm(repo, "write", "blob.bin", input=data, agent="e1").returncode == 0
    assert (repo / "blob.bin").read_bytes() == data


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the repository to another user needs root")
def test_a_repository_of_another_user_is_refused_as_git_refuses_it(repo, tmp_path):
    """libgit2 refuses it as git does ("dubious ownership"); storm said only that it
    could not open it, as if it were corrupt, without git's way out."""
    before = snapshot_refs(repo)
    subprocess.run(["chown", "-R", "nobody", str(repo)], check=True)
    r = storm(repo, "status")
    _assert_refused(repo, r, 3, "belongs to another user")
    assert f"safe.directory {repo}" in r.stderr
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    assert storm(repo, "status", env={"HOME": str(home), "XDG_CONFIG_HOME": str(home)}).returncode == 0
    subprocess.run(["chown", "-R", "root", str(repo)], check=True)
    assert snapshot_refs(repo) == before


def test_a_sha256_repository_is_refused_with_the_reason(tmp_path):
    r = tmp_path / "sha256"
    git(tmp_path, "init", "-q", "--object-format=sha256", "-b", "main", str(r))
    (r / "a").write_text("a\n")
    git(r, "add", "a")
    git(r, "commit", "-q", "-m", "a")
    res = storm(r, "init")
    _assert_refused(r, res, 3, "unknown object format")
    assert "SHA-1" in res.stderr
    assert not (r / ".git" / "refs" / "storm").exists()
