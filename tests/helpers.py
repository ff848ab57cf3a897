"""Small test helpers shared by the suites."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncContextManager, AsyncIterator, TypeVar

T = TypeVar("T")


@contextlib.asynccontextmanager
async def in_background(manager: AsyncContextManager[T]) -> AsyncIterator[T]:
    """Enter ``manager`` in its own task and exit it there.

    pytest-asyncio may run an async fixture's setup and teardown in different tasks, and anyio task
    groups must be exited in the task that entered them.
    """
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def hold() -> None:
        try:
            async with manager as value:
                ready.set_result(value)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    task = asyncio.create_task(hold())
    try:
        yield await asyncio.wait_for(asyncio.shield(ready), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
