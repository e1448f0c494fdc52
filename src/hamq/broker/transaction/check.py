"""RocketMQ's TransactionalMessageCheckService: every ``transaction_check_interval_ms`` the
master asks a live producer of the group (CHECK_TRANSACTION_STATE, oneway, over the
connection the producer's HEART_BEAT came on) about each half message older than
``transaction_timeout_ms`` (or than its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) that is still
undecided; the producer answers with END_TRANSACTION. After ``transaction_check_max``
checks the half message is rolled back.

Departure: only checks actually sent count. RocketMQ counts a round even when no producer
of the group is connected, so a producer that restarts (or is down longer than
``transaction_check_max`` rounds) finds a transaction it committed rolled back. Here a
half message of a group with no live producer waits until one heartbeats (or until
retention removes it). A round looks at ``MAX_CHECKS_PER_ROUND`` half messages and the
next one continues after them, so many waiting halves never starve the younger ones.

A half whose ``CHECK_IMMUNITY_TIME_IN_SECONDS`` has not passed is not looked at: its due
time is noted when it is put (``TransactionalMessageService.check_due_ms``; after a start,
when a round first reads it) and rounds pass over it without reading it or counting it
against ``MAX_CHECKS_PER_ROUND``. RocketMQ re-puts such a half at the end of the half queue
instead. The Spark sink keeps thousands of 1 MiB halves immune for an hour: read and
counted every round they took whole rounds, and an ordinary producer's half behind them
was checked only once the rounds had cycled through them all.

On an acting master (seed 004) the same checks run over the replicated half messages;
the decisions they lead to are taken as ``TransactionalMessageService`` takes an acting
master's (escaped, kept as metadata).

Check counts are kept in memory: after a restart counting starts again, which only means
more checks (RocketMQ keeps them by re-storing the half message).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hamq.broker.clients import ClientManager
from hamq.broker.stored_message import StoredMessage
from hamq.broker.transaction.service import TransactionalMessageService, check_immunity_ms
from hamq.config import BrokerConfig
from hamq.errors import HamqError, MessageIllegal
from hamq.net.counts import COUNTS
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import encode_message, encode_properties
from hamq.protocol.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
)

log = logging.getLogger(__name__)

# Half messages looked at per round, so one round never stalls the event loop for long.
MAX_CHECKS_PER_ROUND = 2048
# What reading a half message's properties raises when they are not a map of strings with
# the group and real queue (msgpack's errors are ValueErrors).
_UNPARSABLE = (KeyError, TypeError, ValueError, AttributeError, MessageIllegal)


class TransactionalMessageCheckService:
    def __init__(
        self,
        transactions: TransactionalMessageService,
        clients: ClientManager,
        config: BrokerConfig,
        *,
        after_put: Callable[[], None],
    ) -> None:
        self.transactions = transactions
        self.clients = clients
        self.after_put = after_put  # writes the log and ships it, as after a request
        self.timeout_ms = config.transaction_timeout_ms
        self.check_max = config.transaction_check_max
        self._checks: dict[int, int] = {}  # half offset -> checks sent
        self._resume_at = 0  # the half offset the next round starts at
        self._unreadable: set[int] = set()  # half offsets skipped: see check()
        self._rounds = PeriodicTask(
            "transaction check",
            config.transaction_check_interval_ms / 1000,
            self.check,
            (HamqError, OSError),
        )

    def start(self) -> None:
        """Master only: read the decisions back (a member that was a slave has the op log
        its master wrote meanwhile), then check every interval. Check counts start afresh:
        they are kept by half-queue offset, and a member that was a slave may have cut the
        halves it counted for and taken others at those offsets (a half's count is this
        master's alone, as after a restart)."""
        self._checks.clear()
        self._unreadable.clear()
        self._resume_at = 0
        self.transactions.start()
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()
        self.transactions.stop_deciding()

    def check(self) -> None:
        if self.transactions.role.master_lease_lapsed():
            return  # a slave may be acting (broker/registration.py): it checks, not us
        store = self.transactions.store
        now = store.clock_ms()
        for offset in [o for o in self._checks if self.transactions.is_decided(o)]:
            del self._checks[offset]  # decided by END_TRANSACTION since its last check
        rolled_back = False
        resume_at = 0  # the next round starts from the oldest again, unless cut short
        due_ms = self.transactions.check_due_ms
        looked = 0
        for offset in self.transactions.undecided(self._resume_at):
            if offset in self._unreadable or due_ms.get(offset, 0) > now:
                continue
            if looked == MAX_CHECKS_PER_ROUND:
                resume_at = offset
                break
            looked += 1
            try:
                msg = self.transactions.half_message(offset)
                age_ms = now - msg.store_timestamp_ms
                if age_ms < self.timeout_ms:
                    break  # half messages are in store order: the rest are younger
                rolled_back |= self._check_one(msg, age_ms)
            except _UNPARSABLE as err:
                # Stored before sends checked properties: no producer can be asked about it
                # (that needs its group and real queue); it is left for END_TRANSACTION or
                # retention instead of stopping every later check.
                log.error(
                    "half message %d has properties that cannot be read (%r); it is not checked",
                    offset,
                    err,
                )
                COUNTS.records_skipped += 1
                self._unreadable.add(offset)
        self._resume_at = resume_at
        if rolled_back:
            self.after_put()

    def _check_one(self, msg: StoredMessage, age_ms: int) -> bool:
        """Ask a producer about one half message old enough to be checked, or roll it back
        after ``check_max`` checks; True if it was rolled back."""
        offset = msg.queue_offset
        immunity_ms = check_immunity_ms(msg.properties)
        if age_ms < immunity_ms:  # not read again until then
            self.transactions.check_due_ms[offset] = msg.store_timestamp_ms + immunity_ms
            return False
        properties = dict(msg.properties)
        group = properties[PROPERTY_PRODUCER_GROUP]
        channels = self.clients.producer_channels(group)
        if not channels:
            log.debug("no live producer of group %s to check half message %d", group, offset)
            return False  # not a check: the transaction waits for its producer
        checks = self._checks.get(offset, 0)
        if checks >= self.check_max:
            log.info("half message %d undecided after %d checks: rolled back", offset, checks)
            self._checks.pop(offset, None)
            return self.transactions.roll_back(msg)
        self._checks[offset] = checks + 1
        topic = properties.pop(PROPERTY_REAL_TOPIC)
        properties.pop(PROPERTY_REAL_QUEUE_ID)
        channel = channels[checks % len(channels)]
        channel.conn.oneway(
            RequestCode.CHECK_TRANSACTION_STATE,
            {
                "group": group,
                "topic": topic,
                "tran_state_table_offset": offset,
                "msg_id": msg.msg_id,
            },
            encode_message(msg.body, encode_properties(properties)),
        )
        return False
