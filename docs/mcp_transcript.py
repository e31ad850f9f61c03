#!/usr/bin/env python3
"""Print the MCP session transcript shown in docs/agents.md, by running it for real.

Two agents, each with its own `git storm mcp` server over stdio (the SDK's
ClientSession), edit the same file; the second edit of engineer_1 is rejected and
its retry is accepted. Regenerate the doc's transcript with:

    python3 docs/mcp_transcript.py > /tmp/transcript.md
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

REPO = "/tmp/storm-mcp-example/project"
FILES = {"src/api.py": "def fetch(url):\n    return http_get(url)\n", "README.md": "# service\n"}


def setup() -> None:
    shutil.rmtree(os.path.dirname(REPO), ignore_errors=True)
    os.makedirs(REPO)
    run = lambda *a: subprocess.run(a, cwd=REPO, check=True, capture_output=True)  # noqa: E731
    run("git", "init", "-q", "-b", "main")
    for path, text in FILES.items():
        os.makedirs(os.path.join(REPO, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(REPO, path), "w") as fh:
            fh.write(text)
    run("git", "add", "-A")
    run("git", "-c", "user.name=you", "-c", "user.email=you@example.invalid", "commit", "-q", "-m", "initial")
    run("git", "storm", "init")


def short(value: object, limit: int = 100) -> object:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    if isinstance(value, dict):
        return {k: short(v) for k, v in value.items()}
    if isinstance(value, list):
        return [short(v) for v in value]
    return value


async def call(s: ClientSession, agent: str, name: str, args: dict, *, payload: bool = False) -> None:
    res = await s.call_tool(name, args)
    print(f"\n**{agent} → `{name}`** `{json.dumps(args)}`\n")
    print(f"← isError: {str(res.is_error).lower()}\n")
    print("```text")
    print(res.content[0].text)
    print("```")
    if payload and res.structured_content is not None:
        print("\nstructuredContent (long strings shortened here):\n")
        print("```json")
        print(json.dumps(short(res.structured_content), indent=2, ensure_ascii=False))
        print("```")


async def main() -> None:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))

    def params(agent: str) -> StdioServerParameters:
        return StdioServerParameters(command="git", args=["storm", "mcp", "--agent", agent], cwd=REPO, env=env)

    async with stdio_client(params("engineer_1")) as (r1, w1), stdio_client(params("engineer_2")) as (r2, w2):
        async with ClientSession(r1, w1) as e1, ClientSession(r2, w2) as e2:
            await e1.initialize()
            await e2.initialize()
            api = f"{REPO}/src/api.py"
            await call(e1, "engineer_1", "view", {"path": api})
            await call(e2, "engineer_2", "view", {"path": "src/api.py"})
            await call(e2, "engineer_2", "str_replace", {
                "path": "src/api.py", "old_str": "    return http_get(url)",
                "new_str": "    return http_get(url, retries=3)  # engineer_2: flaky upstream"})
            await call(e1, "engineer_1", "str_replace", {
                "path": api, "old_str": "def fetch(url):\n    return http_get(url)",
                "new_str": "def fetch(url, timeout=10):\n    return http_get(url, timeout=timeout)"},
                payload=True)
            await call(e1, "engineer_1", "str_replace", {
                "path": api, "old_str": "def fetch(url):\n    return http_get(url, retries=3)",
                "new_str": "def fetch(url, timeout=10):\n    return http_get(url, retries=3, timeout=timeout)"})


if __name__ == "__main__":
    setup()
    anyio.run(main)
