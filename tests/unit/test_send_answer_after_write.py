"""A send's answer leaves only after the write of its record (R1-A, issue 16): a
controller-mode master alone in its SyncStateSet with all-ack finds every send acked at
once, inside the request's handling. That answer went to the socket before the read's
commit wrote the record, so a kill -9 in between lost an acknowledged send (kill -9 keeps
what reached the page cache, not what waits in the process), and a write that failed
undid a send already answered SEND_OK."""

from __future__ import annotations

import asyncio

from disk_faults import RecordingDisk
from hamq.broker.flow import PublisherFlow
from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.ha.service import HAMaster
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.send import SendProcessor
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.errors import ConnectionLost
from hamq.net.connection import Connection, connect
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame
from hamq.protocol.message import encode_batch, encode_message
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore
from hamq.store.metadata import TopicConfig
from helpers import free_port


class SendsOnly:
    """Serves sends as the broker's processor does: the read's appends are written by
    ``after_batch`` (the store's commit) before the read's answers go out."""

    def __init__(self, send: SendProcessor, store: MessageStore) -> None:
        self.send = send
        self.store = store

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        return self.send.send(conn, frame, batch=False)

    def after_batch(self) -> None:
        self.store.commit()


def test_an_all_ack_master_alone_answers_a_send_only_once_its_write_succeeded(tmp_path):
    """The write of the send fails (disk full): the store undoes it and the connection is
    closed, so the producer sees a lost connection and retries. Before the fix it had been
    told SEND_OK already, for a message the log does not hold."""
    config = BrokerConfig(
        store_dir=str(tmp_path),
        disk_min_free_bytes=1,
        enable_controller_mode=True,
        controller_addr=("127.0.0.1:9",),  # never dialled here
        all_ack_in_sync_state_set=True,
        listen=f"127.0.0.1:{free_port()}",
        ha_listen=f"127.0.0.1:{free_port()}",
    )
    disk = RecordingDisk()
    store = MessageStore(config, disk=disk)
    store.topics.put(TopicConfig("T", 1, 1), 0)
    ha = HAMaster(config, store, MemberGroup(config, ConnectionPool()))
    ha.start_epoch(1, broker_id=0)  # the master alone in its SyncStateSet
    topics = TopicService(
        store,
        RoleState(BrokerRole.MASTER, 0),
        default_queue_nums=1,
        auto_create=False,
        on_change=lambda: None,
    )
    send = SendProcessor(
        store,
        topics,
        FlushService(store),
        ha,
        None,
        on_put=lambda topic, queue_id: None,
        put_held_back=lambda *args: None,  # type: ignore[arg-type,return-value] (no delays sent)
        flow=PublisherFlow(config.max_unconfirmed_bytes),
    )
    payload, crc = encode_batch([encode_message(b"acknowledged")])
    ext = {"topic": "T", "queue_id": 0, "count": 1, "crc": crc}

    async def run() -> None:
        await ha.start()
        server = Server(SendsOnly(send, store))
        addr = f"127.0.0.1:{free_port()}"
        await server.start(addr)
        try:
            conn = await connect(addr)
            answer = await conn.request(RequestCode.SEND_MESSAGE, ext, payload)
            assert answer.code == ResponseCode.SUCCESS  # written: answered
            end = store.commitlog.written_offset
            disk.full = True
            try:
                answer = await conn.request(RequestCode.SEND_MESSAGE, ext, payload)
            except ConnectionLost:
                answer = None
            assert answer is None, "a send whose write failed was answered"
            assert store.commitlog.written_offset == end
            conn.close()
        finally:
            await server.close()
            await ha.stop()

    try:
        asyncio.run(run())
    finally:
        disk.full = False
        store.close()
