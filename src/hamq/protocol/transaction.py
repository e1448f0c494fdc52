"""The outcome of a local transaction, as sent in END_TRANSACTION."""

from __future__ import annotations

from enum import Enum


class TransactionState(Enum):
    """RocketMQ's LocalTransactionState, spelling included."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
