"""Seeds 0..SWARM_SEEDS-1 of the simulator, in chunks spread over CHUNK_WORKERS processes."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor

import pytest

from hamq.sim import SimResult, failed_seeds

SWARM_SEEDS = 2000
CHUNKS = 8
CHUNK_WORKERS = 2  # the CI box has two cores
CHUNK_SIZE = SWARM_SEEDS // CHUNKS


@pytest.fixture(scope="module")
def chunk_futures() -> Iterator[list[Future[list[SimResult]]]]:
    with ProcessPoolExecutor(max_workers=CHUNK_WORKERS) as pool:
        yield [pool.submit(failed_seeds, chunk * CHUNK_SIZE, CHUNK_SIZE) for chunk in range(CHUNKS)]


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_swarm_chunk(chunk: int, chunk_futures: list[Future[list[SimResult]]]) -> None:
    failures = chunk_futures[chunk].result()
    assert not failures, "\n".join(
        f"seed {r.seed}: {r.failure} (replay: python -m hamq.sim --seed {r.seed})" for r in failures
    )
