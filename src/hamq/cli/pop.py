"""``hamq consume --pop`` and ``hamq bench consume --pop``: the simple consumer from the
command line. Every message printed (or counted) is acked with ``ack_async``, so acks leave
batched and pipelined."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable

import click

from hamq.cli.consume_run import ConsumeRun
from hamq.client.simple import AsyncSimpleConsumer, PopMessageExt
from hamq.clock import monotonic_s
from hamq.errors import HamqError

CONSUME_POP_BATCH = 32
CONSUME_INVISIBLE_S = 30.0
CONSUME_AWAIT_S = 1.0
BENCH_POP_BATCH = 256  # messages per pop request
BENCH_RECEIVERS = 4  # pop requests in flight
BENCH_ACKS_IN_FLIGHT = 8192  # received but not yet acked messages before receiving waits
BENCH_INVISIBLE_S = 60.0


async def consume_pop(
    namesrv: str,
    topic: str,
    group: str,
    from_beginning: bool,
    max_messages: int | None,
    timeout: float | None,
    print_message: Callable[[PopMessageExt], None],
) -> None:
    consumer = AsyncSimpleConsumer(
        group,
        namesrv,
        {topic: "*"},
        await_duration_s=min(timeout or CONSUME_AWAIT_S, CONSUME_AWAIT_S),
        consume_from_first=from_beginning,
    )

    def acked(err: HamqError | None) -> None:
        if err is not None:
            click.echo(f"ack failed: {type(err).__name__}: {err.message}", err=True)

    remaining = max_messages
    last_message_at = monotonic_s()
    try:
        await consumer.start()
        while remaining is None or remaining > 0:
            if timeout is not None and monotonic_s() - last_message_at > timeout:
                break
            try:
                batch = await consumer.receive(
                    min(remaining or CONSUME_POP_BATCH, CONSUME_POP_BATCH), CONSUME_INVISIBLE_S
                )
            except HamqError as err:
                click.echo(f"receive failed: {err.message}; retrying", err=True)
                await asyncio.sleep(1.0)
                continue
            for message in batch:
                print_message(message)
                consumer.ack_async(message, acked)
                last_message_at = monotonic_s()
            if remaining is not None:
                remaining -= len(batch)
    finally:
        await consumer.close()


async def run_pop_consume(run: ConsumeRun) -> tuple[int, int, int, float, array, dict]:
    """Pop ``run.count`` messages and ack each one; returns (acked, bytes, errors,
    elapsed_s, pop latencies, params). Stops early when a pop finds nothing left."""
    count, timeline = run.count, run.timeline
    consumer = AsyncSimpleConsumer(run.group, run.namesrv, {run.topic: "*"}, await_duration_s=0)
    latencies = array("d")
    perf = time.perf_counter
    received = acked = errors = nbytes = 0
    room = asyncio.Event()
    room.set()
    drained = False

    def on_ack(err: HamqError | None) -> None:
        nonlocal acked, errors
        acked += 1
        if err is not None:
            errors += 1
        if received - acked < BENCH_ACKS_IN_FLIGHT:
            room.set()

    async def receiver() -> None:
        nonlocal received, nbytes, drained
        while received < count and not drained and perf() < deadline:
            await room.wait()
            started = perf()
            batch = await consumer.receive(
                min(BENCH_POP_BATCH, count - received), BENCH_INVISIBLE_S
            )
            latencies.append(perf() - started)
            if not batch:
                drained = True
                return
            received += len(batch)
            for message in batch:
                nbytes += len(message.body)
                consumer.ack_async(message, on_ack)
            if received - acked >= BENCH_ACKS_IN_FLIGHT:
                room.clear()

    try:
        await consumer.start()
        deadline = perf() + run.max_seconds
        start = perf()
        if timeline is not None:
            timeline.follow(lambda: acked - errors, latencies, lambda: errors)
        await asyncio.gather(*(receiver() for _ in range(BENCH_RECEIVERS)))
        while acked < received and perf() < deadline:
            await asyncio.sleep(0.001)
        elapsed = perf() - start
    finally:
        if timeline is not None:
            await timeline.stop()
        await consumer.close()
    params = run.params(
        pop=True,
        pop_batch=BENCH_POP_BATCH,
        receivers=BENCH_RECEIVERS,
        acks_in_flight=BENCH_ACKS_IN_FLIGHT,
        ack="per message, batched per turn",
    )
    return acked - errors, nbytes, errors, elapsed, latencies, params
