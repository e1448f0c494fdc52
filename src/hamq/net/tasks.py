"""Background duties of a server: periodic jobs that one failure must not kill, and the
tasks a service cancels when it stops."""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


async def every(interval_s: float, duty: Callable[[], object],
                errors: tuple[type[BaseException], ...] = (OSError,)) -> None:
    """Run ``duty`` (sync or async) every ``interval_s``; ``errors`` are logged, not fatal
    (a full disk must not stop the flusher for good)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            result = duty()
            if inspect.isawaitable(result):
                await result
        except errors as exc:
            log.error("%s failed: %s", getattr(duty, "__qualname__", duty), exc)


async def cancel_all(tasks: Iterable[asyncio.Task | None]) -> None:
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
