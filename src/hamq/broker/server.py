"""The broker process: wires store, processors, server and name-server registration."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from hamq.broker.acting_master import ActingMasterWatch
from hamq.broker.alarms import ResourceMonitor
from hamq.broker.client_processor import ClientProcessor
from hamq.broker.clients import ClientManager
from hamq.broker.consumer_admin import ConsumerAdmin
from hamq.broker.dledger.driver import DLedgerCommitLog
from hamq.broker.escape import EscapeBridge
from hamq.broker.flow import PublisherFlow
from hamq.broker.ha.exchange import BrokerHaInfoExchange
from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.ha.service import HAMaster, HASlave
from hamq.broker.ha.slave_sync import SlaveSynchronize
from hamq.broker.held_back import HeldBackPut
from hamq.broker.lock_quorum import LockQuorum
from hamq.broker.locks import RebalanceLockManager
from hamq.broker.message_lookup import MessageLookup
from hamq.broker.mirror_sync import MirrorSyncProcessor
from hamq.broker.namesrv_requests import NamesrvRequests
from hamq.broker.need_offset import known_consumers
from hamq.broker.pop.service import PopService
from hamq.broker.pre_online import GroupMetadata, PreOnline, may_act, needs_pre_online
from hamq.broker.processor import BrokerProcessor
from hamq.broker.pull import PullProcessor
from hamq.broker.record_repair import RecordRepair
from hamq.broker.registration import NamesrvRegistration
from hamq.broker.replicas_manager import ReplicasManager
from hamq.broker.role import BrokerRole, RoleService, RoleServices, RoleState
from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.scrape import add_broker_sources
from hamq.broker.scrub import Scrubber
from hamq.broker.send import SendProcessor
from hamq.broker.send_back import ConsumerSendMsgBackProcessor
from hamq.broker.stats import BrokerStats
from hamq.broker.store_lock import StoreDirLock
from hamq.broker.topics import TopicService
from hamq.broker.transaction.check import TransactionalMessageCheckService
from hamq.broker.transaction.decision_share import DecisionShare
from hamq.broker.transaction.service import TransactionalMessageService
from hamq.client.controller import ControllerClient
from hamq.clock import monotonic_ms, wall_ms
from hamq.config import BrokerConfig
from hamq.errors import RequestCodeNotSupported
from hamq.net.connection import Connection
from hamq.net.counts import COUNTS
from hamq.net.metrics import gauge, serve_metrics
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.net.tasks import PeriodicTask, cancel_all
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

CLIENT_SCAN_INTERVAL_S = 10.0  # RocketMQ ClientHousekeepingService period


class Broker:
    """One member of a broker group: the store, the request processors, replication (HA or
    DLedger) and the services that follow the member's role (``broker/role.py``).

    A ``BrokerContainer`` (``broker/container.py``) hosting several members in one process
    passes them one shared ``pool`` (one connection to each name server; the reverse
    notifications are told apart by broker name, ``broker/namesrv_requests.py``) and
    ``siblings``, the other members it hosts (local escape puts into a sibling master).
    Without them the member owns its pool and has no siblings."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        pool: ConnectionPool | None = None,
        siblings: Callable[[], Iterable[Broker]] | None = None,
    ) -> None:
        self.config = config
        self.started_ms = wall_ms()
        self.dledger_mode = config.replication_mode == "dledger"
        # A DLedger or controller-mode member starts as a slave (following no master in
        # controller mode); it takes writes only once elected.
        starts_as_slave = (
            config.broker_role == "slave" or self.dledger_mode or config.enable_controller_mode
        )
        self.role = RoleState(
            BrokerRole.SLAVE if starts_as_slave else BrokerRole.MASTER,
            config.dledger_self_id if self.dledger_mode else config.broker_id,
            None if starts_as_slave else config.broker_addr,
        )

        # -- the store, the group, the name servers -------------------------------------
        self.store_lock = StoreDirLock(config.store_dir)  # before recovery writes anything
        try:
            self._assemble(config, pool, siblings)
        except BaseException:
            self._disassemble()
            raise

    def _assemble(
        self,
        config: BrokerConfig,
        pool: ConnectionPool | None,
        siblings: Callable[[], Iterable[Broker]] | None,
    ) -> None:
        """Everything on the locked store directory. Recovery may fail on what it finds
        there (a file where a directory belongs, say): ``_disassemble`` undoes it."""
        self.store = MessageStore(config)
        self.store.offsets.version_step = config.consumer_offset_update_version_step
        self.flush = FlushService(
            self.store, reads_wait_for_fsync=config.replication_mode != "dledger"
        )
        self._owns_pool = pool is None  # a container's shared pool outlives its members
        self.pool = ConnectionPool() if pool is None else pool
        self.members = MemberGroup(config, self.pool)
        self.members.on_change.append(self._follow_master)
        NamesrvRequests.of(self.pool).add(self.members)
        self.registration = NamesrvRegistration(config, self.store.topics, self.pool, self.role)
        self.topics = TopicService(
            self.store,
            self.role,
            default_queue_nums=config.default_topic_queue_nums,
            auto_create=config.auto_create_topic_enable,
            on_change=self.registration.request_register,
        )

        # -- replication: Raft in DLedger mode, else an HA master and client (one runs) ----
        self.dledger = (
            DLedgerCommitLog(
                config,
                self.store,
                self.topics,
                on_applied=self._arrived,
                on_role_change=self._on_leadership,
            )
            if self.dledger_mode
            else None
        )
        self.ha_master = None if self.dledger_mode else HAMaster(config, self.store, self.members)
        self.ha_slave = (
            None
            if self.dledger_mode
            else HASlave(config, self.store, self.members, self._replicated, self.flush)
        )
        on_written = self.ha_master.new_data if self.ha_master else _nothing
        self.replicas = (
            ReplicasManager(
                config,
                self.store,
                self.role,
                self.members,
                self.ha_master,
                self.ha_slave,
                ControllerClient(config.controller_addr),
            )
            if config.enable_controller_mode and self.ha_master and self.ha_slave
            else None
        )
        if self.replicas is not None:  # a name server refusing us as master: we were deposed
            self.registration.on_master_refused = self.replicas.refresh

        # -- request processors -----------------------------------------------------------
        self.stats = BrokerStats()  # traffic by topic and group, latencies (broker/stats.py)
        self.pull = PullProcessor(
            self.store, self.topics, config.long_polling_max_wait_ms, self.stats
        )
        # where an acting master's delay, transaction and pop writes go (seed 004)
        self.escape = EscapeBridge(config, siblings)
        self.schedule = ScheduleMessageService(
            self.store,
            self.flush,
            self.role,
            self.escape,
            on_put=self.pull.message_arrived,
            after_put=lambda: self.processor.after_batch(),
            flush_interval_ms=config.flush_delay_offset_interval_ms,
        )
        self.schedule.progress.version_step = config.delay_offset_update_version_step
        self.transactions = TransactionalMessageService(
            self.store,
            self.flush,
            self.role,
            self.escape,
            on_put=self.pull.message_arrived,
            share=DecisionShare(self.members, self.pool, config.broker_id).share,
        )
        self.flow = PublisherFlow(config.max_unconfirmed_bytes)  # credit and alarms
        self.alarms = ResourceMonitor(config, self.flow)
        self.send = SendProcessor(
            self.store,
            self.topics,
            self.flush,
            self.ha_master,
            self.dledger,
            on_put=self.pull.message_arrived,
            put_held_back=HeldBackPut(self.schedule, self.transactions),
            flow=self.flow,
            stats=self.stats,
        )
        self.clients = ClientManager()
        self.locks = RebalanceLockManager(config.rebalance_lock_max_live_time_ms)
        self.processor = BrokerProcessor(
            self.store,
            self.topics,
            self.send,
            self.pull,
            ClientProcessor(
                self.store,
                self.topics,
                self.clients,
                self.locks,
                LockQuorum(config, self.members, self.pool, self.locks)
                if config.lock_in_strict_mode
                else None,
            ),
            runtime_info=self.runtime_info,
            on_written=on_written,
        )
        # sends answered at once: their latency, once their read's write is done
        self.processor.register({}, after_write=self.send.after_write)
        send_back = ConsumerSendMsgBackProcessor(
            self.store, self.topics, self.schedule, self.flush, on_put=self.pull.message_arrived
        )
        self.processor.register(
            {
                RequestCode.CONSUMER_SEND_MSG_BACK: send_back.send_back,
                RequestCode.GET_ALL_DELAY_OFFSET: self.schedule.get_all_delay_offset,
                RequestCode.END_TRANSACTION: self.transactions.end_transaction,
                RequestCode.GET_TRANSACTION_DECISIONS: self.transactions.get_decisions,
                RequestCode.PUT_TRANSACTION_DECISIONS: self.transactions.put_decisions,
            }
        )
        self.transaction_check = TransactionalMessageCheckService(
            self.transactions, self.clients, config, after_put=self.processor.after_batch
        )
        self.pop = PopService(
            self.store,
            self.topics,
            self.flush,
            self.role,
            config,
            on_written=on_written,
            on_put=self.pull.message_arrived,
            escape=self.escape,
            stats=self.stats,
        )
        self.processor.register(self.pop.handlers())
        self.processor.register(MessageLookup(self.store, self.topics).handlers())
        # a record a read finds damaged comes back from another member's copy
        self.repair = RecordRepair(self.store, self.members, self.pool, config.broker_addr)
        # and one nobody reads is found by the scrub of closed segments
        self.scrub = Scrubber(self.store, self.repair, config.scrub_interval_ms / 1000)
        self.processor.register(
            ConsumerAdmin(
                config.broker_name,
                self.store,
                self.topics,
                self.clients,
                self.pop.reset_offset,
                lambda: self.processor.check_offset_commit(),
            ).handlers()
        )
        if self.ha_master is not None:
            mirrors = MirrorSyncProcessor(config, self.role, self.ha_master)
            self.processor.register(mirrors.handlers())
            self.ha_master.known_consumers = lambda: known_consumers(self.clients, self.pop.states)
            self.store.offsets.on_start_or_rewind.append(self.ha_master.refresh_need_soon)
            self.clients.on_subscribe.append(self.ha_master.refresh_need_soon)
        self.processor.register({RequestCode.UPDATE_BROKER_CONFIG: self.alarms.update_config})
        self.pull.watch_arrivals(self.pop.held, self.pop.serve_arrivals)
        self.topics.on_delete.append(self.pop.forget_topic)
        if self.replicas is not None:
            self.processor.register(
                {RequestCode.NOTIFY_BROKER_ROLE_CHANGED: self.replicas.handle_role_changed}
            )
        if self.dledger is not None:
            self.processor.register(
                {
                    RequestCode.DLEDGER_TRANSFER_LEADERSHIP: self.dledger.handle_transfer,
                    RequestCode.UPDATE_AND_CREATE_TOPIC: self.dledger.create_topic,
                    RequestCode.DELETE_TOPIC_IN_BROKER: self.dledger.delete_topic,
                    **dict.fromkeys(DLEDGER_UNSUPPORTED, _not_in_dledger),
                }
            )
        self.slave_sync = SlaveSynchronize(
            self.store,
            self.topics,
            self.members,
            self.pool,
            self.schedule.progress,
            interval_ms=config.slave_sync_interval_ms,
            # DLedger: topics come only from the log
            sync_topics=not self.dledger_mode,
        )

        # -- slave acting master and pre-online (seed 004) ---------------------------------
        # a returning master takes its slaves' newer metadata before it registers, and a
        # member about to act the metadata of the one that acted before it
        group_metadata = GroupMetadata(
            self.pool,
            self.store,
            self.schedule.progress,
            self.schedule.write_progress,
            self.pop.merge_checkpoint,
            self.transactions.merge_decisions,
        )
        self.pre_online = (
            PreOnline(config, self.registration, self.ha_master, group_metadata)
            if needs_pre_online(config) and self.ha_master is not None
            else None
        )
        self._starting: asyncio.Task | None = None  # the role's start, behind pre-online
        self.role.services = self._role_services()
        # with no master in the group, its smallest-id slave acts as one
        self.acting = ActingMasterWatch(
            config,
            self.role,
            self.members,
            metadata=group_metadata,
            lease_lapsed=self.registration.lease_lapsed,
        )
        self.processor.check_offset_commit = self.acting.check_offset_commit
        if may_act(config):  # dropped by the name servers: another member may act
            self.registration.watch_lease(self._lease_lapsed)
            self.role.master_lease_lapsed = self.registration.lease_lapsed
        if self.ha_slave is not None:  # a returning master announces itself (pre-online)
            exchange = BrokerHaInfoExchange(
                config,
                self.role,
                self.members,
                self.ha_slave,
                self.store,
                self.acting.master_returning,
            )
            self.processor.register({RequestCode.EXCHANGE_BROKER_HA_INFO: exchange.handle})

        self.server = Server(self.processor, config)
        self.server.on_connection_closed.append(self.clients.connection_closed)
        self.server.on_connection_closed.append(self.flow.closed)
        self._housekeeping = PeriodicTask(
            "client housekeeping", CLIENT_SCAN_INTERVAL_S, self._scan_clients
        )
        self._role_changes: set[asyncio.Task] = set()
        self._shutting_down = False
        self.metrics: WSGIServer | None = None

    def _disassemble(self) -> None:
        """A constructor that failed part way lets go of what it holds: a container whose
        member failed to open its store serves on, and the store can be tried again."""
        try:
            if "members" in vars(self):
                NamesrvRequests.of(self.pool).remove(self.members)
            if "store" in vars(self):
                self.store.close()
        finally:
            self.store_lock.release()

    def _role_services(self) -> RoleServices:
        """What starts and stops with the role, in start order (``broker/role.py`` has the
        order and why). DLedger mode: Raft replicates the log, so there is no HA master or
        client; the broker-internal writers (delay delivery, transaction check-back, pop
        revive) would bypass Raft, so their requests are refused and they never run."""
        slave_sync = RoleService("slave_sync", self.slave_sync.start, self.slave_sync.stop)
        after_change = [self.registration.request_register]
        if self.ha_master is None or self.ha_slave is None:
            return RoleServices(master=[], slave=[slave_sync], after_change=after_change)
        secondary = [  # seed 004's secondary-message services: the master's, also acting
            ("delay_delivery", self.schedule.start_delivery, self.schedule.stop_delivery),
            ("transaction_check", self.transaction_check.start, self.transaction_check.stop),
            ("pop_revive", self.pop.start, self.pop.stop),
        ]
        return RoleServices(
            # controller mode: the epoch file records the controller's epoch first
            before_master=[self.replicas.start_epoch] if self.replicas else [],
            master=[
                RoleService("ha_master", self.ha_master.start, self._stop_ha_master),
                # pre-online: the services after it start once the master is online
                *(
                    # (nothing to stop: a pre-online under way ends with the broker's stop)
                    [RoleService("pre_online", self.pre_online.run, lambda: None)]
                    if self.pre_online
                    else []
                ),
                *(RoleService(name, start, stop) for name, start, stop in secondary),
            ],
            slave=[RoleService("ha_client", self.ha_slave.start, self._stop_ha_client), slave_sync],
            # a slave acting as master (broker/acting_master.py) runs them too; what they
            # write escapes into another group's master
            acting=[RoleService(f"acting_{name}", start, stop) for name, start, stop in secondary],
            after_change=after_change,
        )

    async def _stop_ha_master(self) -> None:
        """Last of a master's services to stop. At the broker's shutdown the client port
        closes first, so every send acknowledged until then is shipped to the slaves (a
        role change refuses sends before this; a shutdown takes them until the port
        closes, and those taken after the HA master stopped never left this member)."""
        if self._shutting_down:
            await self._stop_serving()
        await self.ha_master.stop()

    async def _stop_serving(self) -> None:
        """Stop taking client requests: held pulls are dropped, every client connection closes."""
        self.pull.close()
        await self.server.close()

    async def _stop_ha_client(self) -> None:
        """Last of a slave's services to stop: the log is now all this member has (HA mode;
        DLedger's grows to the committed index). Consumer offsets and delay progress that
        slave sync took from the master past it count records this member never got, and
        as master it writes others there: they go back to its queues' ends."""
        await self.ha_slave.stop()
        self.store.clamp_progress()

    def _arrived(self, arrived: list[tuple[str, int]]) -> None:
        """Records written by replication (HA transfer, DLedger apply): wake held pulls."""
        for topic, queue_id in arrived:
            self.pull.message_arrived(topic, queue_id)
        self.pull.serve_arrivals()

    def _replicated(self, arrived: list[tuple[str, int]]) -> None:
        self._arrived(arrived)
        topics = self.store.topics.topics
        if any(topic not in topics for topic, _ in arrived):
            self.slave_sync.request_sync()  # a new topic: fetch its config now

    def _follow_master(self) -> None:
        if self.replicas is None:  # in controller mode the controller names the master
            self.role.follow(self.members.broker_addrs.get(MASTER_ID))

    def _on_leadership(self, leader: bool) -> None:
        """DLedger: the leader is the group's master (brokerId 0), so producers and
        consumers follow it within one route refresh; its epoch is the Raft term. Called
        from the Raft tick: the change runs as a task of its own, serialised by the role
        state."""
        change = (
            self.role.change(
                BrokerRole.MASTER, self.config.broker_addr, epoch=self.dledger.node.term
            )
            if leader
            else self.role.change(BrokerRole.SLAVE, self.members.broker_addrs.get(MASTER_ID))
        )
        task = asyncio.create_task(change)
        self._role_changes.add(task)
        task.add_done_callback(self._role_change_done)

    def _lease_lapsed(self) -> None:
        """No name server is sure to hold this member (``broker/registration.py``): a
        master runs pre-online again, then its secondary-message services restart from
        what it took; an acting member stops acting."""
        if not self.role.is_master:
            self.acting.reconsider()
            return
        if self.pre_online is None or (self._starting is not None and not self._starting.done()):
            return
        self.pre_online.again()
        self._starting = asyncio.create_task(self.role.restart_from("pre_online"))
        self._starting.add_done_callback(self._role_change_done)

    def _role_change_done(self, task: asyncio.Task) -> None:
        self._role_changes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            COUNTS.internal_errors += 1  # the role state logs a service's failure itself
            log.error("role change failed", exc_info=task.exception())

    def _master_kind(self) -> str:
        """The HA master decides how it answers sends (a promoted slave is a sync master,
        as RocketMQ 5's ``changeToMaster`` makes it); the runtime info reports just that."""
        return "sync_master" if self.ha_master.sync else "async_master"

    def runtime_info(self) -> dict:
        log_ = self.store.commitlog
        return {
            "cluster_name": self.config.cluster_name,
            "broker_name": self.config.broker_name,
            "broker_id": self.role.registered_id,
            "broker_role": ("leader" if self.dledger.is_leader else "follower")
            if self.dledger
            else self._master_kind()
            if self.role.is_master
            else "slave",
            "role": self.role.info(),
            "listen": self.config.listen,
            "pid": os.getpid(),
            "started_ms": self.started_ms,
            "commitlog_min_offset": log_.min_offset,
            "commitlog_max_offset": log_.max_offset,
            "commitlog_flushed_offset": log_.flushed_offset,
            "flush_disk_type": self.config.flush_disk_type,
            "topics": len(self.store.topics.topics),
            "connections": len(self.server.connections),
            "alive_replicas": self.members.alive_replicas,
            "ha": self._ha_status(),
            "controller": None if self.replicas is None else self.replicas.info_dict(),
            "pre_online": None if self.pre_online is None else self.pre_online.info(),
            "acting_master": self.acting.info(),
            "queue_locks": self.locks.owners(monotonic_ms()),
            "flow": self.flow.status(),
            "stats": self.stats.runtime_info(),
            "scrub": self.scrub.info(),
        }

    def _ha_status(self) -> dict:
        if self.dledger is not None:
            return self.dledger.status()
        ha = self.ha_master if self.role.is_master else self.ha_slave
        return ha.status() if ha is not None else {}

    async def start(self) -> None:
        await self.server.start(self.config.listen)
        self.metrics = serve_metrics(self.config.metrics_listen)
        if self.metrics is not None:
            self.add_gauges()
        if self.dledger is not None:
            await self.dledger.start()
        self.flush.start()
        self.alarms.start()
        self.schedule.start()
        if self.replicas is not None:  # the name servers hear of us under that id
            await self.replicas.take_broker_id()
        await self.registration.start()
        await self.members.sync_once()  # a slave needs its master's address
        self.members.start()
        self._housekeeping.start()
        self.scrub.start()
        if self.pre_online is None:
            await self.role.start()
        else:  # isolated: serves its slaves' HA while pre-online runs, then the rest starts
            self._starting = asyncio.create_task(self.role.start())
            self._starting.add_done_callback(self._role_change_done)
        self.acting.start()
        if self.replicas is not None:
            await self.replicas.start()
        log.info(
            "broker %s/%d listening on %s",
            self.config.broker_name,
            self.role.broker_id,
            self.config.listen,
        )

    def add_gauges(self, labels: dict[str, str] | None = None) -> None:
        """This member's gauges; a broker container labels each member's series and serves
        them on its one /metrics."""
        log_ = self.store.commitlog
        for name, documentation, read in (
            ("hamq_commitlog_max_offset", "Commit log end (bytes)", lambda: log_.max_offset),
            (
                "hamq_commitlog_flushed_offset",
                "Commit log fsynced up to (bytes)",
                lambda: log_.flushed_offset,
            ),
            ("hamq_connections", "Open client connections", lambda: len(self.server.connections)),
            (
                "hamq_commitlog_damaged_records",
                "Commit-log records found damaged (CRC) and not yet repaired",
                lambda: len(self.store.damaged),
            ),
            (
                "hamq_commitlog_repaired_records",
                "Damaged commit-log records put back from another member's copy",
                lambda: self.repair.repaired,
            ),
            (
                "hamq_alive_replicas",
                "Members of this group the name server holds alive",
                lambda: self.members.alive_replicas,
            ),
        ):
            gauge(name, documentation, read, labels)
        self.alarms.add_gauges(labels)
        add_broker_sources(self, labels)

    def _scan_clients(self) -> None:
        self.clients.scan_expired(monotonic_ms())
        self.locks.remove_expired(monotonic_ms())

    async def stop(self) -> None:
        """Clean shutdown: stop serving, flush and checkpoint, deregister."""
        self._shutting_down = True
        await cancel_all([self._starting])  # a pre-online under way ends here
        if self.replicas is not None:  # no role change from the controller from here on
            await self.replicas.stop()
        await self._housekeeping.stop()
        await self.registration.stop()
        await self.members.stop()
        await self.scrub.stop()
        await self.repair.close()
        if self.dledger is not None:
            await self.dledger.stop()
        # each change runs to its end, then everything stops
        await asyncio.gather(*self._role_changes, return_exceptions=True)
        await self.acting.stop()
        await self.role.stop()
        await self.schedule.stop()
        await self.alarms.stop()
        await self._stop_serving()  # done already if the HA master stopped
        await self.flush.stop()
        self.store.close()
        self.store_lock.release()
        if self.metrics is not None:
            self.metrics.shutdown()
        NamesrvRequests.of(self.pool).remove(self.members)
        await self.escape.close()
        if self._owns_pool:
            await self.pool.close()


def _nothing() -> None:
    """No HA master to ship new log bytes to (DLedger mode)."""


# Features whose broker-side writes do not go through Raft yet; refused on DLedger groups.
DLEDGER_UNSUPPORTED = (
    RequestCode.CONSUMER_SEND_MSG_BACK,
    RequestCode.END_TRANSACTION,
    RequestCode.POP_MESSAGE,
    RequestCode.ACK_MESSAGE,
    RequestCode.BATCH_ACK_MESSAGE,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
    RequestCode.POP_ESCAPED_REVIVE,  # an acting master's pop record, into the revive log
)


def _not_in_dledger(conn: Connection, frame: Frame) -> list:
    raise RequestCodeNotSupported(
        f"request code {frame.code} is not supported by DLedger groups yet "
        '(replication_mode = "dledger"): its broker-side writes are not replicated by Raft'
    )


async def serve_broker(config: BrokerConfig, stop: asyncio.Event) -> None:
    broker = Broker(config)
    await broker.start()
    print(
        json.dumps(
            {
                "event": "ready",
                "role": "broker",
                "listen": config.listen,
                "broker_name": config.broker_name,
                "broker_id": broker.role.broker_id,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    await stop.wait()
    await broker.stop()
