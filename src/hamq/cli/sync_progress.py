"""``sync-queue --wait``: follow a started sync until the mirrors it restarted are
synchronised, as RabbitMQ's ``rabbitmqctl sync_queue`` blocks until they are; the master's
GET_MIRROR_STATUS gives each syncing mirror's share of the history it has copied, which is
what the progress bar shows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hamq.client.admin import AsyncControllerAdmin
from hamq.clock import monotonic_s
from hamq.errors import HamqError
from hamq.manage.queues import SYNC_TIMEOUT_S, node_request
from hamq.protocol.codes import RequestCode

POLL_S = 0.2  # between two GET_MIRROR_STATUS: the bar's resolution
PERCENT = 100  # the bar's total


async def wait_synchronised(
    controllers: AsyncControllerAdmin,
    group: str,
    members: list[int],
    timeout_s: float,
    advance: Callable[[int], None],
) -> None:
    """Returns once every broker id in ``members`` of ``group`` is synchronised; raises if
    that takes longer than ``timeout_s``. ``advance`` moves a bar of ``PERCENT`` by the
    least progress among them."""
    master = (await controllers.sync_state(group))["master_addr"]
    deadline = monotonic_s() + timeout_s
    shown = 0
    while True:
        status = await node_request(master, RequestCode.GET_MIRROR_STATUS, {}, SYNC_TIMEOUT_S)
        mirrors = [m for m in status["members"] if m["broker_id"] in members]
        if all(m["synchronised"] for m in mirrors):
            advance(PERCENT - shown)
            return
        least = int(PERCENT * min(m["sync_progress"] for m in mirrors))
        if least > shown:
            advance(least - shown)
            shown = least
        if monotonic_s() > deadline:
            waiting = sorted(m["broker_id"] for m in mirrors if not m["synchronised"])
            raise HamqError(f"mirrors {waiting} of {group} not synchronised after {timeout_s} s")
        await asyncio.sleep(POLL_S)
