"""Seed swarms on a process pool, shared by the simulator modes' tests: seeds 0..seeds-1 in
chunks, each chunk's failures a future that its own test case waits on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

R = TypeVar("R")

WORKERS = 2  # the CI box has two cores


@contextmanager
def chunked_seeds(
    failed_seeds: Callable[[int, int], list[R]], seeds: int, chunks: int
) -> Iterator[list[Future[list[R]]]]:
    """``failed_seeds(first, count)`` for every chunk, started at once on ``WORKERS``
    processes (it must be picklable: a module-level function)."""
    size = seeds // chunks
    with ProcessPoolExecutor(max_workers=WORKERS) as pool:
        yield [pool.submit(failed_seeds, chunk * size, size) for chunk in range(chunks)]
