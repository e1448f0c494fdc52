"""The asyncio client API."""

from hamq.client.admin import AsyncAdmin
from hamq.client.consumer import AsyncPullConsumer, PullResult, PullStatus
from hamq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.client.push import AsyncPushConsumer, ConsumeConcurrentlyStatus, ConsumeOrderlyStatus
from hamq.client.simple import AsyncSimpleConsumer, PopMessageExt
from hamq.client.transaction import AsyncTransactionProducer, TransactionSendResult
from hamq.protocol.transaction import TransactionState

__all__ = [
    "AsyncAdmin",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "AsyncTransactionProducer",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyStatus",
    "Message",
    "MessageExt",
    "MessageQueue",
    "PopMessageExt",
    "PullResult",
    "PullStatus",
    "SendResult",
    "SendStatus",
    "TransactionSendResult",
    "TransactionState",
]
