"""What changed in the shared working tree since a token: an inotify watch kept by
the resident process (:mod:`storm_git.integrations.hookd`), asked over a socket.

The watch covers every directory of the working tree but ``.git`` and the inside
of nested repositories (of those only the ``.git`` name is watched). Each batch of
events read raises a generation; a path's last change is the generation that saw
it. A token is ``(epoch, generation)``: :meth:`TreeWatch.changed_since` names the
paths changed after it, or answers None (*unknown*) when the token is of another
epoch. The epoch changes whenever events may have been lost: a queue overflow
(the watch is then rebuilt), more changed paths than the watch keeps, a restart
of the resident process (a new watch, a new epoch). The watch keeps directory
names and changed paths, never the tree's contents.

A process that wants an answer asks the resident process over a socket, even a
forked child of it (whose copy of the watch stops at the fork); the resident
process reads the queued events first, so every change made before the question
is in the answer. Without a resident process watching (none runs, another user's,
it is stopped and does not answer in time) :func:`ask` answers None: walk.
"""
from __future__ import annotations

import errno
import os
import socket
import stat
import sys
import uuid
from dataclasses import dataclass

from ..disk import inotify

MASK = (inotify.IN_MODIFY | inotify.IN_ATTRIB | inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_FROM
        | inotify.IN_MOVED_TO | inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_DELETE_SELF
        | inotify.IN_MOVE_SELF | inotify.IN_DONT_FOLLOW | inotify.IN_ONLYDIR | inotify.IN_EXCL_UNLINK)
NESTED_MASK = (inotify.IN_CREATE | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO
               | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_DONT_FOLLOW | inotify.IN_ONLYDIR)
MAX_CHANGED = 100_000  # changed paths kept; beyond, the epoch changes (the next look walks)
QUERY = b"STWQ1"
ASK_TIMEOUT = 1.0  # a stopped resident process: walk after this long


@dataclass
class Answer:
    """A token, and the paths changed since the token asked about (None: unknown)."""

    epoch: str
    gen: int
    changed: set[str] | None


class TreeWatch:
    """The watch over one working tree (in the resident process only)."""

    def __init__(self, top: str, max_changed: int = MAX_CHANGED) -> None:
        self.top = os.path.realpath(top)
        self.max_changed = max_changed
        self.fd = -1
        self.dirs: dict[int, str] = {}  # watch descriptor -> directory (repository path, "" the top)
        self.nested: set[int] = set()  # watches of nested repositories' top directories
        self.epoch = uuid.uuid4().hex
        self.gen = 0
        self.changed: dict[str, int] = {}
        self.broken: str | None = None  # why no answer can be given (the watch limit, say)
        self.resets: dict[str, int] = {}  # why the epoch changed, how often (doctor, tests)

    def start(self) -> None:
        """Watch every directory (a walk of the directories: the start's cost)."""
        if self.fd >= 0:
            os.close(self.fd)
        self.dirs.clear()
        self.nested.clear()
        self.broken = None
        self.fd = inotify.init()
        self._add_tree("")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _add_tree(self, rel: str) -> None:
        stack = [rel]
        while stack and self.broken is None:
            d = stack.pop()
            path = os.path.join(self.top, d) if d else self.top
            try:
                with os.scandir(path) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                nested = bool(d) and any(n == ".git" for n, _ in entries)
                wd = inotify.add_watch(self.fd, os.fsencode(path), NESTED_MASK if nested else MASK)
            except inotify.WatchLimit as exc:
                self.broken = exc.strerror or str(exc)
                return
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # removed meanwhile, or not a directory any more: its parent's event names it
                self.broken = f"cannot watch {path}: {exc.strerror}"  # a directory left unwatched: no answers
                return
            self.dirs[wd] = d
            self.nested.discard(wd)
            if nested:
                self.nested.add(wd)
                continue
            for name, is_dir in entries:
                if is_dir and not (not d and name == ".git"):
                    stack.append(f"{d}/{name}" if d else name)

    def _drop_tree(self, rel: str) -> None:
        """Stop watching a directory moved away (its watches would name the old place)."""
        for wd, d in list(self.dirs.items()):
            if d == rel or d.startswith(rel + "/"):
                inotify.rm_watch(self.fd, wd)
                del self.dirs[wd]

    def _renest(self, wd: int, d: str) -> None:
        """A ``.git`` came or went in ``d``: it became a nested repository (only its
        ``.git`` is watched) or stopped being one (all of it is)."""
        self._drop_tree(d)
        self.nested.discard(wd)
        self._add_tree(d)

    def _mark(self, path: str) -> None:
        self.changed[path] = self.gen
        if len(self.changed) > self.max_changed:
            self._reset("more changed paths than the watch keeps")

    def _reset(self, why: str) -> None:
        self.epoch = uuid.uuid4().hex
        self.changed.clear()
        self.resets[why] = self.resets.get(why, 0) + 1

    def drain(self) -> None:
        """Read every queued event."""
        if self.fd < 0:
            return
        events = inotify.read_events(self.fd)
        if not events:
            return
        self.gen += 1
        for ev in events:
            if ev.mask & inotify.IN_Q_OVERFLOW:
                self._reset("the event queue overflowed")
                self.start()  # directories made meanwhile were never watched: watch afresh
                self.gen += 1
                return
            if ev.mask & inotify.IN_IGNORED:
                self.dirs.pop(ev.wd, None)
                self.nested.discard(ev.wd)
                continue
            d = self.dirs.get(ev.wd)
            if d is None:
                continue
            if ev.mask & (inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
                if not d:  # the working tree's own directory: nothing more would be seen there
                    self.broken = "the working tree's directory was moved or removed"
                    return
                self._mark(d)  # its parent names it too
                continue
            name = os.fsdecode(ev.name)
            if ev.wd in self.nested and name != ".git":
                continue  # inside a nested repository: only its .git counts
            p = f"{d}/{name}" if d else name
            self._mark(p)
            if name == ".git":
                if d:
                    self._renest(ev.wd, d)
                continue  # never watched inside
            if ev.mask & inotify.IN_ISDIR:
                if ev.mask & inotify.IN_MOVED_FROM:
                    self._drop_tree(p)
                elif ev.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                    self._add_tree(p)

    def changed_since(self, epoch: str | None, gen: int | None) -> Answer | None:
        """After reading the queue: the current token and what changed since
        ``(epoch, gen)``; None when the watch cannot answer at all."""
        self.drain()
        if self.broken is not None or self.fd < 0:
            return None
        if epoch != self.epoch or gen is None or gen > self.gen:
            return Answer(self.epoch, self.gen, None)
        return Answer(self.epoch, self.gen, {p for p, g in self.changed.items() if g > gen})


# -- the question, from any process of the same user ---------------------------------
_served: tuple[str, str] | None = None  # in the resident process: (query socket, the watched tree's real path)


def available() -> bool:
    return inotify.available()


def serve_at(path: str, top: str) -> None:
    """In the resident process: its children ask about ``top`` at ``path``."""
    global _served
    _served = (path, os.path.realpath(top))


def ask(common: str, top: str, epoch: str | None, gen: int | None) -> Answer | None:
    """The resident process's answer for the working tree ``top``; None when there
    is none to ask (no resident process with a watch of it, another user's, no
    answer in time, any failure). A forked child asks its parent; another process
    finds the socket in the state the resident process wrote."""
    if _served is not None:
        path, served_top = _served
    else:
        st = read_state(common)
        if st is None or not st.watching or not st.socket:
            return None
        path, served_top = st.socket, st.top
    if os.path.realpath(top) != served_top:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(ASK_TIMEOUT)
    try:
        s.connect(path)
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
            return None  # someone else listens there: no answer of theirs is taken
        s.sendall(QUERY + f" {epoch or '-'} {gen if gen is not None else -1}\n".encode())
        chunks = []
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            chunks.append(b)
    except OSError:
        return None
    finally:
        s.close()
    return decode(b"".join(chunks))


def encode(ans: Answer | None) -> bytes:
    if ans is None:
        return b"NONE\n"
    head = f"OK {ans.epoch} {ans.gen} {'-' if ans.changed is None else len(ans.changed)}\n".encode()
    if not ans.changed:
        return head
    return head + b"".join(os.fsencode(p) + b"\0" for p in ans.changed)


def decode(data: bytes) -> Answer | None:
    head, _, rest = data.partition(b"\n")
    parts = head.split()
    if len(parts) != 4 or parts[0] != b"OK":
        return None
    epoch, gen, n = parts[1].decode(), int(parts[2]), parts[3]
    if n == b"-":
        return Answer(epoch, gen, None)
    paths = [os.fsdecode(p) for p in rest.split(b"\0")[:-1]]
    if len(paths) != int(n):
        return None  # cut short: no answer
    return Answer(epoch, gen, set(paths))


def parse_query(line: bytes) -> tuple[str | None, int | None] | None:
    """``(epoch, gen)`` of a child's question, None when it is not one."""
    parts = line.split()
    if len(parts) != 3 or parts[0] != QUERY:
        return None
    try:
        gen = int(parts[2])
    except ValueError:
        return None
    return (None if parts[1] == b"-" else parts[1].decode("ascii", "replace")), (None if gen < 0 else gen)


def is_dir(top: str, path: str) -> bool:
    """A directory (not a link to one) at ``path`` in the working tree."""
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(top, path)).st_mode)
    except OSError:
        return False


# -- what the resident process's watch is doing, for git storm doctor ------------------
STATE_NAME = "tree-watch"


@dataclass
class State:
    pid: int
    watching: bool
    dirs: int
    why: str | None  # why there is no watch (the watch limit, say)
    socket: str = ""  # where it answers
    top: str = ""  # the working tree it watches (real path)


def _state_path(common: str) -> str:
    return os.path.join(common, "storm", STATE_NAME)


def write_state(common: str, w: TreeWatch | None, why: str | None = None) -> None:
    import json

    path = _state_path(common)
    broken = why or (w.broken if w is not None else "no watch")
    data = {"pid": os.getpid(), "watching": broken is None, "dirs": len(w.dirs) if w is not None else 0,
            "why": broken, "socket": _served[0] if _served else "", "top": w.top if w is not None else ""}
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # storm's directory gone: the daemon retires on its next tick


def clear_state(common: str) -> None:
    """The resident process ends: its state goes (when it is still its own)."""
    st = read_state(common)
    if st is not None and st.pid == os.getpid():
        try:
            os.unlink(_state_path(common))
        except OSError:
            pass


def read_state(common: str) -> State | None:
    """The state the running resident process wrote (None: none, or it is not running)."""
    import json

    try:
        with open(_state_path(common)) as fh:
            d = json.load(fh)
        st = State(int(d["pid"]), bool(d["watching"]), int(d["dirs"]), d.get("why"), str(d.get("socket") or ""),
                   str(d.get("top") or ""))
        os.kill(st.pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return st
