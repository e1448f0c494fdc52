"""``hamq topic``, ``hamq produce``, ``hamq consume`` and ``hamq cluster``."""

from __future__ import annotations

import asyncio
import base64
import datetime
import sys

import click

from hamq.aio import (
    AsyncAdmin,
    AsyncProducer,
    AsyncPushConsumer,
    ConsumeConcurrentlyStatus,
    Message,
    MessageExt,
)
from hamq.cli.common import emit, json_option, namesrv_option, run_async
from hamq.clock import monotonic_s
from hamq.errors import HamqError, MessageIllegal
from hamq.manage.groups import member_rows
from hamq.protocol.properties import MAX_DELAY_LEVEL, validate_properties

PRODUCE_INFLIGHT = 64
# A command-line consumer is short-lived: join the group and commit progress quickly.
CLI_CONSUMER_TIMINGS = dict(
    heartbeat_interval_s=5.0,
    rebalance_interval_s=5.0,
    persist_offset_interval_s=1.0,
    pull_suspend_ms=1000,
)


@click.group()
def topic() -> None:
    """Create, list, inspect and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("--queues", default=4, show_default=True, help="Queues per broker group.")
@click.option("--cluster", help="Only the masters of this cluster (default: all).")
@namesrv_option
@json_option
@run_async
async def topic_create(
    name: str, queues: int, cluster: str | None, namesrv: str, as_json: bool
) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        masters = await admin.create_topic(name, queues, cluster=cluster)
    finally:
        await admin.close()
    emit(
        {"topic": name, "queues": queues, "brokers": sorted(masters)},
        as_json,
        lambda o: f"created {o['topic']} with {o['queues']} queues on {', '.join(o['brokers'])}",
    )


@topic.command("list")
@namesrv_option
@json_option
@run_async
async def topic_list(namesrv: str, as_json: bool) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        topics = await admin.topic_list()
    finally:
        await admin.close()
    emit(topics, as_json, lambda t: "\n".join(t))


@topic.command("route")
@click.argument("name")
@namesrv_option
@json_option
@run_async
async def topic_route(name: str, namesrv: str, as_json: bool) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        route = await admin.topic_route_raw(name)
    finally:
        await admin.close()
    emit(route, as_json)


@topic.command("delete")
@click.argument("name")
@namesrv_option
@json_option
@run_async
async def topic_delete(name: str, namesrv: str, as_json: bool) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        await admin.delete_topic(name)
    finally:
        await admin.close()
    emit({"topic": name, "deleted": True}, as_json, lambda o: f"deleted {o['topic']}")


@click.group()
def cluster() -> None:
    """Cluster state."""


@cluster.command("status")
@namesrv_option
@json_option
@run_async
async def cluster_status(namesrv: str, as_json: bool) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        rows = await member_rows(admin)
    finally:
        await admin.close()
    emit(
        rows,
        as_json,
        lambda rs: (
            "\n".join(
                f"{r['cluster']:<16} {r['broker_name']:<12} id={r['broker_id']} {r['address']:<22} "
                f"role={r.get('broker_role', '?')} "
                f"commitlog_max={r.get('commitlog_max_offset', '?')} "
                f"topics={r.get('topics', '?')} "
                f"epoch={r.get('role', {}).get('epoch', '?')} "
                f"services={','.join(r.get('role', {}).get('services', [])) or '-'}"
                + _controller_text(r.get("controller"))
                for r in rs
            )
            or "no brokers registered"
        ),
    )


def _controller_text(info: dict | None) -> str:
    """A controller-mode member's own id, SyncStateSet and confirm offset."""
    if not info:
        return ""
    return (
        f" controller_id={info['broker_id']} "
        f"sync_state_set={info['sync_state_set']}@{info['sync_state_set_epoch']} "
        f"confirm_offset={info['confirm_offset']}"
    )


@click.command()
@click.argument("topic_name")
@click.option("--count", type=int, help="Send COUNT generated messages instead of stdin lines.")
@click.option("--size", default=100, show_default=True, help="Body size of generated messages.")
@click.option("--keys", help="Message keys.")
@click.option("--tags", help="Message tag.")
@click.option(
    "--delay-level",
    type=click.IntRange(1, MAX_DELAY_LEVEL),
    help="Deliver after RocketMQ delay level N (1s 5s 10s 30s 1m 2m ... 2h).",
)
@click.option(
    "--deliver-at",
    "deliver_at",
    metavar="TIME",
    help="Deliver at TIME: epoch milliseconds or ISO-8601 (UTC if no offset).",
)
@namesrv_option
@json_option
@run_async
async def produce(
    topic_name: str,
    count: int | None,
    size: int,
    keys: str | None,
    tags: str | None,
    delay_level: int | None,
    deliver_at: str | None,
    namesrv: str,
    as_json: bool,
) -> None:
    """Send stdin lines (or --count generated bodies) to TOPIC; report each send."""
    if delay_level and deliver_at:
        raise click.UsageError("use either --delay-level or --deliver-at")
    schedule = {
        "delay_level": delay_level or 0,
        "deliver_time_ms": _deliver_time_ms(deliver_at) if deliver_at else 0,
    }
    producer = AsyncProducer(namesrv)
    window = asyncio.Semaphore(PRODUCE_INFLIGHT)
    failures = 0

    async def send_one(body: bytes) -> None:
        nonlocal failures
        try:
            result = await producer.send(
                Message(topic_name, body, keys=keys, tags=tags, **schedule)
            )
            emit(
                {
                    "status": result.status.value,
                    "msg_id": result.msg_id,
                    "broker_name": result.queue.broker_name,
                    "queue_id": result.queue.queue_id,
                    "queue_offset": result.queue_offset,
                },
                as_json,
                lambda o: (
                    f"{o['status']} {o['broker_name']}:{o['queue_id']} "
                    f"offset={o['queue_offset']} msg_id={o['msg_id']}"
                ),
            )
        except HamqError as err:
            failures += 1
            click.echo(f"send failed: {type(err).__name__}: {err.message}", err=True)
        finally:
            window.release()

    tasks = []
    try:
        for body in _bodies(count, size):
            await window.acquire()
            tasks.append(asyncio.ensure_future(send_one(body)))
        await asyncio.gather(*tasks)
    finally:
        await producer.close()
    if failures:
        raise click.ClickException(f"{failures} send(s) failed")


def _deliver_time_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither epoch milliseconds nor ISO-8601", param_hint="--deliver-at"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _bodies(count: int | None, size: int):
    if count is not None:
        for i in range(count):
            yield f"{i}:".encode().ljust(size, b"x")
        return
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


@click.command()
@click.argument("topic_name")
@click.option("--group", "-g", required=True, help="Consumer group (offsets are per group).")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the earliest retained message when the group has no offset.",
)
@click.option("--max", "max_messages", type=int, help="Stop after this many messages.")
@click.option("--timeout", type=float, help="Stop after this many seconds without messages.")
@click.option(
    "--pop", is_flag=True, help="Pop consumption (simple consumer): each printed message is acked."
)
@click.option(
    "--expression", default="*", show_default=True, help="Tag expression, e.g. 'TagA || TagB'."
)
@namesrv_option
@json_option
@run_async
async def consume(
    topic_name: str,
    group: str,
    from_beginning: bool,
    max_messages: int | None,
    timeout: float | None,
    pop: bool,
    expression: str,
    namesrv: str,
    as_json: bool,
) -> None:
    """Print messages of TOPIC as a push consumer of GROUP (offsets committed), or with
    --pop as a simple consumer (each printed message acked)."""
    if pop:
        from hamq.cli.pop import consume_pop  # imports the simple consumer only when used

        await consume_pop(
            namesrv,
            topic_name,
            group,
            from_beginning,
            max_messages,
            timeout,
            lambda msg: _print_message(msg, as_json),
        )
        return
    consumer = AsyncPushConsumer(
        group,
        namesrv,
        consume_from_where="first" if from_beginning else "last",
        **CLI_CONSUMER_TIMINGS,
    )
    try:
        await consumer.core.route(topic_name)  # an unknown topic fails here, clearly
    except HamqError:
        await consumer.core.close()
        raise
    consumer.subscribe(topic_name, expression)
    remaining = max_messages
    last_message_at = monotonic_s()
    done = asyncio.Event()

    async def listener(messages: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        nonlocal remaining, last_message_at
        for msg in messages:
            _print_message(msg, as_json)
        last_message_at = monotonic_s()
        if remaining is not None:
            remaining -= len(messages)
            if remaining <= 0:
                consumer.suspend()  # nothing past the last printed message is committed
                done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer.register_message_listener(listener)
    await consumer.start()
    try:
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.2)
            except TimeoutError:
                pass
            if timeout is not None and monotonic_s() - last_message_at > timeout:
                break
    finally:
        await consumer.shutdown()


def _print_message(msg: MessageExt, as_json: bool) -> None:
    if not as_json:
        click.echo(msg.body.decode("utf-8", "replace"))
        return
    obj = {
        "topic": msg.topic,
        "broker_name": msg.broker_name,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "msg_id": msg.msg_id,
        "store_timestamp_ms": msg.store_timestamp_ms,
    }
    try:
        properties = validate_properties(msg.properties)
    except (ValueError, MessageIllegal) as err:  # msgpack's errors are ValueErrors
        # Stored before sends checked properties: printed with what is wrong, never skipped
        # (a failing listener would stop the consumer at this message).
        obj["error"] = f"properties cannot be read: {err}"
    else:
        obj.update(
            keys=properties.get("KEYS"),
            tags=properties.get("TAGS"),
            properties={k: v for k, v in properties.items() if k not in ("KEYS", "TAGS")},
        )
    try:
        obj["body"] = msg.body.decode("utf-8")
    except UnicodeDecodeError:
        obj["body_base64"] = base64.b64encode(msg.body).decode()
    emit(obj, True)
