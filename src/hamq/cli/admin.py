"""``hamq admin``: operator commands (RocketMQ's mqadmin)."""

from __future__ import annotations

import click

from hamq.aio import AsyncAdmin
from hamq.cli.common import emit, json_option, namesrv_option, run_async


@click.group()
def admin() -> None:
    """Operator commands."""


@admin.command("consumer-progress")
@click.option("--group", "-g", required=True, help="Consumer group.")
@namesrv_option
@json_option
@run_async
async def consumer_progress(group: str, namesrv: str, as_json: bool) -> None:
    """Lag per queue of a consumer group."""
    client = AsyncAdmin(namesrv)
    try:
        rows = await client.consumer_progress(group)
    finally:
        await client.close()
    total = sum(r["lag"] for r in rows)
    emit(
        {"group": group, "total_lag": total, "queues": rows},
        as_json,
        lambda o: "\n".join(
            [
                f"{'topic':<24} {'broker':<12} {'queue':>5} {'broker offset':>14} "
                f"{'consumer offset':>16} {'lag':>10}"
            ]
            + [
                f"{r['topic']:<24} {r['broker_name']:<12} {r['queue_id']:>5} "
                f"{r['broker_offset']:>14} {r['consumer_offset']:>16} {r['lag']:>10}"
                for r in o["queues"]
            ]
            + [f"total lag {o['total_lag']}"]
        ),
    )


@admin.command("elect")
@click.option("--group", "-g", "broker_name", required=True, help="Broker group (brokerName).")
@click.option(
    "--member", "-m", "member_id", required=True, type=int, help="DLedger member id to make leader."
)
@namesrv_option
@json_option
@run_async
async def elect(broker_name: str, member_id: int, namesrv: str, as_json: bool) -> None:
    """Transfer a DLedger group's leadership to one member."""
    client = AsyncAdmin(namesrv)
    try:
        address = await client.elect(broker_name, member_id)
    finally:
        await client.close()
    emit(
        {"group": broker_name, "leader": member_id, "address": address},
        as_json,
        lambda o: f"member {o['leader']} ({o['address']}) now leads {o['group']}",
    )
