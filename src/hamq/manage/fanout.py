"""Asking many topics or queues at once, a bounded number at a time and for a bounded time.
The web API runs on a name server's event loop: one ``/api/overview`` of a cluster with
thousands of topics sent every queue's offset requests together (tens of thousands of
futures at once), which held the loop's other work back and let the later ones time out,
counting those topics as empty."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from hamq.clock import monotonic_s
from hamq.errors import HamqError, RequestTimeout

T = TypeVar("T")

# Calls awaited at once; each may itself send a request per queue of a topic.
MAX_IN_FLIGHT = 16
# Calls not begun by then are not made: a hung broker holds a slot for a whole request
# timeout, and thousands of its topics in turn would hold the answer for minutes.
MAX_FANOUT_S = 5.0


async def gather_bounded(
    calls: Sequence[Callable[[], Awaitable[T]]],
    limit: int = MAX_IN_FLIGHT,
    within_s: float = MAX_FANOUT_S,
) -> list[T | HamqError]:
    """Each call's result (or the ``HamqError`` it raised: the cluster's answer, for the
    caller to weigh), in order, with at most ``limit`` of them running at any time; a call
    not begun within ``within_s`` gives ``RequestTimeout``."""
    results: dict[int, T | HamqError] = {}
    todo = iter(enumerate(calls))
    deadline = monotonic_s() + within_s

    async def worker() -> None:
        for i, call in todo:
            if monotonic_s() > deadline:
                results[i] = RequestTimeout(f"not asked: the others took over {within_s:g} s")
                continue
            try:
                results[i] = await call()
            except HamqError as err:
                results[i] = err

    await asyncio.gather(*(worker() for _ in range(min(limit, len(calls)))))
    return [results[i] for i in range(len(calls))]
