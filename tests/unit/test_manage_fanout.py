"""manage.fanout.gather_bounded: results in order, at most ``limit`` calls at once, the
cluster's refusals handed back and anything else raised."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from hamq.errors import RequestTimeout, TopicNotExist
from hamq.manage.fanout import gather_bounded


def test_results_in_order_with_at_most_limit_running():
    running = peak = 0

    async def call(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * (i % 3))  # finishing out of order
        running -= 1
        if i == 7:
            raise TopicNotExist(f"no topic {i}")
        return i * i

    results = asyncio.run(gather_bounded([partial(call, i) for i in range(50)], limit=4))
    assert peak == 4
    assert isinstance(results[7], TopicNotExist)
    assert [r for i, r in enumerate(results) if i != 7] == [i * i for i in range(50) if i != 7]
    assert asyncio.run(gather_bounded([])) == []


def test_a_fault_that_is_no_cluster_answer_is_raised():
    async def broken() -> int:
        raise KeyError("offset")

    async def fine() -> int:
        return 1

    with pytest.raises(KeyError):
        asyncio.run(gather_bounded([fine, broken, fine]))


def test_calls_not_begun_in_time_are_not_made():
    """A hung broker's topics, one request timeout each, must not hold the answer for
    minutes: what is not begun within ``within_s`` is a RequestTimeout, not asked."""
    asked = []

    async def hung(i: int) -> int:
        asked.append(i)
        await asyncio.sleep(0.05)
        return i

    results = asyncio.run(
        gather_bounded([partial(hung, i) for i in range(100)], limit=2, within_s=0.12)
    )
    assert 2 <= len(asked) <= 10, asked  # 6 on an idle machine
    assert results[: len(asked)] == asked
    assert all(isinstance(r, RequestTimeout) for r in results[len(asked) :])
