"""``hamq bench``: the one tool every issue reports its numbers with.

Load is bounded by a message count and a wall-clock limit; results are one JSON object
with ``msgs_per_s``, ``mb_per_s``, latency percentiles and the exact parameters.
"""

from __future__ import annotations

import asyncio
import os
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

import click

from hamq.aio import (
    AsyncAdmin,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    ConsumeConcurrentlyStatus,
)
from hamq.cli.acting_bench import (
    DEFAULT_NOT_ACTIVE_MS,
    DEFAULT_SCAN_MS,
    acting_text,
    run_acting_bench,
)
from hamq.cli.bench_timeline import INTERVAL_S, Timeline
from hamq.cli.common import emit, namesrv_option, run_async
from hamq.cli.consume_run import ConsumeRun
from hamq.cli.failover import failover_text, run_failover
from hamq.cli.progress import progress
from hamq.client.consumer import PullStatus
from hamq.clock import wall_ms
from hamq.errors import HamqError, InvalidArgument, TopicNotExist
from hamq.protocol.message import encode_batch, encode_message

CONSUME_PULL_BATCH = 1024
PUSH_PULL_BATCH = 1024


def percentile_ms(sorted_s: list[float], q: float) -> float:
    if not sorted_s:
        return 0.0
    return round(sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000, 3)


def summary(
    name: str,
    messages: int,
    size: int,
    elapsed_s: float,
    latencies_s: array,
    errors: int,
    params: dict,
) -> dict:
    lat = sorted(latencies_s)
    return {
        "bench": name,
        "messages": messages,
        "elapsed_s": round(elapsed_s, 3),
        "msgs_per_s": round(messages / elapsed_s) if elapsed_s else 0,
        "mb_per_s": round(messages * size / elapsed_s / 1e6, 2) if elapsed_s else 0,
        "p50_ms": percentile_ms(lat, 0.50),
        "p99_ms": percentile_ms(lat, 0.99),
        "p999_ms": percentile_ms(lat, 0.999),
        "errors": errors,
        "params": params,
    }


async def ensure_topic(namesrv: str, topic: str, queues: int) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        try:
            route = await admin.topic_route(topic)
            if len(route.write_queues) >= queues:
                return
        except TopicNotExist:
            pass
        await admin.create_topic(topic, queues)
    finally:
        await admin.close()


async def run_produce(
    namesrv: str,
    topic: str,
    count: int,
    size: int,
    batch: int,
    inflight: int,
    queues: int,
    max_seconds: float,
    timeline: Timeline | None = None,
) -> dict:
    await ensure_topic(namesrv, topic, queues)
    producer = AsyncProducer(namesrv)
    if count < 1 or batch < 1 or inflight < 1:
        raise InvalidArgument("--count, --batch and --inflight must be at least 1")
    message = encode_message(os.urandom(size))
    # Exactly ``count`` messages: full batches, then one smaller batch for the remainder.
    sizes = [batch] * (count // batch) + ([count % batch] if count % batch else [])
    payloads = {n: encode_batch([message] * n) for n in set(sizes)}
    requests = len(sizes)
    latencies = array("d")
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    perf = time.perf_counter
    sent = done = errors = delivered = 0
    first_error: list[str] = []
    deadline = perf() + max_seconds

    def issue() -> None:
        nonlocal sent
        if sent >= requests:  # a deferred retry of a slot found nothing left to send
            if done == sent and not finished.done():
                finished.set_result(None)
            return
        n = sizes[sent]
        sent += 1
        started = perf()
        payload, crc = payloads[n]
        producer.send_payload_async(
            topic, payload, crc, n, lambda result, err: on_done(err, started, n)
        )

    def on_done(err: HamqError | None, started: float, n: int) -> None:
        nonlocal done, errors, delivered
        now = perf()
        latencies.append(now - started)
        done += 1
        if err is None:
            delivered += n
        else:
            errors += 1
            if not first_error:
                first_error.append(f"{type(err).__name__}: {err.message}")
        if sent < requests and now < deadline:
            if err is None:
                issue()
            else:  # errors may come back synchronously: do not recurse into the next send
                loop.call_soon(issue)
        elif done == sent and not finished.done():
            finished.set_result(None)

    try:
        await producer.warm_up(topic)
        start = perf()
        if timeline is not None:
            timeline.follow(lambda: delivered, latencies, lambda: errors)
        for _ in range(min(inflight, requests)):
            issue()
        await finished
        elapsed = perf() - start
    finally:
        if timeline is not None:
            await timeline.stop()
        await producer.close()
    result = summary(
        "produce",
        delivered,
        size,
        elapsed,
        latencies,
        errors,
        {
            "count": count,
            "size": size,
            "batch": batch,
            "inflight": inflight,
            "topic": topic,
            "queues": queues,
            "namesrv": namesrv,
        },
    )
    if first_error:
        result["first_error"] = first_error[0]
    return result


async def run_consume(run: ConsumeRun) -> dict:
    count, timeline = run.count, run.timeline
    consumer = AsyncPullConsumer(run.group, run.namesrv)
    latencies = array("d")
    consumed = 0
    nbytes = 0
    perf = time.perf_counter
    try:
        queues = await consumer.fetch_message_queues(run.topic)
        offsets = {mq: await consumer.min_offset(mq) for mq in queues}
        deadline = perf() + run.max_seconds
        start = perf()
        if timeline is not None:
            timeline.follow(lambda: consumed, latencies)

        async def drain(mq) -> None:
            nonlocal consumed, nbytes
            while consumed < count and perf() < deadline:
                started = perf()
                result = await consumer.pull(mq, offsets[mq], CONSUME_PULL_BATCH)
                latencies.append(perf() - started)
                if result.status is PullStatus.OFFSET_ILLEGAL:
                    offsets[mq] = result.next_begin_offset
                    continue
                if not result.messages:
                    return
                consumed += len(result.messages)
                nbytes += sum(len(m.body) for m in result.messages)
                offsets[mq] = result.next_begin_offset

        await asyncio.gather(*(drain(mq) for mq in queues))
        elapsed = perf() - start
    finally:
        if timeline is not None:
            await timeline.stop()
        await consumer.close()
    size = nbytes // consumed if consumed else 0
    return summary(
        "consume",
        consumed,
        size,
        elapsed,
        latencies,
        0,
        run.params(pull_batch=CONSUME_PULL_BATCH),
    )


async def run_push_consume(run: ConsumeRun) -> dict:
    """A push consumer from the first offset; the listener counts bodies (the cost of the
    consumer's own machinery is what is measured)."""
    count, timeline = run.count, run.timeline
    done = asyncio.Event()
    state = {"consumed": 0, "bytes": 0, "first": 0.0}

    async def listener(messages) -> ConsumeConcurrentlyStatus:
        if not state["consumed"]:  # measured from the first delivery, not the start-up
            state["first"] = time.perf_counter()
        state["consumed"] += len(messages)
        state["bytes"] += sum(len(m.body) for m in messages)
        if state["consumed"] >= count:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = AsyncPushConsumer(
        run.group,
        run.namesrv,
        consume_from_where="first",
        pull_batch_size=PUSH_PULL_BATCH,
        consume_message_batch_max_size=PUSH_PULL_BATCH,
    )
    consumer.subscribe(run.topic)
    consumer.register_message_listener(listener)
    await consumer.start()
    if timeline is not None:  # no latencies: a push consumer's pulls are its own
        timeline.follow(lambda: state["consumed"])
    try:
        await asyncio.wait_for(done.wait(), run.max_seconds)
    except TimeoutError:
        pass
    if timeline is not None:
        await timeline.stop()
    elapsed = time.perf_counter() - state["first"] if state["consumed"] else 0.0
    await consumer.shutdown()
    consumed = state["consumed"]
    return summary(
        "consume_push",
        consumed,
        state["bytes"] // consumed if consumed else 0,
        elapsed,
        array("d"),
        0,
        run.params(pull_batch=PUSH_PULL_BATCH),
    )


@click.group()
def bench() -> None:
    """Measure throughput and latency against a running cluster."""


_common = [
    click.option("--topic", default="BenchTopic", show_default=True),
    click.option(
        "--max-seconds",
        default=60.0,
        show_default=True,
        help="Stop the run after this long, whatever the count.",
    ),
    namesrv_option,
    click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
]


def _plot_path(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """The PNG is written once the run is over: a path that cannot be written is refused
    now, not after minutes of bench (whose result the failed write lost). Opening it is
    the one true test (a missing or read-only directory, a file in the way)."""
    if path is None:
        return None
    existed = os.path.exists(path)
    try:
        open(path, "ab").close()
    except OSError as e:
        raise click.BadParameter(f"cannot write {path!r}: {e.strerror}") from None
    if not existed:
        os.unlink(path)
    return path


plot_option = click.option(
    "--plot",
    type=click.Path(dir_okay=False, writable=True),
    callback=_plot_path,
    help=f"Draw throughput and latency per {INTERVAL_S} s of the run to this PNG.",
)
_common.append(plot_option)


def _with_common(fn):
    for option in reversed(_common):
        fn = option(fn)
    return fn


async def _watched(
    name: str,
    total: int,
    plot: str | None,
    as_json: bool,
    run: Callable[[Timeline], Awaitable[dict]],
) -> dict:
    """A run with its progress bar (``total`` messages) and, with ``--plot``, its timeline
    drawn once it is over."""
    with progress(total, f"bench {name}", not as_json) as advance:
        timeline = Timeline(plot, advance)
        result = await run(timeline)
    result["bench"] = name
    latency = f", p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms" if result["p99_ms"] else ""
    timeline.draw(
        f"hamq bench {name}: {result['messages']:,} msgs, {result['msgs_per_s']:,} msgs/s{latency}"
    )
    return result


def _text(r: dict) -> str:
    return (
        f"{r['bench']}: {r['messages']} msgs in {r['elapsed_s']} s = {r['msgs_per_s']} "
        f"msgs/s, {r['mb_per_s']} MB/s; latency p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
        f"p99.9 {r['p999_ms']} ms; errors {r['errors']}"
    )


@bench.command("produce")
@click.option("--count", default=1_000_000, show_default=True)
@click.option("--size", default=1024, show_default=True, help="Body bytes per message.")
@click.option("--batch", default=64, show_default=True, help="Messages per send request.")
@click.option("--inflight", default=16, show_default=True, help="Requests in flight.")
@click.option("--queues", default=4, show_default=True)
@_with_common
@run_async
async def bench_produce(
    count: int,
    size: int,
    batch: int,
    inflight: int,
    queues: int,
    topic: str,
    max_seconds: float,
    namesrv: str,
    as_json: bool,
    plot: str | None,
) -> None:
    """Throughput of (batched, pipelined) sends."""

    def run(timeline: Timeline) -> Awaitable[dict]:
        return run_produce(
            namesrv, topic, count, size, batch, inflight, queues, max_seconds, timeline
        )

    emit(await _watched("produce", count, plot, as_json, run), as_json, _text)


@bench.command("latency")
@click.option("--count", default=10_000, show_default=True)
@click.option("--size", default=1024, show_default=True)
@click.option("--queues", default=4, show_default=True)
@_with_common
@run_async
async def bench_latency(
    count: int,
    size: int,
    queues: int,
    topic: str,
    max_seconds: float,
    namesrv: str,
    as_json: bool,
    plot: str | None,
) -> None:
    """One send at a time: latency percentiles."""

    def run(timeline: Timeline) -> Awaitable[dict]:
        return run_produce(namesrv, topic, count, size, 1, 1, queues, max_seconds, timeline)

    emit(await _watched("latency", count, plot, as_json, run), as_json, _text)


@bench.command("consume")
@click.option("--count", default=1_000_000, show_default=True)
@click.option(
    "--group",
    help="Consumer group (default: bench_consumer; with --pop a new "
    "group per run, so every run starts at the first message).",
)
@click.option("--pop", is_flag=True, help="Pop consumption with a per-message ack (pipelined).")
@click.option(
    "--push",
    is_flag=True,
    help="A push consumer (a new group per run) with a listener per message.",
)
@_with_common
@run_async
async def bench_consume(
    count: int,
    group: str | None,
    pop: bool,
    push: bool,
    topic: str,
    max_seconds: float,
    namesrv: str,
    as_json: bool,
    plot: str | None,
) -> None:
    """Pull (or pop, or push) throughput from the start of every queue of TOPIC."""

    def told(default_group: str, timeline: Timeline) -> ConsumeRun:
        return ConsumeRun(namesrv, topic, count, group or default_group, max_seconds, timeline)

    run: Callable[[Timeline], Awaitable[dict]]
    if push:
        name = "consume_push"

        def run(timeline: Timeline) -> Awaitable[dict]:
            return run_push_consume(told(f"bench_push_{wall_ms()}", timeline))

    elif pop:
        name = "consume_pop"

        async def run(timeline: Timeline) -> dict:
            from hamq.cli.pop import run_pop_consume

            consumed, nbytes, errors, elapsed, latencies, params = await run_pop_consume(
                told(f"bench_pop_{wall_ms()}", timeline)
            )
            size = nbytes // consumed if consumed else 0
            return summary(name, consumed, size, elapsed, latencies, errors, params)

    else:
        name = "consume"

        def run(timeline: Timeline) -> Awaitable[dict]:
            return run_consume(told("bench_consumer", timeline))

    emit(await _watched(name, count, plot, as_json, run), as_json, _text)


@bench.command("failover")
@click.option("--kills", default=10, show_default=True, type=click.IntRange(min=1))
@click.option("--replicas", default=3, show_default=True, type=click.IntRange(min=2))
@click.option(
    "--controllers", default=3, show_default=True, type=click.IntRange(min=1), help="Peers."
)
@click.option("--embedded", is_flag=True, help="The controller peers are the name servers.")
@click.option(
    "--port-base", default=29876, show_default=True, help="hamq dev's --port-base for the run."
)
@click.option(
    "--data",
    "data_dir",
    help="hamq dev's data directory, kept (default: a temp dir, removed after a clean run).",
)
@click.option("--size", default=1024, show_default=True, help="Body bytes per message.")
@click.option(
    "--senders", default=4, show_default=True, type=click.IntRange(min=1), help="Sends in flight."
)
@click.option("--topic", default="FailoverTopic", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@plot_option
@run_async
async def bench_failover(as_json: bool, **params: Any) -> None:
    """kill -9 a controller-mode master KILLS times under a steady stream of sends (on its
    own `hamq dev --mode controller`): time to the first send the new master acknowledges,
    and every acknowledged message read back."""
    with progress(params["kills"], "bench failover: kill -9s", not as_json) as killed:
        result = await run_failover(**params, killed=killed)
    emit(result, as_json, failover_text)


@bench.command("acting-master")
@click.option(
    "--escape-backlog",
    default=100_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Delay messages of the dead master due together, escaped to the other master.",
)
@click.option(
    "--port-base",
    default=27876,  # below the usual ephemeral ports (32768 and up)
    show_default=True,
    help="Name server port; brokers at +10, +20, +30 (HA one above each).",
)
@click.option(
    "--data",
    "data_dir",
    help="Where the servers keep data and logs (default: a temp dir, removed after a clean run).",
)
@click.option(
    "--max-seconds",
    default=300.0,
    show_default=True,
    help="Stop waiting for any measurement after this long (before and after the kill).",
)
@click.option(
    "--broker-not-active-timeout-ms",
    default=DEFAULT_NOT_ACTIVE_MS,
    show_default=True,
    help="The name server's brokerNotActiveTimeoutMillis: when a silent master is dead.",
)
@click.option(
    "--scan-not-active-broker-interval-ms",
    default=DEFAULT_SCAN_MS,
    show_default=True,
    help="The name server's scanNotActiveBrokerInterval.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@plot_option
@run_async
async def bench_acting_master(as_json: bool, **params: Any) -> None:
    """kill -9 a master-slave group's master with slave acting master on (its own name
    server and two groups): time to the acting master in routes, its first queue lock and
    its first escaped delay message, and the escape throughput of a due backlog."""
    total = params["escape_backlog"]
    with progress(total, "bench acting-master: escaped", not as_json) as escaped:
        result = await run_acting_bench(**params, escaped=escaped)
    emit(result, as_json, acting_text)
