"""Consumer groups as an operator sees them: the clients in a group and, per queue it has
committed on, the broker's max offset, the group's offset and the lag between them
(RocketMQ's ``consumerProgress`` and ``consumerConnection`` in one answer)."""

from __future__ import annotations

import asyncio
from typing import Any

from hamq.client.admin import AsyncAdmin


async def consumer_group(admin: AsyncAdmin, group: str) -> dict[str, Any]:
    """``{group, members, total_lag, queues}``: ``members`` the client ids of its live
    consumers, ``queues`` each ``{topic, broker_name, queue_id, broker_offset,
    consumer_offset, lag}``. A group nobody consumes in and nobody committed for has
    neither."""
    members, queues = await asyncio.gather(
        admin.consumer_members(group), admin.consumer_progress(group)
    )
    return {
        "group": group,
        "members": sorted(members),
        "total_lag": sum(q["lag"] for q in queues),
        "queues": queues,
    }
