"""A pytest plugin, standard library only, that the test runner loads into the
project's own pytest (``-p``) to learn each test's outcome: it writes
``{nodeid: {"outcome", "tail"}}`` to the file named by ``$STORM_WATCH_RESULTS``.
It is copied to a directory of its own so the project's interpreter loads it
without importing git storm."""
import json
import os

_RESULTS: dict = {}


def _tail(report):
    text = getattr(report, "longreprtext", "") or str(getattr(report, "longrepr", "") or "")
    return "\n".join(text.rstrip().splitlines()[-15:])


def pytest_runtest_logreport(report):
    nid = report.nodeid
    if report.failed:
        if _RESULTS.get(nid, {}).get("outcome") != "failed":
            _RESULTS[nid] = {"outcome": "failed", "tail": _tail(report)}
    elif (nid not in _RESULTS or _RESULTS[nid]["outcome"] == "skipped") and (report.when == "call" or report.skipped):
        _RESULTS[nid] = {"outcome": "passed" if report.passed else "skipped", "tail": ""}


def pytest_collectreport(report):
    if report.failed:
        _RESULTS[report.nodeid or "<collection>"] = {"outcome": "failed", "tail": _tail(report)}


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("STORM_WATCH_RESULTS")
    if not out:
        return
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_RESULTS, fh)
    os.replace(tmp, out)
