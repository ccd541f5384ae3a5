"""The tasks of one instance: its body and ticker, and the tasks it spawns (state sends,
drains) that must finish before it does. A task that raises fails the instance."""
from __future__ import annotations

import asyncio
from collections.abc import Callable


class Tasks:
    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.on_error = on_error
        self.main: list[asyncio.Task] = []
        self.spawned: set[asyncio.Task] = set()

    async def guard(self, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.on_error(exc)

    def run(self, coro, guarded: bool = True) -> None:
        """Run one of the instance's own tasks (cancelled when it stops)."""
        self.main.append(asyncio.ensure_future(self.guard(coro) if guarded else coro))

    def spawn(self, coro) -> None:
        """Run ``coro`` as a task the instance waits for before it finishes."""
        task = asyncio.ensure_future(self.guard(coro))
        self.spawned.add(task)
        task.add_done_callback(self.spawned.discard)

    async def join_spawned(self) -> None:
        while self.spawned:
            await asyncio.gather(*list(self.spawned))

    def cancel(self, spawned: bool = False) -> None:
        """Cancel the instance's own tasks, but not the one calling (and, with ``spawned``,
        the tasks it spawned: a stopped instance sends no more state)."""
        for t in self.main + (list(self.spawned) if spawned else []):
            if t is not asyncio.current_task():
                t.cancel()
