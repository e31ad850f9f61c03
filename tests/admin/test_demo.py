"""``git storm demo``: the narrative a new user reads, and the repositories it leaves with --keep.

Assertions are on structure (diff lines, reason keywords, merge status), not on
the exact wording of the rejection text, which storm_git/render.py owns.
"""
from __future__ import annotations

import json

from helpers import git, storm


def _block_after(lines: list[str], start: int) -> list[str]:
    """The indented lines (a quoted payload) that follow line ``start``."""
    out = []
    for line in lines[start + 1:]:
        if line and not line.startswith("    "):
            break
        out.append(line[4:])
    return out


def test_demo_tells_the_rejection_the_retry_and_the_merge_conflict(tmp_path):
    r = storm(tmp_path, "demo")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    flat = " ".join(r.stdout.split())  # narration is wrapped to the terminal

    # the direct conflict: the payload as engineer_2 receives it, with a real multi-line diff
    [at] = [i for i, ln in enumerate(lines) if ln.startswith("  x engineer_2 wrote src/api.py")]
    payload = _block_after(lines, at)
    assert any("direct_conflict" in ln for ln in payload)
    i = payload.index("--- a/src/api.py")
    assert payload[i + 1] == "+++ b/src/api.py" and payload[i + 2].startswith("@@ ")
    assert "-def fetch(url):" in payload and "+def fetch(url, timeout=10):" in payload
    # ... then what engineer_2 did: applied its change to the new version, accepted
    after = " ".join(" ".join(lines[at + 1 + len(payload):]).split())
    assert "+ engineer_2 wrote src/api.py (add retries to fetch, on the new version): accepted" in after

    # the stale dependency: engineer_3 is refused with the diff of the file it had read, then retries
    [at3] = [i for i, ln in enumerate(lines) if ln.startswith("  x engineer_3 wrote src/batch.py")]
    payload3 = _block_after(lines, at3)
    assert any("stale_dependency" in ln for ln in payload3)
    assert "+def fetch_url(url, timeout=10, retries=3):" in payload3
    assert "+ engineer_3 wrote src/batch.py (add load_all, with the new name): accepted" in flat

    # worktree mode: the same collision surfaces at merge, with the hunk's three sides
    [m] = [i for i, ln in enumerate(lines) if ln.startswith("    merge into main")]
    report = "\n".join(_block_after(lines, m - 1))
    assert "conflicted  engineer_2" in report and "src/api.py" in report
    assert "def fetch(url):" in report and "def fetch_url(url, timeout=10):" in report \
        and "def fetch(url, retries=3):" in report
    assert "cannot import name 'fetch'" in flat  # the stale dependency git could not see

    assert "worktree mode" in flat and "When was each conflict caught?" in flat
    assert "checks passed" not in r.stdout and "REJ" not in r.stdout
    assert lines[-1].startswith("demo finished") and "removed" in lines[-1]


def test_demo_keep_json_leaves_both_repositories(tmp_path):
    d = tmp_path / "d"
    r = storm(tmp_path, "demo", "--keep", str(d), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["problems"] == [] and out["kept"]
    kinds = [e["kind"] for e in out["events"]]
    assert {"part", "title", "say", "accepted", "rejected", "merge", "table", "command"} <= set(kinds)
    rejected = [e for e in out["events"] if e["kind"] == "rejected"]
    assert [(e["agent"], e["rejection"]["reason"]) for e in rejected] == [
        ("engineer_2", "direct_conflict"), ("engineer_3", "stale_dependency")]
    assert rejected[0]["rejection"]["diff"].count("\n") >= 4
    [merge] = [e["merge"] for e in out["events"] if e["kind"] == "merge"]
    assert merge["conflicted"] == ["engineer_2"] and set(merge["merged"]) == {"engineer_1", "engineer_3"}

    storm_repo, wt_repo = d / "storm-mode", d / "worktree-mode"
    authors = git(storm_repo, "log", "--format=%an", "refs/storm/workspace").stdout.decode().split()
    assert {"engineer_1", "engineer_2", "engineer_3"} <= set(authors)
    want = "def fetch_url(url, timeout=10, retries=3):\n    return http_get(url)\n"
    assert (storm_repo / "src/api.py").read_text() == want
    assert git(wt_repo, "merge-base", "--is-ancestor", "storm/engineer_2", "main", check=False).returncode == 1
    assert git(wt_repo, "merge-base", "--is-ancestor", "storm/engineer_3", "main").returncode == 0

    again = storm(tmp_path, "demo", "--keep", str(d))
    assert again.returncode == 2 and "not empty" in again.stderr
