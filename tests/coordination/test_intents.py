"""Intent annotations: ``git storm intents``, the ``intent_overwritten`` flag and
``intents_in_diff``."""
from __future__ import annotations

import json

import pytest

from helpers import git, storm


def _write(ws, agent, path, content, **kw):
    ws.read([path], agent=agent)
    return ws.write(path, content.encode(), agent=agent, **kw)


def test_intents_lists_annotations_with_their_writer(repo, ws):
    assert _write(ws, "engineer_1", "src/api.py",
                  "def fetch(url, timeout=10):  # engineer_1: callers hang without it\n"
                  "    return http_get(url)\n").accepted
    assert _write(ws, "engineer_2", "src/util.py",
                  "# TODO: not an annotation\n// engineer_1: asked for by engineer_1, written by 2\n"
                  "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n").accepted
    found = json.loads(storm(repo, "intents", "--json").stdout)
    assert [(a["path"], a["line"], a["agent"], a["written_by"]) for a in found] == [
        ("src/api.py", 1, "engineer_1", "engineer_1"),
        ("src/util.py", 2, "engineer_1", "engineer_2"),
    ]
    assert found[0]["why"] == "callers hang without it"
    r = storm(repo, "intents", "src/util.py")
    assert r.returncode == 0 and r.stdout.strip() == \
        "src/util.py:2: engineer_1: asked for by engineer_1, written by 2  [written by engineer_2]"


def test_overwriting_another_agents_annotation_is_flagged_and_logged(repo, ws):
    annotated = "def fetch(url, timeout=10):  # engineer_1: callers hang\n    return http_get(url)\n"
    assert _write(ws, "engineer_1", "src/api.py", annotated).accepted
    # its own annotation: no flag
    res = _write(ws, "engineer_1", "src/api.py", annotated.replace("callers hang", "callers hang (seen in prod)"))
    assert res.accepted and res.flags == []
    # another agent rewrites it: accepted, flagged, logged
    res = _write(ws, "engineer_2", "src/api.py", "def fetch(url, timeout=30):\n    return http_get(url)\n")
    assert res.accepted and res.flags == ["intent_overwritten"]
    log = json.loads(storm(repo, "log", "--json").stdout)
    ev = next(e for e in log if e["type"] == "intent_overwritten")
    assert ev["agent"] == "engineer_2" and ev["owners"] == ["engineer_1"] and ev["paths"] == ["src/api.py"]
    assert "overwrote intent annotation(s) of engineer_1" in storm(repo, "log").stdout
    # a write that keeps the line (moved elsewhere in the file) is not flagged
    ws.forget(None, agent="engineer_1")  # a new task
    assert _write(ws, "engineer_1", "src/util.py", "x = 1  # engineer_1: why\ny = 2\n").accepted
    res = _write(ws, "engineer_2", "src/util.py", "y = 2\nx = 1  # engineer_1: why\n")
    assert res.accepted and res.flags == []


def test_changing_the_code_of_an_annotated_line_keeps_the_annotation(repo, ws):
    """The annotation is the intent, not the code beside it: a write that changes the
    code on the line and keeps the comment word for word overwrites nothing; changing
    the comment's words, or dropping one of two equal comments, does."""
    assert _write(ws, "e1", "src/api.py", "def f(a):  # e1: keep a positional\n    return a\n").accepted
    res = _write(ws, "e2", "src/api.py", "def f(a, b=0):  # e1: keep a positional\n    return a + b\n")
    assert res.accepted and res.flags == [], res.flags
    res = _write(ws, "e2", "src/api.py", "def f(a, b=0):  # e1: keep a positional arg\n    return a + b\n")
    assert res.accepted and res.flags == ["intent_overwritten"]
    ws.forget(None, agent="e1")  # a new task
    two = "x = 1  # e1: twice\ny = 2  # e1: twice\n"
    assert _write(ws, "e1", "src/util.py", two).accepted
    assert _write(ws, "e2", "src/util.py", "x = 3  # e1: twice\ny = 4  # e1: twice\n").flags == []
    assert _write(ws, "e2", "src/util.py", "x = 3  # e1: twice\ny = 4\n").flags == ["intent_overwritten"]
    log = json.loads(storm(repo, "log", "--json").stdout)
    flagged = [e for e in log if e["type"] == "intent_overwritten"]
    assert [e["lines"][0]["text"] for e in flagged] == ["y = 4  # e1: twice", "def f(a, b=0):  # e1: keep a positional"]


def test_rejection_points_out_annotations_in_the_diff(repo, ws):
    ws.read(["src/api.py"], agent="engineer_2")
    ws.read(["src/api.py", "src/util.py"], agent="engineer_4")
    assert _write(ws, "engineer_1", "src/api.py",
                  "def fetch(url, timeout=10):  # engineer_1: callers hang\n    return http_get(url)\n").accepted
    r = storm(repo, "write", "src/api.py", "--json", input="def fetch(url):\n    return 1\n", agent="engineer_2")
    assert r.returncode == 1
    rej = json.loads(r.stdout)["rejection"]
    assert rej["reason"] == "direct_conflict"
    assert rej["intents_in_diff"] == [{"path": "src/api.py", "line": 1, "agent": "engineer_1", "why": "callers hang",
                                      "change": "added",
                                      "text": "def fetch(url, timeout=10):  # engineer_1: callers hang"}]
    # a stale dependency's diff too, in the human rendering
    r = storm(repo, "write", "src/util.py", input="x = 1\n", agent="engineer_4")
    assert r.returncode == 1 and "stale_dependency" in r.stdout
    assert "intent annotations in this diff: added src/api.py:1 (engineer_1: callers hang)" in r.stdout


def test_annotation_line_numbers_are_gits_after_a_form_feed(repo, ws):
    """A ^L page break (Python's standard library has them) is inside a line for git.
    Intents and a rejection's annotation lines must not count it as a line break, or
    every annotation after it gets a line number git does not give."""
    text = "import os\n\x0c\ndef f():  # engineer_1: page one\n    x = 1\x0c  # odd\n    return x  # engineer_1: two\n"
    ws.read(["src/util.py"], agent="engineer_2")
    assert _write(ws, "engineer_1", "src/util.py", text).accepted
    found = json.loads(storm(repo, "intents", "--json").stdout)
    grep = git(repo, "grep", "-n", "engineer_1:", "refs/storm/workspace", "--", "src/util.py").stdout.decode()
    want = [int(line.split(":")[2]) for line in grep.splitlines()]
    assert [a["line"] for a in found] == want == [3, 5]
    r = storm(repo, "write", "src/util.py", "--json", input="y = 2\n", agent="engineer_2")
    assert [i["line"] for i in json.loads(r.stdout)["rejection"]["intents_in_diff"]] == [3, 5]


@pytest.mark.parametrize("text,agent", [
    ("x = 1  # engineer_1: because", "engineer_1"),
    ("// manager: keep the order", "manager"),
    ("# TODO: later", None),
    ("url = 'http://engineer_1: x'", None),
])
def test_annotation_rule(text, agent):
    from storm_git.coordination.intents import parse_line

    hit = parse_line(text, {"engineer_1", "manager"})
    assert (hit[0] if hit else None) == agent


@pytest.mark.parametrize("extended, flagged", [
    ("callers hang; engineer_2: and retry", False),
    ("callers hang (engineer_2: 30 s for uploads)", False),
    ("callers hang, engineer_2 agrees", False),
    ("callers hang  # engineer_2: retries too", False),
    ("callers hang -- engineer_2: measured", False),
    ("callers hang forever", True),  # words run on: a rewording
    ("callers stall; engineer_2: and retry", True),
])
def test_extending_another_agents_annotation_with_a_clause_keeps_it(repo, ws, extended, flagged):
    annotated = "def fetch(url, timeout=10):  # engineer_1: callers hang\n    return http_get(url)\n"
    assert _write(ws, "engineer_1", "src/api.py", annotated).accepted
    res = _write(ws, "engineer_2", "src/api.py", annotated.replace("callers hang", extended))
    assert res.accepted and res.flags == (["intent_overwritten"] if flagged else []), res.flags
