"""A send whose message is held back (delay, timer or transaction half message) goes to the
service that keeps it instead of its topic. Like RocketMQ, such messages are never batched,
so exactly one message's properties are decoded here."""

from __future__ import annotations

from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.transaction.service import TransactionalMessageService
from hamq.errors import MessageIllegal
from hamq.protocol.properties import (
    HELD_BACK_PROPERTIES,
    PROPERTY_TRANSACTION_PREPARED,
    SCHEDULE_PROPERTIES,
    decode_single_message,
)
from hamq.store.message_store import PutResult


class HeldBackPut:
    def __init__(
        self, schedule: ScheduleMessageService, transaction: TransactionalMessageService
    ) -> None:
        self.schedule = schedule
        self.transaction = transaction

    def __call__(
        self, topic: str, queue_id: int, payload: bytes, count: int, born_timestamp_ms: int
    ) -> PutResult:
        if count != 1:
            raise MessageIllegal(
                "delay, timer and transaction messages cannot be sent in a "
                "batch (as in RocketMQ); send them one at a time"
            )
        properties, body = decode_single_message(payload)
        if PROPERTY_TRANSACTION_PREPARED in properties:
            return self.transaction.put_half(topic, queue_id, properties, body, born_timestamp_ms)
        if any(name in properties for name in SCHEDULE_PROPERTIES):
            return self.schedule.put_message(topic, queue_id, properties, body, born_timestamp_ms)
        raise MessageIllegal(
            f"message bytes look held back but its properties hold none of {HELD_BACK_PROPERTIES}"
        )
