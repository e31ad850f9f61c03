"""What a new team meets in its first hour: the pre-commit guard that init
installs, init on a dirty working tree. Real ``git storm`` and real ``git commit``."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from helpers import ROOT, git, git_commit, make_repo, rev, storm, storm_json

VENV_BIN = os.path.dirname(sys.executable)


def _bin_dir(tmp_path: Path, name: str, **programs: str) -> str:
    """A directory for PATH holding only git and the given sh wrappers {name: target}."""
    d = tmp_path / name
    d.mkdir()
    (d / "git").symlink_to(shutil.which("git"))
    for prog, target in programs.items():
        (d / prog).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (d / prog).chmod(0o755)
    return str(d)


def _break_recorded_python(hook: Path, tmp_path: Path) -> None:
    """What removing the virtualenv that ran git storm init does to the shim."""
    text = hook.read_text()
    start = text.index("STORM_PYTHON=")
    end = text.index("\n", start)
    hook.write_text(text[:start] + f"STORM_PYTHON='{tmp_path}/deleted-venv/bin/python3'" + text[end:])


# -- init says what it installed, why, and how a person commits ----------------------
def test_init_reports_the_hook_and_how_a_person_commits(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    r = storm(repo, "init")
    assert r.returncode == 0, r.stderr
    hook = repo / ".git" / "hooks" / "pre-commit"
    assert f"installed the pre-commit guard: {hook}" in r.stdout
    assert "why:" in r.stdout and "git storm commit -m MSG" in r.stdout and "git storm uninstall-hooks" in r.stdout
    code, res = storm_json(repo, "init")
    assert code == 0
    h = res["hooks_install"]
    assert res["hooks"] == ["pre-commit"] and h["paths"] == [str(hook)]
    assert "git storm commit -m MSG" in h["how_to_commit"] and "uninstall-hooks" in h["how_to_commit"]
    assert h["why"] and h["skipped"] is None
    # a person's plain git commit of an edit is refused, and the refusal says what to do
    (repo / "src/util.py").write_text("edited by a person\n")
    git(repo, "add", "src/util.py")
    base = rev(repo, "HEAD")
    c = git_commit(repo, "-m", "a person's commit")
    assert c.returncode != 0 and rev(repo, "HEAD") == base
    assert "git storm commit -m MSG" in c.stderr and "git storm uninstall-hooks" in c.stderr
    # ... and both ways out work
    assert storm(repo, "uninstall-hooks").returncode == 0
    assert git_commit(repo, "-m", "a person's commit").returncode == 0


# -- the recorded interpreter is gone ----------------------------------------------------
def test_shim_without_its_interpreter_falls_back_or_says_how_to_fix(tmp_path):
    repo = make_repo(tmp_path / "r")
    hook = repo / ".git" / "hooks" / "pre-commit"
    _break_recorded_python(hook, tmp_path)
    base = rev(repo, "HEAD")
    # nothing to run the guard with: one clear message, commit refused, hook untouched
    bare = _bin_dir(tmp_path, "bare")
    c = git_commit(repo, "--allow-empty", "-m", "x", PATH=bare)
    assert c.returncode != 0 and "not found" not in c.stderr, c.stderr
    assert "cannot run storm's guard" in c.stderr and "deleted-venv" in c.stderr
    assert "reinstall git storm" in c.stderr and "git storm uninstall-hooks" in c.stderr
    # from the clone it came from (the test's editable install), not from an index
    assert f"(python3 -m pip install -e {ROOT}), then" in c.stderr, c.stderr
    assert "pre-commit" in c.stderr and rev(repo, "HEAD") == base
    # a python3 without storm_git does not count
    nostorm = _bin_dir(tmp_path, "nostorm", python3=shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3")
    c = git_commit(repo, "--allow-empty", "-m", "x", PATH=nostorm)
    assert c.returncode != 0 and "cannot run storm's guard" in c.stderr, c.stderr
    # git-storm on PATH runs the guard: it refuses an engineer, lets a person commit
    with_cli = _bin_dir(tmp_path, "cli", **{"git-storm": os.path.join(VENV_BIN, "git-storm")})
    c = git_commit(repo, "--allow-empty", "-m", "x", agent="e1", PATH=with_cli)
    assert c.returncode != 0 and "is an engineer" in c.stderr, c.stderr
    assert git_commit(repo, "--allow-empty", "-m", "by a person", PATH=with_cli).returncode == 0
    # python3 -m storm_git, when importable, too
    with_py = _bin_dir(tmp_path, "py", python3=sys.executable)
    c = git_commit(repo, "--allow-empty", "-m", "x", agent="e1", PATH=with_py)
    assert c.returncode != 0 and "is an engineer" in c.stderr, c.stderr
    # install-hooks (run with a working interpreter) repairs the shim
    assert storm(repo, "install-hooks").returncode == 0
    c = git_commit(repo, "--allow-empty", "-m", "x", agent="e1", PATH=bare)
    assert c.returncode != 0 and "is an engineer" in c.stderr, c.stderr


# -- tracked hooks (core.hooksPath inside the working tree) ------------------------------
def test_tracked_hooks_path_is_never_written(tmp_path):
    tracked = "#!/bin/sh\necho project hook\nexit 0\n"
    repo = make_repo(tmp_path / "r", {"README.md": "x\n", ".githooks/pre-commit": tracked}, init_storm=False)
    (repo / ".githooks/pre-commit").chmod(0o755)
    git(repo, "add", ".githooks/pre-commit")
    git(repo, "commit", "-q", "-m", "executable hook")
    git(repo, "config", "core.hooksPath", ".githooks")
    r = storm(repo, "init")
    assert r.returncode == 0, r.stderr
    assert "not installed" in r.stderr and "working tree" in r.stderr and "near the top" in r.stderr
    assert "git-storm hook pre-commit" in r.stderr and str(repo / ".githooks/pre-commit") in r.stderr
    assert (repo / ".githooks/pre-commit").read_text() == tracked
    assert sorted(os.listdir(repo / ".githooks")) == ["pre-commit"]
    assert git(repo, "status", "--porcelain").stdout == b""
    code, res = storm_json(repo, "init")
    assert code == 0 and res["hooks"] == [] and res["hooks_install"]["skipped"]
    assert "git-storm hook pre-commit" in res["hooks_install"]["add_line"]
    assert any("not installed" in w for w in res["warnings"])
    # the manager's commit is not blocked by anything storm left behind
    storm(repo, "read", "README.md", agent="e1")
    assert storm(repo, "write", "README.md", input="y\n", agent="e1").returncode == 0
    r = storm(repo, "commit", "-m", "integrate")
    assert r.returncode == 0, r.stderr
    # the printed line, added to the project's hook, enables the guard
    with_cli = _bin_dir(tmp_path, "cli", **{"git-storm": os.path.join(VENV_BIN, "git-storm")})
    shebang, rest = tracked.split("\n", 1)
    (repo / ".githooks/pre-commit").write_text(f"{shebang}\n{res['hooks_install']['add_line']}\n{rest}")
    c = git_commit(repo, "--allow-empty", "-m", "x", agent="e1", PATH=with_cli + os.pathsep + "/usr/bin:/bin")
    assert c.returncode != 0 and "is an engineer" in c.stderr, c.stderr
    # ... and is harmless where git storm is not installed
    nocli = _bin_dir(tmp_path, "nocli")
    c = git_commit(repo, "--allow-empty", "-m", "x", PATH=nocli + os.pathsep + "/usr/bin:/bin")
    assert c.returncode == 0, c.stderr


# -- a global core.hooksPath --------------------------------------------------------------
def test_global_hooks_path_is_never_written(tmp_path):
    repo = make_repo(tmp_path / "r", init_storm=False)
    global_hooks = tmp_path / "global-hooks"
    global_hooks.mkdir()
    (global_hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (global_hooks / "pre-commit").chmod(0o755)
    cfg = tmp_path / "gitconfig"
    cfg.write_text(Path(os.environ["GIT_CONFIG_GLOBAL"]).read_text() + f"[core]\n\thooksPath = {global_hooks}\n")
    env = {"GIT_CONFIG_GLOBAL": str(cfg)}
    before = {p.name: p.read_bytes() for p in global_hooks.iterdir()}
    r = storm(repo, "init", env=env)
    assert r.returncode == 0, r.stderr
    assert "not installed" in r.stderr and "global" in r.stderr and "every repository" in r.stderr
    assert str(global_hooks / "pre-commit") in r.stderr and "git-storm hook pre-commit" in r.stderr
    assert {p.name: p.read_bytes() for p in global_hooks.iterdir()} == before
    assert not (repo / ".git/hooks/pre-commit").exists()
    assert git(repo, "config", "--local", "--get", "core.hooksPath", check=False).returncode == 1
    r = storm(repo, "install-hooks", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["hooks_path_scope"] == "global"
    assert {p.name: p.read_bytes() for p in global_hooks.iterdir()} == before
    # a hooks directory set for this repository only is storm's to use (outside the working tree)
    local = tmp_path / "repo-hooks"
    git(repo, "config", "--local", "core.hooksPath", str(local))
    r = storm(repo, "install-hooks", env=env)
    assert r.returncode == 0 and "installed the pre-commit guard" in r.stdout, r.stderr
    assert (local / "pre-commit").exists()
    assert {p.name: p.read_bytes() for p in global_hooks.iterdir()} == before


# -- init on a dirty working tree -------------------------------------------------------------
def test_init_on_a_dirty_tree_warns_lists_and_offers_choices(tmp_path):
    repo = make_repo(tmp_path / "r", {"README.md": "x\n", ".gitignore": "build/\n*.log\n", "a.py": "a\n"},
                     init_storm=False)
    (repo / "a.py").write_text("edited\n")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "build").mkdir()
    (repo / "build/out.o").write_text("ignored\n")
    (repo / "debug.log").write_text("ignored\n")
    for i in range(25):
        (repo / f"new{i:02}.py").write_text("x\n")
    r = storm(repo, "init")
    assert r.returncode == 0, r.stderr
    assert "27 uncommitted change(s)" in r.stderr
    assert " M a.py" in r.stderr and "?? new00.py" in r.stderr and "and 7 more" in r.stderr
    assert "build" not in r.stderr and "debug.log" not in r.stderr
    assert "git storm adopt PATH... --agent NAME" in r.stderr and "git stash -u" in r.stderr
    assert "--base REF" in r.stderr
    assert "uncommitted" not in r.stdout  # warnings go to stderr
    # --json (on a fresh init) carries the full list
    repo2 = make_repo(tmp_path / "r2", init_storm=False)
    (repo2 / "README.md").write_text("changed\n")
    r = storm(repo2, "init", "--json")
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["created"]
    assert res["dirty"] == [{"status": " M", "path": "README.md"}]
    assert len(res["choices"]) == 3 and any("uncommitted" in w for w in res["warnings"])
    assert "uncommitted" in r.stderr
    # the edit is still on disk (init did not refuse or touch it), and adopting it works
    assert (repo2 / "README.md").read_text() == "changed\n"
    storm(repo2, "read", "README.md", agent="person")
    assert storm(repo2, "adopt", "README.md", agent="person").returncode == 0
    # a clean tree: no warning
    repo3 = make_repo(tmp_path / "r3", init_storm=False)
    r = storm(repo3, "init")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_a_work_tree_whose_git_directory_lives_elsewhere(tmp_path):
    """``git init --separate-git-dir`` (and ``git clone --separate-git-dir``) leave a
    ``.git`` *file* in the work tree. Storm opened the git directory itself, for which
    libgit2 takes the directory's parent as the work tree: init failed (exit 3), a
    read of a file in the repository was refused as inside a "submodule", and status
    listed every file of the parent directory as an unmediated edit."""
    (tmp_path / "neighbour.txt").write_text("not in the repository\n")
    wt, gd = tmp_path / "wt", tmp_path / "gitdirs" / "wt.git"
    gd.parent.mkdir()
    git(tmp_path, "init", "-q", "-b", "main", "--separate-git-dir", str(gd), str(wt))
    (wt / "src").mkdir()
    (wt / "src/app.py").write_text("x = 1\n")
    git(wt, "add", "-A")
    git(wt, "commit", "-q", "-m", "initial")
    r = storm(wt, "init")
    assert r.returncode == 0, r.stderr
    assert (gd / "hooks" / "pre-commit").exists()
    r = storm(wt / "src", "read", "app.py", agent="e1")
    assert r.returncode == 0 and r.stdout == "x = 1\n", r.stderr
    assert storm(wt, "write", "src/app.py", input="x = 2  # e1: more\n", agent="e1").returncode == 0
    assert (wt / "src/app.py").read_text() == "x = 2  # e1: more\n"
    code, out = storm_json(wt, "status", agent="e1")
    assert code == 0 and out["unmediated"] == [], out
    # git --git-dir=GD --work-tree=WT storm …, from anywhere (git exports both variables)
    code, out = storm_json(tmp_path, "status", agent="e1", env={"GIT_DIR": str(gd), "GIT_WORK_TREE": str(wt)})
    assert code == 0 and out["unmediated"] == [], out
    r = storm(wt, "read", "src/app.py", agent="e1", env={"GIT_DIR": str(gd)})  # git's rule: cwd is the top
    assert r.returncode == 0 and r.stdout == "x = 2  # e1: more\n", r.stderr
    refused = git_commit(wt, "-qam", "by hand", agent="e1")
    assert refused.returncode != 0 and "storm" in refused.stderr  # the guard found its repository
    assert storm(wt, "commit", "-m", "integrate").returncode == 0
    assert git(wt, "show", "HEAD:src/app.py").stdout == b"x = 2  # e1: more\n"
    assert git(wt, "status", "--porcelain").stdout == b""
    assert (tmp_path / "neighbour.txt").read_text() == "not in the repository\n"


def test_a_repository_shared_by_a_group_stays_writable_by_the_group(tmp_path):
    """``git init --shared=group`` (core.sharedRepository): git makes what it creates
    group-writable so several users (agents in containers with their own uids on one
    volume) can share the repository. Storm created its locks, journals and disk
    record 0644 (its directories, and libgit2's new object directories, 0755), and its
    commit left git's index 0600: a second user of the group could not take a lock or
    write an object, and every storm command of theirs failed with "Permission
    denied". A second user cannot be made everywhere, so this checks what that user
    needs: the group's bits on everything storm made."""
    r = tmp_path / "shared"
    git(tmp_path, "init", "-q", "--shared=group", "-b", "main", str(r))
    (r / "a.py").write_text("x = 1\n")
    git(r, "add", "a.py")
    git(r, "commit", "-q", "-m", "initial")
    gd = r / ".git"
    index_mode = (gd / "index").stat().st_mode & 0o777
    old = os.umask(0o022)  # what a container's processes usually run with
    try:
        assert storm(r, "init").returncode == 0
        assert storm(r, "read", "a.py", agent="e1").returncode == 0
        assert storm(r, "write", "a.py", input="x = 2  # e1: more\n", agent="e1").returncode == 0
        assert storm(r, "commit", "-m", "integrate").returncode == 0
    finally:
        os.umask(old)
    dirs = [gd / "storm", *(p for p in (gd / "storm").rglob("*") if p.is_dir()),
            *(p for p in (gd / "objects").iterdir() if len(p.name) == 2),
            *(p for p in (gd / "refs" / "storm").rglob("*") if p.is_dir()), gd / "refs" / "storm"]
    files = [p for p in (gd / "storm").rglob("*") if p.is_file()]
    assert files and dirs
    closed = {str(p.relative_to(gd)): oct(p.stat().st_mode & 0o777) for p in dirs if p.stat().st_mode & 0o070 != 0o070}
    closed.update({str(p.relative_to(gd)): oct(p.stat().st_mode & 0o777) for p in files
                   if p.stat().st_mode & 0o060 != 0o060})
    assert closed == {}, closed
    assert (gd / "index").stat().st_mode & 0o777 == index_mode  # the commit's new index kept git's mode
    assert git(r, "status", "--porcelain").stdout == b""
