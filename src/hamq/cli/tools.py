"""``hamq topic``, ``hamq produce``, ``hamq consume`` and ``hamq cluster``."""
from __future__ import annotations

import asyncio
import base64
import sys
import time

import click

from hamq.aio import AsyncAdmin, AsyncProducer, AsyncPullConsumer, Message, MessageExt
from hamq.cli.common import emit, json_option, namesrv_option, run_async
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageQueue
from hamq.errors import HamqError

PRODUCE_INFLIGHT = 64
CONSUME_COMMIT_INTERVAL_S = 1.0
CONSUME_PULL_BATCH = 256
CONSUME_SUSPEND_MS = 1000


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
async def topic_create(name: str, queues: int, cluster: str | None, namesrv: str,
                       as_json: bool) -> None:
    admin = AsyncAdmin(namesrv)
    try:
        masters = await admin.create_topic(name, queues, cluster=cluster)
    finally:
        await admin.close()
    emit({"topic": name, "queues": queues, "brokers": sorted(masters)}, as_json,
         lambda o: f"created {o['topic']} with {o['queues']} queues on {', '.join(o['brokers'])}")


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
        info = await admin.cluster_info()
        rows = []
        for name, entry in sorted(info["broker_addr_table"].items()):
            for broker_id, addr in sorted(entry["broker_addrs"].items()):
                try:
                    runtime = await admin.broker_runtime_info(addr)
                except HamqError as err:
                    runtime = {"error": err.message}
                rows.append({"cluster": entry["cluster"], "broker_name": name,
                             "broker_id": int(broker_id), "address": addr, **runtime})
    finally:
        await admin.close()
    emit(rows, as_json, lambda rs: "\n".join(
        f"{r['cluster']:<16} {r['broker_name']:<12} id={r['broker_id']} {r['address']:<22} "
        f"role={r.get('broker_role', '?')} commitlog_max={r.get('commitlog_max_offset', '?')} "
        f"topics={r.get('topics', '?')}" for r in rs) or "no brokers registered")


@click.command()
@click.argument("topic_name")
@click.option("--count", type=int, help="Send COUNT generated messages instead of stdin lines.")
@click.option("--size", default=100, show_default=True, help="Body size of generated messages.")
@click.option("--keys", help="Message keys.")
@click.option("--tags", help="Message tag.")
@namesrv_option
@json_option
@run_async
async def produce(topic_name: str, count: int | None, size: int, keys: str | None,
                  tags: str | None, namesrv: str, as_json: bool) -> None:
    """Send stdin lines (or --count generated bodies) to TOPIC; report each send."""
    producer = AsyncProducer(namesrv)
    window = asyncio.Semaphore(PRODUCE_INFLIGHT)
    failures = 0

    async def send_one(body: bytes) -> None:
        nonlocal failures
        try:
            result = await producer.send(Message(topic_name, body, keys=keys, tags=tags))
            emit({"status": result.status.value, "msg_id": result.msg_id,
                  "broker_name": result.queue.broker_name, "queue_id": result.queue.queue_id,
                  "queue_offset": result.queue_offset}, as_json,
                 lambda o: f"{o['status']} {o['broker_name']}:{o['queue_id']} "
                           f"offset={o['queue_offset']} msg_id={o['msg_id']}")
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
@click.option("--from-beginning", is_flag=True,
              help="Start at the earliest retained message when the group has no offset.")
@click.option("--max", "max_messages", type=int, help="Stop after this many messages.")
@click.option("--timeout", type=float, help="Stop after this many seconds without messages.")
@namesrv_option
@json_option
@run_async
async def consume(topic_name: str, group: str, from_beginning: bool, max_messages: int | None,
                  timeout: float | None, namesrv: str, as_json: bool) -> None:
    """Print messages of TOPIC and commit the group's offsets."""
    consumer = AsyncPullConsumer(group, namesrv)
    state = _ConsumeState(max_messages)
    try:
        queues = await consumer.fetch_message_queues(topic_name)
        offsets = {mq: await _start_offset(consumer, mq, from_beginning) for mq in queues}
        committed = dict(offsets)
        pullers = [asyncio.ensure_future(_pull_queue(consumer, mq, offsets, state, as_json))
                   for mq in queues]
        last_commit = time.monotonic()
        while not state.done.is_set():
            try:
                await asyncio.wait_for(state.done.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
            if timeout is not None and time.monotonic() - state.last_message_at > timeout:
                state.done.set()
            if time.monotonic() - last_commit > CONSUME_COMMIT_INTERVAL_S:
                await _commit(consumer, offsets, committed)
                last_commit = time.monotonic()
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        await _commit(consumer, offsets, committed)
    finally:
        await consumer.close()


class _ConsumeState:
    def __init__(self, max_messages: int | None) -> None:
        self.remaining = max_messages
        self.done = asyncio.Event()
        self.last_message_at = time.monotonic()


async def _start_offset(consumer: AsyncPullConsumer, mq: MessageQueue, from_beginning: bool) -> int:
    committed = await consumer.fetch_offset(mq)
    if committed is not None:
        return committed
    # RocketMQ's CONSUME_FROM_LAST_OFFSET for a new group, CONSUME_FROM_FIRST_OFFSET on request.
    return await (consumer.min_offset(mq) if from_beginning else consumer.max_offset(mq))


async def _pull_queue(consumer: AsyncPullConsumer, mq: MessageQueue, offsets: dict,
                      state: _ConsumeState, as_json: bool) -> None:
    while not state.done.is_set():
        try:
            result = await consumer.pull(mq, offsets[mq], CONSUME_PULL_BATCH, CONSUME_SUSPEND_MS)
        except HamqError as err:
            click.echo(f"pull {mq} failed: {err.message}; retrying", err=True)
            await asyncio.sleep(1.0)
            continue
        if result.status is PullStatus.OFFSET_ILLEGAL:
            offsets[mq] = result.next_begin_offset
            continue
        for msg in result.messages:
            if state.done.is_set():
                return
            _print_message(msg, as_json)
            offsets[mq] = msg.queue_offset + 1
            state.last_message_at = time.monotonic()
            if state.remaining is not None:
                state.remaining -= 1
                if state.remaining <= 0:
                    state.done.set()
        if result.status is PullStatus.FOUND and not result.messages:
            offsets[mq] = result.next_begin_offset


async def _commit(consumer: AsyncPullConsumer, offsets: dict, committed: dict) -> None:
    for mq, offset in offsets.items():
        if committed.get(mq) != offset:
            try:
                await consumer.commit_offset(mq, offset)
                committed[mq] = offset
            except HamqError as err:
                click.echo(f"commit {mq} failed: {err.message}", err=True)


def _print_message(msg: MessageExt, as_json: bool) -> None:
    if not as_json:
        click.echo(msg.body.decode("utf-8", "replace"))
        return
    obj = {"topic": msg.topic, "broker_name": msg.broker_name, "queue_id": msg.queue_id,
           "queue_offset": msg.queue_offset, "msg_id": msg.msg_id, "keys": msg.keys,
           "tags": msg.tags, "store_timestamp_ms": msg.store_timestamp_ms,
           "properties": {k: v for k, v in msg.properties.items() if k not in ("KEYS", "TAGS")}}
    try:
        obj["body"] = msg.body.decode("utf-8")
    except UnicodeDecodeError:
        obj["body_base64"] = base64.b64encode(msg.body).decode()
    emit(obj, True)
