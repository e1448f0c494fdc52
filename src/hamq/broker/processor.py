"""The broker's request dispatch: one table from request code to a small processor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from hamq.broker.client_processor import ClientProcessor
from hamq.broker.pull import PullProcessor
from hamq.broker.send import SendProcessor
from hamq.broker.topics import TopicService, client_topic, topic_args
from hamq.errors import QueryNotFound, RequestCodeNotSupported
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body, require, require_int, require_name
from hamq.protocol.limits import MAX_QUEUE_NUMS
from hamq.store.message_store import MessageStore

Handler = Callable[[Connection, Frame], "list | None"]


class BrokerProcessor:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        send: SendProcessor,
        pull: PullProcessor,
        clients: ClientProcessor,
        *,
        runtime_info: Callable[[], dict],
        on_written: Callable[[], None],
    ) -> None:
        self.store = store
        self.on_written = on_written  # ships new log bytes to slaves
        self.topics = topics
        self.pull = pull
        self.runtime_info = runtime_info
        # raises to refuse an offset commit (a slave whose group has a master, seed 004:
        # ``ActingMasterWatch.check_offset_commit``)
        self.check_offset_commit: Callable[[], None] = lambda: None
        self._after_write: list[Callable[[], None]] = []
        self._handlers: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: lambda c, f: send.send(c, f, batch=False),
            RequestCode.SEND_BATCH_MESSAGE: lambda c, f: send.send(c, f, batch=True),
            RequestCode.PULL_MESSAGE: pull.pull,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self._get_max_offset,
            RequestCode.GET_MIN_OFFSET: self._get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self._get_earliest_msg_storetime,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self._delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._get_all_consumer_offset,
            RequestCode.GET_BROKER_RUNTIME_INFO: self._get_runtime_info,
            RequestCode.HEART_BEAT: clients.heart_beat,
            RequestCode.UNREGISTER_CLIENT: clients.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: clients.get_consumer_list_by_group,
            RequestCode.LOCK_BATCH_MQ: clients.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: clients.unlock_batch_mq,
        }

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        handler = self._handlers.get(frame.code)
        if handler is None:
            raise RequestCodeNotSupported(f"broker does not serve request code {frame.code}")
        return handler(conn, frame)

    def register(
        self, handlers: dict[int, Handler], after_write: Callable[[], None] | None = None
    ) -> None:
        """Add a request family served by its own module (pop); ``after_write`` runs
        after each read's commit-log write, like the pull's long-polling wake-up."""
        self._handlers.update(handlers)
        if after_write is not None:
            self._after_write.append(after_write)

    def after_batch(self) -> None:
        self.store.commit()
        self.on_written()
        self.pull.serve_arrivals()
        for hook in self._after_write:
            hook()

    # -- offsets ------------------------------------------------------------------------
    def _queue_args(self, frame: Frame) -> tuple[str, int]:
        topic = require(frame.ext, "topic")
        queue_id = require_int(frame.ext, "queue_id", 0, MAX_QUEUE_NUMS - 1)
        self.topics.for_read(topic, queue_id)
        return topic, queue_id

    def _query_consumer_offset(self, conn: Connection, frame: Frame) -> list:
        topic, queue_id = self._queue_args(frame)
        group = require_name(frame.ext, "group")
        offset = self.store.offsets.query(group, topic, queue_id)
        if offset is None:
            raise QueryNotFound(f"group {group!r} has no committed offset for {topic}:{queue_id}")
        return response_pieces(frame, ext={"offset": offset})

    def _update_consumer_offset(self, conn: Connection, frame: Frame) -> list | None:
        self.check_offset_commit()
        topic, queue_id = self._queue_args(frame)
        offset = require_int(frame.ext, "offset")
        self.store.offsets.commit(
            require_name(frame.ext, "group"), topic, queue_id, offset, self.store.clock_ms()
        )
        return None if frame.is_oneway else response_pieces(frame)

    def _get_max_offset(self, conn: Connection, frame: Frame) -> list:
        """What readers may reach (RocketMQ's getMaxOffsetInQueue(committed)): a consumer
        starting from the end, or committing it, never stands past a record that a
        failover or a power loss may still take, where later sends would be skipped."""
        return response_pieces(
            frame, ext={"offset": self.store.readable_max_offset(*self._queue_args(frame))}
        )

    def _get_min_offset(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(
            frame, ext={"offset": self.store.min_offset(*self._queue_args(frame))}
        )

    def _search_offset_by_timestamp(self, conn: Connection, frame: Frame) -> list:
        topic, queue_id = self._queue_args(frame)
        offset = self.store.offset_by_timestamp(
            topic, queue_id, require_int(frame.ext, "timestamp_ms")
        )
        return response_pieces(frame, ext={"offset": offset})

    def _get_earliest_msg_storetime(self, conn: Connection, frame: Frame) -> list:
        ts = self.store.earliest_store_time_ms(*self._queue_args(frame))
        return response_pieces(frame, ext={"timestamp_ms": ts})

    # -- topics -------------------------------------------------------------------------
    def _update_and_create_topic(self, conn: Connection, frame: Frame) -> list:
        ext = frame.ext
        config = self.topics.create(*topic_args(ext, self.topics.default_queue_nums))
        return response_pieces(
            frame,
            ext={
                "read_queue_nums": config.read_queue_nums,
                "write_queue_nums": config.write_queue_nums,
            },
        )

    def _delete_topic(self, conn: Connection, frame: Frame) -> list:
        self.topics.delete(client_topic(frame.ext.get("topic")))
        return response_pieces(frame)

    def _get_all_topic_config(self, conn: Connection, frame: Frame) -> list:
        body = {
            name: {
                "read_queue_nums": t.read_queue_nums,
                "write_queue_nums": t.write_queue_nums,
                "perm": t.perm,
            }
            for name, t in self.store.topics.topics.items()
        }
        return response_pieces(frame, body=pack_body(body))

    def _get_all_consumer_offset(self, conn: Connection, frame: Frame) -> list:
        """The offset table; its DataVersion in ``ext`` (pre-online and slave sync compare it)
        with the groups' reset generations (they let a reset move the others' offsets back)."""
        offsets = self.store.offsets
        return response_pieces(
            frame,
            ext={
                "data_version": asdict(offsets.data_version),
                "reset_generations": offsets.reset_generations(),
            },
            body=pack_body(offsets.table()),
        )

    def _get_runtime_info(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.runtime_info()))
