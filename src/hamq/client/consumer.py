"""The asyncio pull consumer: pull a queue from an offset, commit and fetch group offsets.

Reads go to the group's master, or to its lowest-id slave while the master is gone
(RocketMQ's slave read), so consumption survives a master failure. A consumer made with
``master_only`` reads the master (or DLedger leader) alone and fails while there is none:
a slave may lag, which a reader deciding from the queue's tail (the Spark sink's journal)
must never see.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from hamq.client.core import ClientCore
from hamq.client.message import MessageExt, MessageQueue
from hamq.errors import QueryNotFound, ServiceNotAvailable
from hamq.policy.definition import DEFAULT_VHOST
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame
from hamq.protocol.message import decode_records
from hamq.protocol.properties import DEFAULT_MAX_RECONSUME_TIMES

_PULL_OK = (
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
)


class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    records: bytes | memoryview = b""  # pull_raw only: the stored records as they came


class AsyncPullConsumer:
    """``core`` lets a push consumer share its connections, routes and vhost. The queues
    it hands out name their topics on the wire (``vhost%topic`` outside ``/``) and are
    given back as they are."""

    def __init__(
        self,
        group: str,
        namesrv: str | Iterable[str] = (),
        timeout_s: float = 3.0,
        core: ClientCore | None = None,
        vhost: str = DEFAULT_VHOST,
        master_only: bool = False,
    ) -> None:
        self.core = core or ClientCore(namesrv, timeout_s, vhost=vhost)
        self.group = self.core.wire(group)
        self.master_only = master_only

    async def start(self) -> None:
        """Nothing to open eagerly; kept so the lifecycle reads like RocketMQ's."""

    async def close(self) -> None:
        await self.core.close()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return sorted((await self.core.route(self.core.wire(topic), refresh=True)).read_queues)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_msgs: int = 32,
        suspend_timeout_ms: int = 0,
        commit_offset: int | None = None,
    ) -> PullResult:
        """Messages of ``mq`` from ``offset``. With ``suspend_timeout_ms`` the broker holds
        the request until messages arrive (long polling)."""
        raw = await self.pull_raw(mq, offset, max_msgs, suspend_timeout_ms, commit_offset)
        if raw.status is PullStatus.FOUND:
            raw.messages = decode_records(raw.records, offset, MessageExt, mq.broker_name)
            if not raw.messages:
                raw.status = PullStatus.NO_NEW_MSG
        raw.records = b""
        return raw

    async def pull_raw(
        self,
        mq: MessageQueue,
        offset: int,
        max_msgs: int = 32,
        suspend_timeout_ms: int = 0,
        commit_offset: int | None = None,
    ) -> PullResult:
        """As ``pull``, but the stored records stay undecoded in ``records`` (the Spark
        source turns them into Arrow columns without a Python object per message)."""
        ext = {
            "topic": mq.topic,
            "queue_id": mq.queue_id,
            "queue_offset": offset,
            "max_msgs": max_msgs,
            "suspend_timeout_ms": suspend_timeout_ms,
            "group": self.group,
        }
        if commit_offset is not None:
            ext["commit_offset"] = commit_offset
        frame = await self._read(
            mq,
            RequestCode.PULL_MESSAGE,
            ext,
            ok=_PULL_OK,
            timeout_s=self.core.timeout_s + suspend_timeout_ms / 1000,
        )
        x = frame.ext
        if frame.code == ResponseCode.SUCCESS:
            return PullResult(
                PullStatus.FOUND,
                x["next_begin_offset"],
                x["min_offset"],
                x["max_offset"],
                records=frame.body,
            )
        status = (
            PullStatus.OFFSET_ILLEGAL
            if frame.code == ResponseCode.PULL_OFFSET_MOVED
            else PullStatus.NO_NEW_MSG
        )
        return PullResult(
            status,
            x.get("next_begin_offset", offset),
            x.get("min_offset", 0),
            x.get("max_offset", 0),
        )

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        await self.core.invoke_group(
            mq.topic,
            mq.broker_name,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"group": self.group, "topic": mq.topic, "queue_id": mq.queue_id, "offset": offset},
        )

    async def send_back(
        self,
        message: MessageExt,
        delay_level: int = 0,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    ) -> None:
        """Hand a message the group failed to process back to its broker group's master:
        it returns through ``%RETRY%<group>`` after ``delay_level`` (0: the broker picks
        3 + reconsume_times), or goes to ``%DLQ%<group>`` once reconsumed
        ``max_reconsume_times`` times (RocketMQ's CONSUMER_SEND_MSG_BACK)."""
        mq = message.queue  # where this copy is stored (``topic`` may be restored)
        master = (await self.core.route(mq.topic)).master_addr(mq.broker_name) or (
            await self.core.route(mq.topic, refresh=True)
        ).master_addr(mq.broker_name)
        if master is None:
            raise ServiceNotAvailable(
                f"broker group {message.broker_name} has no master to take the message back"
            )
        await self.core.invoke(
            master,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "group": self.group,
                "topic": mq.topic,
                "queue_id": message.queue_id,
                "queue_offset": message.queue_offset,
                "delay_level": delay_level,
                "max_reconsume_times": max_reconsume_times,
            },
        )

    async def fetch_offset(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq``, or None if it never committed one."""
        try:
            frame = await self.core.invoke_group(
                mq.topic,
                mq.broker_name,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"group": self.group, "topic": mq.topic, "queue_id": mq.queue_id},
            )
        except QueryNotFound:
            return None
        return frame.ext["offset"]

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._queue_query(mq, RequestCode.GET_MAX_OFFSET)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._queue_query(mq, RequestCode.GET_MIN_OFFSET)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._queue_query(
            mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp_ms=timestamp_ms
        )

    async def earliest_msg_store_time_ms(self, mq: MessageQueue) -> int:
        frame = await self.core.invoke_group(
            mq.topic,
            mq.broker_name,
            RequestCode.GET_EARLIEST_MSG_STORETIME,
            {"topic": mq.topic, "queue_id": mq.queue_id},
        )
        return frame.ext["timestamp_ms"]

    async def _queue_query(self, mq: MessageQueue, code: int, **extra: int) -> int:
        frame = await self._read(mq, code, {"topic": mq.topic, "queue_id": mq.queue_id, **extra})
        return frame.ext["offset"]

    async def _read(
        self,
        mq: MessageQueue,
        code: int,
        ext: dict,
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
        timeout_s: float | None = None,
    ) -> Frame:
        if not self.master_only:
            return await self.core.invoke_group(
                mq.topic, mq.broker_name, code, ext, ok=ok, timeout_s=timeout_s
            )
        master = (await self.core.route(mq.topic)).master_addr(mq.broker_name)
        if master is None:
            raise ServiceNotAvailable(f"broker group {mq.broker_name} has no master to read from")
        return await self.core.invoke(master, code, ext, ok=ok, timeout_s=timeout_s)
