"""A clone's back-off after stale leases, and the turn that stops one clone starving the others.

Both live in ``.git/storm/remote-gate`` and change only with the clone's remote lock
held (:mod:`.client`).

**Back-off.** After a stale lease the clone waits a random time in a window that
doubles with each stale lease in a row (``BACKOFF_BASE`` .. ``BACKOFF_CAP``), reset by
a push that lands.

**The turn** (``refs/storm/turn`` on the server). Eight busy clones are not eight
peers: the clone whose push just landed pushes again at once (its copy of the
server's head *is* the head), so it wins every race; a clone that lost must fetch,
move its queue and push, and by then the winner has landed again. Measured before
the turn existed (8 clones x 32 writers): one clone landed every write of a 6 s
window while the others' writers waited. So a clone that lost ``TURN_AFTER`` leases
in a row, with writes that survived the move onto the new head, takes the turn: it
moves ``refs/storm/turn`` from the *free* value (:func:`free_value`, the same blob
in every clone) to a value of its own, leased on free (the server's compare-and-
swap: one clone wins, nobody takes it from a holder). Every push of a queue carries
the ref unchanged and leased on free (git sends nothing for it but checks the lease
against the server's advertisement), so while one clone holds the turn every other
clone's push is refused, and a clone that has fetched the turn does not even push: it
looks again as the turn's slice ends. The holder keeps it (:func:`turn_update`,
:func:`clone_busy`) for TURN_SLICE while it is busy, and frees it in a landing push.
A holder that went quiet or died leaves it: another clone that has seen it with the
server's head unchanged for ``storm.remoteTurnIdle``, or at all for
``storm.remoteTurnSeconds`` (measured on its own clock: clocks of two machines never
decide anything), frees it with its push. ``storm.remoteTurns false``: the clone
neither takes turns nor waits for them.

**The line.** Freed, a turn went to whichever waiting clone pushed first, and a clone
could lose every handover of a run (writes waiting 30-42 s in 20-30 s windows, with
others landing every slice). So a clone blocked by another's turn puts its id in the
line (``refs/storm/waiting/<clone id>``, :func:`waiting_value`: one push per wait),
and a holder that lets its turn go *hands* it to the next clone in the line after its
own id, cyclically (:func:`next_in_line`): a turn value that names that clone
(``Storm-Turn-For``, :func:`turn_value`), with that clone's entry deleted in the same
atomic push. A blocked clone looks with ``git ls-remote`` (the turn, the head, its
entry: no objects, its queue not moved) and fetches only when its entry is gone (it
was served), the turn is free, or the idle rule frees it; a clone handed the turn
adopts it at that fetch, without a push of its own. Round robin by id, not by time:
no clock of another machine orders anything, and each waiting clone is served once
before any is served twice. A clone handed a turn that it never uses (dead, or gone
quiet) is freed by the idle rule, and taken out of the line by that push.

**Next in line.** A handing push also names the clone after the new holder in the
line (``NEXT_REF``, :func:`deck_value`: fixed bytes per clone id, so a clone knows its
own value from ``ls-remote`` without a fetch, :func:`on_deck`). That clone fetches the
server's head ahead, objects only, at its looks while blocked (and looks DECK_LEAD
before the slice's end): the fetch after the handover, on the way to its first push,
then carries the last few pushes, not a round of turns' writes.

The turn is advice between storm clients, never correctness: the lease on
``refs/storm/workspace`` is what keeps writes valid. See docs/remote.md, "Busy
clones take turns".
"""
from __future__ import annotations

import os
import random
import re
import socket
import time
from dataclasses import dataclass, replace

import pygit2

from ..core.files import NotRegularFile, read_own, remove_quietly, replace_file
from ..core.remote_state import CLONE_FILE, GATE_FILE
from ..core.store import Store

BACKOFF_BASE = 0.1
BACKOFF_CAP = 2.0
TURN_REF = "refs/storm/turn"
TURN_AFTER = 2  # stale leases in a row after which a clone takes the turn
TURN_SLICE = 2.0  # how long a clone keeps the turn it took (its pushes land back to back meanwhile)
TURN_PAUSE = 0.4  # a holder that has just freed its turn pushes nothing for this long: the next taker's turn
TURN_BURST = 0.25  # a clone whose last push landed this recently is writing back to back
TURN_GRACE = 0.03  # after a landing that kept the turn: no writer of the clone under way this later = idle
TURN_IDLE = 1.0  # storm.remoteTurnIdle: another clone's turn with the server's head unchanged this long is freed
IDLE_KEY = "storm.remoteTurnIdle"
TURNS_KEY = "storm.remoteTurns"  # false: this clone neither takes turns nor waits for them
TURN_SECONDS = 5.0  # storm.remoteTurnSeconds: a turn seen that long unchanged is taken over
TURN_KEY = "storm.remoteTurnSeconds"
TURN_MESSAGE = "storm turn"
WAITING_PREFIX = "refs/storm/waiting/"  # + clone id: that clone waits for a turn
TURN_POLL = (0.04, 0.08)  # blocked past the slice's end (the handover is due): look again this often
NEXT_REF = "refs/storm/next"  # the clone a handing push put next in line after the turn's new holder (deck_value)
DECK_LEAD = 0.3  # the clone next in line looks this long before the slice's end, and fetches ahead
AHEAD_EVERY = 0.5  # a clone next in line fetches ahead at most this often (seconds)
_CLONE_ID = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class Gate:
    """What ``remote-gate`` records. Times are ``time.monotonic()`` of this machine."""

    streak: int = 0  # stale leases in a row
    until: float = 0.0  # no push before
    held: str = ""  # the turn value this clone put on the server (it holds the turn)
    taken: float = 0.0  # when it took it
    seen: str = ""  # another clone's turn, as last fetched
    since: float = 0.0  # when this clone first saw ``seen``
    head: str = ""  # the server's head when it last saw ``seen``
    still: float = 0.0  # since when it has seen ``seen`` and ``head`` both unchanged
    landed: float = 0.0  # when a push of this clone last landed
    deck: bool = False  # the server names this clone next in line after ``seen``'s holder (NEXT_REF)
    ahead: float = 0.0  # when it last fetched ahead, next in line

    def encode(self) -> bytes:
        return (f"{self.streak} {self.until} {self.held or '-'} {self.taken} {self.seen or '-'} {self.since} "
                f"{self.head or '-'} {self.still} {self.landed} {int(self.deck)} {self.ahead}\n").encode("ascii")

    @classmethod
    def decode(cls, raw: bytes) -> Gate:
        """A gate from the file's bytes; the two-field form of older versions reads as
        a streak and a time, the nine-field form (before the line's next) without ``deck``;
        anything unreadable is no back-off and no turn."""
        try:
            p = raw.decode("ascii").split()
            if len(p) == 2:
                return cls(int(p[0]), float(p[1]))
            if len(p) in (9, 11):
                held, seen, head = ("" if x == "-" else x for x in (p[2], p[4], p[6]))
                deck, ahead = (p[9] == "1", float(p[10])) if len(p) == 11 else (False, 0.0)
                return cls(int(p[0]), float(p[1]), held, float(p[3]), seen, float(p[5]), head, float(p[7]),
                           float(p[8]), deck, ahead)
        except (UnicodeDecodeError, ValueError):
            pass
        return cls()


def gate_path(store: Store) -> str:
    return os.path.join(store.commondir, "storm", GATE_FILE)


def read_gate(store: Store) -> Gate:
    """The clone's gate (a fresh one when absent or not a regular file: doctor names that)."""
    try:
        raw = read_own(gate_path(store))
    except (NotRegularFile, OSError):
        return Gate()
    return Gate() if raw is None else Gate.decode(raw)


def write_gate(store: Store, gate: Gate) -> None:
    path = gate_path(store)
    if gate == Gate() and not os.path.exists(path):
        return
    replace_file(path, gate.encode(), tmp=f"{path}.{os.getpid()}")


def after_push(gate: Gate, stale: bool, kept: bool = False) -> Gate:
    """The gate after a push: a landed push resets the back-off (and ended this clone's
    turn, unless it ``kept`` it); a stale lease doubles the window (none while this
    clone holds the turn: its pushes go first). Blocked by another clone's turn, the
    clone looks again as that turn's slice ends (timed from when it was taken:
    ``since``, see after_fetch), if that comes before its window does, and past it
    every TURN_POLL: the handover is noticed as it happens, not up to BACKOFF_CAP
    later."""
    if not stale:
        now = time.monotonic()
        return Gate(held=gate.held, taken=gate.taken, landed=now) if kept and gate.held else \
            replace(gate, streak=0, until=0.0, held="", taken=0.0, landed=now)
    streak = gate.streak + 1
    now = time.monotonic()
    window = 0.0 if gate.held else min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(streak, 16))
    until = now + random.uniform(0, window)
    if gate.seen:  # another clone's turn: look again as its slice ends, if that comes first
        # ``since`` is this clone's first sight of the turn, never before its holder took it:
        # the holder lets it go at its first landing after TURN_SLICE, so this look comes as
        # that landing is due, and the looks after it every TURN_POLL until the handover.
        # The longer a clone has been losing, the sooner it looks (first to take a free
        # turn); the clone next in line looks DECK_LEAD sooner, to fetch the slice ahead.
        ends = gate.since + TURN_SLICE - (DECK_LEAD if gate.deck else 0.0) + random.uniform(0, 0.05 / streak)
        if now < ends < until:
            until = ends
        elif ends <= now:  # the slice is over: its holder hands the turn on at its next landing
            until = min(until, now + random.uniform(*TURN_POLL))
    return replace(gate, streak=streak, until=until)


def after_fetch(gate: Gate, turn: pygit2.Oid | None, held_elsewhere: bool, head: pygit2.Oid | None,
                age: float = 0.0, handed: bool = False) -> Gate:
    """The gate once a fetch showed the server's turn ref and head: a turn this clone
    held and no longer sees was taken over; a turn ``handed`` to this clone is its own
    from now, its slice timed from the handover (``age`` ago); another clone's turn is
    timed from the
    first fetch that showed it (``since``), less its ``age`` then (turn_age: how long
    ago its holder took it, by the holder's clock), and from the first fetch that
    showed it with the server's head where it is now (``still``: its holder has
    landed nothing since)."""
    value = str(turn) if turn is not None else ""
    now = time.monotonic()
    if handed and gate.held != value:  # (it takes the turn to write: a burst starts, as at a take)
        return replace(gate, until=0.0, held=value, taken=now - age, seen="", since=0.0, head="", still=0.0,
                       landed=now, deck=False)
    g = gate if gate.held and gate.held == value else replace(gate, held="", taken=0.0)
    if not held_elsewhere:
        return replace(g, seen="", since=0.0, head="", still=0.0, deck=False)
    where = str(head or "")
    since = g.since if g.seen == value else now - age
    still = g.still if g.seen == value and g.head == where else now
    # next in line or not is known for the turn it was read with (a look reads it again)
    return replace(g, seen=value, since=since, head=where, still=still, deck=g.deck and g.seen == value)


def seen_now(gate: Gate, turn: str, head: str) -> Gate:
    """The gate once this clone knows, without a fetch, that ``turn`` is another clone's
    from now (it handed it on, or a look by ls-remote showed a new one), the server's
    head at ``head``: timed from this moment, as after_fetch times a first sight."""
    now = time.monotonic()
    return replace(gate, seen=turn, since=now, head=head, still=now, deck=False)


def turn_update(gate: Gate, turn: pygit2.Oid | None, free: pygit2.Oid, expire: float,
                idle: float = TURN_IDLE, busy: bool = True,
                legacy: pygit2.Oid | None = None) -> tuple[str, str, str] | None:
    """What every push of a queue does to ``TURN_REF`` (source, ref, lease). Free (the
    ref at ``free``, or absent on a server that never had it): leave it free, with a
    lease that it is (the server's advertisement shows a turn taken since this clone
    last looked: the push is refused). This clone's turn: keep it (the same value:
    git sends nothing but checks the lease) while writes of this clone are under way
    beside those this push carries (``busy``), or free it: once held for TURN_SLICE,
    or when this push carries all there is (the clone would then hold the turn idle,
    and every other clone wait TURN_IDLE to see that). ``legacy``, the free value older
    clones left, is free too. Another clone's turn: free it when this clone has seen it
    for ``expire`` seconds, or for ``idle`` seconds with the server's head unchanged
    (its holder writes nothing); otherwise None: do not push."""
    if gate.held:
        keep = busy and time.monotonic() - gate.taken < TURN_SLICE
        return (gate.held if keep else str(free), TURN_REF, gate.held)
    if turn is None:
        return (str(free), TURN_REF, "")
    now = time.monotonic()
    given_up = gate.seen == str(turn) and (now - gate.since >= expire or now - gate.still >= idle)
    if turn in (free, legacy) or given_up:
        return (str(free), TURN_REF, str(turn))
    return None


def clone_busy(gate: Gate, writers: int) -> bool:
    """Whether this clone's turn is worth keeping past the push it is about to make:
    other writers are under way (``writers``: write locks held, the pusher's own among
    them), or its one writer writes back to back (its last push landed TURN_BURST ago
    or less). One writer alone after a pause (an agent that thinks between writes, or
    its last write) leaves nothing behind the push: the turn goes with it."""
    return bool(gate.held) and (writers >= 2 or time.monotonic() - gate.landed < TURN_BURST)


# The turn's values are blobs, not commits. A ref's new value that is a commit with
# no history in common with the fetching clone (each turn taken was a root commit)
# keeps the server's upload-pack from ever answering "ready": the clone then sends
# every commit of every ref it holds as a "have", in rounds, each waiting on a
# delayed ACK over git:// -- 38-67 haves and 110-170 ms for a fetch after a handover
# in an aged 8 x 32 clone. A blob is not negotiated at all.
def free_value(store: Store) -> pygit2.Oid:
    """The value of ``TURN_REF`` when nobody holds the turn: the same blob in every
    clone of a repository (fixed bytes), so that a clone knows it without a fetch."""
    return store.repo.create_blob(f"{TURN_MESSAGE}: free\n".encode("ascii"))


def legacy_free(store: Store) -> pygit2.Oid:
    """The free value of clones from before the turn's values were blobs (a fixed root
    commit): still free to this version, so that a server they left it on is not
    taken for a turn held."""
    repo = store.repo
    sig = pygit2.Signature("git storm", "storm@localhost", 0, 0)
    return repo.create_commit(None, sig, sig, f"{TURN_MESSAGE}: free\n", repo.TreeBuilder().write(), [])


def turn_text(store: Store, oid: pygit2.Oid) -> str:
    """What a turn value says (a blob's text; a commit's message for the values older
    clones wrote); "" for anything else or a missing object."""
    try:
        obj = store.repo[oid]
    except (KeyError, ValueError):
        return ""
    if isinstance(obj, pygit2.Blob):
        return obj.data.decode("utf-8", "replace")
    return obj.message if isinstance(obj, pygit2.Commit) else ""


def turn_age(message: str, now: float) -> float:
    """How long ago (seconds, by ``now``, this machine's ``time.time()``) the turn whose
    text is ``message`` was taken, by its holder's clock, within 0 and
    TURN_SLICE: a hint for when its slice ends, so that a clone that first saw the
    turn late does not look again late every time (it would lose every handover).
    Clocks of two machines disagree: bounded, a wrong hint costs a look too early or
    too late, never a wrong write. 0 when the message carries no time."""
    try:
        taken = int(message.split("Storm-Turn:", 1)[1].split()[2]) / 1e9
    except (IndexError, ValueError):
        return 0.0
    return min(max(now - taken, 0.0), TURN_SLICE)


def turn_value(store: Store, to: str | None = None) -> pygit2.Oid:
    """A value of its own for this clone's turn (a blob), unique to one taking (host,
    pid, time, random bits). ``to``: the clone id it is handed to
    (``Storm-Turn-For``: that clone holds it from its next fetch)."""
    stamp = f"{socket.gethostname()} {os.getpid()} {time.time_ns()} {random.getrandbits(32):08x}"
    text = f"{TURN_MESSAGE}\n\nStorm-Turn: {stamp}\n"  # turn_age reads the time (third field)
    if to is not None:
        text += f"Storm-Turn-For: {to}\n"
    return store.repo.create_blob(text.encode("utf-8", "replace"))


def turn_for(message: str) -> str | None:
    """The clone id a turn was handed to (None: taken, not handed)."""
    for line in message.splitlines():
        if line.startswith("Storm-Turn-For: "):
            cid = line.split(": ", 1)[1].strip()
            return cid if _CLONE_ID.match(cid) else None
    return None


def waiting_value(store: Store, cid: str) -> pygit2.Oid:
    """The value of ``WAITING_PREFIX + cid``: fixed bytes, so that any clone knows it
    without a fetch and can lease on it when it takes a dead clone out of the line."""
    return store.repo.create_blob(f"{TURN_MESSAGE}: {cid} waits\n".encode("ascii"))


def deck_bytes(cid: str | None) -> bytes:
    """The content of NEXT_REF naming ``cid`` (None: nobody waits after the new holder)."""
    return f"{TURN_MESSAGE}: {cid or 'nobody'} is next\n".encode("ascii")


def deck_value(store: Store, cid: str | None) -> pygit2.Oid:
    """NEXT_REF's value naming ``cid``, written where a handing push can send it."""
    return store.repo.create_blob(deck_bytes(cid))


def on_deck(value: str | None, cid: str | None) -> bool:
    """Whether NEXT_REF's ``value`` (from ``git ls-remote``) names clone ``cid``: fixed
    bytes, so a clone knows its own value without a fetch and without writing it."""
    return bool(value and cid) and value == str(pygit2.hash(deck_bytes(cid)))


def next_in_line(waiting: list[str], own: str) -> str | None:
    """The clone a holder ``own`` hands its turn to: the first waiting id after its own,
    cyclically (round robin: each waiting clone is served once before any twice)."""
    line = sorted(set(w for w in waiting if w != own and _CLONE_ID.match(w)))
    if not line:
        return None
    return next((w for w in line if w > own), line[0])


def clone_id(store: Store) -> str | None:
    """This clone's id (``CLONE_FILE``), made once: 16 random hex digits, linked into
    place whole (two processes of a new clone agree on the first one; none reads a
    half-written id). None when the path is not a regular file (doctor moves it
    aside): the clone then keeps out of the line and takes turns as they come."""
    path = os.path.join(store.commondir, "storm", CLONE_FILE)
    for _ in range(3):
        try:
            raw = read_own(path)
        except (NotRegularFile, OSError):
            return None
        cid = (raw or b"").decode("ascii", "replace").strip()
        if _CLONE_ID.match(cid):
            return cid
        tmp = f"{path}.{os.getpid()}"
        try:
            with open(tmp, "wb") as fh:
                fh.write(f"{random.getrandbits(64):016x}\n".encode("ascii"))
            if raw is None:
                os.link(tmp, path)  # FileExistsError: another process made it first
            else:  # edited by hand: a new id (the old one's place in the line is freed as idle)
                os.replace(tmp, path)
        except FileExistsError:
            continue
        except OSError:
            return None
        finally:
            remove_quietly(tmp)
    return None
