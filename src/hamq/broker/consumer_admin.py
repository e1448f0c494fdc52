"""INVOKE_BROKER_TO_RESET_OFFSET and GET_ALL_SUBSCRIPTIONGROUP_CONFIG: what an operator
asks a master about consumer groups (RocketMQ's AdminBrokerProcessor.resetOffset and
Broker2Client.resetOffset).

A reset by time sets the group's committed offset of every queue of the topic here to the
first message stored at or after the timestamp (as SEARCH_OFFSET_BY_TIMESTAMP finds it),
moves the group's pop state there (pop consumers read where the broker says, so they need
nothing more), and tells the group's connected clients with a one-way
RESET_CONSUMER_CLIENT_OFFSET: a push consumer drops its in-memory offsets of those queues
and takes the queues again from the new ones, so its next commit does not overwrite the
reset. A client that connects afterwards reads the committed offset anyway.
"""

from __future__ import annotations

from collections.abc import Callable

from hamq.broker.clients import ClientManager
from hamq.broker.topics import TopicService
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body, require, require_int, require_name
from hamq.store.message_store import MessageStore

# (group, topic, {queue_id: offset}): the pop service starts the group's queues there again
PopReset = Callable[[str, str, dict[int, int]], None]


class ConsumerAdmin:
    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        topics: TopicService,
        clients: ClientManager,
        pop_reset: PopReset,
        check_offset_commit: Callable[[], None],
    ) -> None:
        self.broker_name = broker_name  # the notice names it: a client's queues do
        self.store = store
        self.topics = topics
        self.clients = clients
        self.pop_reset = pop_reset
        # a slave whose group has a master refuses, as it refuses a consumer's commit
        self.check_offset_commit = check_offset_commit

    def handlers(self) -> dict:
        return {
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.consumer_groups,
        }

    def reset_offset(self, conn: Connection, frame: Frame) -> list:
        self.check_offset_commit()
        ext = frame.ext
        group, topic = require_name(ext, "group"), require(ext, "topic")
        timestamp_ms = require_int(ext, "timestamp_ms")
        config = self.topics.for_read(topic, 0)
        offsets, now = self.store.offsets, self.store.clock_ms()
        rows, table = [], {}
        for queue_id in range(config.read_queue_nums):
            new = self.store.offset_by_timestamp(topic, queue_id, timestamp_ms)
            old = offsets.query(group, topic, queue_id)
            rows.append({"queue_id": queue_id, "old_offset": old, "new_offset": new})
            table[queue_id] = new
        # first: its revive-log write is the one step a full disk refuses, and then nothing
        # has moved (the offsets reset without a notice were undone by the next commit)
        self.pop_reset(group, topic, table)
        # under a new reset generation: the slaves take the rewind (store/metadata.py)
        offsets.reset(group, topic, table, now)
        body = pack_body(
            {"broker_name": self.broker_name, "group": group, "topic": topic, "offsets": table}
        )
        for channel in self.clients.consumers.get(group, {}).values():
            channel.conn.oneway(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, body=body)
        return response_pieces(frame, body=pack_body(rows))

    def consumer_groups(self, conn: Connection, frame: Frame) -> list:
        """Consumer groups with a client connected now: their members and message model."""
        body = {
            group: {
                "members": sorted(members),
                "message_model": next(iter(members.values())).message_model,
            }
            for group, members in self.clients.consumers.items()
            if members
        }
        return response_pieces(frame, body=pack_body(body))
