"""The validator on its own (storm_git.storm.validate): the rule at a tree, the
locked check's order (a reservation before the verdict), refuse and reject, on a
real repository whose head other agents' writes move."""
from __future__ import annotations

from helpers import accepted_write, read_as
from storm_git.core import readsets, reservations
from storm_git.core.locks import flocked
from storm_git.core.payloads import DIRECT_CONFLICT, STALE_DEPENDENCY, UNREAD_TARGET
from storm_git.core.reservations import Reservation
from storm_git.storm import validate


def _at_head(ws):
    head = ws.head()
    return head, ws.store.commit(head).tree


def test_moved_is_the_rule_over_any_lookup():
    now = {"a": "1", "b": "2"}
    assert validate.moved([("a", "1"), ("b", "9"), ("c", None), ("d", "4")], now.get) == ["b", "d"]


def test_verdict_orders_conflict_unread_and_stale(repo, ws):
    read_as(repo, "a", "src/api.py", "src/util.py")
    reads = readsets.load(ws.store, "a")
    head, tree = _at_head(ws)
    found = validate.verdict(ws.store, tree, ["src/api.py"], reads, reads, None)
    assert found.reason is None and found.conflicts == [] and found.stale == []
    # another agent changes a file a read: a stale dependency of a's write of api.py
    accepted_write(repo, "b", "src/util.py", "def clamp(x, lo=0, hi=1):\n    return x\n")
    head, tree = _at_head(ws)
    found = validate.verdict(ws.store, tree, ["src/api.py"], reads, reads, None)
    assert (found.reason, found.stale) == (STALE_DEPENDENCY, ["src/util.py"])
    # ... a direct conflict when it is the target, whatever else is stale
    found = validate.verdict(ws.store, tree, ["src/util.py"], reads, reads, None)
    assert (found.reason, found.conflicts) == (DIRECT_CONFLICT, ["src/util.py"])
    # a target never read: unread
    found = validate.verdict(ws.store, tree, ["README.md"], reads, {}, None)
    assert (found.reason, found.conflicts) == (UNREAD_TARGET, ["README.md"])
    # expected (an edit on disk) replaces the read version of the target
    cur = str(tree["src/util.py"].id)
    found = validate.verdict(ws.store, tree, ["src/util.py"], reads, {}, {"src/util.py": cur})
    assert found.reason is None


def test_check_stops_at_another_agents_reservation_before_judging(repo, ws):
    store = ws.store
    now = reservations.clock()
    with flocked(store.commondir, "workspace"):
        reservations.update(store, {"src/api.py": Reservation("src/api.py", "b", now + 30, now)}, agent="b",
                            message="test: b reserves")
    judged = []

    def judge():
        judged.append(1)
        return validate.Verdict(None, {}, [], [])

    with flocked(store.commondir, "workspace"):
        chk = validate.check(store, "a", ["src/api.py"], now, judge)
    assert chk.blocked is not None and chk.blocked.holder == "b" and judged == []
    # the holder itself is not blocked, and ignore= passes over a lease whose edit never ran
    with flocked(store.commondir, "workspace"):
        own = validate.check(store, "b", ["src/api.py"], now, judge)
        ignored = validate.check(store, "a", ["src/api.py"], now, judge, ignore=lambda r: r.holder == "b")
    assert own.blocked is None and own.held == ["src/api.py"] and ignored.blocked is None and len(judged) == 2


def test_refuse_reserves_for_a_replan_and_reject_counts_only_the_target_as_read(repo, ws):
    store = ws.store
    read_as(repo, "a", "src/api.py", "src/util.py")
    reads = readsets.load(store, "a")
    accepted_write(repo, "b", "src/util.py", "def clamp(x, lo=0, hi=1):\n    return x\n")
    accepted_write(repo, "b", "src/api.py", "def fetch(url):\n    return 1\n")
    head, tree = _at_head(ws)
    found = validate.verdict(store, tree, ["src/api.py"], reads, reads, None)
    assert found.reason == DIRECT_CONFLICT and found.stale == ["src/util.py"]
    now = reservations.clock()
    with flocked(store.commondir, "workspace"):
        granted = validate.refuse(store, "a", "write", ["src/api.py"], found, head, now, 30)
    assert granted is not None and reservations.get(store, "src/api.py").holder == "a"
    rej = validate.reject(ws, "a", "write", found, head, reads, granted, b"def fetch(url):\n    return 2\n")
    assert rej.reason == DIRECT_CONFLICT and rej.current_content == b"def fetch(url):\n    return 1\n"
    assert [s.path for s in rej.stale] == ["src/util.py"] and "b" in rej.target.changed_by
    after = readsets.load(store, "a")
    assert after["src/api.py"].blob == str(tree["src/api.py"].id)  # shown in full: now read
    assert after["src/util.py"].blob == reads["src/util.py"].blob  # shown as a diff: still stale


def test_a_stale_write_of_a_new_file_reserves_nothing(repo):
    """A's old read of util.py is stale; A's write of a brand-new file is rejected for it,
    and B, who creates that file next, is not made to wait out a reservation of a path
    that holds nobody's work."""
    from helpers import storm, storm_json

    assert storm(repo, "read", "src/util.py", agent="a").returncode == 0
    assert storm(repo, "read", "src/util.py", agent="c").returncode == 0
    assert storm(repo, "write", "src/util.py", input="changed = 1\n", agent="c").returncode == 0
    code, res = storm_json(repo, "write", "src/brand_new.py", "--no-wait", input="x = 1\n", agent="a")
    assert code == 1 and res["rejection"]["reason"] == "stale_dependency", res
    assert res["rejection"].get("reservation") is None, res["rejection"]
    code, st = storm_json(repo, "status")
    assert st["reservations"] == [], st["reservations"]
    code, res = storm_json(repo, "write", "src/brand_new.py", "--no-wait", input="y = 2\n", agent="b")
    assert code == 0 and res["accepted"], res
