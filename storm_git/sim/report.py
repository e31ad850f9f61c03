"""The simulation report: JSON (everything), a Markdown table (the same numbers)
and PNG plots (matplotlib, optional: without it the plots are skipped with a
message, never a crash)."""
from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

COLUMNS = [  # (header, key in a run's dict)
    ("workload", "workload"), ("agents", "agents"), ("mode", "mode"), ("deps", "deps"),
    ("at write", "caught_at_write"), ("at merge", "caught_at_merge"), ("by tests", "caught_by_tests"),
    ("differs from reference", "caught_never"), ("lost updates", "lost_updates"), ("rejections", "rejections"),
    ("needed", "rejections_needed"), ("needless", "rejections_needless"), ("re-reads", "rereads"),
    ("judgement", "judgement"), ("reservation waits", "reservation_waits"), ("wall s", "wall_s"),
    ("of it merge/commit s", "integrate_s"),
    ("tests", "test_passed"),
]
TOTALS = ["caught_at_write", "caught_at_merge", "caught_by_tests", "caught_never", "lost_updates",
          "rejections", "rejections_needed", "rejections_needless", "rereads", "judgement", "wall_s", "integrate_s"]
PLOTS = ("conflicts.png", "rejections.png", "wall_time.png")


def cell(key: str, value: Any) -> str:
    if key == "test_passed":
        return "-" if value is None else ("pass" if value else "FAIL")
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def label(run: dict[str, Any]) -> str:
    return "storm" if run["mode"] == "storm" and run["deps"] in ("full", "-") else (
        f"storm/{run['deps']}" if run["mode"] == "storm" else "worktree")


def replayed(w: dict[str, Any]) -> str:
    """What a replay replayed, in one line: the commits taken of the range given."""
    p = w["params"]
    taken = (f"all {p['commits']}" if p["commits"] == p.get("commits_in_range", p["commits"])
             else f"the first {p['commits']} of the {p['commits_in_range']}")
    return (f"* {w['name']}: {taken} first-parent commits of {p['range']} "
            f"({p['from'][:10]}..{p['to'][:10]}), dealt to {p['agents']} agents, order {p['order']}.")


def totals(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Sums per mode (and validation scope) over all runs."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in runs:
        t = out[label(r)]
        t["runs"] += 1
        t["tests_failed"] += int(r["test_passed"] is False)
        for k in TOTALS:
            t[k] += r[k]
    return {m: dict(v) for m, v in out.items()}


def markdown(data: dict[str, Any], plots: list[str] | None = None) -> str:
    runs = data["runs"]
    lines = ["# git storm simulate", "",
             f"{len(runs)} runs, {data['seconds']:.0f} s, started {data['started']}.", ""]
    replays = [w for w in data.get("workloads", []) if w.get("kind") == "replay"]
    if replays:
        lines += [replayed(w) for w in replays] + [""]
    lines += [
             "## Totals per mode", "",
             "| mode | runs | at write | at merge | by tests | differs from reference | lost updates | rejections "
             "| needless "
             "| judgement | tests failed | wall s | of it merge/commit s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m, t in totals(runs).items():
        lines.append(f"| {m} | {t['runs']:.0f} | {t['caught_at_write']:.0f} | {t['caught_at_merge']:.0f} | "
                     f"{t['caught_by_tests']:.0f} | {t['caught_never']:.0f} | {t['lost_updates']:.0f} | "
                     f"{t['rejections']:.0f} | {t['rejections_needless']:.0f} | {t['judgement']:.0f} | "
                     f"{t['tests_failed']:.0f} | {t['wall_s']:.1f} | {t['integrate_s']:.1f} |")
    by_reason: dict[str, dict[str, list[int]]] = {}
    for r in runs:
        for reason, n in r.get("rejections_by_reason", {}).items():
            row = by_reason.setdefault(label(r), {}).setdefault(reason, [0, 0])
            row[0] += n["all"]
            row[1] += n["needless"]
    if by_reason:
        lines += ["", "## Rejections by reason (all / needless)", "",
                  "| mode | reason | rejections | needless |", "| --- | --- | ---: | ---: |"]
        for m, reasons in by_reason.items():
            lines += [f"| {m} | {reason} | {a} | {b} |" for reason, (a, b) in sorted(reasons.items())]
    lines += ["", "## Every run", "",
              "| " + " | ".join(h for h, _ in COLUMNS) + " |",
              "| " + " | ".join("---" if i < 4 else "---:" for i in range(len(COLUMNS))) + " |"]
    for r in runs:
        lines.append("| " + " | ".join(cell(k, r[k]) for _, k in COLUMNS) + " |")
    definitions = data.get("definitions", {})
    lines += ["", "## Definitions", ""] + [f"* **{h}**: {definitions[k]}" for h, k in COLUMNS if k in definitions]
    notes = [f"* {r['workload']}, {r['agents']} agents, {label(r)}: {n}"
             for r in runs for n in r.get("agent_errors", []) + r.get("notes", [])]
    if notes:
        lines += ["", "## Errors and notes", ""] + notes
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def parse_markdown_runs(text: str) -> list[dict[str, str]]:
    """The "Every run" table back as rows of strings (tests compare it with the JSON)."""
    part = text.split("## Every run", 1)[1].split("## Definitions", 1)[0]
    rows = [ln for ln in part.splitlines() if ln.startswith("|")][2:]
    return [dict(zip([k for _, k in COLUMNS], [c.strip() for c in ln.strip("|").split("|")], strict=False))
            for ln in rows]


def write(data: dict[str, Any], out: str) -> dict[str, Any]:
    """Write report.json, report.md and the plots into ``out``; what was written."""
    return write_with(data, out, plot, markdown)


def write_with(data: dict[str, Any], out: str, plotter: Any, to_markdown: Any) -> dict[str, Any]:
    """report.json, report.md (``to_markdown(data, plots)``) and the plots
    (``plotter(data, out)`` -> (file names, why none)) into ``out``; what was written."""
    os.makedirs(out, exist_ok=True)
    plots, note = plotter(data, out)
    with open(os.path.join(out, "report.json"), "w") as fh:
        json.dump(data, fh, indent=1)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(to_markdown(data, plots))
    return {"dir": out, "files": ["report.json", "report.md"] + list(plots), "plots_skipped": note}


def plot(data: dict[str, Any], out: str) -> tuple[list[str], str | None]:
    """The three plots as PNGs; ([], reason) when matplotlib is not installed."""
    try:
        made = figures(data)
    except ImportError:
        from ..core.installation import pip_install

        return [], f"matplotlib is not installed: plots skipped ({pip_install('sim')})"
    import matplotlib.pyplot as plt

    for name, fig in made:
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
    return [name for name, _ in made], None


def figures(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """(file name, matplotlib figure) of each plot the runs have data for (raises
    ImportError without matplotlib). The caller saves or inspects and closes them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    made = [(name, fn(plt, runs)) for name, fn in zip(PLOTS, (_conflicts, _rejections, _wall), strict=True)]
    return [(name, fig) for name, fig in made if fig is not None]


# Okabe-Ito colours: told apart with any common colour vision deficiency, and in grey
# print by lightness; "differs" is a light neutral grey: a difference, not a verdict.
CONFLICT_KINDS = [("caught_at_write", "at write", "#009E73"), ("caught_at_merge", "at merge", "#E69F00"),
                  ("caught_by_tests", "by tests (after)", "#CC79A7"),
                  ("caught_never", "differs from reference, no test failed", "#DDDDDD")]


def _count_axes(ax: Any, groups: int) -> None:
    """Counts start at 0 with whole-number ticks (matplotlib picks 0.25 steps for small
    ones) and some room above the tallest bar; a lone group of bars keeps a bar's width."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(1.0, ax.dataLim.y1) * 1.08)
    ax.set_xlim(-0.75, groups - 0.25)


def _group(r: dict[str, Any]) -> str:
    """Scenarios are summed over their agent counts; a replay is one bar per agent count."""
    if r["kind"] == "scenario":
        return r["workload"]
    name = r["workload"].replace("replay ", "").split(" ", 1)[0]
    return f"{name[:24]} ({r['agents']} agents)"


def _agents_note(runs: list[dict[str, Any]]) -> str:
    ks = sorted({r["agents"] for r in runs if r["kind"] == "scenario"})
    return f"; scenarios summed over {'/'.join(map(str, ks))} agents" if len(ks) > 1 else ""


def _conflicts(plt: Any, runs: list[dict[str, Any]]) -> Any:
    """Stacked bars: conflicts by when they were caught, per workload, one bar per mode."""
    groups = list(dict.fromkeys(_group(r) for r in runs))
    modes = list(dict.fromkeys(label(r) for r in runs))
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(groups) * len(modes)), 4.2))
    width = 0.8 / max(1, len(modes))
    hatches = ["", "//", ".."]
    for j, m in enumerate(modes):
        bottom = [0.0] * len(groups)
        for key, name, color in CONFLICT_KINDS[:-1]:  # "differs from reference" is not a conflict count
            vals = [sum(r[key] for r in runs if _group(r) == g and label(r) == m) for g in groups]
            xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(groups))]
            ax.bar(xs, vals, width, bottom=bottom, color=color, hatch=hatches[j % 3], edgecolor="black",
                   linewidth=0.4, label=f"{name}" if j == 0 else None)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(groups)), groups, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("conflicts")
    _count_axes(ax, len(groups))
    bars = ", ".join(f"{m} {['left', 'right (hatched)', 'third (dotted)'][j % 3]}" for j, m in enumerate(modes))
    ax.set_title(f"When conflicts are caught\n({bars}{_agents_note(runs)})", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _rejections(plt: Any, runs: list[dict[str, Any]]) -> Any:
    storm = [r for r in runs if r["mode"] == "storm"]
    if not storm:
        return None
    groups = list(dict.fromkeys(_group(r) for r in storm))
    scopes = list(dict.fromkeys(r["deps"] for r in storm))
    fig, ax = plt.subplots(figsize=(max(7, 0.5 * len(groups) * len(scopes)), 4.2))
    width = 0.8 / len(scopes)
    for j, s in enumerate(scopes):
        xs = [i + (j - (len(scopes) - 1) / 2) * width for i in range(len(groups))]
        need = [sum(r["rejections_needed"] for r in storm if _group(r) == g and r["deps"] == s) for g in groups]
        less = [sum(r["rejections_needless"] for r in storm if _group(r) == g and r["deps"] == s) for g in groups]
        ax.bar(xs, need, width, color="#0072B2" if j == 0 else "#56B4E9", label=f"needed (deps {s})")
        ax.bar(xs, less, width, bottom=need, color="#D55E00" if j == 0 else "#F0E442", label=f"needless (deps {s})")
    ax.set_xticks(range(len(groups)), groups, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("rejections (storm mode)")
    _count_axes(ax, len(groups))
    ax.set_title("Storm-mode rejections: needed vs needless" + _agents_note(runs), fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _wall(plt: Any, runs: list[dict[str, Any]]) -> Any:
    """Bars of the mean wall time per run, grouped by number of agents, one bar per mode
    (bars, not lines: one agent count is the usual replay, and a line needs two)."""
    ks = sorted({r["agents"] for r in runs})
    modes = list(dict.fromkeys(label(r) for r in runs))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(ks) * len(modes)), 4))
    width = 0.8 / max(1, len(modes))
    colors = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]
    for j, m in enumerate(modes):
        xs, means = [], []
        for i, k in enumerate(ks):
            walls = [r["wall_s"] for r in runs if label(r) == m and r["agents"] == k]
            if walls:
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                means.append(sum(walls) / len(walls))
        ax.bar(xs, means, width, color=colors[j % len(colors)], edgecolor="black", linewidth=0.4, label=m)
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("agents")
    ax.set_ylabel("mean wall time per run, s (agents + integration)")
    ax.set_ylim(bottom=0)
    ax.set_title("Wall time by number of agents", fontsize=10)
    ax.legend(fontsize=8)
    return fig
