"""hamq: a highly available, replicated message queue.

The synchronous client facade lives here (``hamq.Producer``, ``hamq.PullConsumer``,
``hamq.Admin``); the asyncio core is ``hamq.aio``.
"""

from hamq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from hamq.client.push import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
from hamq.client.sync import Admin, Producer, PullConsumer, PushConsumer, SimpleConsumer
from hamq.client.transaction import TransactionProducer, TransactionSendResult
from hamq.protocol.transaction import TransactionState

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
