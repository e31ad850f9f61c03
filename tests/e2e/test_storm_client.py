"""The STORM paper's own client (its ManagerBackedFileEditorExecutor, the OpenHands
file_editor routed through the manager) on git storm's drop-in manager, with the one
import of its ``multiagent_sync/__init__.py`` (``from .manager import Manager``) pointed
at git storm. Its code comes from ``shared/data/storm-client/`` beside the checkout
(CI copies shared/ beside the clone) and needs Python 3.12 for its SDK; where either is
missing the tests are skipped with the reason.

The driver (storm_client_driver.py, run in the 3.12 virtualenv) records every
observation with what the disk and refs/storm/workspace held right after it; the tests
check each against both.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import git, make_repo, shared_data

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CALC = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n# end\n"
FILES = {"calc.py": CALC, "old.py": "OLD = 1\n", "README.md": "# calc\n"}

pytestmark = pytest.mark.harness
# captured at import, before the suite's hermetic HOME replaces it: the virtualenv is cached
REAL_HOME = os.path.expanduser("~")
VENV = os.environ.get("STORM_CLIENT_VENV") or os.path.join(REAL_HOME, ".cache", "storm-client-venv")


def client_dir() -> Path | None:
    """shared/data/storm-client beside the checkout (or beside the main checkout of a
    git worktree), or $STORM_CLIENT_DIR."""
    if os.environ.get("STORM_CLIENT_DIR"):
        return Path(os.environ["STORM_CLIENT_DIR"])
    d = shared_data("storm-client")
    return d if d is not None and (d / "multiagent_sync" / "mgr_tools.py").is_file() else None


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(the 3.12 virtualenv's python, a copy of multiagent_sync with the one-line manager.py)."""
    src = client_dir()
    if src is None:
        pytest.skip("the STORM paper's client is not here: no shared/data/storm-client beside the checkout")
    r = subprocess.run(["bash", str(HERE / "install_storm_client.sh"), str(src), str(ROOT), VENV],
                       capture_output=True, text=True, timeout=1800, env={**os.environ, "HOME": REAL_HOME})
    if r.returncode == 3:
        pytest.skip(f"the STORM paper's client needs Python 3.12: {r.stderr.strip()}")
    assert r.returncode == 0, f"installing the paper's client failed:\n{r.stderr[-3000:]}"
    python = r.stdout.strip().splitlines()[-1]
    copy = tmp_path_factory.mktemp("storm-client")
    shutil.copytree(src / "multiagent_sync", copy / "multiagent_sync")
    for p in copy.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    verbatim = (src / "multiagent_sync" / "mgr_tools.py").read_bytes()
    assert (copy / "multiagent_sync" / "mgr_tools.py").read_bytes() == verbatim
    (copy / "multiagent_sync" / "manager.py").write_text(
        "from storm_git.paper.manager import Manager  # noqa: F401 - the harness's one change\n")
    return python, copy


@pytest.fixture(scope="module")
def results(client: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario, run by one driver process (the SDK's import is slow), each on
    its own repository: {scenario: its record, with its repository}."""
    python, copy = client
    base = tmp_path_factory.mktemp("client-repos")
    repos = {name: make_repo(base / name, FILES)
             for name in ("threads", "sed", "shell_files", "commit", "old_version")}
    # the one setting storm's refusal names for a harness whose terminal bypasses storm
    # (docs/agents.md): the shell's edits are writes, and plain git add -A && git commit works
    git(repos["commit"], "config", "storm.shellEdits", "adopt")
    argv = [python, str(HERE / "storm_client_driver.py"), str(copy)]
    for name, repo in repos.items():
        argv += [name, str(repo)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env={**os.environ, "STORM_KEEP": "3"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            rec["repo"] = repos[rec["scenario"]]
            out[rec["scenario"]] = rec
    assert set(out) == set(repos), (r.stdout[-2000:], r.stderr[-3000:])
    return out


def steps(rec: dict[str, Any]) -> list[dict[str, Any]]:
    assert "crash" not in rec, rec["crash"]
    return rec["steps"]


def one_truth(rec: dict[str, Any]) -> None:
    """After every step, and at the end, the disk holds what the shared head holds."""
    for s in steps(rec):
        if s["agent"] == "shell":
            continue  # a shell edit is on disk first; the next storm operation shares it
        for path, st in s["state"].items():
            assert st["disk"] == st["shared"], (path, s["action"], st)
    for path, st in rec["final"].items():
        assert st["disk"] == st["shared"], (path, st)
    head = git(rec["repo"], "rev-parse", "refs/storm/workspace").stdout
    assert head.strip(), "no shared head"


def test_three_agents_on_threads_lose_no_edit(results: dict[str, dict[str, Any]]) -> None:
    rec = results["threads"]
    one_truth(rec)
    final = rec["final"]["calc.py"]["shared"]
    for i in (1, 2, 3):
        assert f"def f{i}():\n    return {i}\n" in final  # every agent's edit landed, none overwritten
        assert rec["final"][f"a{i}.py"]["shared"] == f"A = {i}\n"
    accepted = [s for s in steps(rec) if s["action"]["command"] == "str_replace" and not s["is_error"]]
    assert len(accepted) == 3
    versions = sorted(int(s["text"].split("->v")[1].split(",")[0]) for s in accepted)
    assert versions == [2, 3, 4]  # each accepted edit a new version, as the reference counts
    for s in steps(rec):
        if s["action"]["command"] == "str_replace" and s["is_error"]:
            assert "WRITE REJECTED on calc.py" in s["text"] and "Full current content" in s["text"]
    log = git(rec["repo"], "log", "--format=%(trailers:key=Storm-Agent,valueonly)", "refs/storm/workspace",
              "--", "calc.py").stdout.decode().split()
    assert sorted(log) == ["engineer_1", "engineer_2", "engineer_3"]


def test_a_version_older_than_those_kept_is_a_stale_read(results: dict[str, dict[str, Any]]) -> None:
    rec = results["old_version"]
    one_truth(rec)
    *_, late, view, redo = steps(rec)
    assert late["is_error"] and "unexpected error" not in late["text"], late["text"]
    assert "WRITE REJECTED on calc.py" in late["text"] and "Stale dependencies: calc.py(v1->v" in late["text"]
    assert "# step 4" in late["text"]  # the current content, to redo the edit on
    assert not view["is_error"] and not redo["is_error"], redo["text"]
    assert "def add(a, b, /):" in rec["final"]["calc.py"]["shared"]
    assert rec["final"]["calc.py"]["shared"].count("# step") == 5


def test_a_sed_between_a_view_and_an_edit_is_a_conflict_on_disk_too(results: dict[str, dict[str, Any]]) -> None:
    rec = results["sed"]
    view, shell, edit, other = steps(rec)
    assert not shell["is_error"] and shell["state"]["calc.py"]["disk"] != CALC
    # the agent's edit was made on the content before sed: a conflict, shown with sed's change
    assert edit["is_error"] and "WRITE REJECTED on calc.py" in edit["text"], edit["text"]
    assert "return b + a" in edit["text"]
    assert "return b + a" in other["text"] and "a: int" not in other["text"]
    one_truth(rec)
    assert "return b + a" in rec["final"]["calc.py"]["shared"]


def test_files_the_shell_made_and_removed_are_seen_as_they_are(results: dict[str, dict[str, Any]]) -> None:
    rec = results["shell_files"]
    view_old, shell, view_made, create, view_gone, edit_gone = steps(rec)
    assert not view_old["is_error"]
    assert not view_made["is_error"] and "M = 1" in view_made["text"], view_made["text"]
    assert create["is_error"] and "WRITE REJECTED on made.py" in create["text"]  # it exists
    assert view_gone["is_error"], view_gone["text"]  # removed by the shell: not served
    assert edit_gone["is_error"]
    one_truth(rec)
    assert rec["final"]["made.py"] == {"disk": "M = 1\n", "shared": "M = 1\n"}
    assert rec["final"]["old.py"] == {"disk": None, "shared": None}


def test_the_harness_commit_after_shell_edits_works(results: dict[str, dict[str, Any]]) -> None:
    rec = results["commit"]
    *_, commit = steps(rec)
    assert not commit["is_error"], commit["text"]
    repo = rec["repo"]
    assert rec["status"] == "", rec["status"]  # nothing left staged or changed
    assert git(repo, "log", "-1", "--format=%an", "HEAD").stdout.decode().strip() == "engineer_1"
    committed = git(repo, "show", "HEAD:calc.py").stdout.decode()
    assert "# end of calc" in committed and "return -(b - a)" in committed
    assert git(repo, "show", "HEAD:notes.txt").stdout.decode() == "by the shell\n"
    one_truth(rec)
