"""Real git servers for the remote tests: a ``git daemon`` on loopback, bare
repositories, the first clone that creates the shared workspace and the clones
that join it."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pygit2

from helpers import git, make_repo, read_as, setup_dir, setup_key, storm, write_as
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


def seed(tmp_path: Path, url: str, *, reservation: str | None = "0.5", name: str = "seed") -> Path:
    """The first clone: the project's code, pushed, and the shared workspace created on the remote.

    A server as ``bare`` (and ``install_guard``) left it is seeded once per worker for
    each kind of URL and server: later seeds copy that server's and that clone's files
    (the push runs storm's server hooks, the costliest part of a test's set-up)."""
    srv = _served_repo(tmp_path, url)
    key = _seed_key(srv, url, reservation, name) if srv is not None else None
    done = _SEEDS.get(key) if key is not None else None
    a = tmp_path / name
    if done is not None:
        assert srv is not None
        served_copy, seed_copy, seed_url = done
        shutil.rmtree(srv)
        _copy_repo(served_copy, srv, _SERVER_PATH, str(srv))
        _copy_repo(seed_copy, a, seed_url, url)
        return a
    a = make_repo(a, init_storm=False)
    git(a, "remote", "add", "origin", url)
    git(a, "push", "-q", "origin", "main")
    r = storm(a, "init", "--remote", "origin")
    assert r.returncode == 0, r.stderr
    if reservation is not None:
        git(a, "config", "storm.reservationSeconds", reservation)
    if key is not None:
        assert srv is not None
        _SEEDS[key] = (_keep(srv, str(srv)), _keep(a), url)
    return a


def clone(tmp_path: Path, url: str, name: str, *, reservation: str | None = "0.5") -> Path:
    """A clone that joined the shared workspace; copied from an earlier clone of a
    server whose refs were the same (a join changes nothing on the server)."""
    srv = _served_repo(tmp_path, url)
    key = _clone_key(srv, url, name, reservation) if srv is not None else None
    done = _CLONES.get(key) if key is not None else None
    c = tmp_path / name
    if done is not None:
        _copy_repo(done[0], c, done[1], url)
        return c
    git(tmp_path, "clone", "-q", url, name)
    r = storm(c, "join", "origin")
    assert r.returncode == 0, r.stderr
    if reservation is not None:
        git(c, "config", "storm.reservationSeconds", reservation)
    if key is not None:
        _CLONES[key] = (_keep(c), url)
    return c


# Set-ups kept for copying (see seed and clone). A copy is exact but for the paths its
# git config names (the remote's URL, the server's own path), rewritten to the copy's.
_SEEDS: dict[tuple, tuple[Path, Path, str]] = {}
_CLONES: dict[tuple, tuple[Path, str]] = {}
_SERVER_PATH = "@served-repository@"


def _served_repo(tmp_path: Path, url: str) -> Path | None:
    """The bare repository ``url`` names when the test made it under ``tmp_path`` (a path,
    a file:// URL, or the loopback daemon's ``served`` folder), else None."""
    if url.startswith("file://"):
        path = Path(url[len("file://"):])
    elif url.startswith("git://127.0.0.1:"):
        path = tmp_path / "served" / url.split("/", 3)[3]
    elif "://" in url or ":" in url.split("/")[0]:
        return None
    else:
        path = Path(url)
    return path if path.is_dir() and (path / "HEAD").is_file() and tmp_path in path.parents else None


def _transport(url: str) -> str:
    """A clone or push over a path is git's local copy; file:// and git:// are the pack protocol."""
    return "pack" if "://" in url else "local"


def _tree_files(root: Path) -> tuple:
    return tuple((p.relative_to(root).as_posix(), p.stat().st_mode & 0o777, p.read_bytes())
                 for p in sorted(root.rglob("*")) if p.is_file())


def _seed_key(srv: Path, url: str, reservation: str | None, name: str) -> tuple | None:
    """What a seed meets on the server: nothing pushed yet, its hooks, config, HEAD and
    what installing storm's guard made (the ordering ref: its tree and subject, as its
    commit's id carries the time of the install)."""
    refs = git(srv, "for-each-ref", "--format=%(refname) %(objecttype) %(tree) %(parent) %(subject)").stdout
    if any(not line.startswith(b"refs/storm/ordering ") for line in refs.splitlines()):
        return None
    state = tuple(_tree_files(srv / sub) if (srv / sub).is_dir() else None for sub in ("hooks", "storm"))
    return ("seed", _transport(url), reservation, name, refs, state, _meta(srv), setup_key({}, False))


def _clone_key(srv: Path, url: str, name: str, reservation: str | None) -> tuple:
    """What a clone and its join meet on the server: its refs, HEAD, config and hooks."""
    refs = git(srv, "for-each-ref", "--format=%(objectname) %(refname)").stdout
    hooks = _tree_files(srv / "hooks") if (srv / "hooks").is_dir() else None
    return ("clone", _transport(url), name, reservation, refs, _meta(srv), hooks, setup_key({}, False))


def _meta(srv: Path) -> tuple[bytes, bytes]:
    """The server's config and HEAD, its own path in them made neutral."""
    own, neutral = str(srv).encode(), _SERVER_PATH.encode()
    return (srv / "config").read_bytes().replace(own, neutral), (srv / "HEAD").read_bytes().replace(own, neutral)


def _keep(repo: Path, own_path: str | None = None) -> Path:
    """A copy of ``repo`` among the kept set-ups (its own path in its config made neutral)."""
    kept = setup_dir(f"{repo.name}-") / repo.name
    shutil.copytree(repo, kept, symlinks=True)
    if own_path is not None:
        config = kept / "config"
        config.write_bytes(config.read_bytes().replace(own_path.encode(), _SERVER_PATH.encode()))
    return kept


def _copy_repo(kept: Path, to: Path, old: str, new: str) -> None:
    """``kept`` copied to ``to``, the string ``old`` in its git config (a URL, or the
    server's neutral path) replaced by ``new``; a working tree's index refreshed."""
    shutil.copytree(kept, to, symlinks=True, dirs_exist_ok=True)
    config = to / ".git" / "config" if (to / ".git").is_dir() else to / "config"
    config.write_bytes(config.read_bytes().replace(old.encode(), new.encode()))
    if (to / ".git").is_dir():
        git(to, "update-index", "-q", "--refresh")


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
    a = seed(tmp_path, url, reservation=None, name="a")
    return srv, a, clone(tmp_path, url, "b", reservation=None)


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
