"""``storm_git.core.waits``: the marks of writes waiting for a reservation, read by the
team's board; a mark outlives no process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from storm_git.core import waits
from storm_git.core.store import Store


def test_a_wait_is_marked_until_it_ends_and_a_dead_processes_mark_is_dropped(repo):
    store = Store.discover(str(repo))
    assert waits.current(store) == {}
    before = waits.stamp(store)
    waits.begin(store, "engineer_2", "engineer_1", "README.md")
    w = waits.current(store)["engineer_2"]
    assert (w.holder, w.path, w.pid) == ("engineer_1", "README.md", os.getpid())
    assert waits.current(store, ["engineer_1"]) == {}
    assert waits.stamp(store) != before
    waits.end(store, "engineer_2")
    assert waits.current(store) == {}
    # a writer killed while it waited: its process is gone, so is its wait
    code = ("import sys; from storm_git.core import waits; from storm_git.core.store import Store; "
            f"waits.begin(Store.discover({str(repo)!r}), 'engineer_3', 'engineer_1', 'src/api.py')")
    subprocess.run([sys.executable, "-c", code], check=True)
    names = os.listdir(waits.waits_dir(store))
    assert len(names) == 1 and json.loads((repo / ".git/storm/waits" / names[0]).read_text())["agent"] == "engineer_3"
    assert waits.current(store) == {}
    assert os.listdir(waits.waits_dir(store)) == []
