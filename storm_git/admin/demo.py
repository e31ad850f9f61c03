"""``git storm demo``: the same small piece of work in storm mode and in worktree mode.

Two throw-away repositories with the same four files. Three engineers make the
same changes in both:

* each edits a different file (nothing overlaps);
* engineer_1 adds a ``timeout`` parameter to ``fetch()`` while engineer_2 adds
  ``retries`` to the same line, working from the version before;
* engineer_3 writes a new file that calls ``fetch()`` while engineer_1 renames
  it to ``fetch_url()``.

In storm mode the engineers are three real processes synchronised on a barrier
(so the interleaving is the same every run): the second writer of the line and
the caller of the renamed function are refused at their write, get the
rejection payload, re-plan and retry. In worktree mode each engineer works in
its own worktree and branch; the first conflict appears only at merge, and the
second one is not seen by git at all (the merged code fails to import).

The library never prints: :func:`run_demo` returns a :class:`DemoReport`, a list
of :class:`Step` (narration plus the real payloads: the :class:`Rejection` an
agent receives, the :class:`MergeReport` the manager gets); the CLI renders them.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

FILES = {
    "src/api.py": "def fetch(url):\n    return http_get(url)\n",
    "src/client.py": "from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n",
    "src/util.py": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "README.md": "# demo service\n",
}
AGENTS = ("engineer_1", "engineer_2", "engineer_3")
OWN_FILE = {"engineer_1": "src/util.py", "engineer_2": "README.md", "engineer_3": "docs/notes.md"}
FINAL_API = "def fetch_url(url, timeout=10, retries=3):\n    return http_get(url)\n"

STORM, WORKTREE = "storm", "worktree"


@dataclass
class Step:
    """One thing the demo tells: ``kind`` says how to show it.

    part / title / say / item: narration (a part holds titled sections; an item
    is a list entry); accepted: a write that landed; rejected: the
    ``rejection`` exactly as the writing agent received it; merge: the manager's
    ``merge`` report; table: ``rows`` (first row is the header); command: a
    command line to try, ``text`` being what it shows.
    """

    kind: str  # part | title | say | item | accepted | rejected | merge | table | command
    text: str = ""
    mode: str = ""
    agent: str | None = None
    rejection: Any = None  # payloads.Rejection
    merge: Any = None  # merge.MergeReport
    command: str = ""
    rows: list[list[str]] = field(default_factory=list)
    phase: int = 0
    t: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "mode": self.mode, "agent": self.agent, "text": self.text}
        if self.rejection is not None:
            d["rejection"] = self.rejection.to_dict()
        if self.merge is not None:
            d["merge"] = self.merge.to_dict()
        if self.command:
            d["command"] = self.command
        if self.rows:
            d["rows"] = self.rows
        return d


@dataclass
class DemoReport:
    repo: str  # the directory holding both repositories
    repos: dict[str, str]
    kept: bool
    steps: list[Step]
    problems: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"repo": self.repo, "repos": self.repos, "kept": self.kept, "ok": self.ok,
                "problems": self.problems, "seconds": round(self.seconds, 2),
                "events": [s.to_dict() for s in self.steps]}


# -- the work, the same in both modes ------------------------------------------------------

def _text(data: bytes | None) -> str:
    """A file the demo wrote itself, as text (it is there: the demo made it)."""
    assert data is not None
    return data.decode()

def add_parameter(api: str, param: str) -> str:
    """Add ``param`` to the signature of fetch (whatever it is called now)."""
    return re.sub(r"^(def fetch\w*\(.*?)\):", rf"\1, {param}):", api, count=1, flags=re.M)


def rename_fetch(text: str) -> str:
    return re.sub(r"\bfetch\b", "fetch_url", text)


def fetch_name(api: str) -> str:
    """What the fetch function is called in this version of src/api.py (what an agent reads off)."""
    m = re.search(r"^def (fetch\w*)\(", api, flags=re.M)
    return m.group(1) if m else "fetch"


def batch_file(name: str) -> str:
    return f"from api import {name}\n\n\ndef load_all(urls):\n    return [{name}(u) for u in urls]\n"


def _git(repo: str, *args: str) -> None:
    from ..core.store import git_env  # without the caller's GIT_DIR & co: the demo makes its own repositories

    env = git_env(GIT_AUTHOR_NAME="storm demo", GIT_AUTHOR_EMAIL="demo@storm.invalid",
                  GIT_COMMITTER_NAME="storm demo", GIT_COMMITTER_EMAIL="demo@storm.invalid")
    subprocess.run(["git", *args], cwd=repo, check=True, env=env, capture_output=True)


def make_repo(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    for rel, text in FILES.items():
        full = os.path.join(path, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "demo: initial service")


def imports_cleanly(src: str) -> tuple[bool, str]:
    """Does the code on disk import (``import client, batch`` in src/)? The last error line if not."""
    r = subprocess.run([sys.executable, "-B", "-E", "-s", "-c", "import client, batch"], cwd=src,
                       capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    return r.returncode == 0, lines[-1] if lines else ""


# -- storm mode: three processes ------------------------------------------------------------
def _agent(name: str, repo: str, barrier: Any, out: Any) -> None:
    """One engineer in storm mode (a separate process); reports Steps on ``out``."""
    from ..api import open_workspace

    ws = open_workspace(repo)

    def tell(phase: int, kind: str, text: str, **kw: Any) -> None:
        out.put(Step(kind, text, STORM, name, phase=phase, t=time.time(), **kw))

    def write(phase: int, path: str, content: str, intent: str) -> Any:
        res = ws.write(path, content.encode(), agent=name, intent=intent)
        if res.accepted:
            tell(phase, "accepted", f"{name} wrote {path} ({intent}): accepted as commit {(res.commit or '')[:10]}")
        else:
            tell(phase, "rejected", f"{name} wrote {path} ({intent}): refused", rejection=res.rejection)
        return res

    # 1. disjoint edits, at the same moment
    own = OWN_FILE[name]
    [r] = ws.read([own], agent=name)
    base = _text(r.content) if r.content else ""
    barrier.wait()
    write(1, own, base + f"# {name}: my own part of the work\n", "a note of my own")
    barrier.wait()
    ws.forget(None, agent=name)

    # 2. two engineers change the same line
    if name in ("engineer_1", "engineer_2"):
        [r] = ws.read(["src/api.py"], agent=name)
    barrier.wait()
    if name == "engineer_1":
        write(2, "src/api.py", add_parameter(_text(r.content), "timeout=10"), "add a timeout to fetch")
    barrier.wait()
    if name == "engineer_2":
        res = write(2, "src/api.py", add_parameter(_text(r.content), "retries=3"), "add retries to fetch")
        if not res.accepted:
            current = _text(res.rejection.current_content)
            write(2, "src/api.py", add_parameter(current, "retries=3"), "add retries to fetch, on the new version")
    barrier.wait()
    ws.forget(None, agent=name)

    # 3. a caller of a function that is renamed meanwhile
    if name == "engineer_3":
        [api] = ws.read(["src/api.py"], agent=name)
    if name == "engineer_1":
        api1, client1 = ws.read(["src/api.py", "src/client.py"], agent=name)
    barrier.wait()
    if name == "engineer_1":
        write(3, "src/api.py", rename_fetch(_text(api1.content)), "rename fetch to fetch_url")
        write(3, "src/client.py", rename_fetch(_text(client1.content)), "rename fetch to fetch_url")
    barrier.wait()
    if name == "engineer_3":
        res = write(3, "src/batch.py", batch_file(fetch_name(_text(api.content))), "add load_all")
        if not res.accepted:
            [api] = ws.read(["src/api.py"], agent=name)
            write(3, "src/batch.py", batch_file(fetch_name(_text(api.content))), "add load_all, with the new name")
    barrier.wait()


def _run_storm(repo: str, steps: list[Step], problems: list[str]) -> None:
    from ..admin.setup import init
    from ..api import open_workspace
    from ..core.store import Store

    make_repo(repo)
    init(Store.discover(repo))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(AGENTS), timeout=60)
    out = ctx.Queue()
    procs = [ctx.Process(target=_agent, args=(n, repo, barrier, out), name=n) for n in AGENTS]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    told: list[Step] = []
    while any(p.is_alive() for p in procs) or not out.empty():
        try:  # drain while they run: a full pipe would block an agent at exit
            told.append(out.get(timeout=0.05))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                barrier.abort()  # a dead agent must not leave the others at the barrier
        if time.monotonic() - t0 > 120:
            break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
        if p.exitcode != 0:
            problems.append(f"storm mode: agent process {p.name} exited with {p.exitcode}")
    elapsed = time.monotonic() - t0
    told.sort(key=lambda s: (s.phase, s.t))
    by_phase = {ph: [s for s in told if s.phase == ph] for ph in (1, 2, 3)}

    def say(text: str) -> None:
        steps.append(Step("say", text, STORM))

    steps.append(Step("part", "Part 1: storm mode, one shared workspace", STORM))
    say("All three engineers read and write the same files. Every read returns the file together with its "
        "version. A write is accepted only if the file, and every other file the engineer read, is still the "
        "version the engineer saw; otherwise the write is refused, nothing is changed, and the engineer is "
        "told what changed. Each accepted write is a git commit on the shared branch refs/storm/workspace, "
        "and the file is updated on disk. The engineers are three separate processes calling git storm's "
        "library, as `git storm read` and `git storm write` would.")
    steps.append(Step("title", "1. Three engineers edit three different files at the same moment", STORM))
    steps.extend(by_phase[1])
    say("Nothing overlapped, so all three writes landed.")

    steps.append(Step("title", "2. Two engineers change the same line", STORM))
    say("engineer_1 and engineer_2 both read src/api.py, which starts with `def fetch(url):`. engineer_1 "
        "adds a timeout parameter and writes first:")
    rest = _split_at_rejection(by_phase[2])
    steps.extend(rest[0])
    if rest[1] is not None:
        say("engineer_2, still working from the version it read, adds a retries parameter to the same line "
            "and writes. It is refused. This is what engineer_2 receives, exactly as `git storm write` "
            "prints it (exit code 1; `--json` gives the same fields):")
        steps.append(rest[1])
        say("What engineer_2 does next: it does not overwrite engineer_1's change. The rejection carries the "
            "current content, so engineer_2 applies its own change to that version (retries next to "
            "timeout) and writes again. Meanwhile it holds the file for a short while, so that nobody "
            "overtakes its retry:")
    steps.extend(rest[2])

    steps.append(Step("title", "3. A function is renamed while another engineer starts calling it", STORM))
    say("engineer_3 reads src/api.py to see how to call fetch(). Meanwhile engineer_1 renames fetch() to "
        "fetch_url() in src/api.py and src/client.py:")
    rest = _split_at_rejection(by_phase[3])
    steps.extend(rest[0])
    if rest[1] is not None:
        say("engineer_3 now writes a new file, src/batch.py, that calls fetch() as it read it. engineer_3 "
            "never touched src/api.py, but its new file depends on what it read there, and that has changed "
            "(a stale dependency). The write is refused:")
        steps.append(rest[1])
        say("What engineer_3 does next: it reads src/api.py again, sees the new name, and writes src/batch.py "
            "calling fetch_url():")
    steps.extend(rest[2])

    ws = open_workspace(repo)
    with open(os.path.join(repo, "src/api.py"), encoding="utf-8") as fh:
        api = fh.read()
    runs, error = imports_cleanly(os.path.join(repo, "src"))
    accepted = sum(1 for s in told if s.kind == "accepted")
    refused = [s for s in told if s.kind == "rejected"]
    first = api.splitlines()[0] if api else "(empty)"
    say(f"Result: {accepted} writes accepted, {len(refused)} refused and retried by {len(AGENTS)} processes "
        f"in {elapsed:.1f}s. src/api.py now starts with `{first}`"
        + (": both parameters and the new name, nothing lost, and the code imports cleanly "
           "(`import client, batch`)." if api == FINAL_API and runs else f"; `import client, batch`: {error or 'ok'}."))

    reasons = sorted((s.agent or "", s.rejection.reason) for s in refused)
    checks = {
        "three disjoint writes accepted": sum(1 for s in by_phase[1] if s.kind == "accepted") == 3,
        "engineer_2 refused as a direct conflict, engineer_3 as a stale dependency":
            reasons == [("engineer_2", "direct_conflict"), ("engineer_3", "stale_dependency")],
        "src/api.py with both parameters and the new name": api == FINAL_API,
        f"the code to import cleanly{f' ({error})' if error else ''}": runs,
        "the files on disk to equal the shared head": _disk_matches(ws),
    }
    problems.extend(f"storm mode: expected {what}" for what, ok in checks.items() if not ok)


def _split_at_rejection(told: list[Step]) -> tuple[list[Step], Step | None, list[Step]]:
    """(steps before the first rejection, the rejection, steps after it)."""
    for i, s in enumerate(told):
        if s.kind == "rejected":
            return told[:i], s, told[i + 1:]
    return told, None, []


# -- worktree mode: one branch per engineer ---------------------------------------------------
def _run_worktree(repo: str, steps: list[Step], problems: list[str]) -> None:
    from ..admin.modes import switch
    from ..admin.setup import init
    from ..core.store import Store
    from ..worktree.merge import merge
    from ..worktree.workspace import WorktreeWorkspace
    from ..worktree.worktrees import spawn

    make_repo(repo)
    store = Store.discover(repo)
    init(store)
    switch(store, WORKTREE, by="manager")
    ws = WorktreeWorkspace(store)

    def say(text: str) -> None:
        steps.append(Step("say", text, WORKTREE))

    steps.append(Step("part", "Part 2: the same work in worktree mode, one branch per engineer", WORKTREE))
    say("Same starting files, same three engineers, same changes. This time each engineer gets its own git "
        "worktree and branch, and a manager merges the branches at the end "
        "(`git storm mode worktree`, then `git storm spawn engineer_1`, and so on):")
    for name in AGENTS:
        res = spawn(store, name, by="manager")
        steps.append(Step("item", f"{name}: branch {res.branch}, worktree {os.path.relpath(res.path, repo)}",
                          WORKTREE, name))

    def write(name: str, path: str, content: str, intent: str) -> None:
        ws.write(path, content.encode(), agent=name, intent=intent)
        steps.append(Step("accepted", f"{name} wrote {path} ({intent}) in its own worktree", WORKTREE, name))

    def current(name: str, path: str) -> str:
        [r] = ws.read([path], agent=name)
        return _text(r.content) if r.content else ""

    say("Each engineer makes exactly the changes it made in part 1. Nobody sees anybody else's files, so "
        "every write is accepted and nobody is told anything:")
    for name in AGENTS:
        write(name, OWN_FILE[name], current(name, OWN_FILE[name]) + f"# {name}: my own part of the work\n",
              "a note of my own")
    write("engineer_1", "src/api.py", add_parameter(current("engineer_1", "src/api.py"), "timeout=10"),
          "add a timeout to fetch")
    write("engineer_2", "src/api.py", add_parameter(current("engineer_2", "src/api.py"), "retries=3"),
          "add retries to fetch")
    api3 = current("engineer_3", "src/api.py")
    write("engineer_1", "src/api.py", rename_fetch(current("engineer_1", "src/api.py")), "rename fetch to fetch_url")
    write("engineer_1", "src/client.py", rename_fetch(current("engineer_1", "src/client.py")),
          "rename fetch to fetch_url")
    write("engineer_3", "src/batch.py", batch_file(fetch_name(api3)), "add load_all")
    with ThreadPoolExecutor(len(AGENTS)) as pool:  # they finish at the same time, as in part 1
        list(pool.map(lambda name: ws.commit(f"{name}: done", agent=name), AGENTS))
    say("Each engineer commits to its branch (`git storm commit --agent engineer_1 -m ...`). Then the manager "
        "merges the branches into main (`git storm merge engineer_1 engineer_2 engineer_3`). This is where "
        "the first conflict shows up:")
    rep = merge(store, list(AGENTS), by="manager")
    steps.append(Step("merge", "the manager's merge report", WORKTREE, "manager", merge=rep))
    status = {r.agent: r for r in rep.results}
    say("engineer_2's branch was not merged: its change to the fetch() line collides with engineer_1's. "
        "Someone now has to redo it on top of main (rebase the branch, or merge with --strategy ours|theirs "
        "and check the result), after engineer_2 has long finished its work.")
    runs, error = imports_cleanly(os.path.join(repo, "src"))
    say("engineer_3's branch merged without any conflict, and yet main is broken: src/batch.py calls fetch(), "
        "which engineer_1 renamed. `import client, batch` on main fails with: "
        f"{error or '(it did not fail)'}. No merge can see this; in storm mode the same write was refused and "
        "fixed at once.")

    e2 = status.get("engineer_2")
    checks = {
        "engineer_1 and engineer_3 merged": all(status.get(a) is not None and status[a].status == "merged"
                                                for a in ("engineer_1", "engineer_3")),
        "engineer_2 conflicted on src/api.py": e2 is not None and e2.status == "conflicted"
                                                  and [c.path for c in e2.conflicts] == ["src/api.py"],
        "the merged code fails to import (fetch was renamed)": not runs and "fetch" in error,
    }
    problems.extend(f"worktree mode: expected {what}" for what, ok in checks.items() if not ok)


# -- the whole demo -----------------------------------------------------------------------------
def _closing(repos: dict[str, str], kept: bool) -> list[Step]:
    rows = [
        ["what happened", "storm mode", "worktree mode"],
        ["three edits of different files", "all accepted at once", "all merged"],
        ["two engineers change one line", "refused at the second write, with a diff; "
                                          "fixed by that engineer seconds later",
         "found at merge, after all the work; the branch is not merged"],
        ["a caller of a renamed function", "refused at the write (stale dependency); fixed on retry",
         "not found: merged cleanly, main fails to import"],
    ]
    keep = os.path.dirname(repos[STORM]) if kept else "/tmp/storm-demo"
    cmds = [] if kept else [Step("command", "the same demo, keeping both repositories to look around",
                                 command=f"git storm demo --keep {keep}")]
    cmds += [
        Step("command", "every write and refusal of part 1, by engineer",
             command=f"git -C {keep}/storm-mode storm log"),
        Step("command", "the engineers, what they read, what is stale now",
             command=f"git -C {keep}/storm-mode storm status"),
        Step("command", "the manager commits the shared work of part 1 to main",
             command=f"STORM_AGENT=manager git -C {keep}/storm-mode storm commit -m 'integrate'"),
        Step("command", "the branches of part 2 (engineer_2's is still unmerged)",
             command=f"git -C {keep}/worktree-mode branch -v"),
        Step("command", "every command; each has its own -h with an example", command="git storm -h"),
    ]
    return [Step("part", "When was each conflict caught?"), Step("table", rows=rows),
            Step("part", "Try next")] + cmds


def run_demo(keep: str | None = None) -> DemoReport:
    """Run both parts; the report's ``problems`` name anything that did not go as described."""
    from ..core.errors import UsageError

    base = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="storm-demo-")
    if keep and os.path.exists(base) and os.listdir(base):
        raise UsageError(f"{base} is not empty", hint="give a new directory to --keep")
    repos = {STORM: os.path.join(base, "storm-mode"), WORKTREE: os.path.join(base, "worktree-mode")}
    t0 = time.monotonic()
    steps = [Step("say", "Three coding agents (engineer_1, engineer_2, engineer_3) work on one small Python "
                  "service at the same time: src/api.py, src/client.py, src/util.py and README.md. The same "
                  "work is done twice, first in storm mode, then in worktree mode, each in a throw-away git "
                  f"repository under {base}.")]
    problems: list[str] = []
    try:
        # The worktree part runs while the storm agents start and wait on each other:
        # both mostly wait (on processes, git, the hook), so the demo takes less time.
        wt_steps: list[Step] = []
        with ThreadPoolExecutor(1) as pool:
            worktree_part = pool.submit(_run_worktree, repos[WORKTREE], wt_steps, problems)
            _run_storm(repos[STORM], steps, problems)
            worktree_part.result()
        steps += wt_steps
        steps += _closing(repos, bool(keep))
        return DemoReport(base, repos, bool(keep), steps, problems, time.monotonic() - t0)
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def _disk_matches(ws: Any) -> bool:
    from ..disk.safe_fs import disk_oid

    tree = ws.store.commit(ws.head()).tree
    for path in (*FILES, "docs/notes.md", "src/batch.py"):
        e = ws.store.entry(tree, path)
        if disk_oid(os.path.join(ws.store.main_workdir, path)) != (e.oid if e else None):
            return False
    return True
