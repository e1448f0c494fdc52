"""hamq: a highly available, replicated message queue.

The synchronous client facade lives here (``hamq.Producer``, ``hamq.PullConsumer``,
``hamq.Admin``); the asyncio core is ``hamq.aio``.
"""
from hamq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from hamq.client.sync import Admin, Producer, PullConsumer

__all__ = [
    "Admin", "Message", "MessageExt", "MessageQueue", "Producer", "PullConsumer",
    "SendResult", "SendStatus",
]
