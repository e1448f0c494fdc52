"""Background duties of a server: periodic jobs that one failure must not kill, and the
tasks a service cancels when it stops."""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable

from hamq.net.counts import COUNTS

log = logging.getLogger(__name__)


async def every(interval_s: float, duty: Callable[[], object],
                errors: tuple[type[BaseException], ...] = (OSError,)) -> None:
    """Run ``duty`` (sync or async) every ``interval_s``. ``errors`` are expected (a full
    disk must not stop the flusher for good) and logged; any other exception is a bug:
    logged with its traceback, counted, and the duty runs again at the next interval, so
    one bad record or reply never stops a background service for good."""
    name = getattr(duty, "__qualname__", duty)
    while True:
        await asyncio.sleep(interval_s)
        try:
            result = duty()
            if inspect.isawaitable(result):
                await result
        except errors as exc:
            log.error("%s failed: %s", name, exc)
        except Exception:
            COUNTS.internal_errors += 1
            log.exception("%s failed on a bug; running it again in %.3g s", name, interval_s)


async def cancel_all(tasks: Iterable[asyncio.Task | None]) -> None:
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
