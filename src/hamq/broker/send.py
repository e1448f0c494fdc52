"""SEND_MESSAGE / SEND_BATCH_MESSAGE: validate, append as one record, answer (at once, or
when the group commit of a sync flush covers it)."""
from __future__ import annotations

from hamq.broker.topics import TopicService
from hamq.errors import MessageIllegal
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import ResponseCode
from hamq.protocol.frame import Frame, require
from hamq.protocol.message import offset_msg_id, validate_batch
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore


class SendProcessor:
    def __init__(self, store: MessageStore, topics: TopicService, flush: FlushService,
                 on_put) -> None:
        self.store = store
        self.topics = topics
        self.flush = flush
        self.on_put = on_put  # (topic, queue_id) -> None: wakes held pulls
        self.max_message_bytes = store.config.max_message_size

    def send(self, conn: Connection, frame: Frame, batch: bool) -> list | None:
        ext = frame.ext
        topic = require(ext, "topic")
        queue_id = require(ext, "queue_id", int)
        count = require(ext, "count", int)
        if not batch and count != 1:
            raise MessageIllegal("SEND_MESSAGE carries exactly one message; use "
                                 "SEND_BATCH_MESSAGE for batches")
        self.topics.for_write(topic, queue_id)
        validate_batch(frame.body, count, require(ext, "crc", int), self.max_message_bytes)
        result = self.store.put_batch(topic, queue_id, frame.body, count, ext["crc"],
                                      ext.get("born_ts", 0))
        self.on_put(topic, queue_id)
        if frame.is_oneway:
            return None
        answer = {"msg_id": offset_msg_id(result.physical_offset, 0), "queue_id": queue_id,
                  "queue_offset": result.base_queue_offset}
        if not self.flush.sync:
            return response_pieces(frame, ext=answer)

        def flushed(ok: bool) -> None:
            conn.reply(response_pieces(
                frame, ResponseCode.SUCCESS if ok else ResponseCode.FLUSH_DISK_TIMEOUT,
                ext=answer, remark="" if ok else "flush to disk timed out; message stored"))

        self.flush.wait_flushed(result.end_offset, flushed)
        return None
