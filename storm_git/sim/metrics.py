"""What a run measures, and the lost-update check against the final tree.

Definitions (the report prints them too):

* ``caught_at_write``: rejections whose re-application changed what the agent
  wrote (storm mode): a conflict found before it entered the shared state.
* ``caught_at_merge``: conflicting paths reported by the manager's merge
  (worktree mode), counted at each merge attempt.
* ``caught_by_tests``: 1 when the integrated result fails its test: broken work
  that got in and is only found afterwards.
* ``caught_never`` (reported as "differs from reference"): paths where the
  result differs from the reference (a replay: the history's end state) and no
  test failed. Not a count of missed conflicts: a re-application or a clean
  merge can differ from the history and still be right; only a test tells.
* ``rejections_needed`` / ``rejections_needless``: a needless rejection
  re-applied the agent's change to the same content, with no more judgement
  than the content it first wrote had taken, and the final result passes. A
  re-application that needed new judgement is needed, even when the judgement
  kept the agent's own side.
* ``lost_updates``: accepted writes whose added lines are missing from the final
  tree although no later write that had seen them removed them, plus (storm
  mode) writes that replaced a version their author had not seen. Must be 0.
"""
from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any

# One line per metric of a run, keyed as in the JSON (the report shows them under the
# column headers of storm_git.sim.report.COLUMNS).
DEFINITIONS = {
    "caught_at_write": "storm mode: rejections whose re-application changed what the agent wrote "
                       "(a conflict stopped before it entered the shared state)",
    "caught_at_merge": "worktree mode: conflicting paths reported by the manager's merge, each attempt",
    "caught_by_tests": "1 when the integrated result fails its test: broken work found only afterwards",
    "caught_never": "paths whose final content differs from the reference (a replay: the history's end "
                    "state) while no test failed, or no test ran (--test-cmd). Not a count of missed "
                    "conflicts: a re-application or a clean merge can differ from the history and still "
                    "be right; only a test tells",
    "lost_updates": "accepted work missing from the final tree that no later writer saw and removed (must be 0)",
    "rejections": "storm mode: writes refused (each retried after a re-read)",
    "rejections_needed": "rejections after which the agent wrote something else, or had to judge",
    "rejections_needless": "rejections after which the agent re-applied its change to the same content with "
                           "no new judgement and the result passed",
    "rereads": "files read again after a rejection or a sync",
    "judgement": "hunks that did not re-apply cleanly (the agent's judgement was needed)",
    "reservation_waits": "storm mode: writes that waited for another agent's reservation",
    "wall_s": "seconds from the agents' start to the integrated result",
    "integrate_s": "of those, the manager's commit (storm) or merges and re-applications (worktree)",
    "test_passed": "the integrated result's test: pass, FAIL, or - when there is none",
}


@dataclass
class RunMetrics:
    workload: str
    kind: str
    mode: str
    deps: str
    agents: int
    coupling: float | None
    changes: int
    overlaps: int
    caught_at_write: int = 0
    caught_at_merge: int = 0
    caught_by_tests: int = 0
    caught_never: int = 0
    lost_updates: int = 0
    writes_checked: int = 0  # accepted writes the lost-update check looked at
    rejections: int = 0
    rejections_needed: int = 0
    rejections_needless: int = 0
    # per reason (direct_conflict, stale_dependency, ...): how many, and how many needless;
    # a dependency scope can only ever spare stale_dependency ones
    rejections_by_reason: dict[str, dict[str, int]] = field(default_factory=dict)
    retries: int = 0
    rereads: int = 0
    judgement: int = 0
    reservation_waits: int = 0
    reservation_wait_s: float = 0.0
    gave_up: int = 0
    merge_rounds: int = 0
    diverged_paths: list[str] = field(default_factory=list)
    test_passed: bool | None = None
    test_output: str = ""
    wall_s: float = 0.0
    agents_s: float = 0.0  # of wall_s: the agents' processes, start to last exit
    integrate_s: float = 0.0  # of wall_s: the manager's commit (storm) or merges and resolutions (worktree)
    agent_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the runner had to work around
    # agents working through the CLI: their commands (one per read, per file written, per
    # commit, per merge-resolution step), and rejections cleared by accepting the rebased change
    agent_calls: int = 0
    rebased_accepted: int = 0
    rebased_refused: int = 0  # the rebased change had conflict markers: the agent re-planned
    per_agent: dict[str, dict[str, float]] = field(default_factory=dict)  # retries, re-reads, waits per agent
    # storm mode: each stale_dependency rejection (agent, change, target, stale paths,
    # needless) with, under --deps auto, why each moved file still counted ("moved")
    stale_rejections: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("wall_s", "agents_s", "integrate_s"):
            d[k] = round(d[k], 3)
        d["reservation_wait_s"] = round(self.reservation_wait_s, 3)
        return d


@dataclass
class Write:
    """An accepted write as the checker sees it: in integration order."""

    agent: str
    path: str
    base: bytes | None
    written: bytes | None
    seen: bytes | None = None  # more content its author had in front of it (a merge's other side)


def _lines(c: bytes | None) -> list[bytes]:
    return (c or b"").splitlines()


def added_lines(base: bytes | None, written: bytes | None) -> list[bytes]:
    """Non-blank lines the write added (insert/replace hunks of base -> written)."""
    a, b = _lines(base), _lines(written)
    out = []
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("insert", "replace"):
            out.extend(line for line in b[j1:j2] if line.strip())
    return out


def lost_updates(writes: list[Write], final: dict[str, bytes | None]) -> list[dict[str, Any]]:
    """Writes some of whose added lines the final tree lacks, with no later write
    that had those lines in its base removing them: work silently undone."""
    lost = []
    for i, w in enumerate(writes):
        have = set(_lines(final.get(w.path)))
        missing = [ln for ln in added_lines(w.base, w.written) if ln not in have]
        gone = [ln for ln in missing
                if not any(v.path == w.path and ln in _lines(v.base) + _lines(v.seen) and ln not in _lines(v.written)
                           for v in writes[i + 1:])]
        if gone:
            lost.append({"agent": w.agent, "path": w.path, "lines": [g.decode("utf-8", "replace") for g in gone[:5]]})
    return lost
