"""``hamq admin query-msg-by-id``, ``query-msg-by-key`` and ``reset-offset``: mqadmin's
queryMsgById, queryMsgByKey and resetOffsetByTime, over the same ``AsyncAdmin`` calls the
web API makes."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any

import click

from hamq.aio import AsyncAdmin
from hamq.cli.common import emit, json_option, namesrv_option, run_async
from hamq.clock import wall_ms
from hamq.manage.messages import message_json

topic_option = click.option("--topic", "-t", required=True, help="Topic.")


async def _ask(namesrv: str, call: Callable[[AsyncAdmin], Awaitable[Any]]) -> Any:
    client = AsyncAdmin(namesrv)
    try:
        return await call(client)
    finally:
        await client.close()


def _messages_text(report: dict) -> str:
    blocks = [
        "\n".join(
            [
                f"msg id {m['msg_id']}  {m['broker_name']}:{m['queue_id']} "
                f"offset {m['queue_offset']}",
                f"  topic {m['topic']}  tags {m['tags']}  keys {m['keys']}",
                f"  stored {_iso(m['store_timestamp'])}  born {_iso(m['born_timestamp'])}"
                f"  reconsumed {m['reconsume_times']}",
                f"  body ({m['body_encoding']}) {m['body'][:200]}",
            ]
        )
        for m in report["messages"]
    ]
    if not blocks:
        blocks = ["no message found"]
    if report.get("truncated"):
        blocks.append("(the scan stopped at --max-scan before the queues' start)")
    return "\n".join(blocks)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds"
    )


@click.command("query-msg-by-id")
@topic_option
@click.option("--id", "-i", "msg_id", required=True, help="Message id (offsetMsgId).")
@namesrv_option
@json_option
@run_async
async def query_msg_by_id(topic: str, msg_id: str, namesrv: str, as_json: bool) -> None:
    """The message a msg id names, from every broker group of the topic that holds it."""
    found = await _ask(namesrv, lambda admin: admin.view_message(topic, msg_id))
    emit({"messages": [message_json(m) for m in found]}, as_json, _messages_text)


@click.command("query-msg-by-key")
@topic_option
@click.option("--key", "-k", required=True, help="A key of the message (KEYS) or its UNIQ_KEY.")
@click.option(
    "--max-scan",
    type=int,
    default=10_000,
    show_default=True,
    help="Messages each queue is scanned back at most (there is no key index).",
)
@namesrv_option
@json_option
@run_async
async def query_msg_by_key(
    topic: str, key: str, max_scan: int, namesrv: str, as_json: bool
) -> None:
    """Messages of a topic with a key, newest first."""
    found, truncated = await _ask(
        namesrv, lambda admin: admin.query_messages_by_key(topic, key, max_scan)
    )
    report = {"messages": [message_json(m) for m in found], "truncated": truncated}
    emit(report, as_json, _messages_text)


def _timestamp_ms(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """Epoch milliseconds, ``now``, or an ISO 8601 time (UTC unless it names a zone)."""
    if value == "now":
        return wall_ms()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not epoch milliseconds, 'now' or an ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


@click.command("reset-offset")
@click.option("--group", "-g", required=True, help="Consumer group.")
@topic_option
@click.option(
    "--timestamp",
    "-s",
    "timestamp_ms",
    required=True,
    callback=_timestamp_ms,
    help="Where to go: epoch milliseconds, 'now', or an ISO 8601 time (UTC by default).",
)
@namesrv_option
@json_option
@run_async
async def reset_offset(
    group: str, topic: str, timestamp_ms: int, namesrv: str, as_json: bool
) -> None:
    """Move a group's offsets of a topic to the first message stored at or after a time;
    its running consumers continue from there."""
    rows = await _ask(namesrv, lambda admin: admin.reset_offset(group, topic, timestamp_ms))
    emit(
        {"group": group, "topic": topic, "timestamp_ms": timestamp_ms, "queues": rows},
        as_json,
        lambda o: "\n".join(
            [f"{'broker':<12} {'queue':>5} {'old offset':>12} {'new offset':>12}"]
            + [
                f"{r['broker_name']:<12} {r['queue_id']:>5} {r['old_offset']!s:>12} "
                f"{r['new_offset']:>12}"
                for r in o["queues"]
            ]
        ),
    )


MESSAGE_COMMANDS = (query_msg_by_id, query_msg_by_key, reset_offset)
