"""The asyncio client API."""
from hamq.client.admin import AsyncAdmin
from hamq.client.consumer import AsyncPullConsumer, PullResult, PullStatus
from hamq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from hamq.client.producer import AsyncProducer

__all__ = ["AsyncAdmin", "AsyncProducer", "AsyncPullConsumer", "Message", "MessageExt",
           "MessageQueue", "PullResult", "PullStatus", "SendResult", "SendStatus"]
