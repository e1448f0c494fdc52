"""PeriodicTask (net/tasks.py), the one helper behind every periodic loop: a duty that
raises is logged with the task's name and runs again, a stopped task starts again, and
``wake`` runs the duty before the interval is over."""

from __future__ import annotations

import asyncio
import logging

from hamq.net.tasks import PeriodicTask

WAIT_S = 5.0


async def until(predicate) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), WAIT_S)


def test_a_failing_duty_is_logged_and_runs_again(caplog):
    runs = []

    def duty() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise ValueError("a bad record")

    async def scenario() -> None:
        task = PeriodicTask("bad record duty", 0.001, duty)
        task.start()
        await until(lambda: len(runs) >= 4)
        await task.stop()

    with caplog.at_level(logging.ERROR, "hamq.net.tasks"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "bad record duty failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)  # a bug: traceback


def test_a_stopped_task_starts_again():
    runs = []

    async def duty() -> None:
        runs.append(1)

    async def scenario() -> None:
        task = PeriodicTask("restartable", 0.001, duty)
        task.start()
        await until(lambda: runs)
        await task.stop()
        assert not task.running
        stopped_at = len(runs)
        await asyncio.sleep(0.02)
        assert len(runs) == stopped_at  # nothing runs while stopped
        task.start()
        await until(lambda: len(runs) > stopped_at)
        await task.stop()

    asyncio.run(scenario())


def test_wake_runs_the_duty_now_and_a_wake_during_a_run_runs_it_again():
    runs = []

    async def scenario() -> None:
        task = PeriodicTask("woken", 3600, lambda: runs.append(1))
        task.start()
        await asyncio.sleep(0)  # waiting out an hour
        task.wake()
        await until(lambda: len(runs) == 1)
        task.wake()
        task.wake()  # two wakes before it ran: one run
        await until(lambda: len(runs) == 2)
        await asyncio.sleep(0.02)
        assert len(runs) == 2
        await task.stop()

    asyncio.run(scenario())
