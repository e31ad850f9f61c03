"""Server-side ordering of clones' writes: the ``proc-receive`` hook of the bare repository.

A clone of a server that orders writes (``refs/storm/ordering`` exists there) does
not race other clones for a lease on ``refs/storm/workspace``: it pushes what it
has queued to its inbox,

* ``refs/storm/inbox/<clone>/workspace``: its queued writes, one commit each, on
  the head they were validated at;
* ``refs/storm/inbox/<clone>/notes/<agent>``: the notes ref of each agent whose
  writes are in the queue (the read sets the writes' provenance names);

and git hands those updates to this hook (``receive.procReceiveRefs =
refs/storm/inbox``) instead of writing them. The hook waits for its turn
(:mod:`.arrival`: pushes are served in the order they came) and, under the server
lock:

1. checks every pushed write as the guard checks a push to the workspace
   (storm_git.remote.server_hook.check_commit: storm's trailers, paths, provenance
   agreeing with its parent); one refused write refuses the whole push;
2. applies the writes to the current head in queue order with the rule a clone
   uses to move its queue (:mod:`.queue_move`): a write already there (a push
   whose answer was lost) is reported landed and not applied again; one whose
   scope and targets did not move is rebuilt on the head; any other is not
   applied, and neither is anything else of its agent in the push;
3. checks the rebuilt writes against their new parents (failing closed);
4. moves ``refs/storm/workspace`` and the agents' notes refs in one ``git
   update-ref --stdin`` transaction, each leased on the value it read: a clone
   that pushes to the workspace with a lease beside the inbox is never
   overwritten (the transaction fails, and the hook plans again on the new head).
   A transaction that dies part way (the ``git update-ref`` killed between two of
   its renames) leaves its locks and some refs moved: the hook removes the locks it
   left and plans again on the refs as they are, so a write the workspace took is
   answered landed (:func:`_commit`, :mod:`.ref_locks`);
5. notes the push in ``storm/order/log`` and answers each update: one ``ok``
   per landed write (``option refname refs/storm/workspace``, ``old-oid`` the
   head it went on, ``new-oid`` the commit it landed as), ``ng`` with why for a
   queue of which nothing landed, and the reasons of the others on stderr.

Step 1's checks run in the pre-receive hook too (:func:`prepare`,
:mod:`.inbox_check`), while git still holds the push's objects in quarantine: a
push refused there leaves none behind. A hook killed before step 4 has changed no
ref (the objects it wrote are unreferenced); killed after it, the writes are landed and the clone, whose push
failed, pushes the same queue again and hears "landed" (step 2). Any error before
step 4 refuses the push: a hook that cannot check does not apply.
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field

import pygit2

from ..core.agents import validate_agent
from ..core.errors import BadAgent, Busy, UsageError
from ..core.files import append_log_line
from ..core.gitcmd import run_git
from ..core.objects import commit_at
from ..core.provenance import entries as provenance_entries
from ..core.reservations import MAX_AHEAD_FACTOR, MAX_AHEAD_SECONDS
from ..core.store import AGENTS_PREFIX, WORKSPACE_REF
from ..core.trailers import Provenance, parse as parse_trailers
from . import arrival, pktline, queue_move, ref_locks
from .server_hook import GUARD_NAME as GUARD, INBOX_PREFIX, ZERO, Refused, check_commit, open_repo

QUEUE = "workspace"
NOTES = "notes/"
MAX_WRITES = 1024  # in one push (a clone pushes what it queued meanwhile: a few)
ATTEMPTS = 8  # transactions lost to pushes leased on the workspace beside the inbox
LOG_ROTATE_BYTES = 1 << 20
_CLONE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BUSY = "git storm order: busy"  # the prefix of an answer that says: push again
NOT_APPLIED = "storm: no write applied"  # the prefix of a queue of which nothing landed


def inbox_ref(clone: str, ref: str) -> str:
    """The inbox ref a clone pushes ``ref`` (the workspace, or an agent's notes ref) to."""
    if ref == WORKSPACE_REF:
        return f"{INBOX_PREFIX}{clone}/{QUEUE}"
    if ref.startswith(AGENTS_PREFIX):
        return f"{INBOX_PREFIX}{clone}/{NOTES}{ref[len(AGENTS_PREFIX):]}"
    raise ValueError(f"{ref} does not go through the inbox")


def target_of(inbox: str) -> tuple[str, str]:
    """(the clone, the ref it stands for) of an inbox ref; Refused for any other name."""
    rest = inbox[len(INBOX_PREFIX):] if inbox.startswith(INBOX_PREFIX) else ""
    clone, _slash, what = rest.partition("/")
    if not _CLONE.fullmatch(clone):
        raise Refused(f"{inbox} is not {INBOX_PREFIX}<clone>/... (a clone's name is letters, digits, . _ -)")
    if what == QUEUE:
        return clone, WORKSPACE_REF
    if what.startswith(NOTES):
        agent = what[len(NOTES):]
        try:
            validate_agent(agent)
        except (BadAgent, UsageError) as exc:
            raise Refused(f"{inbox} does not name an agent: {exc}") from None
        return clone, AGENTS_PREFIX + agent
    raise Refused(f"{inbox} is not a ref of an inbox ({INBOX_PREFIX}<clone>/{QUEUE} or "
                  f"{INBOX_PREFIX}<clone>/{NOTES}<agent>)")


@dataclass
class Command:
    old: str
    new: str
    ref: str


@dataclass
class Report:
    """The answer to one command: ``ng`` with ``reason``, or one ``ok`` per update."""

    ref: str
    reason: str | None = None
    updates: list[tuple[str, str, str]] = field(default_factory=list)  # (refname, old, new)

    def packets(self) -> list[bytes]:
        if self.reason is not None:
            return [f"ng {self.ref} {_one_line(self.reason)}".encode("utf-8", "replace")]
        out = []
        for name, old, new in self.updates or [("", "", "")]:
            out.append(f"ok {self.ref}".encode())
            if name:
                out += [f"option refname {name}".encode(), f"option old-oid {old}".encode(),
                        f"option new-oid {new}".encode()]
        return out


@dataclass
class Outcome:
    reports: list[Report]
    messages: list[str] = field(default_factory=list)  # for the pusher (git shows them as "remote: ")
    before: str | None = None  # the head before and after (the log)
    after: str | None = None
    landed: int = 0
    dropped: int = 0


def _one_line(text: str) -> str:
    return " ".join(text.split())[:900]


def refuse_all(commands: list[Command], reason: str) -> Outcome:
    return Outcome([Report(c.ref, reason) for c in commands])


@dataclass
class _Plan:
    outcome: Outcome
    changes: list[tuple[str, str, str]]  # (ref, old, new) for the transaction; old ZERO: must not exist


@dataclass
class Prepared:
    """An inbox push as checked before its turn (:func:`prepare`)."""

    who: str  # the clone
    repo: pygit2.Repository
    queue: Command | None
    notes: dict[str, Command]  # agent -> its notes ref's update
    checked: set[pygit2.Oid]  # the writes the guard's checks passed


def prepare(gitdir: str, commands: list[Command]) -> Prepared:
    """The checks of an inbox push that depend on what it carries, not on the order:
    its ref names, one queue, and the guard's checks of every write it brings (the
    writes' trees, sizes, trailers and provenance, at most MAX_WRITES). Refused for
    a push they refuse. The pre-receive hook runs them too (:mod:`.inbox_check`), so
    that git drops what they refuse with its quarantine."""
    targets = []
    for c in commands:
        targets.append(target_of(c.ref))
        if c.new == ZERO:
            raise Refused(f"{c.ref}: deleting an inbox ref is not a write (inbox refs are never created)")
    queues = [c for c, (_clone, t) in zip(commands, targets, strict=True) if t == WORKSPACE_REF]
    if len(queues) > 1:
        raise Refused("one queue per push: push one refs/storm/inbox/<clone>/workspace")
    notes = {t[len(AGENTS_PREFIX):]: c
             for c, (_clone, t) in zip(commands, targets, strict=True) if t != WORKSPACE_REF}
    repo = open_repo(gitdir)
    for c in notes.values():
        if not isinstance(_get(repo, c.new), pygit2.Commit):
            raise Refused(f"{c.ref}: {c.new[:10]} is not a commit")
    queue = queues[0] if queues else None
    return Prepared(targets[0][0] if targets else "?", repo, queue, notes, _precheck(repo, queue, notes))


def _get(repo: pygit2.Repository, oid: str) -> object:
    try:
        return repo.get(oid)
    except ValueError:
        return None


def serve(gitdir: str, commands: list[Command]) -> Outcome:
    """Order one push's inbox updates (module docstring); never raises."""
    try:
        p = prepare(gitdir, commands)
        who, repo, notes, checked = p.who, p.repo, p.notes, p.checked
        queues = [p.queue] if p.queue is not None else []
    except Refused as exc:
        return refuse_all(commands, f"{GUARD}: refused {exc}")
    except Exception as exc:  # noqa: BLE001 - a hook that cannot check refuses
        return refuse_all(commands, f"{GUARD}: cannot check this push ({type(exc).__name__}: {exc}); refused")
    try:
        with arrival.turn(gitdir, who) as ticket:
            why = f"{WORKSPACE_REF} kept moving under pushes leased on it"
            for _attempt in range(ATTEMPTS):
                try:
                    plan = _plan(repo, queues[0] if queues else None, notes, checked)
                except Refused as exc:
                    return refuse_all(commands, f"{GUARD}: refused {exc}")
                if plan.changes:
                    lost = _commit(repo, gitdir, plan.changes, who)
                    if lost is not None:
                        why = lost
                        time.sleep(0.02 * (_attempt + 1))  # a push leased on a ref holds its lock, or moved it
                        continue  # plan again on what it left (a write it landed is answered landed)
                _log(gitdir, ticket, who, plan.outcome)
                return plan.outcome
            return refuse_all(commands, f"{BUSY}: {why}; push again")
    except Busy as exc:
        return refuse_all(commands, f"{BUSY}: {exc.message}; push again")
    except Exception as exc:  # noqa: BLE001 - nothing was committed: refuse
        return refuse_all(commands, f"{GUARD}: cannot check this push ({type(exc).__name__}: {exc}); refused")


def _ref(repo: pygit2.Repository, name: str) -> str | None:
    ref = repo.references.get(name)
    return None if ref is None else str(ref.target)


def _precheck(repo: pygit2.Repository, queue: Command | None, notes: dict[str, Command]) -> set[pygit2.Oid]:
    """The guard's checks of the pushed writes, before the push waits for its turn
    (they depend on the writes and the pushed notes, not on the head): the ones
    checked. The few a turn finds above a newer head are checked in it."""
    if queue is None:
        return set()
    head = _ref(repo, WORKSPACE_REF)
    writes = _writes(repo, queue, head) if head is not None else []
    post = {AGENTS_PREFIX + a: c.new for a, c in notes.items()}
    for c in writes:
        _check(repo, queue, c, post)
    return {c.id for c in writes}


def _check(repo: pygit2.Repository, queue: Command, c: pygit2.Commit, post: dict[str, str]) -> None:
    try:
        check_commit(repo, c, post)
    except Refused as exc:
        raise Refused(f"{WORKSPACE_REF} (through {queue.ref}): {exc}") from None


def _writes(repo: pygit2.Repository, queue: Command, head: str) -> list[pygit2.Commit]:
    """The queue's writes the head does not have, oldest first."""
    obj = repo.get(queue.new)
    if not isinstance(obj, pygit2.Commit):
        raise Refused(f"{queue.ref}: {queue.new[:10]} is not a commit")
    base = repo.merge_base(obj.id, pygit2.Oid(hex=head))
    if base is None:
        raise Refused(f"{queue.ref}: {queue.new[:10]} shares no history with {WORKSPACE_REF}")
    walker = repo.walk(obj.id, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    walker.hide(base)
    writes = []
    for c in walker:
        if len(writes) >= MAX_WRITES:
            raise Refused(f"{queue.ref}: more than {MAX_WRITES} writes in one push")
        writes.append(c)
    return writes


def _plan(repo: pygit2.Repository, queue: Command | None, notes: dict[str, Command],
          checked: set[pygit2.Oid]) -> _Plan:
    """What the push does to the refs as they are now (server lock held); Refused
    for a push the guard refuses as a whole."""
    head = _ref(repo, WORKSPACE_REF)
    post = {AGENTS_PREFIX + a: c.new for a, c in notes.items()}
    held = {a: _ref(repo, AGENTS_PREFIX + a) for a in notes}
    not_forward: set[str] = set()
    for a, c in notes.items():
        obj = repo.get(c.new)
        if not isinstance(obj, pygit2.Commit):
            raise Refused(f"{c.ref}: {c.new[:10]} is not a commit")
        cur = held[a]
        if cur is not None and cur != c.new and not repo.descendant_of(obj.id, pygit2.Oid(hex=cur)):
            not_forward.add(a)
    out = Outcome([], before=head, after=head)
    changes: list[tuple[str, str, str]] = []
    dropped_agents = set(not_forward)
    if queue is not None:
        report, tip, dropped_agents = _apply_queue(repo, queue, head, post, not_forward, checked, out)
        out.reports.append(report)
        if head is not None and tip != head:
            changes.append((WORKSPACE_REF, head, tip))
            out.after = tip
    for a, c in notes.items():
        ref = AGENTS_PREFIX + a
        if a in not_forward:
            out.reports.append(Report(c.ref, f"non-fast-forward: {ref} on the server was written from another clone "
                                             f"(agent {a} has notes there that this push does not extend)"))
        elif a in dropped_agents:
            out.reports.append(Report(c.ref, f"not applied: the write of {a} it goes with was not"))
        else:
            out.reports.append(Report(c.ref, updates=[(ref, held[a] or ZERO, c.new)]))
            if held[a] != c.new:
                changes.append((ref, held[a] or ZERO, c.new))
    return _Plan(out, changes)


def _apply_queue(repo: pygit2.Repository, queue: Command, head: str | None, post: dict[str, str],
                 not_forward: set[str], checked: set[pygit2.Oid], out: Outcome) -> tuple[Report, str, set[str]]:
    """The queue's report, the new head, and the agents with a write not applied."""
    if head is None:
        raise Refused(f"the server has no shared workspace ({WORKSPACE_REF}): a clone creates it with "
                      "git storm init --remote")
    writes = _writes(repo, queue, head)
    if not writes:  # the whole queue is on the head already (an answer lost): landed
        obj = commit_at(repo, pygit2.Oid(hex=queue.new))
        parent = str(obj.parent_ids[0]) if obj.parent_ids else ZERO
        return Report(queue.ref, updates=[(WORKSPACE_REF, parent, str(obj.id))]), head, set()
    for c in writes:
        if c.id not in checked:
            _check(repo, queue, c, post)
    head_oid = pygit2.Oid(hex=head)
    base = writes[0].parent_ids[0] if writes[0].parent_ids else None
    landed = queue_move.landed_since(repo, head_oid, base)
    drop = frozenset(not_forward)
    scope_of = _scopes(repo, post)
    moved_under: dict[pygit2.Oid, list[str]] = {}  # why each write was first dropped
    while True:
        mv = queue_move.move(repo, writes, head_oid, scope_of, landed=landed, drop_agents=drop,
                             reserved_ahead=_reserved_ahead(repo))
        for q, paths in mv.dropped:
            moved_under.setdefault(q, paths)
        agents = drop | {_agent(commit_at(repo, q)) for q, _paths in mv.dropped}
        if agents == drop:
            break
        drop = frozenset(agents)  # a write not applied: nothing else of its agent is (its notes are not)
    for _q, now in mv.moved:
        _check(repo, queue, commit_at(repo, now), post)
    updates = []
    for _q, now in mv.landed + mv.placed:
        c = commit_at(repo, now)
        updates.append((WORKSPACE_REF, str(c.parent_ids[0]), str(now)))
    for q, _paths in mv.dropped:
        c, paths = commit_at(repo, q), moved_under[q]
        why = (f"{', '.join(paths[:5])}{' and more' if len(paths) > 5 else ''} changed since it was validated"
               if paths else "its agent's notes or other write were not applied")
        out.messages.append(f"git storm order: {str(q)[:10]} of {_agent(c)} not applied: {why}")
    out.landed, out.dropped = len(updates), len(mv.dropped)
    if not updates:
        reason = "; ".join(m.split(": ", 1)[1] for m in out.messages[:3])
        return Report(queue.ref, f"{NOT_APPLIED}: {reason}"), head, set(drop)
    return Report(queue.ref, updates=updates), str(mv.tip), set(drop)


def _reserved_ahead(repo: pygit2.Repository) -> float:
    """storm_git.core.reservations.max_ahead, from the server's own config."""
    try:
        seconds = float(repo.config["storm.reservationSeconds"] or "")  # no value: as unparsable
    except (KeyError, ValueError, pygit2.GitError):
        seconds = 30.0
    return max(MAX_AHEAD_SECONDS, MAX_AHEAD_FACTOR * seconds)


def _agent(c: pygit2.Commit) -> str:
    return (parse_trailers(c.message).get("Storm-Agent") or [""])[0]


def _scopes(repo: pygit2.Repository, post: dict[str, str]) -> queue_move.ScopeOf:
    """The paths of a write's whole read set, from its agent's notes as pushed (or held)."""
    def scope_of(c: pygit2.Commit, prov: Provenance) -> frozenset[str]:
        agent = _agent(c)
        tip = post.get(AGENTS_PREFIX + agent) or _ref(repo, AGENTS_PREFIX + agent)
        tree = repo[pygit2.Oid(hex=tip)].peel(pygit2.Commit).tree if tip else None
        return frozenset(e.path for e in provenance_entries(repo, tree, agent, prov))
    return scope_of


def _commit(repo: pygit2.Repository, gitdir: str, changes: list[tuple[str, str, str]], who: str) -> str | None:
    """Move the refs in one transaction, each leased on the value it was read at (server
    lock held). None when they moved; else why not, and the caller plans again on the
    refs as they are then: a ref had moved (a push leased on it got there first), its
    lock was held, or the transaction died part way (killed: its locks stay, and some
    refs may have moved). The locks it left are removed (:mod:`.ref_locks`), and so is
    a stale lock of a dead writer, so that no push is refused for a lock nobody holds;
    the plan made again then finds a write that landed on the workspace and answers it
    landed (and moves the notes refs that did not move with it)."""
    text = "".join(f"update {ref} {new} {old}\n" for ref, old, new in changes)
    r = run_git(["update-ref", "--stdin", "-m", f"storm: writes of {who}, in arrival order"], gitdir,
                check=False, env={"GIT_DIR": gitdir}, input=text.encode())
    if r.returncode == 0:
        return None
    err = _one_line(r.stderr.decode("utf-8", "replace"))
    left = ref_locks.clear_own(gitdir, changes)
    cleared = ref_locks.clear_stale(gitdir, [ref for ref, _old, _new in changes])
    if r.returncode < 0 or left:
        return f"git update-ref died (signal {-r.returncode})" if r.returncode < 0 else f"git update-ref failed: {err}"
    if cleared:
        return f"{', '.join(s.ref for s in cleared)}: a stale lock was removed ({cleared[0].describe()})"
    if any(m in err for m in ("cannot lock ref", "but expected", "reference already exists", "is at")):
        held = [ref for ref, _old, _new in changes if os.path.exists(ref_locks.lock_path(gitdir, ref))]
        return (f"{held[0]}.lock on the server is held by another update (a push leased on it)" if held
                else f"{WORKSPACE_REF} kept moving under pushes leased on it")
    if any(_ref(repo, ref) != (None if old == ZERO else old) for ref, old, _new in changes):
        return f"git update-ref failed part way: {err}"  # plan again: what moved is answered for what it is
    raise RuntimeError(f"git update-ref failed: {err}")


def _log(gitdir: str, ticket: int, who: str, out: Outcome) -> None:
    """One line per push served, in the order served (the order's record, for the
    operator). Best effort: the refs have moved; the answer must still go out."""
    line = f"{ticket} {time.time():.6f} {who} {out.before} {out.after} landed={out.landed} dropped={out.dropped}\n"
    append_log_line(os.path.join(arrival.order_dir(gitdir), "log"), line.encode("utf-8", "replace"), LOG_ROTATE_BYTES)


# -- the hook's end of the protocol -------------------------------------------------------
def main(argv: list[str]) -> int:
    """What git runs: the pkt-line exchange of githooks(5) "proc-receive"."""
    if argv[:1] != ["proc-receive"]:
        sys.stderr.write("usage: python -m storm_git.remote.server_order proc-receive\n")
        return 2
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        hello = pktline.until_flush(inp)
        if not hello or not hello[0].startswith(b"version=1"):
            sys.stderr.write(f"{GUARD}: receive-pack offers {hello[:1]!r}, not version=1 of proc-receive\n")
            return 1
        pktline.write(out, b"version=1\0")
        pktline.flush(out)
        commands = [Command(*p.decode("utf-8").split(" ", 2)) for p in pktline.until_flush(inp)]
    except (pktline.Broken, ValueError, TypeError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"{GUARD}: cannot read receive-pack's commands ({exc}); refused\n")
        return 1
    outcome = serve(os.path.abspath(os.environ.get("GIT_DIR", ".")), commands)
    sys.stderr.write("".join(m + "\n" for m in outcome.messages))
    sys.stderr.flush()
    for report in outcome.reports:
        for packet in report.packets():
            pktline.write(out, packet)
    pktline.flush(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
