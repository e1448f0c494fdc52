"""Background duties of a server: periodic jobs that one failure must not kill, and the
tasks a service cancels when it stops."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterable

from hamq.clock import monotonic_s
from hamq.net.counts import COUNTS

log = logging.getLogger(__name__)

# A duty failing at every run is logged this many times in a row, then once a LOG_QUIET_S
# with the count of failures not shown, so a 10 ms tick cannot flood the log.
LOG_BURST = 3
LOG_QUIET_S = 60.0


class PeriodicTask:
    """Runs ``duty`` (sync or async) every ``interval_s`` in a task of its own, from
    ``start()`` until ``stop()``; it can be started again after a stop (a service that
    follows the member's role does that). ``errors`` are expected (a full disk must not
    stop the flusher for good) and logged; any other exception is a bug: logged with its
    traceback and the task's name, counted, and the duty runs again at the next interval,
    so one bad record or reply never stops a background service for good. A future the
    duty awaits that another part cancels is such a failure too (only ``stop`` ends the
    loop). Failures in a row are logged ``LOG_BURST`` times, then once a ``LOG_QUIET_S``.

    ``wake()`` runs the duty now instead of at the end of the interval (a wake during a
    run makes the next run follow at once); the interval then starts again. The pause is
    one timer per interval, like ``asyncio.sleep``, so a 10 ms tick costs no more."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        duty: Callable[[], object],
        errors: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.duty = duty
        self.errors = errors
        self._task: asyncio.Task | None = None
        self._pause: asyncio.Future | None = None  # set while waiting for the next run
        self._woken = False
        self._failures = 0  # in a row
        self._unlogged = 0  # failures not logged since the last one that was
        self._quiet_until = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if self._pause is not None:
            _release(self._pause)
        await cancel_all([task])

    def wake(self) -> None:
        if self._pause is not None:  # waiting: end the wait (once, however often woken)
            _release(self._pause)
        else:  # running the duty (or not started): run again right after
            self._woken = True

    async def _loop(self) -> None:
        this_run = asyncio.current_task()
        # checked before the wait too: a stop whose cancel the duty swallowed would else
        # wait a whole interval (30 s for registration) before the loop saw it
        while self._task is this_run:
            await self._wait()
            if self._task is not this_run:
                return  # stopped, though a duty's asyncio.wait_for swallowed the cancel (3.11)
            try:
                result = self.duty()
                if inspect.isawaitable(result):
                    await result
            except self.errors as exc:
                self._failed(exc, bug=False)
            except asyncio.CancelledError as exc:
                if self._task is not this_run or this_run.cancelling():
                    raise  # stop()
                self._failed(exc, bug=True)  # what it awaited was cancelled by another part
            except Exception as exc:  # noqa: BLE001 - logged with its traceback in _failed
                self._failed(exc, bug=True)
            else:
                if self._failures:
                    self._recovered()

    def _failed(self, exc: BaseException, bug: bool) -> None:
        if bug:
            COUNTS.internal_errors += 1
        self._failures += 1
        if self._failures > LOG_BURST:
            now = monotonic_s()
            if now < self._quiet_until:
                self._unlogged += 1
                return
            self._quiet_until = now + LOG_QUIET_S
        unlogged, self._unlogged = self._unlogged, 0
        more = f" ({unlogged} failures since not logged)" if unlogged else ""
        if bug:
            log.error(
                "%s failed on a bug%s; running it again in %.3g s",
                self.name,
                more,
                self.interval_s,
                exc_info=exc,
            )
        else:
            log.error("%s failed%s: %s", self.name, more, exc)

    def _recovered(self) -> None:
        if self._failures > LOG_BURST:
            log.warning("%s runs without error again after %d failures", self.name, self._failures)
        self._failures = self._unlogged = 0
        self._quiet_until = 0.0

    async def _wait(self) -> None:
        if self._woken:
            self._woken = False
            return
        loop = asyncio.get_running_loop()
        self._pause = pause = loop.create_future()
        timer = loop.call_later(self.interval_s, _release, pause)
        try:
            await pause
        finally:
            timer.cancel()
            self._pause = None


def _release(pause: asyncio.Future) -> None:
    if not pause.done():
        pause.set_result(None)


async def cancel_all(tasks: Iterable[asyncio.Task | None]) -> None:
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_spawned: set[asyncio.Task] = set()


def spawn(coro: Coroutine[object, object, object]) -> asyncio.Task:
    """Run ``coro`` in the background, fire and forget: the event loop holds only weak
    references to tasks, so one nobody keeps could be collected before it finishes."""
    task = asyncio.ensure_future(coro)
    _spawned.add(task)
    task.add_done_callback(_spawned.discard)
    return task
