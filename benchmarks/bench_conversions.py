"""What git's content conversions cost a storm write (.gitattributes, core.autocrlf).

    python benchmarks/bench_conversions.py [--files 1000] [--writes 300] [--workdir DIR]

Not a test: it prints figures. On one repository of ``--files`` files (bench_core's
layout), in one run, each storm write (in-process, by an agent whose read set holds
the file) interleaved with the bare pygit2 cycle of the same change (blob, trees,
commit, CAS: the floor):

* a file in a directory without attributes, with storm's conversion checks, and with
  them switched off (alternating): what looking costs when there is nothing to convert;
* a file under ``text eol=crlf`` (libgit2's line-ending filter, in-process, both ways);
* a file under a filter driver from git config (``tr`` as clean and smudge, as
  git-lfs or git-crypt would be), against what git itself pays for the same
  conversions: ``git hash-object -w --path`` plus ``git cat-file --filters``;
* a read of every file outside the driver's directory by a new agent, checks on
  and off (alternating): what giving agents the file ``write`` takes back costs
  where git config defines a filter driver (each path's attributes are then looked
  up); and a read of the files under the driver, per file (a smudge each), against
  ``git cat-file --filters`` of the same files.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_core  # noqa: E402

ROT13 = "tr a-zA-Z n-za-mN-ZA-M"


def med(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--writes", type=int, default=300, help="writes per row (default 300)")
    ap.add_argument("--workdir", default=None, help="where to build the repository (default: a new temp dir)")
    args = ap.parse_args()

    import pygit2

    import storm_git.disk.safe_fs as safe_fs
    import storm_git.disk.sync as disk_sync
    import storm_git.storm.workspace as workspace
    import storm_git.storm.write as write
    from storm_git import open_workspace
    from storm_git.core.convert import Conversions

    class Off(Conversions):
        """The conversion checks switched off: storm as it was before them."""

        def applies(self, path: str) -> bool:
            return False

        def to_odb(self, path: str, data: bytes, *, from_disk: bool = True) -> bytes:
            return data

        def to_worktree(self, path: str, data: bytes, oid=None) -> bytes:
            return data

        def for_agent(self, path: str, data: bytes, oid=None) -> bytes:
            return data

    workdir = args.workdir or tempfile.mkdtemp(prefix="storm-bench-conv-")
    repo, paths = bench_core.build_repo(workdir, args.files)
    bench_core.reset_repo(repo)
    bench_core.git(repo, "config", "storm.autoMaintenance", "0")
    bench_core.git(repo, "config", "filter.rot.clean", ROT13)
    bench_core.git(repo, "config", "filter.rot.smudge", ROT13)
    dirs = sorted({p.rsplit("/", 1)[0] for p in paths if p.count("/") == 3})
    plain_dir, crlf_dir, rot_dir = dirs[0], dirs[1], dirs[2]
    ws = open_workspace(repo)
    for d, rule in ((crlf_dir, "* text eol=crlf\n"), (rot_dir, "* filter=rot\n")):
        ws.write(f"{d}/.gitattributes", rule.encode(), agent="setup")
    targets = {name: next(p for p in paths if p.startswith(d + "/"))
               for name, d in (("plain", plain_dir), ("crlf", crlf_dir), ("rot", rot_dir))}
    r = pygit2.Repository(repo)
    r.references.create("refs/bench/floor", r.lookup_reference("refs/storm/workspace").target, force=True)
    base = {name: ws.read([p], agent="a1")[0].content for name, p in targets.items()}
    tag = os.urandom(3).hex().encode()

    def timed_write(name: str, i: int) -> float:
        t = time.perf_counter()
        ws.write(targets[name], base[name] + b"# w %s %d\n" % (tag, i), agent="a1")
        return time.perf_counter() - t

    def floor(name: str, i: int) -> float:
        t = time.perf_counter()
        bench_core.floor_cycle(r, "refs/bench/floor", targets[name], base[name] + b"# f %s %d\n" % (tag, i))
        return time.perf_counter() - t

    on, off, fl = [], [], []
    for i in range(2 * args.writes):
        kind = Conversions if i % 2 == 0 else Off
        write.Conversions = workspace.Conversions = safe_fs.Conversions = disk_sync.Conversions = kind
        (on if i % 2 == 0 else off).append(timed_write("plain", i))
        fl.append(floor("plain", i))
    write.Conversions = workspace.Conversions = safe_fs.Conversions = disk_sync.Conversions = Conversions
    crlf, crlf_fl = [], []
    for i in range(args.writes):
        crlf.append(timed_write("crlf", i))
        crlf_fl.append(floor("crlf", i))
    n_rot = max(20, args.writes // 5)
    rot, git_rot = [], []
    for i in range(n_rot):
        rot.append(timed_write("rot", i))
        data = base["rot"] + b"# g %s %d\n" % (tag, i)
        t = time.perf_counter()
        out = subprocess.run(["git", "hash-object", "-w", "--stdin", f"--path={targets['rot']}"], cwd=repo,
                             input=data, capture_output=True, check=True).stdout.decode().strip()
        subprocess.run(["git", "cat-file", "--filters", f"--path={targets['rot']}", out], cwd=repo,
                       capture_output=True, check=True)
        git_rot.append(time.perf_counter() - t)
    assert (open(os.path.join(repo, targets["crlf"]), "rb").read().count(b"\r\n") > 0), "eol=crlf not applied"
    # a read of every file by a new agent (what it is given: for_agent), checks on and off,
    # alternating; git config defines a filter driver here, so every path's attributes are looked up
    everything = [p for p in paths if p not in targets.values() and not p.startswith(rot_dir + "/")]
    smudged = [p for p in paths if p.startswith(rot_dir + "/") and p != targets["rot"]]
    r_on, r_off = [], []
    for i in range(2 * max(10, args.writes // 15)):
        write.Conversions = workspace.Conversions = Conversions if i % 2 == 0 else Off
        t = time.perf_counter()
        ws.read(everything, agent=f"reader{i}")
        (r_on if i % 2 == 0 else r_off).append(time.perf_counter() - t)
    write.Conversions = workspace.Conversions = Conversions
    r_rot, git_smudge = [], []  # the files under the driver: a smudge each, as git checkout runs it
    for i in range(5):
        t = time.perf_counter()
        ws.read(smudged, agent=f"smudge{i}")
        r_rot.append((time.perf_counter() - t) / len(smudged))
        t = time.perf_counter()
        for p in smudged:
            subprocess.run(["git", "cat-file", "--filters", f"refs/storm/workspace:{p}"], cwd=repo,
                           capture_output=True, check=True)
        git_smudge.append((time.perf_counter() - t) / len(smudged))

    print(f"{args.files} files, medians in ms ({args.writes} writes per row, {n_rot} under the filter driver)")
    print(f"  bare cycle (floor)                          {med(fl):7.3f}")
    print(f"  write, no attributes, checks on             {med(on):7.3f}  ({med(on) / med(fl):.2f}x floor)")
    print(f"  write, no attributes, checks off            {med(off):7.3f}  ({med(off) / med(fl):.2f}x floor)")
    print(f"    cost of the checks                        {med(on) - med(off):+7.3f}  "
          f"({(med(on) / med(off) - 1) * 100:+.1f} %)")
    print(f"  write, text eol=crlf                        {med(crlf):7.3f}  ({med(crlf) / med(crlf_fl):.2f}x its floor "
          f"{med(crlf_fl):.3f})")
    print(f"  read of {len(everything)} files, checks on           {med(r_on):7.3f}")
    print(f"  read of {len(everything)} files, checks off          {med(r_off):7.3f}  "
          f"(cost of the checks {(med(r_on) / med(r_off) - 1) * 100:+.1f} %; a filter driver is defined)")
    print(f"  read under the filter driver, per file      {med(r_rot):7.3f}  (git cat-file --filters per file "
          f"{med(git_smudge):.3f}: {med(r_rot) / med(git_smudge):.2f}x)")
    print(f"  write, filter driver (3 git processes)      {med(rot):7.3f}")
    print(f"    git hash-object -w --path + cat-file --filters  {med(git_rot):7.3f}  "
          f"(storm write / git's own conversions: {med(rot) / med(git_rot):.2f}x)")


if __name__ == "__main__":
    main()
