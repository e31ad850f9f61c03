"""``git storm demo``: three scripted agents as real concurrent processes.

A throw-away repository; three processes (engineer_1..3) that synchronise on a
barrier so the interesting interleavings happen every time:

1. disjoint edits, written at the same moment: all accepted;
2. engineer_1 and engineer_2 change the same function signature: the second
   writer is rejected (direct conflict) with the first one's diff, re-plans on
   the current content and succeeds, and the signature has both parameters;
3. engineer_3 writes a caller of a function that engineer_1 renamed after
   engineer_3 read it: rejected as a stale dependency with the rename's diff,
   re-planned, accepted.

The function returns the report; the CLI prints it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

FILES = {
    "src/api.py": "def fetch(url):\n    return http_get(url)\n",
    "src/client.py": "from api import fetch\n\n\ndef load(url):\n    return fetch(url)\n",
    "src/util.py": "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    "README.md": "# demo service\n",
}


@dataclass
class DemoReport:
    repo: str
    lines: list[str]
    ok: bool
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"repo": self.repo, "ok": self.ok, "lines": self.lines, "events": self.events}


def _git(repo: str, *args: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="storm demo", GIT_AUTHOR_EMAIL="demo@storm.invalid",
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


def _agent(name: str, repo: str, barrier: Any, out: Any) -> None:
    from .api import open_workspace

    ws = open_workspace(repo)

    def say(phase: int, kind: str, text: str, **data: Any) -> None:
        out.put({"phase": phase, "agent": name, "kind": kind, "text": text, "t": time.time(), **data})

    def write(phase: int, path: str, content: str, intent: str) -> Any:
        res = ws.write(path, content.encode(), agent=name, intent=intent)
        if res.accepted:
            say(phase, "accepted", f"{name} wrote {path} ({intent})", commit=res.commit)
        else:
            r = res.rejection
            stale = ", ".join(s.path for s in r.stale)
            diff = (r.stale[0].diff if r.stale else r.target.diff) if r.target else ""
            changed = [ln for ln in diff.splitlines() if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))]
            say(phase, "rejected", f"{name} rejected writing {path}: {r.reason}"
                + (f" ({stale} changed)" if stale else "")
                + (f"; diff shows {' | '.join(changed[:2])}" if changed else ""),
                reason=r.reason)
        return res

    # 1. disjoint edits at the same moment
    own = {"engineer_1": "src/util.py", "engineer_2": "README.md", "engineer_3": "docs/notes.md"}[name]
    [r] = ws.read([own], agent=name)
    base = r.content.decode() if r.content else ""
    barrier.wait()
    write(1, own, base + f"# {name}: my own part of the work\n", f"{name}: disjoint edit")
    barrier.wait()
    ws.forget(None, agent=name)

    # 2. a direct conflict on one function signature
    if name in ("engineer_1", "engineer_2"):
        [r] = ws.read(["src/api.py"], agent=name)
    barrier.wait()
    if name == "engineer_1":
        text = r.content.decode().replace("def fetch(url):", "def fetch(url, timeout=10):  # engineer_1: callers hang")
        write(2, "src/api.py", text, "engineer_1: add timeout")
    barrier.wait()
    if name == "engineer_2":
        text = r.content.decode().replace("def fetch(url):", "def fetch(url, retries=3):  # engineer_2: flaky server")
        res = write(2, "src/api.py", text, "engineer_2: add retries")
        if not res.accepted:  # re-plan on the current content from the payload
            current = res.rejection.current_content.decode()
            text = current.replace("timeout=10):", "timeout=10, retries=3):").replace(
                "# engineer_1: callers hang", "# engineer_1: callers hang; engineer_2: flaky server")
            write(2, "src/api.py", text, "engineer_2: add retries (retry)")
    barrier.wait()
    ws.forget(None, agent=name)

    # 3. a stale dependency: engineer_1 renames what engineer_3 is about to call
    if name == "engineer_3":
        files = {x.path: x.content.decode() for x in ws.read(["src/api.py", "src/client.py"], agent=name)}
    if name == "engineer_1":
        [r] = ws.read(["src/api.py"], agent=name)
    barrier.wait()
    if name == "engineer_1":
        write(3, "src/api.py", r.content.decode().replace("def fetch(", "def fetch_url("),
              "engineer_1: rename fetch to fetch_url")
    barrier.wait()
    if name == "engineer_3":
        client = files["src/client.py"] + "\n\ndef load_all(urls):  # engineer_3: batch loading\n    return [fetch(u) for u in urls]\n"
        res = write(3, "src/client.py", client, "engineer_3: add load_all")
        if not res.accepted:
            [cur] = [x for x in ws.read(["src/client.py"], agent=name)]
            fixed = cur.content.decode().replace("fetch", "fetch_url") + client[len(files["src/client.py"]):].replace("fetch(", "fetch_url(")
            write(3, "src/client.py", fixed, "engineer_3: add load_all (uses fetch_url)")
    barrier.wait()


def run_demo(keep: str | None = None) -> DemoReport:
    """Run the scenario; returns the report (``ok`` False if any step went otherwise)."""
    from .api import open_workspace
    from .setup import init
    from .store import Store

    repo = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="storm-demo-")
    if keep and os.path.exists(repo) and os.listdir(repo):
        from .errors import UsageError

        raise UsageError(f"{repo} is not empty", hint="give a new directory to --keep")
    try:
        make_repo(repo)
        init(Store.discover(repo))
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(3, timeout=60)
        out = ctx.Queue()
        names = ["engineer_1", "engineer_2", "engineer_3"]
        procs = [ctx.Process(target=_agent, args=(n, repo, barrier, out), name=n) for n in names]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            if p.exitcode != 0:  # a dead agent must not leave the others at the barrier
                barrier.abort()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        elapsed = time.monotonic() - t0
        evs = []
        while not out.empty():
            evs.append(out.get())
        evs.sort(key=lambda e: (e["phase"], e["t"]))
        ws = open_workspace(repo)
        api = (ws.store.main_workdir and open(os.path.join(repo, "src/api.py"), encoding="utf-8").read())
        client = open(os.path.join(repo, "src/client.py"), encoding="utf-8").read()
        titles = {1: "1. disjoint edits, concurrently", 2: "2. same function, two agents (direct conflict)",
                  3: "3. caller of a renamed function (stale dependency)"}
        lines = [f"demo repository: {repo}" + ("" if keep else " (removed afterwards; --keep DIR to keep it)")]
        for phase in (1, 2, 3):
            lines.append(titles[phase])
            lines += [f"   {'ok ' if e['kind'] == 'accepted' else 'REJ'} {e['text']}" for e in evs if e["phase"] == phase]
        reasons = [e.get("reason") for e in evs if e["kind"] == "rejected"]
        checks = {
            "all processes finished": all(p.exitcode == 0 for p in procs),
            "3 disjoint writes accepted": sum(1 for e in evs if e["phase"] == 1 and e["kind"] == "accepted") == 3,
            "direct conflict rejected": reasons.count("direct_conflict") == 1,
            "stale dependency rejected": reasons.count("stale_dependency") == 1,
            "signature has both parameters": "timeout=10, retries=3" in api,
            "caller uses the new name": "fetch_url(u)" in client and "fetch(" not in client.replace("fetch_url(", ""),
            "disk equals the shared head": _disk_matches(ws),
        }
        st = ws.log(100)
        writes = sum(1 for e in st if e["type"] == "write")
        rejections = sum(1 for e in st if e["type"] == "rejection")
        lines.append(f"result: {writes} writes accepted, {rejections} rejected and retried, "
                     f"{len(procs)} agent processes, {elapsed:.1f}s")
        for name, passed in checks.items():
            if not passed:
                lines.append(f"FAILED: {name}")
        ok = all(checks.values())
        lines.append("final src/api.py:   " + api.splitlines()[0])
        lines.append("inspect with: git log --notes='storm/agents/*' refs/storm/workspace; git storm log"
                     if keep else "all checks passed" if ok else "some checks failed")
        return DemoReport(repo, lines, ok, evs)
    finally:
        if not keep:
            shutil.rmtree(repo, ignore_errors=True)


def _disk_matches(ws: Any) -> bool:
    from .disk import disk_oid

    tree = ws.store.commit(ws.head()).tree
    for path in ("src/api.py", "src/client.py", "src/util.py", "README.md", "docs/notes.md"):
        e = ws.store.entry(tree, path)
        if disk_oid(os.path.join(ws.store.main_workdir, path)) != (e.oid if e else None):
            return False
    return True
