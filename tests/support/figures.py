"""Figures the reliability tests measure, for docs/reliability.md.

Each test calls :func:`record`; the figures are printed (``pytest -s`` shows
them) and, when ``$STORM_FIGURES`` names a file, appended to it as JSON lines.
"""
from __future__ import annotations

import json
import os
import time


def record(test: str, **figures: object) -> None:
    line = json.dumps({"test": test, "time": round(time.time()), **figures}, sort_keys=True)
    print(f"\nFIGURES {line}")
    path = os.environ.get("STORM_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def long_run() -> bool:
    """``STORM_LONG=1`` selects the long variants' sizes (also used by @pytest.mark.slow tests)."""
    return os.environ.get("STORM_LONG", "") not in ("", "0")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]
