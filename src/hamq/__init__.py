"""hamq: a highly available, replicated message queue.

The synchronous client facade lives here (``hamq.Producer``, ``hamq.PullConsumer``,
``hamq.Admin``); the asyncio core is ``hamq.aio``. The names load on first use, so
importing a sans-IO part (``hamq.raft``, ``hamq.broker.dledger.wire``) does not pull in the
client and its event loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hamq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
    from hamq.client.push import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
    from hamq.client.sync import Admin, Producer, PullConsumer, PushConsumer, SimpleConsumer
    from hamq.client.transaction import TransactionProducer, TransactionSendResult
    from hamq.protocol.transaction import TransactionState

_EXPORTS = {
    "Admin": "hamq.client.sync",
    "ConsumeConcurrentlyStatus": "hamq.client.push",
    "ConsumeOrderlyStatus": "hamq.client.push",
    "Message": "hamq.client.message",
    "MessageExt": "hamq.client.message",
    "MessageQueue": "hamq.client.message",
    "Producer": "hamq.client.sync",
    "PullConsumer": "hamq.client.sync",
    "PushConsumer": "hamq.client.sync",
    "SendResult": "hamq.client.message",
    "SendStatus": "hamq.client.message",
    "SimpleConsumer": "hamq.client.sync",
    "TransactionProducer": "hamq.client.transaction",
    "TransactionSendResult": "hamq.client.transaction",
    "TransactionState": "hamq.protocol.transaction",
}
__all__ = [
    "Admin",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyStatus",
    "Message",
    "MessageExt",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hamq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
