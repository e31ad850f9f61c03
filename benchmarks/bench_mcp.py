#!/usr/bin/env python3
"""Round trip of one MCP tool call (`view`, `str_replace`) against the same operation
through the CLI (`git storm read` / `git storm edit`, a process per call) and
in-process (`ws.read` / `ws.edit`), at 1k / 10k (/ 100k) files.

Not a test: it prints medians and the ratio str_replace / in-process edit (target:
<= 2x, flat in repository size). The MCP figures are a real stdio session with
`git storm mcp`, through the SDK's ClientSession, so they include JSON-RPC, the
pipe and the SDK's dispatch on both sides.

    python3 benchmarks/bench_mcp.py                 # 1k and 10k files
    python3 benchmarks/bench_mcp.py --big           # also 100k files (builds for a minute)
    python3 benchmarks/bench_mcp.py --sizes 1000 --runs 50 --workdir /tmp/storm-bench-mcp

Repositories are built once per size with one `git fast-import` and kept in --workdir.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

PER_DIR = 50
TARGET = "src/target.py"
TARGET_TEXT = "".join(f"line_{i} = {i}\n" for i in range(200)) + "x = 0\n"


def build(path: str, n: int) -> None:
    """n files in directories of PER_DIR, plus TARGET; one fast-import, one checkout, storm init."""
    subprocess.run(["git", "init", "-q", "-b", "main", path], check=True)
    chunks = [b"commit refs/heads/main\ncommitter Bench <bench@example.invalid> 0 +0000\ndata 4\ninit\n"]
    for i in range(n):
        data = f"VALUE = {i}\n".encode()
        chunks.append(f"M 100644 inline d{i // PER_DIR:05d}/f{i:06d}.py\ndata {len(data)}\n".encode() + data + b"\n")
    t = TARGET_TEXT.encode()
    chunks.append(f"M 100644 inline {TARGET}\ndata {len(t)}\n".encode() + t + b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=b"".join(chunks), check=True)
    subprocess.run(["git", "checkout", "-q", "-f", "main"], cwd=path, check=True)
    for k, v in (("user.name", "Bench"), ("user.email", "bench@example.invalid")):
        subprocess.run(["git", "config", k, v], cwd=path, check=True)
    subprocess.run(["git", "storm", "init"], cwd=path, check=True, capture_output=True)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def timed(fn: Callable[[], Any], runs: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def flipper(repo: str) -> Callable[[int], tuple[str, str]]:
    """Alternate x = 0 <-> x = 1 from what the file holds now: every edit is a real change."""
    with open(os.path.join(repo, TARGET)) as fh:
        start = 0 if "x = 0\n" in fh.read() else 1

    def flip(i: int) -> tuple[str, str]:
        return ("x = 0\n", "x = 1\n") if (i + start) % 2 == 0 else ("x = 1\n", "x = 0\n")

    return flip


def in_process(repo: str, runs: int) -> dict[str, list[float]]:
    from storm_git.api import open_workspace

    ws = open_workspace(repo)
    agent = "bench_inproc"
    view = timed(lambda: ws.read([TARGET], agent=agent), runs)
    flip = flipper(repo)
    counter = iter(range(10 ** 9))

    def edit() -> None:
        old, new = flip(next(counter))
        res = ws.edit(TARGET, old, new, agent=agent)
        assert res.accepted, res.rejection

    return {"view": view, "str_replace": timed(edit, runs)}


def over_mcp(repo: str, runs: int) -> dict[str, list[float]]:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    params = StdioServerParameters(command="git", args=["storm", "mcp", "--agent", "bench_mcp"], cwd=repo, env=env)
    out: dict[str, list[float]] = {"view": [], "str_replace": []}
    flip = flipper(repo)

    async def main() -> None:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                for i in range(runs + 2):
                    t0 = time.perf_counter()
                    res = await s.call_tool("view", {"path": TARGET})
                    if i >= 2:
                        out["view"].append(time.perf_counter() - t0)
                    assert not res.is_error
                for i in range(runs + 2):
                    old, new = flip(i)
                    t0 = time.perf_counter()
                    res = await s.call_tool("str_replace", {"path": TARGET, "old_str": old, "new_str": new})
                    if i >= 2:
                        out["str_replace"].append(time.perf_counter() - t0)
                    assert not res.is_error, res.content[0].text

    anyio.run(main)
    return out


def via_cli(repo: str, runs: int) -> dict[str, list[float]]:
    env = dict(os.environ, STORM_AGENT="bench_cli")
    run = lambda *a: subprocess.run(["git", "storm", *a], cwd=repo, env=env, capture_output=True, check=True)  # noqa: E731
    counter = iter(range(10 ** 9))
    flip = flipper(repo)

    def edit() -> None:
        old, new = flip(next(counter))
        run("edit", TARGET, "--old", old, "--new", new)

    view = timed(lambda: run("read", TARGET), runs, warmup=1)
    return {"view": view, "str_replace": timed(edit, runs, warmup=1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated file counts")
    ap.add_argument("--big", action="store_true", help="also 100,000 files")
    ap.add_argument("--runs", type=int, default=30, help="calls per measurement (CLI: a third of it)")
    ap.add_argument("--workdir", default=None, help="keep the built repositories here (default: a temp dir)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.big and 100_000 not in sizes:
        sizes.append(100_000)
    work = args.workdir or tempfile.mkdtemp(prefix="storm-bench-mcp-")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        for n in sizes:
            repo = os.path.join(work, f"repo-{n}")
            if not os.path.isdir(os.path.join(repo, ".git")):
                t0 = time.perf_counter()
                build(repo, n)
                print(f"built {n} files in {time.perf_counter() - t0:.1f}s at {repo}", flush=True)
            ip = in_process(repo, args.runs)
            mc = over_mcp(repo, args.runs)
            cl = via_cli(repo, max(5, args.runs // 3))
            row = {"n": n, **{f"{k}_{op}": median_ms(v[op]) for k, v in (("ip", ip), ("mcp", mc), ("cli", cl))
                              for op in ("view", "str_replace")}}
            rows.append(row)
            print(f"{n:>7} files: view mcp {row['mcp_view']:.2f} ms / in-process {row['ip_view']:.2f} ms / "
                  f"cli {row['cli_view']:.0f} ms; str_replace mcp {row['mcp_str_replace']:.2f} ms / in-process "
                  f"{row['ip_str_replace']:.2f} ms / cli {row['cli_str_replace']:.0f} ms", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| files | view: MCP / in-process / CLI | str_replace: MCP / in-process / CLI "
          "| str_replace MCP ÷ in-process (target ≤ 2×) |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        ratio = r["mcp_str_replace"] / r["ip_str_replace"]
        print(f"| {r['n']:,} | {r['mcp_view']:.2f} / {r['ip_view']:.2f} / {r['cli_view']:.0f} ms "
              f"| {r['mcp_str_replace']:.2f} / {r['ip_str_replace']:.2f} / {r['cli_str_replace']:.0f} ms "
              f"| {ratio:.2f}× {'(met)' if ratio <= 2 else '(not met)'} |")
    if len(rows) > 1:
        growth = rows[-1]["mcp_str_replace"] / rows[0]["mcp_str_replace"]
        print(f"\nstr_replace over MCP, {rows[-1]['n']:,} vs {rows[0]['n']:,} files: {growth:.2f}× (flat: ≈ 1×)")


if __name__ == "__main__":
    main()
