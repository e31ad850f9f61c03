"""The pair replay's report: JSON (everything), Markdown (the same numbers) and one
PNG plot (matplotlib, optional as for the other simulation reports)."""
from __future__ import annotations

import json
import os
from typing import Any

from . import report

PLOT = "pairs.png"
PROGRESS = "pairs.jsonl"  # one line per pair as it is done
CAUGHT = [("caught_write", "at write", "#2a9d8f"), ("caught_merge", "at merge", "#e9c46a"),
          ("caught_tests", "by tests", "#f4a261"), ("caught_never", "never", "#e76f51"),
          ("caught_none", "nothing to catch", "#cccccc")]


KEYS = ("pairs", "caught_write", "caught_merge", "caught_tests", "caught_never", "caught_none", "rejections",
        "rebased_accepted", "rebased_refused", "lost_updates", "semantic", "tests_failed", "agent_calls", "wall_s",
        "errors", "clean_pairs", "clean_pairs_calls", "clean_pairs_rejections", "clean_pairs_cleared")


def merges_cleanly(pair: dict[str, Any]) -> bool:
    """git merges the pair without a conflict (worktree mode's merge; else the dataset's verdict)."""
    wt = pair["modes"].get("worktree")
    if wt is not None and not wt["errors"]:
        return not wt["merge_conflicts"]
    return pair["gold_conflict"] is False


def totals(pairs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per mode: the pairs by how they were caught, rejections, rebased clears, lost
    updates, semantic conflicts, agent calls, wall time; and on cleanly merging pairs."""
    out: dict[str, dict[str, float]] = {}
    for p in pairs:
        for mode, r in p["modes"].items():
            t = out.setdefault(mode, dict.fromkeys(KEYS, 0))
            t["pairs"] += 1
            t[f"caught_{r['caught']}"] += 1
            for k in ("rejections", "rebased_accepted", "rebased_refused", "lost_updates", "agent_calls", "wall_s"):
                t[k] += r[k]
            t["semantic"] += int(r["semantic"])
            t["tests_failed"] += int(any(v is False for v in r["tests"].values()))
            t["errors"] += int(bool(r["errors"]))
            if merges_cleanly(p):
                t["clean_pairs"] += 1
                t["clean_pairs_calls"] += r["agent_calls"]
                t["clean_pairs_rejections"] += r["rejections"]
                # every rejection of the pair cleared by one accepted rebased change each
                t["clean_pairs_cleared"] += int(bool(r["rejections"]) and r["rebased_accepted"] == r["rejections"])
    for t in out.values():
        t["wall_s"] = round(t["wall_s"], 2)
    return out


def gold_agreement(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Worktree mode's merge conflicts against the dataset's verdicts."""
    rows = [(p, p["modes"]["worktree"]) for p in pairs if p["gold_conflict"] is not None and "worktree" in p["modes"]]
    differ = [f"{p['task']} f{p['f1']}+f{p['f2']}: merge {'conflicts' if r['merge_conflicts'] else 'clean'}, "
              f"dataset {'conflict' if p['gold_conflict'] else 'clean'}"
              for p, r in rows if bool(r["merge_conflicts"]) != p["gold_conflict"]]
    return {"compared": len(rows), "agree": len(rows) - len(differ), "differ": differ,
            "gold_conflicting": sum(1 for p, _ in rows if p["gold_conflict"]),
            "merge_conflicting": sum(1 for _, r in rows if r["merge_conflicts"])}


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its totals and its agreement with the dataset (re)computed from its pairs."""
    return dict(data, totals=totals(data["pairs"]), gold=gold_agreement(data["pairs"]))


def combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several (the shards of one run): pairs in task and feature order."""
    pairs = sorted((p for r in reports for p in r["pairs"]), key=lambda p: (p["task"], p["f1"], p["f2"]))
    alone: dict[str, dict[str, Any]] = {}
    for r in reports:
        for task, feats in r["alone"].items():
            alone.setdefault(task, {}).update(feats)
    first = reports[0]
    return summarize(dict(first, pairs=pairs, alone=alone, started=min(r["started"] for r in reports),
                          seconds=max(r["seconds"] for r in reports), tests_s=sum(r["tests_s"] for r in reports),
                          plan=dict(first["plan"], shard=[1, 1], shards=len(reports))))


def append_pair(out: str, pair: Any) -> None:
    """Add one finished pair (a :class:`pairs.PairResult`) to ``out``'s progress file."""
    from dataclasses import asdict

    with open(os.path.join(out, PROGRESS), "a") as fh:
        fh.write(json.dumps(asdict(pair)) + "\n")


def _tests(r: dict[str, Any]) -> str:
    if not r["tests"]:
        return "-"
    return " ".join(f"f{k} {'pass' if v else ('-' if v is None else 'FAIL')}" for k, v in r["tests"].items())


def totals_table(data: dict[str, Any]) -> list[str]:
    lines = ["| mode | pairs | at write | at merge | by tests | never | rejections | cleared by rebased change "
             "| lost updates | semantic conflicts | agent calls | calls per cleanly merging pair | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, t in data["totals"].items():
        per = f"{t['clean_pairs_calls'] / t['clean_pairs']:.1f}" if t["clean_pairs"] else "-"
        lines.append(f"| {mode} | {t['pairs']:.0f} | {t['caught_write']:.0f} | {t['caught_merge']:.0f} | "
                     f"{t['caught_tests']:.0f} | {t['caught_never']:.0f} | {t['rejections']:.0f} | "
                     f"{t['rebased_accepted']:.0f} | {t['lost_updates']:.0f} | {t['semantic']:.0f} | "
                     f"{t['agent_calls']:.0f} | {per} | {t['wall_s']:.1f} |")
    return lines


def markdown(data: dict[str, Any], plot: str | None = None) -> str:
    pairs = data["pairs"]
    lines = ["# git storm simulate --pairs", "",
             f"{len(pairs)} pairs, {data['seconds']:.0f} s (of it tests {data['tests_s']:.0f} s), "
             f"started {data['started']}.", "", "## Totals per mode", ""] + totals_table(data)
    clean = [(m, t) for m, t in data["totals"].items() if t["clean_pairs"]]
    if clean:
        n = clean[0][1]["clean_pairs"]
        lines += ["", f"Pairs git merges cleanly: {n}. " + "; ".join(
            f"{m}: {t['clean_pairs_rejections']:.0f} rejections"
            + (f", {t['clean_pairs_cleared']:.0f} pairs cleared by one rebased change a rejection"
               if "rebased" in m else "")
            + f", {t['clean_pairs_calls'] / n:.1f} agent calls a pair" for m, t in clean) + "."]
    g = data["gold"]
    if g["compared"]:
        lines += ["", "## Worktree mode's merge against the dataset's verdicts", "",
                  f"{g['agree']} of {g['compared']} pairs agree (merge conflicts: {g['merge_conflicting']}; "
                  f"dataset: {g['gold_conflicting']} conflicting)."]
        lines += [f"* {d}" for d in g["differ"]]
    lines += ["", "## Every pair", "",
              "| pair | shared files | mode | caught | rejections | rebased | calls | lost | tests | semantic "
              "| wall s |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for p in pairs:
        for mode, r in p["modes"].items():
            lines.append(f"| {p['task']} f{p['f1']}+f{p['f2']} | {', '.join(p['shared']) or '-'} | {mode} | "
                         f"{r['caught']} | {r['rejections']} | {r['rebased_accepted']} | {r['agent_calls']} | "
                         f"{r['lost_updates']} | {_tests(r)} | {'yes' if r['semantic'] else '-'} | {r['wall_s']:.1f} |")
    lines += ["", "## Definitions", ""] + [f"* `{k}`: {v}" for k, v in data["definitions"].items()]
    notes = [f"* {p['task']} f{p['f1']}+f{p['f2']} {m}: {e}" for p in pairs for m, r in p["modes"].items()
             for e in r["errors"]]
    if notes:
        lines += ["", "## Errors and notes", ""] + notes
    if plot:
        lines += ["", "## Plot", "", f"![{plot}]({plot})"]
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], out: str) -> dict[str, Any]:
    """report.json, report.md and the plot into ``out``; what was written."""
    def one_plot(d: dict[str, Any], o: str) -> tuple[list[str], str | None]:
        plotted, note = plot(d, o)
        return ([plotted] if plotted else []), note

    return report.write_with(data, out, one_plot, lambda d, plots: markdown(d, plots[0] if plots else None))


def plot(data: dict[str, Any], out: str) -> tuple[str | None, str | None]:
    """Left: pairs by how each mode caught them; right: agent calls per pair, cleanly
    merging pairs and conflicting ones. (None, reason) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed: plot skipped (pip install 'git-storm[sim]')"
    modes = list(data["totals"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    bottom = [0.0] * len(modes)
    for key, name, color in CAUGHT:
        vals = [data["totals"][m][key] for m in modes]
        left.bar(modes, vals, bottom=bottom, color=color, edgecolor="black", linewidth=0.4, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    left.set_ylabel("pairs")
    left.set_title("How each mode caught the pairs", fontsize=10)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    clean = [p for p in data["pairs"] if merges_cleanly(p)]
    conflicting = [p for p in data["pairs"] if p not in clean]
    width = 0.38
    for j, (group, name) in enumerate(((clean, "cleanly merging pairs"), (conflicting, "conflicting pairs"))):
        vals = [sum(p["modes"][m]["agent_calls"] for p in group if m in p["modes"]) / len(group) if group else 0
                for m in modes]
        right.bar([i + (j - 0.5) * width for i in range(len(modes))], vals, width, label=f"{name} ({len(group)})",
                  color=["#264653", "#e76f51"][j])
    right.set_xticks(range(len(modes)), modes)
    right.set_ylabel("agent calls per pair (both agents)")
    right.set_title("What the pairs cost the agents", fontsize=10)
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, PLOT), dpi=110)
    plt.close(fig)
    return PLOT, None
