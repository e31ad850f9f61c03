"""``git storm simulate``: the scenario suite's tests detect their breakage, storm
mode catches the overlapping scenarios at write time, the disjoint control has
no rejections, lost updates are checked against the real final tree, history
replay works on a real history (click), and the report's Markdown says what its
JSON says. Real processes and repositories throughout; long variants are slow."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, git, shared_data, storm
from storm_git.core.errors import UsageError
from storm_git.sim import report, runner, scenarios, workload
from storm_git.sim.metrics import Write, lost_updates

CLICK_BUNDLE = shared_data("click.bundle")  # None: the tests that replay it skip
OVERLAPPING = [n for n in scenarios.NAMED if n != "disjoint"]


def _plots_possible() -> bool:
    """Whether matplotlib (the ``sim`` extra) imports here, as the report's code asks."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _materialize(files: dict[str, bytes | None], root: Path) -> Path:
    for p, c in files.items():
        if c is not None:
            (root / p).parent.mkdir(parents=True, exist_ok=True)
            (root / p).write_bytes(c)
    return root


def _check(files: dict[str, bytes | None], root: Path) -> subprocess.CompletedProcess:
    _materialize(files, root)
    return subprocess.run([sys.executable, scenarios.CHECK], cwd=root, capture_output=True, text=True)


# -- the scenario suite's tests ---------------------------------------------------------------
@pytest.mark.parametrize("name", OVERLAPPING)
def test_scenario_test_fails_on_the_isolated_result(name, tmp_path):
    """Each agent's work done on the base alone and combined (isolation, merge favouring the
    later agent): the scenario's test must catch the breakage."""
    w = scenarios.scenario(name, 2)
    r = _check(scenarios.isolated_result(w), tmp_path)
    assert r.returncode != 0, f"{name}: the check passed on a broken result\n{r.stdout}"


@pytest.mark.parametrize("name", [n for n in scenarios.NAMED if n != "rename-late"])
def test_scenario_test_passes_when_each_agent_replans_on_fresh_reads(name, tmp_path):
    w = scenarios.scenario(name, 4)
    r = _check(scenarios.sequential_result(w), tmp_path)
    assert r.returncode == 0, r.stderr


def test_rename_late_is_broken_even_when_replanned(tmp_path):
    """The renamer finishes last and never read the new caller: no re-planning of the
    caller can help; the scenario documents the limit (caught by tests in both modes)."""
    w = scenarios.scenario("rename-late", 2)
    assert _check(scenarios.sequential_result(w), tmp_path).returncode != 0


def test_coupling_scales_the_shared_file():
    w = scenarios.coupling(8, 0.5)
    shared = [c for a in w.agents for c in a if "src/registry.py" in c.targets]
    assert len(w.agents) == 8 and len(shared) == 4 and w.overlaps() == 6  # 4 choose 2
    assert scenarios.coupling(4, 0.0).overlaps() == 0


# -- both modes, real processes ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["signature", "cycle"])
def test_storm_mode_catches_the_conflict_at_write(name):
    m = runner.run(scenarios.scenario(name, 2), "storm")
    assert m.agent_errors == []
    assert m.caught_at_write == 1 and m.rejections_needless == 0
    assert sum(a["rejections"] for a in m.per_agent.values()) == 1
    assert m.test_passed is True and m.caught_by_tests == 0
    assert m.lost_updates == 0 and m.writes_checked >= 2


@pytest.mark.slow
def test_worktree_mode_finds_them_at_merge_or_by_tests():
    sig = runner.run(scenarios.scenario("signature", 2), "worktree")
    assert sig.caught_at_merge == 1 and sig.test_passed is True and sig.lost_updates == 0
    cyc = runner.run(scenarios.scenario("cycle", 2), "worktree")
    assert cyc.caught_at_merge == 0 and cyc.test_passed is False and cyc.caught_by_tests == 1
    assert "circular import" in cyc.test_output


@pytest.mark.parametrize("mode", runner.MODES)
def test_disjoint_control_has_no_rejections_or_conflicts(mode):
    m = runner.run(scenarios.scenario("disjoint", 2), mode)
    assert (m.rejections, m.caught_at_merge, m.reservation_waits) == (0, 0, 0)
    assert m.test_passed is True and m.lost_updates == 0 and m.writes_checked == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", OVERLAPPING)
def test_every_scenario_with_four_agents_both_modes(name):
    st = runner.run(scenarios.scenario(name, 4), "storm")
    wt = runner.run(scenarios.scenario(name, 4), "worktree")
    assert st.lost_updates == wt.lost_updates == 0 and not st.agent_errors and not wt.agent_errors
    if name == "rename-late":
        assert st.test_passed is False and wt.test_passed is False
    else:
        assert st.caught_at_write >= 1 and st.test_passed is True
        assert wt.caught_at_merge + wt.caught_by_tests >= 1


@pytest.mark.slow
def test_disjoint_control_with_eight_agents_both_modes():
    for mode in runner.MODES:
        m = runner.run(scenarios.scenario("disjoint", 8), mode)
        assert (m.rejections, m.caught_at_merge) == (0, 0) and m.test_passed is True


# -- lost updates, against the final tree -------------------------------------------------------
def test_lost_update_check_finds_work_missing_from_a_real_final_tree(tmp_path):
    """A blind overwrite (the second writer based its write on the version before the
    first one's) drops a line from the final tree: the check must report it, and must
    not report a removal made by a writer that had seen the line."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base, first = b"a\nb\n", b"a\nb\nfirst\n"
    blind = b"a\nb\nsecond\n"  # made on `base`: `first` is gone
    (repo / "f.txt").write_bytes(blind)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "final")
    final = {"f.txt": runner._content(str(repo), "HEAD", "f.txt")}
    writes = [Write("a1", "f.txt", base, first), Write("a2", "f.txt", base, blind)]
    lost = lost_updates(writes, final)
    assert [x["agent"] for x in lost] == ["a1"] and lost[0]["lines"] == ["first"]
    seen = [Write("a1", "f.txt", base, first), Write("a2", "f.txt", first, blind)]
    assert lost_updates(seen, final) == []


# -- history replay on a real history -------------------------------------------------------
@pytest.fixture(scope="module")
def click_repo(tmp_path_factory):
    if CLICK_BUNDLE is None:
        pytest.skip("click.bundle is not here: no shared/data beside the checkout")
    dest = tmp_path_factory.mktemp("click") / "click"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(CLICK_BUNDLE), str(dest)], check=True)
    return dest


@pytest.mark.slow
def test_replay_deals_commits_and_reads_imports(click_repo):
    w = workload.replay(str(click_repo), "HEAD~10..HEAD", 3)
    assert w.n_changes == 10 and [len(a) for a in w.agents] == [4, 3, 3]
    py = [c for a in w.agents for c in a if any(t.endswith("core.py") for t in c.targets)]
    assert py and any(r.startswith("src/click/") for c in py for r in c.reads)
    assert set(w.reference) == {t for a in w.agents for c in a for t in c.targets}


@pytest.mark.slow
def test_replay_both_modes_on_click(click_repo):
    w = workload.replay(str(click_repo), "HEAD~8..HEAD", 2, test_cmd="python -m compileall -q src")
    for mode in runner.MODES:
        m = runner.run(w, mode)
        assert m.agent_errors == [] and m.changes == 8
        assert m.lost_updates == 0 and m.writes_checked >= 8
        assert m.test_passed is True
        if mode == "storm" and m.judgement == 0:
            assert m.diverged_paths == []  # re-applied in order: the history's end state


@pytest.mark.slow
def test_replay_of_a_repository_holding_a_storm_git_package_uses_the_installed_storm(tmp_path):
    """Replaying storm's own history puts an older storm_git/ in the replayed tree: the
    agents must not import it (they once did, and failed with its old errors)."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "storm_git").mkdir()
    (repo / "storm_git/__init__.py").write_text("raise ImportError('the replayed storm_git was imported')\n")
    (repo / "a.txt").write_text("1\n")
    (repo / "b.txt").write_text("1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    # two commits on different files: no conflict, so both modes must reach the history's
    # end state whatever order the agents finish in (the same file made it a race)
    for i, name in ((2, "a.txt"), (3, "b.txt")):
        (repo / name).write_text(f"{i}\n")
        git(repo, "commit", "-q", "-am", f"{name} {i}")
    w = workload.replay(str(repo), "HEAD~2..HEAD", 2)
    for mode in runner.MODES:
        m = runner.run(w, mode)
        assert m.agent_errors == [], m.agent_errors
        assert m.lost_updates == 0 and m.diverged_paths == []


@pytest.mark.slow
def test_replay_on_click_with_four_agents(click_repo):
    w = workload.replay(str(click_repo), "HEAD~16..HEAD", 4)
    for mode in runner.MODES:
        m = runner.run(w, mode)
        assert m.agent_errors == [] and m.lost_updates == 0


# -- the report and the CLI -------------------------------------------------------------------
@pytest.mark.slow
def test_cli_report_files_and_markdown_matches_json(tmp_path):
    out = tmp_path / "out"
    r = storm(tmp_path, "simulate", "--scenarios", "--only", "registry,disjoint", "--agents", "2",
              "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for f in ("report.json", "report.md"):
        assert (out / f).stat().st_size > 0, f
    assert json.loads((out / "report.json").read_text())["runs"] == data["runs"]
    rows = report.parse_markdown_runs((out / "report.md").read_text())
    assert len(rows) == len(data["runs"]) == 4
    for row, run in zip(rows, data["runs"], strict=True):
        assert row == {k: report.cell(k, run[k]) for _, k in report.COLUMNS}
    assert "simulate: registry, 2 agents, in storm mode" in r.stderr
    if not _plots_possible():
        assert not list(out.glob("*.png")) and "matplotlib is not installed" in r.stderr
        pytest.skip("the plots need matplotlib (the sim extra), which is not installed")
    for f in report.PLOTS:
        assert (out / f).stat().st_size > 0, f


def test_report_without_matplotlib_skips_plots_with_a_message(tmp_path):
    data = {"runs": [], "seconds": 0.0, "started": "now", "definitions": {}}
    code = ("import sys, json; sys.modules['matplotlib'] = None\n"
            "from storm_git.sim import report\n"
            f"print(json.dumps(report.write({data!r}, {str(tmp_path)!r})))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["files"] == ["report.json", "report.md"] and "matplotlib is not installed" in res["plots_skipped"]
    root = ROOT
    assert f"{sys.executable} -m pip install -e '{root}[sim]'" in res["plots_skipped"], res
    assert not list(tmp_path.glob("*.png"))


def test_cli_refuses_bad_input_with_one_line(tmp_path):
    one = tmp_path / "one"  # a single commit: nothing after it to replay
    one.mkdir()
    git(one, "init", "-q", "-b", "main")
    git(one, "commit", "-q", "--allow-empty", "-m", "only")
    for args, needle in ((["simulate"], "nothing to simulate"),
                         (["simulate", "--repo", str(one)], "HEAD has no parent"),
                         (["simulate", "--repo", str(tmp_path / "nope")], "no such directory"),
                         (["simulate", "--scenarios", "--only", "nope"], "no such scenario"),
                         (["simulate", "--scenarios", "--agents", "x"], "comma-separated"),
                         (["simulate", "--repo", ".", "--range", "A..B", "--seed", "x"], "nor 'race'")):
        r = storm(tmp_path, *args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_deps_both_runs_storm_mode_with_each_scope_and_auto_misses_no_conflict(tmp_path):
    """--deps both: storm mode once per validation scope, side by side; on the scenario
    suite's overlapping work the computed scope catches at write what the full one does."""
    out = tmp_path / "out"
    r = storm(tmp_path, "simulate", "--scenarios", "--only", "signature,disjoint", "--agents", "2",
              "--deps", "both", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    runs = {(x["workload"], x["mode"], x["deps"]): x for x in json.loads(r.stdout)["runs"]}
    assert set(runs) == {(w, "storm", d) for w in ("signature", "disjoint") for d in ("full", "auto")} | \
        {("signature", "worktree", "-"), ("disjoint", "worktree", "-")}
    for d in ("full", "auto"):
        sig = runs[("signature", "storm", d)]
        assert sig["caught_at_write"] >= 1 and sig["caught_never"] == 0 and sig["lost_updates"] == 0, sig
        by_reason = sig["rejections_by_reason"]
        assert sum(v["all"] for v in by_reason.values()) == sig["rejections"], by_reason
        assert sum(v["needless"] for v in by_reason.values()) == sig["rejections_needless"], by_reason
        assert runs[("disjoint", "storm", d)]["rejections"] == 0
    assert "auto" in (out / "report.md").read_text()


def test_a_rejection_whose_re_application_needed_judgement_is_needed(tmp_path):
    """Three agents on one file, in a fixed order (c3, then c2, then c1). c2's re-application
    onto c3's write conflicts on one line, and the judgement keeps c2's own side: the
    content is what c2 first wrote, yet the rejection surfaced a conflict, so it is needed.
    (It was counted as needless: 'unchanged' looked at the content only.)"""
    gap = "".join(f"pad{i} = {i}\n" for i in range(6))
    f = lambda m, lo: f"m = {m}\n{gap}L = {lo}\n".encode()  # noqa: E731
    base, c1, c2, c3 = f(0, 0), f(1, 0), f(1, 2), f(1, 3)
    ch = lambda parent, post, order: workload.Change(  # noqa: E731
        f"to {post!r}", ["f.py"], [], {"f.py": parent}, {"f.py": post}, None, {"_order": order})
    w = workload.Workload("judged", "replay", {"f.py": base},
                          [[ch(base, c1, 2)], [ch(c1, c2, 1)], [ch(c2, c3, 0)]])
    m = runner.run(w, "storm")
    assert m.agent_errors == [] and m.lost_updates == 0
    assert m.rejections == 2 and m.judgement >= 2, m
    assert m.rejections_needless == 0 and m.rejections_needed == 2, m
    assert m.rejections_by_reason == {"direct_conflict": {"all": 2, "needless": 0}}


def _overlapping_history(repo: Path) -> None:
    """Six commits on two files, each changing one line of its file: every round of
    three agents has writers of the same file."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name in ("a.txt", "b.txt"):
        (repo / name).write_text("".join(f"line {i}\n" for i in range(40)))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    for i in range(6):
        name = ("a.txt", "b.txt")[i % 2]
        text = (repo / name).read_text().replace(f"line {i * 6}\n", f"line {i * 6} changed\n")
        (repo / name).write_text(text)
        git(repo, "commit", "-q", "-am", f"{name} {i}")


@pytest.mark.slow
def test_a_seeded_replay_is_the_same_run_every_time(tmp_path):
    """--seed: the agents of a round write in a shuffled but fixed order, so two runs
    (two scopes, two versions of storm) meet the same interleaving; 'race' lets them
    write at once. Both reach the history's end state."""
    repo = tmp_path / "r"
    _overlapping_history(repo)
    w = workload.replay(str(repo), "HEAD~6..HEAD", 3, seed=7)
    orders = [[c.args["_order"] for c in a] for a in w.agents]
    assert sorted(o[0] for o in orders) == [0, 1, 2] and sorted(o[1] for o in orders) == [0, 1, 2]
    assert w.params["order"] == "seed 7"
    seen = []
    for _ in range(3):
        m = runner.run(w, "storm")
        assert m.agent_errors == [] and m.lost_updates == 0 and m.diverged_paths == []
        seen.append((m.rejections, m.rejections_by_reason, m.judgement, m.reservation_waits))
    assert seen[0] == seen[1] == seen[2] and seen[0][0] >= 2, seen
    race = workload.replay(str(repo), "HEAD~6..HEAD", 3, seed=None)
    assert all("_order" not in c.args for a in race.agents for c in a) and race.params["order"] == "race"
    m = runner.run(race, "storm")
    assert m.agent_errors == [] and m.lost_updates == 0 and m.diverged_paths == []


# -- what the report says ---------------------------------------------------------------------
def _history(repo: Path, n: int) -> None:
    """``n`` commits after a base, each on its own file: nothing to conflict."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "base.txt").write_text("base\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"{i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"f{i}")


def test_repo_without_range_replays_its_last_commits_and_the_report_says_what_ran(tmp_path):
    """--repo alone replays HEAD's last commits (--quick: 8; fewer in a short history);
    a capped range is reported as what was replayed, not as the range given; the plan
    shows the number of commits in force."""
    repo = tmp_path / "r"
    _history(repo, 11)
    out = tmp_path / "out"
    r = storm(tmp_path, "simulate", "--repo", str(repo), "--quick", "--mode", "storm", "--agents", "2",
              "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["plan"]["rng"] == "HEAD~8..HEAD" and data["plan"]["max_commits"] == 8
    [w] = data["workloads"]
    assert w["name"] == "replay r HEAD~8..HEAD" and w["params"]["commits"] == 8
    assert data["runs"][0]["changes"] == 8
    md = (out / "report.md").read_text()
    assert "* replay r HEAD~8..HEAD: all 8 first-parent commits of HEAD~8..HEAD (" in md, md
    # a range longer than --quick takes: its first 8 commits, and the report says so
    r = storm(tmp_path, "simulate", "--repo", str(repo), "--range", "HEAD~11..HEAD", "--quick", "--mode", "storm",
              "--agents", "2", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["plan"]["max_commits"] == 8 and data["runs"][0]["changes"] == 8
    [w] = data["workloads"]
    assert w["name"] == "replay r HEAD~11..HEAD, first 8 of 11 commits"
    head8 = git(repo, "rev-parse", "HEAD~3").stdout.decode().strip()
    assert w["params"]["to"] == head8
    assert report.replayed(w).startswith("* replay r HEAD~11..HEAD, first 8 of 11 commits: the first 8 of the 11 "
                                         "first-parent commits of HEAD~11..HEAD (")
    # a short history: as many as there are
    short = tmp_path / "short"
    _history(short, 3)
    assert workload.last_commits(str(short), 40) == "HEAD~3..HEAD"
    # a clone whose HEAD is unborn (a clone of a bundle): one line that says so, not git's usage text
    unborn = tmp_path / "unborn"
    subprocess.run(["git", "init", "-q", str(unborn)], check=True)
    with pytest.raises(UsageError, match="HEAD is unborn") as e:
        workload.last_commits(str(unborn), 40)
    assert "--range A..B" in (e.value.hint or "")


def _runs() -> dict:
    """Two runs with small counts (where matplotlib's own ticks are 0.25 apart), one
    agent count: what a quick replay reports."""
    from storm_git.sim.metrics import DEFINITIONS, RunMetrics

    storm_run = RunMetrics("replay r HEAD~8..HEAD", "replay", "storm", "full", 2, None, 8, 3,
                           caught_at_write=1, caught_never=1, rejections=1, rejections_needed=1, wall_s=2.5)
    tree_run = RunMetrics("replay r HEAD~8..HEAD", "replay", "worktree", "-", 2, None, 8, 3,
                          caught_at_merge=1, caught_by_tests=1, wall_s=4.0)
    return {"runs": [storm_run.to_dict(), tree_run.to_dict()], "seconds": 6.5, "started": "now",
            "definitions": DEFINITIONS, "workloads": []}


def _rgb(color) -> tuple:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def test_plots_tell_the_kinds_apart_count_in_whole_numbers_and_start_at_zero():
    pytest.importorskip("matplotlib")
    import itertools
    import math

    import matplotlib.pyplot as plt

    figs = dict(report.figures(_runs()))
    try:
        assert set(figs) == set(report.PLOTS)
        ax = figs["conflicts.png"].axes[0]
        handles, labels = ax.get_legend_handles_labels()
        colors = {lab: _rgb(h.patches[0].get_facecolor()) for h, lab in zip(handles, labels, strict=True)}
        # "differs from reference" is not a conflict count: the table has it, the stacked bars do not
        assert "never" not in labels and not any(lab.startswith("differs") for lab in labels), labels
        tops = sorted(round(p.get_y() + p.get_height(), 6) for p in ax.patches if p.get_height())
        assert tops == [1.0, 1.0, 2.0], tops  # storm: 1 at write (not 2 with the difference); worktree: 1 + 1
        for (a, ca), (b, cb) in itertools.combinations(colors.items(), 2):
            assert math.dist(ca, cb) > 0.3, (a, b, ca, cb)  # "by tests" and "differs" were two oranges
        for name in ("conflicts.png", "rejections.png"):
            ax = figs[name].axes[0]
            ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
            assert ax.get_ylim()[0] == 0
        ax = figs["wall_time.png"].axes[0]
        assert ax.get_lines() == []  # one agent count: no line through a single x
        assert len(ax.patches) == 2 and ax.get_ylim()[0] == 0
        heights = sorted(p.get_height() for p in ax.patches)
        assert heights == [2.5, 4.0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2"]
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_report_md_defines_its_columns_by_their_headers(tmp_path):
    md = report.markdown(_runs())
    definitions = md.split("## Definitions", 1)[1]
    for header, key in report.COLUMNS[4:]:  # workload, agents, mode, deps need none
        assert f"* **{header}**: " in definitions, header
        assert f"`{key}`" not in md
    assert "| never |" not in md and "| differs from reference |" in md
    assert "only a test tells" in definitions  # what a difference from the reference is not
