"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK_BATCH_MQ and
UNLOCK_BATCH_MQ: the requests through which clients tell the broker who they are."""
from __future__ import annotations

from hamq.broker.clients import ClientManager
from hamq.broker.locks import RebalanceLockManager
from hamq.errors import InvalidArgument
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.frame import Frame, pack_body, require, unpack_body
from hamq.store.message_store import MessageStore


class ClientProcessor:
    def __init__(self, store: MessageStore, clients: ClientManager,
                 locks: RebalanceLockManager) -> None:
        self.store = store
        self.clients = clients
        self.locks = locks

    def heart_beat(self, conn: Connection, frame: Frame) -> list | None:
        body = unpack_body(frame.body)
        if not isinstance(body, dict):
            raise InvalidArgument("HEART_BEAT body must be a map")
        self.clients.heart_beat(conn, body, self.store.clock_ms())
        return None if frame.is_oneway else response_pieces(frame)

    def unregister_client(self, conn: Connection, frame: Frame) -> list | None:
        self.clients.unregister(require(frame.ext, "client_id"))
        return None if frame.is_oneway else response_pieces(frame)

    def get_consumer_list_by_group(self, conn: Connection, frame: Frame) -> list:
        ids = self.clients.consumer_ids(require(frame.ext, "group"))
        return response_pieces(frame, body=pack_body(ids))

    def lock_batch_mq(self, conn: Connection, frame: Frame) -> list:
        group, client_id, queues = self._lock_args(frame)
        held = self.locks.try_lock_batch(group, queues, client_id, self.store.clock_ms())
        return response_pieces(frame, body=pack_body([list(k) for k in held]))

    def unlock_batch_mq(self, conn: Connection, frame: Frame) -> list | None:
        group, client_id, queues = self._lock_args(frame)
        self.locks.unlock_batch(group, queues, client_id)
        return None if frame.is_oneway else response_pieces(frame)

    @staticmethod
    def _lock_args(frame: Frame) -> tuple[str, str, list[tuple[str, int]]]:
        body = unpack_body(frame.body)
        if not isinstance(body, list) or not all(
                isinstance(q, list) and len(q) == 2 and isinstance(q[0], str)
                and isinstance(q[1], int) for q in body):
            raise InvalidArgument("lock body must be a list of [topic, queue_id]")
        return require(frame.ext, "group"), require(frame.ext, "client_id"), \
            [(t, q) for t, q in body]
