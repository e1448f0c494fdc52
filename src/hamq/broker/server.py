"""The broker process: wires store, processors, server and name-server registration."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from hamq.broker.ha import HAMaster, HASlave
from hamq.broker.member_group import MemberGroup
from hamq.broker.processor import BrokerProcessor
from hamq.broker.pull import PullProcessor
from hamq.broker.registration import NamesrvRegistration
from hamq.broker.send import SendProcessor
from hamq.broker.topics import TopicService
from hamq.broker.slave_sync import SlaveSynchronize
from hamq.config import BrokerConfig
from hamq.errors import RequestCodeNotSupported
from hamq.net.connection import Connection
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)


class _NamesrvRequests:
    """Requests a name server sends back on the broker's connection to it."""

    def __init__(self, members: MemberGroup) -> None:
        self.members = members

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE:
            return self.members.handle_notification(conn, frame)
        raise RequestCodeNotSupported(f"broker does not take request code {frame.code} from "
                                      "a name server")

    def after_batch(self) -> None:
        pass


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.started_ms = int(time.time() * 1000)
        self.is_slave = config.broker_role == "slave"
        self.store = MessageStore(config)
        self.flush = FlushService(self.store)
        self.pool = ConnectionPool()
        self.members = MemberGroup(config, self.pool)
        self.pool.handler = _NamesrvRequests(self.members)
        self.registration = NamesrvRegistration(config, self.store.topics, self.pool)
        self.topics = TopicService(self.store, config.default_topic_queue_nums,
                                   config.auto_create_topic_enable,
                                   self.registration.request_register, self.is_slave)
        self.pull = PullProcessor(self.store, self.topics, config.long_polling_max_wait_ms)
        if self.is_slave:
            self.ha_master = None
            self.ha_slave = HASlave(config, self.store, self.members, self._replicated)
            self.slave_sync = SlaveSynchronize(self.store, self.topics, self.members, self.pool,
                                               config.slave_sync_interval_ms)
        else:
            self.ha_master = HAMaster(config, self.store, self.members)
            self.ha_slave = self.slave_sync = None
        send = SendProcessor(self.store, self.topics, self.flush, self.pull.message_arrived,
                             self.ha_master)
        self.processor = BrokerProcessor(
            self.store, self.topics, send, self.pull, self.runtime_info,
            self.ha_master.new_data if self.ha_master else lambda: None)
        self.server = Server(self.processor)

    def _replicated(self, arrived: list[tuple[str, int]]) -> None:
        topics = self.store.topics.topics
        for topic, queue_id in arrived:
            self.pull.message_arrived(topic, queue_id)
            if topic not in topics:
                self.slave_sync.request_sync()  # a new topic: fetch its config now
        self.pull.serve_arrivals()

    def runtime_info(self) -> dict:
        log_ = self.store.commitlog
        return {
            "cluster_name": self.config.cluster_name, "broker_name": self.config.broker_name,
            "broker_id": self.config.broker_id, "broker_role": self.config.broker_role,
            "listen": self.config.listen, "pid": os.getpid(), "started_ms": self.started_ms,
            "commitlog_min_offset": log_.min_offset, "commitlog_max_offset": log_.max_offset,
            "commitlog_flushed_offset": log_.flushed_offset,
            "flush_disk_type": self.config.flush_disk_type,
            "topics": len(self.store.topics.topics), "connections": len(self.server.connections),
            "alive_replicas": self.members.alive_replicas,
            "ha": self.ha_master.status() if self.ha_master else self.ha_slave.status(),
        }

    async def start(self) -> None:
        await self.server.start(self.config.listen)
        if self.ha_master is not None:
            await self.ha_master.start()
        self.flush.start()
        await self.registration.start()
        await self.members.sync_once()
        self.members.start()
        if self.ha_slave is not None:
            await self.slave_sync.sync_once()
            self.slave_sync.start()
            self.ha_slave.start()
        log.info("broker %s/%d listening on %s", self.config.broker_name, self.config.broker_id,
                 self.config.listen)

    async def stop(self) -> None:
        """Clean shutdown: stop serving, flush and checkpoint, deregister."""
        await self.registration.stop()
        await self.members.stop()
        if self.ha_slave is not None:
            await self.ha_slave.stop()
            await self.slave_sync.stop()
        self.pull.close()
        await self.server.close()
        if self.ha_master is not None:
            await self.ha_master.stop()
        await self.flush.stop()
        self.store.close()
        await self.pool.close()


async def serve_broker(config: BrokerConfig, stop: asyncio.Event) -> None:
    broker = Broker(config)
    await broker.start()
    print(json.dumps({"event": "ready", "role": "broker", "listen": config.listen,
                      "broker_name": config.broker_name, "broker_id": config.broker_id,
                      "pid": os.getpid()}), flush=True)
    await stop.wait()
    await broker.stop()
