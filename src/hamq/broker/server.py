"""The broker process: wires store, processors, server and name-server registration."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from hamq.broker.processor import BrokerProcessor
from hamq.broker.pull import PullProcessor
from hamq.broker.registration import NamesrvRegistration
from hamq.broker.send import SendProcessor
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.started_ms = int(time.time() * 1000)
        self.store = MessageStore(config)
        self.flush = FlushService(self.store)
        self.pool = ConnectionPool()
        self.registration = NamesrvRegistration(config, self.store.topics, self.pool)
        self.topics = TopicService(self.store, config.default_topic_queue_nums,
                                   config.auto_create_topic_enable,
                                   self.registration.request_register)
        self.pull = PullProcessor(self.store, self.topics, config.long_polling_max_wait_ms)
        send = SendProcessor(self.store, self.topics, self.flush, self.pull.message_arrived)
        self.processor = BrokerProcessor(self.store, self.topics, send, self.pull,
                                         self.runtime_info)
        self.server = Server(self.processor)

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
        }

    async def start(self) -> None:
        await self.server.start(self.config.listen)
        self.flush.start()
        await self.registration.start()
        log.info("broker %s/%d listening on %s", self.config.broker_name, self.config.broker_id,
                 self.config.listen)

    async def stop(self) -> None:
        """Clean shutdown: stop serving, flush and checkpoint, deregister."""
        await self.registration.stop()
        self.pull.close()
        await self.server.close()
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
