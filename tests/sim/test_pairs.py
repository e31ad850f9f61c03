"""``git storm simulate --pairs``: feature pairs in CooperBench's layout, replayed by
two agents that work through the real ``git storm`` CLI, in worktree mode, storm
mode and storm mode accepting rebased changes.

A synthetic pairs directory (one task, four features on one base commit of a real
repository): features 1 and 2 change one file where git merges them cleanly, but
feature 1 renames what feature 2's new code calls (a semantic conflict its test
finds); feature 3 changes feature 1's line differently (a conflict) and a second
file both change where git merges them; feature 4 changes another file
(disjoint). The long variant runs one real click pair."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import git, shared_data, storm
from storm_git.core.errors import UsageError
from storm_git.sim import pairs, pairs_report

CLICK_BUNDLE = shared_data("click.bundle")  # None: the tests that replay it skip
CLICK_PAIRS = shared_data("cooperbench-click")
# one test command for the synthetic features: their "tests" are scripts (no pytest start-up)
SCRIPT_TESTS = 'for f in $STORM_TEST_FILES; do python "$f" || exit 1; done'

BASE = {"src/m.py": "def value():\n    return 1\n" + "".join(f"# filler {i}\n" for i in range(12))
        + "def total():\n    return 2\n",
        "src/other.py": "X = 1\n",
        "src/third.py": "Y = 1\n" + "".join(f"# filler {i}\n" for i in range(6)) + "Z = 1\n"}


def _plots_possible() -> bool:
    """Whether matplotlib (the ``sim`` extra) imports here, as the report's code asks."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


FEATURES = {  # number -> (files after the feature, its test script or None)
    1: ({"src/m.py": _sub(BASE["src/m.py"], "def value():", "def amount():"),
         "src/third.py": _sub(BASE["src/third.py"], "Y = 1", "Y = 2")}, None),
    2: ({"src/m.py": _sub(BASE["src/m.py"], "    return 2\n", "    return 2 + value()\n")},
        "import sys; sys.path.insert(0, 'src'); import m; assert m.total() == 3\n"),
    3: ({"src/m.py": _sub(BASE["src/m.py"], "def value():", "def value_of():"),
         "src/third.py": _sub(BASE["src/third.py"], "Z = 1", "Z = 3")}, None),
    4: ({"src/other.py": "X = 2\n"}, "import sys; sys.path.insert(0, 'src'); import other; assert other.X == 2\n"),
}


def _diff(repo: Path, files: dict[str, str]) -> bytes:
    """A patch from the base commit to ``files`` (git's own diff of the two)."""
    for p, c in files.items():
        (repo / p).write_text(c)
    out = git(repo, "diff", "HEAD").stdout
    git(repo, "checkout", "-q", "--", ".")
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    """(pairs dir, repository): one task on the repository's base commit, four features."""
    root = tmp_path_factory.mktemp("pairs")
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for p, c in BASE.items():
        (repo / p).write_text(c)
    # a symbolic link: the runs' repositories leave it out, so their trees are never the
    # tasks' repository's trees (a feature's tree must be looked up where it was made)
    (repo / "link").symlink_to("src/other.py")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    sha = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    git(repo, "commit", "-q", "--allow-empty", "-m", "later work the tasks do not start from")
    task = root / "pairs" / "task7"
    task.mkdir(parents=True)
    (task / "setup.sh").write_text(f'#!/bin/bash\nREPO_NAME="x"\nBASE_COMMIT="{sha}"\ngit checkout "$BASE_COMMIT"\n')
    for k, (files, test) in FEATURES.items():
        (task / f"feature{k}").mkdir()
        (task / f"feature{k}" / "feature.patch").write_bytes(_diff(repo, files))
        if test:
            (task / f"feature{k}" / "tests.patch").write_bytes(_new_file_patch(f"tests/check_f{k}.py", test))
    gold = {"pairs": [{"task_id": 7, "f1": a, "f2": b, "has_conflict": (a, b) == (1, 3)}
                      for a, b in ((1, 2), (1, 3), (1, 4))]}
    (root / "pairs" / "gold_conflicts.json").write_text(json.dumps(gold))
    return root / "pairs", repo


def _new_file_patch(path: str, text: str) -> bytes:
    lines = text.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}").encode()


# -- loading -------------------------------------------------------------------------
def test_load_reads_base_commit_features_and_their_changes(synthetic):
    pairs_dir, repo = synthetic
    (task,) = pairs.load(str(pairs_dir), str(repo))
    assert task.name == "task7" and task.base == git(repo, "rev-parse", "HEAD~1").stdout.decode().strip()
    assert [f.number for f in task.features] == [1, 2, 3, 4]
    f1 = task.features[0]
    assert f1.change.targets == ["src/m.py", "src/third.py"]
    assert f1.change.parent["src/m.py"].decode() == BASE["src/m.py"]
    assert f1.change.post["src/m.py"].startswith(b"def amount():")
    assert task.features[0].tests is None and pairs.test_files(task.features[1].tests) == ["tests/check_f2.py"]


def test_load_refuses_what_it_cannot_use(synthetic, tmp_path):
    pairs_dir, repo = synthetic
    with pytest.raises(UsageError, match="no task folder task99"):
        pairs.load(str(pairs_dir), str(repo), tasks=("99",))
    bad = tmp_path / "bad" / "task1"
    bad.mkdir(parents=True)
    (bad / "setup.sh").write_text("echo no base here\n")
    with pytest.raises(UsageError, match="names no BASE_COMMIT"):
        pairs.load(str(tmp_path / "bad"), str(repo))
    (bad / "setup.sh").write_text("BASE_COMMIT=0123456789abcdef0123456789abcdef01234567\n")
    with pytest.raises(UsageError, match="failed"):
        pairs.load(str(tmp_path / "bad"), str(repo))
    with pytest.raises(UsageError, match="not a directory"):
        pairs.load(str(tmp_path / "nowhere"), str(repo))


def test_survivors_names_the_lines_a_feature_added_that_the_result_lacks(synthetic):
    pairs_dir, repo = synthetic
    (task,) = pairs.load(str(pairs_dir), str(repo), features=(2,))
    f2 = task.features[0]
    assert pairs.survivors(f2, dict(f2.change.post)) == []
    lost = pairs.survivors(f2, dict(f2.change.parent))
    assert lost == [{"feature": 2, "path": "src/m.py", "lines": ["    return 2 + value()"]}]


# -- replays -----------------------------------------------------------------------------
@pytest.mark.slow
def test_clean_pair_is_rejected_at_write_and_cleared_by_one_rebased_change(synthetic):
    """git merges features 1 and 2 cleanly; storm rejects the second writer. Re-planning
    costs a re-read; accepting the rebased change does not. Both changes survive, and
    feature 2's test finds the semantic conflict the clean integration hides."""
    pairs_dir, repo = synthetic
    rep = pairs.simulate(str(pairs_dir), str(repo), features=(1, 2), test_cmd=SCRIPT_TESTS)
    (pr,) = rep.pairs
    wt, st, rb = (pr.modes[m] for m in pairs.MODES)
    assert pr.shared == ["src/m.py"] and pr.gold_conflict is False
    assert rep.alone == {"task7": {"1": None, "2": True}}
    assert (wt.merge_conflicts, wt.rejections, wt.caught) == (0, 0, "tests")
    assert (st.caught, st.rejections, st.rebased_accepted, st.rereads) == ("write", 1, 0, 1)
    assert (rb.caught, rb.rejections, rb.rebased_accepted, rb.rereads) == ("write", 1, 1, 0)
    assert rb.agent_calls == st.agent_calls - 1  # the re-read the rebased change spares
    for r in (wt, st, rb):
        assert r.lost_updates == 0 and r.errors == []
        assert r.tests == {"1": None, "2": False} and r.semantic
    t = rep.to_dict()["totals"]
    assert t["storm+rebased"]["rebased_accepted"] == 1 and t["storm+rebased"]["semantic"] == 1
    assert rep.to_dict()["gold"]["agree"] == 1


@pytest.mark.slow
def test_conflicting_pair_is_caught_at_merge_and_at_write_and_no_rebased_change_is_accepted(synthetic):
    """Features 1 and 3 change one line differently: worktree mode's merge conflicts (as
    the dataset says), storm rejects, and the rebased change (conflict markers) is refused:
    the agent re-plans, which needed judgement, at the cost of plain storm mode (the
    stale second file is not re-read before the refusal); tests are not run on a judged
    result."""
    pairs_dir, repo = synthetic
    rep = pairs.simulate(str(pairs_dir), str(repo), features=(1, 3), test_cmd=SCRIPT_TESTS)
    (pr,) = rep.pairs
    wt, st, rb = (pr.modes[m] for m in pairs.MODES)
    assert pr.shared == ["src/m.py", "src/third.py"]
    assert (wt.caught, wt.merge_conflicts > 0, wt.judgement > 0) == ("merge", True, True)
    assert (rb.caught, rb.rejections, rb.rebased_accepted, rb.rebased_refused) == ("write", 1, 0, 1)
    assert rb.judgement > 0 and not rb.semantic and rb.tests == {}
    # first agent: read, 2 writes; second: read, write (rejected), re-read, write, write third.py
    assert rb.agent_calls == st.agent_calls == 8
    assert wt.lost_updates == st.lost_updates == rb.lost_updates == 0
    assert rep.to_dict()["gold"] == {"compared": 1, "agree": 1, "differ": [], "gold_conflicting": 1,
                                    "merge_conflicting": 1}


@pytest.mark.slow
def test_cli_disjoint_pair_has_nothing_to_catch_and_the_markdown_says_what_the_json_says(synthetic, tmp_path):
    """Features 1 and 4 change different files: no rejection, one read and one write
    per agent; the report's files are written."""
    pairs_dir, repo = synthetic
    out = tmp_path / "rep"
    r = storm(tmp_path, "simulate", "--pairs", str(pairs_dir), "--repo", str(repo), "--features", "1,4",
              "--mode", "storm", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["totals"]) == {"storm", "storm+rebased"}
    (pr,) = data["pairs"]
    for m in pr["modes"].values():
        assert pr["shared"] == [] and (m["caught"], m["rejections"], m["lost_updates"]) == ("none", 0, 0)
        assert m["agent_calls"] == 5  # each agent: one read, one write a file
    md = (out / "report.md").read_text()
    assert "| task7 f1+f4 | - | storm | none | 0 | 0 | 5 | 0 |" in md
    if not _plots_possible():
        assert sorted(data["written"]["files"]) == ["report.json", "report.md"]
        assert "matplotlib is not installed" in data["written"]["plots_skipped"]
        assert md == pairs_report.markdown(json.loads((out / "report.json").read_text()), None)
        pytest.skip("the plot needs matplotlib (the sim extra), which is not installed")
    assert sorted(data["written"]["files"])[:2] == ["pairs.png", "report.json"]
    assert md == pairs_report.markdown(json.loads((out / "report.json").read_text()), "pairs.png")


def test_cli_refuses_bad_input_with_one_line(synthetic, tmp_path):
    pairs_dir, repo = synthetic
    r = storm(tmp_path, "simulate", "--pairs", str(pairs_dir))
    assert r.returncode == 2 and "--pairs needs --repo" in r.stderr
    r = storm(tmp_path, "simulate", "--pairs", str(tmp_path / "none"), "--repo", str(repo))
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = storm(tmp_path, "simulate", "--pairs", str(pairs_dir), "--repo", str(repo), "--features", "x")
    assert r.returncode == 2 and "--features" in r.stderr


# -- a real pair -------------------------------------------------------------------------
@pytest.mark.slow
def test_click_pair_that_merges_cleanly_fails_a_features_tests(tmp_path):
    """click task 2800, features 1 and 2: git merges them cleanly (the dataset agrees),
    storm's rejection is cleared by one rebased change, nothing is lost, and feature 2's
    tests fail on the clean integration although they pass on the feature alone."""
    if CLICK_BUNDLE is None or CLICK_PAIRS is None:
        pytest.skip("the click data is not here")
    repo = tmp_path / "click"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(CLICK_BUNDLE), str(repo)], check=True)
    rep = pairs.simulate(str(CLICK_PAIRS), str(repo), tasks=("2800",), features=(1, 2), run_tests=True)
    (pr,) = rep.pairs
    assert rep.alone == {"task2800": {"1": True, "2": True}}
    assert rep.to_dict()["gold"]["agree"] == 1
    rb = pr.modes["storm+rebased"]
    assert (rb.rejections, rb.rebased_accepted, rb.lost_updates) == (1, 1, 0)
    for r in pr.modes.values():
        assert r.lost_updates == 0 and r.semantic and r.tests == {"1": True, "2": False}


@pytest.mark.slow
def test_the_pairs_plot_does_not_show_a_catch_at_write_whose_result_failed_as_clean(tmp_path):
    """Storm rejected a write of the pair (caught at write), yet the integrated result
    failed a feature's tests: the bar for it is marked as such, not a clean 'at write'."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    def mode(caught, tests):
        return {"caught": caught, "tests": tests, "rejections": 1, "rebased_accepted": 0, "rebased_refused": 0,
                "lost_updates": 0, "agent_calls": 6, "wall_s": 1.0, "semantic": False, "errors": [],
                "merge_conflicts": 0}

    pair_list = [{"modes": {"storm": mode("write", {"1": True, "2": False})}, "gold_conflict": False},
                 {"modes": {"storm": mode("write", {"1": True, "2": True})}, "gold_conflict": False}]
    data = {"totals": pairs_report.totals(pair_list), "pairs": pair_list}
    assert data["totals"]["storm"]["caught_write_then_failed"] == 1
    saved = []
    orig = plt.Figure.savefig

    def keep(fig, *a, **kw):
        saved.append(fig)
        return orig(fig, *a, **kw)

    plt.Figure.savefig = keep
    try:
        name, note = pairs_report.plot(data, str(tmp_path))
    finally:
        plt.Figure.savefig = orig
    assert name == "pairs.png" and note is None and (tmp_path / "pairs.png").exists()
    left = saved[0].axes[0]
    labels = left.get_legend_handles_labels()[1]
    assert "at write, result then failed its tests" in labels, labels
    heights = {lab: sum(p.get_height() for p in h.patches)
               for h, lab in zip(*left.get_legend_handles_labels(), strict=True)}
    assert heights["at write"] == 1 and heights["at write, result then failed its tests"] == 1, heights
    plt.close(saved[0])


@pytest.mark.slow
def test_click_2800_semantic_conflict_is_found_on_the_shared_head_before_the_managers_commit(tmp_path):
    """The same pair in storm mode with the test runner's rounds on the shared head:
    feature 2's tests fail after the last write, the bisection blames one write of
    each feature (a semantic conflict), before the manager commits; no false alarm."""
    if CLICK_BUNDLE is None or CLICK_PAIRS is None:
        pytest.skip("the click data is not here")
    repo = tmp_path / "click"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(CLICK_BUNDLE), str(repo)], check=True)
    rep = pairs.simulate(str(CLICK_PAIRS), str(repo), tasks=("2800",), features=(1, 2), modes=("storm",),
                         run_tests=True, watch=True)
    (pr,) = rep.pairs
    w = pr.modes["storm"].watch
    assert w is not None and w["blamed_pair"] and w["false_alarms"] == 0
    (found,) = w["found"]
    assert found["kind"] == "semantic" and found["features"] == [1, 2] and found["after_write"] == w["writes"]
    assert found["test"].startswith("tests/test_shell_completion__f2.py::")
    totals = rep.to_dict()["watch"]["storm"]
    assert totals["semantic_found"] == 1 and totals["false_alarms"] == 0 and totals["test_runs"] >= 3


def test_a_false_alarm_is_a_finding_the_integrated_result_does_not_bear_out():
    """click task 2956's feature 7 fails its own tests alone: the runner's break by its
    write is right (the result fails them too), no false alarm; a semantic conflict on
    a pair whose result passes, or a break by a feature whose tests pass, is one."""
    brk = {"kind": "break", "features": [7], "test": "tests/test_basic__f7.py"}
    sem = {"kind": "semantic", "features": [1, 2], "test": "tests/test_x__f2.py::t"}
    assert pairs.false_alarms([brk], {"6": True, "7": False}, failing=[]) == 0
    assert pairs.false_alarms([brk], {"6": True, "7": True}, failing=[]) == 1
    assert pairs.false_alarms([sem], {"1": True, "2": False}, failing=["2"]) == 0
    assert pairs.false_alarms([sem], {"1": True, "2": True}, failing=[]) == 1
    assert pairs.false_alarms([sem, brk], {"1": True, "7": False}, failing=[]) == 1
