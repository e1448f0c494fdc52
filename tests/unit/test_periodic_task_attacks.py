"""PeriodicTask attacked: a duty that fails at every run must not flood the log (a 10 ms
DLedger tick failing would write a hundred tracebacks a second), and a duty whose awaited
future someone else cancels must not end the loop for good without a word."""

from __future__ import annotations

import asyncio
import logging

from hamq.net.tasks import PeriodicTask
from helpers import until


def test_a_duty_failing_at_every_run_is_logged_a_bounded_number_of_times(caplog):
    runs = []
    healthy = False

    def duty() -> None:
        runs.append(1)
        if not healthy:
            raise ValueError("always broken")

    async def scenario() -> None:
        nonlocal healthy
        task = PeriodicTask("broken duty", 0.001, duty)
        task.start()
        await until(lambda: len(runs) >= 200, 30, "200 failed runs")
        healthy = True
        failed = len(runs)
        await until(lambda: len(runs) >= failed + 2, 30, "runs without error")
        await task.stop()

    with caplog.at_level(logging.WARNING, "hamq.net.tasks"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records]
    failures = [line for line in lines if "broken duty failed" in line]
    assert 1 <= len(failures) <= 5, lines  # a few of 200, not one a run
    assert caplog.records[0].exc_info  # the first one with its traceback
    assert any("broken duty runs without error again after" in line for line in lines), lines


def test_a_duty_whose_awaited_future_is_cancelled_by_someone_else_runs_again(caplog):
    runs = []

    async def duty() -> None:
        runs.append(1)
        if len(runs) == 1:  # something it waits on is cancelled by another part
            victim = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(victim.cancel)
            await victim

    async def scenario() -> None:
        task = PeriodicTask("cancelled wait duty", 0.001, duty)
        task.start()
        await until(lambda: len(runs) >= 3, 30, "runs after the cancel")
        assert task.running
        await task.stop()
        assert not task.running

    with caplog.at_level(logging.ERROR, "hamq.net.tasks"):
        asyncio.run(scenario())
    assert any("cancelled wait duty failed" in r.getMessage() for r in caplog.records)


def test_stop_while_the_duty_awaits_ends_it_and_start_runs_it_again():
    started = []
    ended = []

    async def duty() -> None:
        started.append(1)
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(1)

    async def scenario() -> None:
        task = PeriodicTask("slow duty", 0.001, duty)
        task.start()
        task.start()  # twice: still one loop
        await until(lambda: started, 30, "the first run")
        await asyncio.wait_for(task.stop(), 5)
        assert (len(started), len(ended)) == (1, 1)
        task.start()
        await until(lambda: len(started) == 2, 30, "a run after the restart")
        await asyncio.wait_for(task.stop(), 5)
        assert len(ended) == 2

    asyncio.run(scenario())


def test_a_stop_whose_cancel_the_duty_swallows_ends_without_waiting_an_interval():
    started = []

    async def duty() -> None:
        started.append(1)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # as asyncio.wait_for (3.11) may when what it waits on ends as it is cancelled

    async def scenario() -> None:
        task = PeriodicTask("swallowing duty", 60.0, duty)
        task.start()
        task.wake()  # run now, not in a minute
        await until(lambda: started, 30, "the run")
        await asyncio.wait_for(task.stop(), 5)
        assert not task.running

    asyncio.run(scenario())
