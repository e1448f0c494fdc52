"""Executor side of a read: pull one planned offset range of a queue as Arrow batches."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import pyarrow as pa

from hamq.client.consumer import PullResult, PullStatus
from hamq.client.message import MessageQueue
from hamq.clock import monotonic_s
from hamq.errors import HamqError
from hamq.spark.arrow_codec import records_to_batch
from hamq.spark.offsets import QueueRange
from hamq.spark.options import ReadOptions
from hamq.spark.schema import READ_COLUMNS, arrow_schema
from hamq.spark.worker_client import worker_consumer

# Messages asked per pull; the broker also stops at its byte limit (4 MiB).
PULL_BATCH = 8192


def read_range(
    options: ReadOptions, part: QueueRange, columns: tuple[str, ...] = READ_COLUMNS
) -> Iterator[pa.RecordBatch]:
    """Pull ``[start, end)`` of one queue, one Arrow batch of ``columns`` per pull. Two
    pulls stay in flight: the next one starts where the last response ended, the one after
    that where the next is expected to end (responses are cut at the broker's byte limit,
    so their length repeats); a guess that misses is only a pull wasted. The pulls go
    through the worker process's client (``worker_client.py``), not one per partition."""
    schema = arrow_schema(columns)
    mq = MessageQueue(part.topic, part.broker, part.queue_id)
    client, consumer = worker_consumer(options.namesrv, options.timeout_s, options.pull_group)
    pulls: dict[int, concurrent.futures.Future] = {}  # by start offset

    def ensure(at: int) -> None:
        if at < part.end and at not in pulls:
            size = min(PULL_BATCH, part.end - at)
            pulls[at] = client.submit(consumer.pull_raw(mq, at, size))

    offset, step = part.start, 0
    waited_since = None
    try:
        ensure(offset)
        while offset < part.end:
            result = _answer(pulls.pop(offset))
            batch = None
            if result is not None and result.status is PullStatus.FOUND:
                batch, next_offset = records_to_batch(
                    result.records, offset, part.end, part.topic, part.broker, part.queue_id, schema
                )
                step, offset, waited_since = next_offset - offset, next_offset, None
            elif (
                result is not None
                and result.status is PullStatus.OFFSET_ILLEGAL
                and result.min_offset > offset
            ):
                if options.fail_on_data_loss:
                    raise RuntimeError(
                        f"hamq queue {part.broker}:{part.queue_id} of {part.topic} no longer "
                        f"holds offsets {offset}..{result.min_offset - 1} (removed by retention)"
                        "; set failOnDataLoss=false to skip them"
                    )
                offset = min(result.min_offset, part.end)
            else:
                waited_since = waited_since or monotonic_s()
                if monotonic_s() - waited_since > options.poll_timeout_s:
                    raise RuntimeError(
                        f"hamq queue {part.broker}:{part.queue_id} of {part.topic} did not "
                        f"serve offset {offset} (planned up to {part.end}) within "
                        f"{options.poll_timeout_s:.0f} s (option pollTimeoutMs)"
                    )
                time.sleep(0.05)
            for stale in [at for at in pulls if at < offset]:
                pulls.pop(stale).cancel()  # guessed wrong: its answer is not needed
            ensure(offset)
            if step:
                ensure(offset + step)
            if batch is not None:
                yield batch
    finally:
        # the client outlives this range (a task ended early, a limit was reached)
        for pending in pulls.values():
            pending.cancel()


def _answer(pending: concurrent.futures.Future) -> PullResult | None:
    """A pull's answer, or None if its broker could not answer for now (a master
    restarting, a connection lost): the range waits for it as for a lagging slave."""
    try:
        return pending.result()
    except HamqError as e:
        if not e.retriable:
            raise
        return None
