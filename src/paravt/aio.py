"""`run`: asyncio.run for coroutines whose result is large (episodes and their frames).

On the main thread, asyncio.run (Python 3.11 to 3.13) ends by checking whether its SIGINT handler is
still installed: `signal.getsignal` tries to turn the handler, a partial that holds the main task, into
a `signal.Handlers` member, and the ValueError that attempt raises formats the task's repr, with its
result's, twice: every frame of every episode printed by numpy and thrown away (~0.3 CPU-s at the end
of each rollout phase of 8 to 16 episodes at K = 24 on the shipped SFT model). The result is handed
back beside the task instead, whose own result is None.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro), without the repr of its result that asyncio.run computes on the main thread."""
    box: list = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]
