"""RocketMQ's TransactionalMessageCheckService: every ``transaction_check_interval_ms`` the
master asks a live producer of the group (CHECK_TRANSACTION_STATE, oneway, over the
connection the producer's HEART_BEAT came on) about each half message older than
``transaction_timeout_ms`` (or than its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) that is still
undecided; the producer answers with END_TRANSACTION. After ``transaction_check_max``
checks the half message is rolled back.

Check counts are kept in memory: after a restart counting starts again, which only means
more checks (RocketMQ keeps them by re-storing the half message).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from hamq.broker.clients import ClientManager
from hamq.broker.transaction import TransactionalMessageService
from hamq.errors import HamqError
from hamq.net.tasks import cancel_all
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import encode_message, encode_properties
from hamq.protocol.properties import (PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
                                      PROPERTY_PRODUCER_GROUP, PROPERTY_REAL_QUEUE_ID,
                                      PROPERTY_REAL_TOPIC)
from hamq.protocol.transaction import TransactionState

log = logging.getLogger(__name__)

# Half messages looked at per round, so one round never stalls the event loop for long.
MAX_CHECKS_PER_ROUND = 2048


class TransactionalMessageCheckService:
    def __init__(self, transactions: TransactionalMessageService, clients: ClientManager,
                 after_put: Callable[[], None], interval_ms: int, timeout_ms: int,
                 check_max: int) -> None:
        self.transactions = transactions
        self.clients = clients
        self.after_put = after_put  # writes the log and ships it, as after a request
        self.interval_s = interval_ms / 1000
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self._checks: dict[int, int] = {}  # half offset -> checks sent
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        await cancel_all([self._task])

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except HamqError as err:
                log.error("transaction check failed: %s", err.message)

    def check(self) -> None:
        store = self.transactions.store
        now = store.clock_ms()
        rolled_back = False
        for offset in itertools.islice(self.transactions.undecided(), MAX_CHECKS_PER_ROUND):
            msg = self.transactions.half_message(offset)
            age_ms = now - msg.store_timestamp_ms
            if age_ms < self.timeout_ms:
                break  # half messages are in store order: the rest are younger
            if age_ms < _immunity_ms(msg.properties):
                continue
            checks = self._checks.pop(offset, 0)
            if checks >= self.check_max:
                log.info("half message %d undecided after %d checks: rolled back", offset, checks)
                self.transactions.decide(msg, TransactionState.ROLLBACK_MESSAGE)
                rolled_back = True
                continue
            self._checks[offset] = checks + 1
            properties = dict(msg.properties)
            topic = properties.pop(PROPERTY_REAL_TOPIC)
            properties.pop(PROPERTY_REAL_QUEUE_ID)
            group = properties[PROPERTY_PRODUCER_GROUP]
            channels = self.clients.producer_channels(group)
            if not channels:
                log.debug("no live producer of group %s to check half message %d", group, offset)
                continue
            channel = channels[checks % len(channels)]
            channel.conn.oneway(RequestCode.CHECK_TRANSACTION_STATE,
                                {"group": group, "topic": topic, "tran_state_table_offset": offset,
                                 "msg_id": msg.msg_id},
                                encode_message(msg.body, encode_properties(properties)))
        if rolled_back:
            self.after_put()


def _immunity_ms(properties: dict[str, str]) -> int:
    try:
        return int(properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, 0)) * 1000
    except ValueError:
        return 0  # a producer's typo must not keep the half message forever
