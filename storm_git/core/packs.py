"""The geometric roll-up of a partial clone's own packs, which git 2.39 cannot do.

``git repack -d --geometric=2`` (storm_git.core.maintenance) dies in a partial
clone ("cannot use internal rev list with --stdin-packs": there repack adds
``--exclude-promisor-objects``, which ``--stdin-packs`` refuses): storm's writes
would pile up one pack per maintenance run, and ``git storm maintenance`` exit 3.
Here storm does what that repack does, with git's own pack writer: choose the
packs to roll by git's rule (``split_pack_geometry``: the smallest packs that do
not already grow by the factor, plus any larger one the merged pack would catch
up with), write them as one with ``git pack-objects --stdin-packs`` (every other
pack excluded, so nothing is copied twice), then delete exactly the packs rolled.

Only packs the clone made itself roll: a *promisor* pack (``.promisor``, what was
fetched from the server) stays as it is, because its objects may name blobs the
clone lacks and git tells those apart by the marker; a ``.keep`` pack stays, as
git's repack keeps it.
"""
from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass

from .errors import RepoStateError

FACTOR = 2
_EXTS = (".idx", ".pack", ".rev", ".bitmap", ".mtimes")  # what a rolled pack leaves: .idx first, as git


@dataclass(frozen=True)
class Pack:
    base: str  # path without extension
    objects: int
    fixed: bool  # promisor or kept: never rolled

    @property
    def name(self) -> str:
        return os.path.basename(self.base) + ".pack"


def _objects_in(idx: str) -> int | None:
    """Objects in a version-2 pack index (the last fan-out entry), None if unreadable."""
    try:
        with open(idx, "rb") as f:
            head = f.read(8 + 256 * 4)
    except OSError:
        return None
    if len(head) < 8 + 256 * 4 or head[:4] != b"\xfftOc" or struct.unpack(">I", head[4:8])[0] != 2:
        return None
    return struct.unpack(">I", head[-4:])[0]


def listing(commondir: str) -> list[Pack]:
    """The packs of the repository (complete ones: their .pack is there too)."""
    d = os.path.join(commondir, "objects", "pack")
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    have = set(names)
    out = []
    for n in sorted(names):
        if not n.endswith(".idx") or n.startswith("."):  # pack-*, and the loose step's loose-*
            continue
        stem = n[:-len(".idx")]
        count = _objects_in(os.path.join(d, n))
        if count is None or stem + ".pack" not in have:
            continue
        out.append(Pack(os.path.join(d, stem), count, stem + ".promisor" in have or stem + ".keep" in have))
    return out


def split(packs: list[Pack], factor: int = FACTOR) -> list[Pack]:
    """The packs a geometric repack rolls together (git's ``split_pack_geometry``)."""
    packs = sorted(packs, key=lambda p: p.objects)
    i = len(packs) - 1
    while i > 0 and packs[i].objects >= factor * packs[i - 1].objects:
        i -= 1  # the largest packs already form a progression
    cut = i + 1 if i else 0
    total = sum(p.objects for p in packs[:cut])
    for p in packs[cut:]:
        if p.objects >= factor * total:
            break
        cut, total = cut + 1, total + p.objects  # the merged pack would catch this one up
    return packs[:cut] if cut > 1 else []


def rollup(commondir: str, env: dict[str, str]) -> list[str]:
    """Roll the clone's own packs up (module docstring); returns the names rolled."""
    packs = listing(commondir)
    chosen = split([p for p in packs if not p.fixed])
    if not chosen:
        return []
    rolled = {p.base for p in chosen}
    lines = [p.name for p in chosen] + [f"^{p.name}" for p in packs if p.base not in rolled]
    r = subprocess.run(["git", "--git-dir", commondir, "pack-objects", "--stdin-packs", "--delta-base-offset",
                        "--non-empty", "-q", os.path.join(commondir, "objects", "pack", "pack")],
                       input="".join(ln + "\n" for ln in lines), capture_output=True, text=True, env=env)
    made = r.stdout.strip()
    if r.returncode != 0 or not made:
        msg = (r.stderr.strip().splitlines() or ["failed"])[-1]
        raise RepoStateError(f"geometric-rollup: git pack-objects --stdin-packs: {msg}",
                             hint="nothing was deleted; run git storm maintenance again")
    if not os.path.exists(os.path.join(commondir, "objects", "pack", f"pack-{made}.idx")):
        raise RepoStateError(f"geometric-rollup: the new pack pack-{made} is not there",
                             hint="nothing was deleted; run git storm maintenance again")
    midx = os.path.join(commondir, "objects", "pack", "multi-pack-index")
    if os.path.exists(midx):  # it names packs about to go (git's repack drops it too)
        os.unlink(midx)
    for p in chosen:
        if p.base.endswith(made):
            continue  # the same objects made the same pack: it is the new one
        for ext in _EXTS:
            try:
                os.unlink(p.base + ext)
            except FileNotFoundError:
                pass
    return [p.name for p in chosen]
