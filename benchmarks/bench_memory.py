#!/usr/bin/env python3
"""Peak memory (max RSS) of ``git storm`` commands on one large file.

Not a test: it prints figures and asserts nothing. Each command runs as its own
process under ``/usr/bin/time -v`` (or, without it, in a wrapper process whose
``RUSAGE_CHILDREN`` gives the peak), so a figure is the peak resident set of that
one ``python -m storm_git`` process, next to the file size and its ratio.

    python3 benchmarks/bench_memory.py                 # a 200 MB file
    python3 benchmarks/bench_memory.py --mb 50         # a smaller one
    python3 benchmarks/bench_memory.py --rev HEAD~3    # the library at a revision

The file is random bytes in base64 lines (text, so ``read --json`` emits it as a
JSON string) and a second one of raw random bytes (binary: ``content_base64``).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

TIME = "/usr/bin/time"


def _run_peak(argv: list[str], cwd: str, env: dict[str, str], stdin_path: str | None,
              pipe: bool) -> tuple[int, int]:
    """(exit code, peak RSS in KiB) of ``argv``; stdout is discarded."""
    if pipe and stdin_path is not None:
        # a real pipe, as `cat big | git storm write`: the size is not known up front
        shell = f"cat {sh_quote(stdin_path)} | {' '.join(sh_quote(a) for a in argv)} >/dev/null"
        argv, stdin_path = ["sh", "-c", shell], None
    if os.path.exists(TIME):
        stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        try:
            r = subprocess.run([TIME, "-v", *argv], cwd=cwd, env=env, stdin=stdin,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        finally:
            if stdin_path:
                stdin.close()
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        # with `sh -c`, time reports the largest of sh and its children: the storm process
        return r.returncode, int(m.group(1)) if m else -1
    code = (
        "import resource, subprocess, sys\n"
        f"r = subprocess.run({argv!r}, stdin=open({stdin_path!r}, 'rb') if {stdin_path!r} else None,"
        " stdout=subprocess.DEVNULL)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True).stdout
    rc, kib = out.split()
    return int(rc), int(kib)


def sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _make_files(d: str, mb: int) -> tuple[str, str]:
    text, binary = os.path.join(d, "big.txt"), os.path.join(d, "big.bin")
    import base64

    chunk = 3 * 1024 * 1024
    with open(text, "wb") as t, open(binary, "wb") as b:
        left = mb * 1024 * 1024
        while left > 0:
            n = min(chunk, left)
            raw = os.urandom(n)
            b.write(raw)
            enc = base64.encodebytes(raw)  # 76-character lines
            t.write(enc[:n])
            left -= n
    return text, binary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=200, help="file size in MiB (default 200)")
    ap.add_argument("--rev", default=None, help="benchmark the library as committed at REV")
    ap.add_argument("--workdir", default=None, help="where to build (default: a temporary directory)")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="storm-mem-", dir=args.workdir)
    env = dict(os.environ)
    env.pop("STORM_AGENT", None)
    env["STORM_AGENT"] = "bench"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.rev:
        src = os.path.join(root, "src")
        os.makedirs(src)
        arch = subprocess.run(["git", "-C", here, "archive", args.rev, "storm_git", "cli", "hooks"],
                              check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=arch, check=True)
        # installed layout: cli/ and hooks/ are the packages storm_git.cli and storm_git.hooks
        for sub in ("cli", "hooks"):
            if os.path.isdir(os.path.join(src, sub)):
                os.rename(os.path.join(src, sub), os.path.join(src, "storm_git", sub))
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    try:
        repo = os.path.join(root, "repo")
        os.makedirs(repo)
        g = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
        g("init", "-q", "-b", "main")
        with open(os.path.join(repo, "README.md"), "w") as fh:
            fh.write("# bench\n")
        g("add", "-A")
        g("-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "init")
        storm = [sys.executable, "-m", "storm_git"]
        subprocess.run([*storm, "init"], cwd=repo, env=env, check=True, capture_output=True)
        g("config", "storm.maxFileBytes", f"{args.mb * 2}m")
        text, binary = _make_files(root, args.mb)
        size_kib = args.mb * 1024
        rc0, base = _run_peak([*storm, "status"], repo, env, None, False)
        print(f"file: {args.mb} MiB; baseline (git storm status): {base / 1024:.0f} MiB peak RSS"
              + (f"; library at {args.rev}" if args.rev else ""))
        cases = [
            ("write < file (stdin redirected)", [*storm, "write", "a.txt"], text, False),
            ("cat file | write (pipe)", [*storm, "write", "b.txt"], text, True),
            ("write --file (binary)", [*storm, "write", "c.bin", "--file", binary], None, False),
            ("read a.txt (raw)", [*storm, "read", "a.txt"], None, False),
            ("read a.txt --json (text)", [*storm, "read", "a.txt", "--json"], None, False),
            ("read c.bin --json (base64)", [*storm, "read", "c.bin", "--json"], None, False),
        ]
        print(f"{'command':36} {'exit':>4} {'peak MiB':>9} {'x file':>7}")
        for name, argv, stdin_path, pipe in cases:
            rc, kib = _run_peak(argv, repo, env, stdin_path, pipe)
            print(f"{name:36} {rc:>4} {kib / 1024:>9.0f} {kib / size_kib:>7.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
