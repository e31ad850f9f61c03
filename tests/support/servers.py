"""Real git servers for the remote tests: a ``git daemon`` on loopback, bare
repositories, the first clone that creates the shared workspace and the clones
that join it."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pygit2

from helpers import git, make_repo, read_as, storm, write_as
from storm_git.core import provenance, readsets
from storm_git.core.store import Store

WS = "refs/storm/workspace"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """``git daemon`` serving ``base`` on 127.0.0.1 with pushes enabled."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.log = open(base.parent / f"daemon-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            ["git", "daemon", "--enable=receive-pack", "--export-all", f"--base-path={base}",
             "--listen=127.0.0.1", f"--port={self.port}", "--reuseaddr", "--informative-errors", str(base)],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 15
        while True:  # ready when it accepts a connection
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"git daemon did not start (see {self.log.name})") from None
                time.sleep(0.02)

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


def bare(path: Path) -> Path:
    git(path.parent, "init", "-q", "--bare", "-b", "main", str(path))
    return path


def seed(tmp_path: Path, url: str, *, reservation: str = "0.5") -> Path:
    """The first clone: the project's code, pushed, and the shared workspace created on the remote."""
    a = make_repo(tmp_path / "seed", init_storm=False)
    git(a, "remote", "add", "origin", url)
    git(a, "push", "-q", "origin", "main")
    r = storm(a, "init", "--remote", "origin")
    assert r.returncode == 0, r.stderr
    git(a, "config", "storm.reservationSeconds", reservation)
    return a


def clone(tmp_path: Path, url: str, name: str, *, reservation: str = "0.5") -> Path:
    git(tmp_path, "clone", "-q", url, name)
    c = tmp_path / name
    r = storm(c, "join", "origin")
    assert r.returncode == 0, r.stderr
    git(c, "config", "storm.reservationSeconds", reservation)
    return c


def server_log(server: Path, since: str | None = None) -> list[str]:
    spec = f"{since}..{WS}" if since else WS
    return git(server, "rev-list", spec).stdout.decode().split()


def server_provenance(srv: Path, agent: str, commit: str):
    """(the commit's provenance trailers, the read set they name) resolved on the server
    alone: its copy of the agent's notes ref holds the journal they point into."""
    import pygit2

    from storm_git.core import trailers

    r = pygit2.Repository(str(srv))
    prov = trailers.provenance(trailers.parse(r[pygit2.Oid(hex=commit)].message))
    assert prov is not None, commit
    tip = r.lookup_reference(f"refs/notes/storm/agents/{agent}").target
    return prov, provenance.entries(r, r[tip].tree, agent, prov)


def install_guard(srv: Path) -> None:
    """storm's server guard in the bare repository ``srv``."""
    r = storm(srv, "server-hook", "install", str(srv))
    assert r.returncode == 0, r.stderr


def served(request, tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A bare repository and the URL of ``kind`` (daemon, file, path) it is served at;
    a daemon is stopped when the test ends."""
    if kind == "daemon":
        base = tmp_path / "served"
        base.mkdir()
        d = Daemon(base)
        request.addfinalizer(d.stop)
        srv = bare(base / "proj.git")
        return srv, d.url("proj.git")
    srv = bare(tmp_path / "proj.git")
    return srv, (f"file://{srv}" if kind == "file" else str(srv))


def ordered_site(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a bare server with storm's guard and ordering, served over file://; clone a,
    which created the shared workspace; clone b, joined)."""
    srv = bare(tmp_path / "proj.git")
    install_guard(srv)
    url = f"file://{srv}"
    a = make_repo(tmp_path / "a", init_storm=False)
    git(a, "remote", "add", "origin", url)
    git(a, "push", "-q", "origin", "main")
    assert storm(a, "init", "--remote", "origin").returncode == 0
    git(tmp_path, "clone", "-q", url, "b")
    r = storm(tmp_path / "b", "join", "origin")
    assert r.returncode == 0, r.stderr
    return srv, a, tmp_path / "b"


def queue(c: Path, agent: str, path: str, content: str) -> tuple[Store, pygit2.Oid, pygit2.Oid]:
    """A write of ``agent`` validated in clone ``c`` and queued there, not pushed: made
    in local mode on the clone's copy of the server's head (then the journal folded
    into the agent's notes, as a clone does before it pushes). (store, commit, notes)."""
    read_as(c, agent, path)
    git(c, "config", "--unset", "storm.remote")
    try:
        code, out = write_as(c, path, content, agent=agent)
        assert code == 0, out
    finally:
        git(c, "config", "storm.remote", "origin")
    st = Store(pygit2.Repository(str(c)))
    readsets.fold(st, agent)
    return st, st.ref_target(WS), st.ref_target("refs/notes/storm/agents/" + agent)
