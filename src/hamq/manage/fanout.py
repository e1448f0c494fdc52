"""Asking many topics or queues at once, a bounded number at a time. The web API runs on a
name server's event loop: one ``/api/overview`` of a cluster with thousands of topics sent
every queue's offset requests together (tens of thousands of futures at once), which held
the loop's other work back and let the later ones time out, counting those topics as
empty."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from hamq.errors import HamqError

T = TypeVar("T")

# Calls awaited at once; each may itself send a request per queue of a topic.
MAX_IN_FLIGHT = 16


async def gather_bounded(
    calls: Sequence[Callable[[], Awaitable[T]]], limit: int = MAX_IN_FLIGHT
) -> list[T | HamqError]:
    """Each call's result (or the ``HamqError`` it raised: the cluster's answer, for the
    caller to weigh), in order, with at most ``limit`` of them running at any time."""
    results: dict[int, T | HamqError] = {}
    todo = iter(enumerate(calls))

    async def worker() -> None:
        for i, call in todo:
            try:
                results[i] = await call()
            except HamqError as err:
                results[i] = err

    await asyncio.gather(*(worker() for _ in range(min(limit, len(calls)))))
    return [results[i] for i in range(len(calls))]
