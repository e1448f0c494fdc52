"""The broker process: wires store, processors, server and name-server registration."""
from __future__ import annotations

import asyncio
import json
import logging
import os
from wsgiref.simple_server import WSGIServer

from hamq.broker.client_processor import ClientProcessor
from hamq.broker.clients import ClientManager
from hamq.broker.dledger.driver import DLedgerCommitLog
from hamq.broker.ha.service import HAMaster, HASlave
from hamq.broker.held_back import HeldBackPut
from hamq.broker.locks import RebalanceLockManager
from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.processor import BrokerProcessor
from hamq.broker.pop.service import PopService
from hamq.broker.pull import PullProcessor
from hamq.broker.registration import NamesrvRegistration
from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.send import SendProcessor
from hamq.broker.send_back import ConsumerSendMsgBackProcessor
from hamq.broker.topics import TopicService
from hamq.broker.ha.slave_sync import SlaveSynchronize
from hamq.broker.transaction.service import TransactionalMessageService
from hamq.broker.transaction.check import TransactionalMessageCheckService
from hamq.clock import monotonic_ms, wall_ms
from hamq.config import BrokerConfig
from hamq.errors import RequestCodeNotSupported
from hamq.net.connection import Connection
from hamq.net.metrics import gauge, serve_metrics
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

CLIENT_SCAN_INTERVAL_S = 10.0  # RocketMQ ClientHousekeepingService period


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
        self.started_ms = wall_ms()
        self.dledger_mode = config.replication_mode == "dledger"
        # A DLedger member starts as a follower; it takes writes only once elected.
        self.is_slave = config.broker_role == "slave" or self.dledger_mode
        self.store = MessageStore(config)
        self.flush = FlushService(self.store)
        self.pool = ConnectionPool()
        self.members = MemberGroup(config, self.pool)
        self.pool.handler = _NamesrvRequests(self.members)
        self.registration = NamesrvRegistration(config, self.store.topics, self.pool)
        if self.dledger_mode:
            self.registration.broker_id = config.dledger_self_id
        self.topics = TopicService(self.store, config.default_topic_queue_nums,
                                   config.auto_create_topic_enable,
                                   self.registration.request_register, self.is_slave)
        self.pull = PullProcessor(self.store, self.topics, config.long_polling_max_wait_ms)
        self.schedule = ScheduleMessageService(self.store, self.flush, self.pull.message_arrived,
                                               lambda: self.processor.after_batch(),
                                               config.flush_delay_offset_interval_ms)
        self.transactions = TransactionalMessageService(self.store, self.flush,
                                                        self.pull.message_arrived,
                                                        self.is_slave)
        self.dledger = DLedgerCommitLog(config, self.store, self.topics, self._replicated,
                                        self._on_role_change) if self.dledger_mode else None
        if self.is_slave:
            self.ha_master = None
            self.ha_slave = None if self.dledger_mode else \
                HASlave(config, self.store, self.members, self._replicated)
            self.slave_sync = SlaveSynchronize(self.store, self.topics, self.members, self.pool,
                                               config.slave_sync_interval_ms,
                                               self.schedule.progress,
                                               # DLedger: topics come only from the log
                                               sync_topics=not self.dledger_mode)
        else:
            self.ha_master = HAMaster(config, self.store, self.members)
            self.ha_slave = self.slave_sync = None
        send = SendProcessor(self.store, self.topics, self.flush, self.pull.message_arrived,
                             self.ha_master, HeldBackPut(self.schedule, self.transactions),
                             self.dledger)
        self.clients = ClientManager()
        self.locks = RebalanceLockManager(config.rebalance_lock_max_live_time_ms)
        self.processor = BrokerProcessor(
            self.store, self.topics, send, self.pull,
            ClientProcessor(self.store, self.topics, self.clients, self.locks), self.runtime_info,
            self.ha_master.new_data if self.ha_master else lambda: None)
        send_back = ConsumerSendMsgBackProcessor(self.store, self.topics, self.schedule,
                                                 self.flush, self.pull.message_arrived)
        self.processor.register({
            RequestCode.CONSUMER_SEND_MSG_BACK: send_back.send_back,
            RequestCode.GET_ALL_DELAY_OFFSET: self.schedule.get_all_delay_offset,
            RequestCode.END_TRANSACTION: self.transactions.end_transaction,
        })
        self.transaction_check = TransactionalMessageCheckService(
            self.transactions, self.clients, self.processor.after_batch,
            config.transaction_check_interval_ms, config.transaction_timeout_ms,
            config.transaction_check_max)
        self.pop = PopService(self.store, self.topics, self.flush, config.broker_name,
                              config.long_polling_max_wait_ms,
                              config.pop_inflight_message_threshold, config.revive_interval_ms,
                              self.is_slave,
                              self.ha_master.new_data if self.ha_master else lambda: None,
                              self.pull.message_arrived, config.max_held_pops_per_connection,
                              config.max_held_pops_per_queue)
        self.processor.register(self.pop.handlers())
        self.pull.watch_arrivals(self.pop.held, self.pop.serve_arrivals)
        self.topics.on_delete.append(self.pop.forget_topic)
        if self.dledger is not None:
            self.processor.register({
                RequestCode.DLEDGER_TRANSFER_LEADERSHIP: self.dledger.handle_transfer,
                RequestCode.UPDATE_AND_CREATE_TOPIC: self.dledger.create_topic,
                RequestCode.DELETE_TOPIC_IN_BROKER: self.dledger.delete_topic,
                **{code: _not_in_dledger for code in DLEDGER_UNSUPPORTED}})
        self.server = Server(self.processor, config)
        self.server.on_connection_closed.append(self.clients.connection_closed)
        self._housekeeping: asyncio.Task | None = None
        self.metrics: WSGIServer | None = None

    def _replicated(self, arrived: list[tuple[str, int]]) -> None:
        topics = self.store.topics.topics
        for topic, queue_id in arrived:
            self.pull.message_arrived(topic, queue_id)
            if topic not in topics and self.is_slave and not self.dledger_mode:
                self.slave_sync.request_sync()  # a new topic: fetch its config now
        self.pull.serve_arrivals()

    def _on_role_change(self, leader: bool) -> None:
        """DLedger: the leader registers as the group's master (brokerId 0), so producers
        and consumers follow it within one route refresh."""
        self.is_slave = self.topics.is_slave = not leader
        self.registration.broker_id = 0 if leader else self.config.dledger_self_id
        self.registration.request_register()

    def runtime_info(self) -> dict:
        log_ = self.store.commitlog
        return {
            "cluster_name": self.config.cluster_name, "broker_name": self.config.broker_name,
            "broker_id": self.registration.broker_id,
            "broker_role": ("leader" if self.dledger.is_leader else "follower")
            if self.dledger else self.config.broker_role,
            "listen": self.config.listen, "pid": os.getpid(), "started_ms": self.started_ms,
            "commitlog_min_offset": log_.min_offset, "commitlog_max_offset": log_.max_offset,
            "commitlog_flushed_offset": log_.flushed_offset,
            "flush_disk_type": self.config.flush_disk_type,
            "topics": len(self.store.topics.topics), "connections": len(self.server.connections),
            "alive_replicas": self.members.alive_replicas,
            "ha": self.dledger.status() if self.dledger else
            self.ha_master.status() if self.ha_master else self.ha_slave.status(),
        }

    async def start(self) -> None:
        await self.server.start(self.config.listen)
        self.metrics = serve_metrics(self.config.metrics_listen)
        if self.metrics is not None:
            log_ = self.store.commitlog
            gauge("hamq_commitlog_max_offset", "Commit log end (bytes)", lambda: log_.max_offset)
            gauge("hamq_commitlog_flushed_offset", "Commit log fsynced up to (bytes)",
                  lambda: log_.flushed_offset)
            gauge("hamq_connections", "Open client connections",
                  lambda: len(self.server.connections))
            gauge("hamq_alive_replicas", "Members of this group the name server holds alive",
                  lambda: self.members.alive_replicas)
        if self.ha_master is not None:
            await self.ha_master.start()
        if self.dledger is not None:
            await self.dledger.start()
        self.flush.start()
        await self.registration.start()
        await self.members.sync_once()
        self.members.start()
        self.schedule.start(deliver=not self.is_slave)
        if not self.is_slave:
            self.transactions.start()
            self.transaction_check.start()
        self._housekeeping = asyncio.create_task(self._scan_clients())
        self.pop.start()
        if self.slave_sync is not None:
            await self.slave_sync.sync_once()
            self.slave_sync.start()
        if self.ha_slave is not None:
            self.ha_slave.start()
        log.info("broker %s/%d listening on %s", self.config.broker_name, self.config.broker_id,
                 self.config.listen)

    async def _scan_clients(self) -> None:
        while True:
            await asyncio.sleep(CLIENT_SCAN_INTERVAL_S)
            self.clients.scan_expired(monotonic_ms())
            self.locks.remove_expired(monotonic_ms())

    async def stop(self) -> None:
        """Clean shutdown: stop serving, flush and checkpoint, deregister."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        await self.registration.stop()
        await self.members.stop()
        if self.dledger is not None:
            await self.dledger.stop()
        if self.ha_slave is not None:
            await self.ha_slave.stop()
        if self.slave_sync is not None:
            await self.slave_sync.stop()
        await self.schedule.stop()
        await self.transaction_check.stop()
        await self.pop.stop()
        self.pull.close()
        await self.server.close()
        if self.ha_master is not None:
            await self.ha_master.stop()
        await self.flush.stop()
        self.store.close()
        if self.metrics is not None:
            self.metrics.shutdown()
        await self.pool.close()


# Features whose broker-side writes do not go through Raft yet; refused on DLedger groups.
DLEDGER_UNSUPPORTED = (RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION,
                       RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE,
                       RequestCode.BATCH_ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME)


def _not_in_dledger(conn: Connection, frame: Frame) -> list:
    raise RequestCodeNotSupported(
        f"request code {frame.code} is not supported by DLedger groups yet "
        "(replication_mode = \"dledger\"): its broker-side writes are not replicated by Raft")


async def serve_broker(config: BrokerConfig, stop: asyncio.Event) -> None:
    broker = Broker(config)
    await broker.start()
    print(json.dumps({"event": "ready", "role": "broker", "listen": config.listen,
                      "broker_name": config.broker_name, "broker_id": config.broker_id,
                      "pid": os.getpid()}), flush=True)
    await stop.wait()
    await broker.stop()
