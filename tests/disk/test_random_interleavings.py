"""Randomised interleavings of everything that touches the shared working tree:
agents' writes, the manager's ``commit --adopt``, ``exec``, writers
SIGKILLed between their CAS and their disk write, and a person's editor,
``git stash`` and ``git reset --hard``. After every step:

* every acknowledged write is in the shared history;
* no accepted content is ever undone implicitly: every content in this test is
  unique, so a path whose shared history shows a version again (A → B → A) was
  reverted, which only a stash/reset adopted blindly could do;
* after one storm command, the disk equals the shared head for every path no
  person touched since storm last wrote it;
* ``git fsck`` is clean and the next command works without help.
"""
from __future__ import annotations

import json
import random
import time

import pytest

from figures import record
from helpers import fsck, git, hold, make_repo, release, rev, start_storm as spawn, storm, storm_json

FILES = {f"pkg/m{i}.py": f"m{i} = 0\n" for i in range(4)} | {"README.md": "# r\n", "top.txt": "t\n"}
AGENTS = ["e1", "e2", "e3"]


class World:
    def __init__(self, repo, rng: random.Random) -> None:
        self.repo, self.rng = repo, rng
        self.acked: list[tuple[str, str]] = []  # (commit, path) of acknowledged writes
        self.touched: set[str] = set()  # paths a person changed since storm last wrote them
        self.n = 0

    def content(self, who: str) -> str:
        self.n += 1
        return f"# {who} step {self.n} {self.rng.random()}\n"

    # -- steps ----------------------------------------------------------------------
    def write(self) -> None:
        agent, path = self.rng.choice(AGENTS), self.rng.choice(list(FILES))
        storm(self.repo, "read", path, agent=agent)
        code, res = storm_json(self.repo, "write", path, "--no-wait", agent=agent, input=self.content(agent))
        # exit 3: the path holds a person's edit, which storm never writes over: refused before it lands
        refused = code == 3 and (res.get("error") or {}).get("kind") == "unmediated_edit" and path in self.touched
        assert code in (0, 1) or refused, res
        if code == 0 and res.get("commit"):
            self.acked.append((res["commit"], path))

    def exec_(self) -> None:
        agent, path = self.rng.choice(AGENTS), self.rng.choice(list(FILES))
        r = storm(self.repo, "exec", "--no-wait", "--json", "--", "sh", "-c",
                  f"printf '%s' '{self.content(agent)}' >> {path}", agent=agent)
        code, res = r.returncode, json.loads(r.stdout)
        # exit 3: the command changed a file that already held a person's edit; its change
        # cannot be told apart from that edit, so nothing is recorded (unmediated_edit)
        refused = code == 3 and (res.get("error") or {}).get("kind") == "unmediated_edit" and path in self.touched
        assert code in (0, 1) or refused, r.stderr
        if code == 0 and (res.get("write") or {}).get("commit"):
            self.acked.append((res["write"]["commit"], path))
            self.touched -= set(res["paths"])  # the command's result (on top of any edit) is recorded
        else:
            self.touched.add(path)  # the command's change stays on disk, unmediated

    def killed_writer(self) -> None:
        # a path a person edited is refused before the CAS (after a look under the held
        # worktree lock): the window between CAS and disk write is opened on the others
        free = [p for p in FILES if p not in self.touched]
        if not free:
            return
        agent, path = self.rng.choice(AGENTS), self.rng.choice(free)
        storm(self.repo, "read", path, agent=agent)
        before = rev(self.repo, "refs/storm/workspace")
        holder = hold(self.repo, "worktree", seconds=30)
        try:
            w = spawn(self.repo, "write", path, "--no-wait", agent=agent, input=self.content(agent).encode())
            deadline = time.monotonic() + 20
            while rev(self.repo, "refs/storm/workspace") == before and w.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            w.kill()
            w.wait()
        finally:
            release(holder)

    def editor(self) -> None:
        path = self.rng.choice(list(FILES))
        (self.repo / path).write_text(self.content("person"))
        self.touched.add(path)

    def stash_or_reset(self) -> None:
        before = {p: (self.repo / p).read_bytes() if (self.repo / p).exists() else None for p in FILES}
        if self.rng.random() < 0.5:
            git(self.repo, "stash", "-q", check=False)
            git(self.repo, "stash", "drop", "-q", check=False)
        else:
            git(self.repo, "reset", "-q", "--hard")
        self.touched |= {p for p in FILES if ((self.repo / p).read_bytes() if (self.repo / p).exists() else None)
                         != before[p]}

    def commit_adopt(self) -> None:
        code, res = storm_json(self.repo, "commit", "-m", f"integrate {self.n}", "--adopt", agent="manager")
        assert code in (0, 1), res
        if code == 0:
            self.touched -= set(res["adopted"])

    def checkout(self) -> None:
        if self.touched:
            path = self.rng.choice(sorted(self.touched))
            assert storm(self.repo, "checkout", path).returncode == 0
            self.touched.discard(path)

    # -- the invariants --------------------------------------------------------------------
    def check(self) -> None:
        repo = self.repo
        assert storm(repo, "status").returncode == 0  # the next command works, and syncs the disk
        head = rev(repo, "refs/storm/workspace")
        for commit, _ in self.acked:
            assert git(repo, "merge-base", "--is-ancestor", commit, head, check=False).returncode == 0
        for path in FILES:
            seen = git(repo, "log", "--format=", "--raw", "--no-abbrev", "refs/storm/workspace", "--", path
                       ).stdout.decode().split("\n")
            blobs = [ln.split()[3] for ln in seen if ln.startswith(":")]
            blobs = [b for b in blobs if set(b) != {"0"}]
            assert len(blobs) == len(set(blobs)), f"{path} went back to an older version: {blobs}"
            if path not in self.touched:
                want = git(repo, "show", f"{head}:{path}", check=False).stdout
                have = (repo / path).read_bytes() if (repo / path).exists() else b""
                assert have == want, f"{path} on disk is not the shared head's"
        r = fsck(repo)
        assert r.returncode == 0, r.stderr


def run(repo, seed: int, steps: int) -> World:
    rng = random.Random(seed)
    w = World(repo, rng)
    ops = [(w.write, 5), (w.exec_, 2), (w.killed_writer, 1), (w.editor, 2), (w.stash_or_reset, 1),
           (w.commit_adopt, 2), (w.checkout, 1)]
    funcs, weights = zip(*ops, strict=True)
    counts: dict[str, int] = {}
    for _ in range(steps):
        f = rng.choices(funcs, weights)[0]
        f()
        counts[f.__name__.strip("_")] = counts.get(f.__name__.strip("_"), 0) + 1
        w.check()
    record("disk_random", seed=seed, steps=steps, acknowledged=len(w.acked), ops=counts)
    return w


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_random_interleavings_never_revert_or_lose_accepted_work(tmp_path, seed):
    repo = make_repo(tmp_path / "r", FILES)
    w = run(repo, seed, 25)
    assert w.acked, "the run made no accepted write"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 16))
def test_random_interleavings_long(tmp_path, seed):
    repo = make_repo(tmp_path / "r", FILES)
    run(repo, seed, 150)
