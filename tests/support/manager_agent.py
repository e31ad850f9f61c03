"""An agent of the STORM paper's harness on the manager interface
(storm_git.paper.manager): a cache of viewed files and versions,
edits applied to the cached view."""
from __future__ import annotations

from storm_git.paper.manager import Manager, ReadResponse, WriteResponse


class Agent:
    """The harness's file_editor for one agent: a cache of viewed files and versions."""

    def __init__(self, manager: Manager, agent_id: str) -> None:
        self.m, self.id = manager, agent_id
        self.cache: dict[str, ReadResponse] = {}

    async def view(self, path: str) -> ReadResponse:
        r = await self.m.read_file(self.id, path)
        self.cache[path] = r
        return r

    def snapshot(self) -> dict[str, int]:
        return {p: r.version for p, r in self.cache.items()}

    async def str_replace(self, path: str, old: str, new: str) -> WriteResponse:
        seen = self.cache[path]
        assert seen.content.count(old) == 1, (path, old, seen.content)
        res = await self.m.write_file(self.id, path, seen.content.replace(old, new, 1), seen.version,
                                      snapshot=self.snapshot(), base_content=seen.content)
        if res.success:
            self.cache[path] = ReadResponse(seen.content.replace(old, new, 1), res.new_version)
        return res

    async def create(self, path: str, text: str) -> WriteResponse:
        res = await self.m.write_file(self.id, path, text, 0)
        if res.success:
            self.cache[path] = ReadResponse(text, res.new_version)
        return res


async def increment(manager: Manager, agent: str, path: str, times: int) -> list[int]:
    """Add one line to ``path`` ``times`` times, as the harness would: view, edit the
    cached view, write; on a rejection take the current content and retry."""
    a = Agent(manager, agent)
    got = []
    await a.view(path)
    done = 0
    while done < times:
        seen = a.cache[path]
        res = await manager.write_file(agent, path, seen.content + f"{agent} {done}\n", seen.version,
                                       snapshot={path: seen.version})
        if res.success:
            got.append(res.new_version)
            a.cache[path] = ReadResponse(seen.content + f"{agent} {done}\n", res.new_version)
            done += 1
        else:
            assert res.reason in ("direct_conflict", "reserved"), res
            await manager.release_reservation(agent, path)
            await a.view(path)
    return got
