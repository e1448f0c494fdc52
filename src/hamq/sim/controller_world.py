"""Controller mode (seed 001) under the simulator: controller peers, one broker group of
three members and its clients, on the production code of every part.

- Controller peers: ``ControllerCore`` (the production peer: ``RawNode`` Ready cycle, decide
  on the serving leader, apply, heartbeat soft state, master-timeout scan, snapshots) over
  ``FileStorage`` on each peer's ``SimDisk``, its snapshot file written atomically there.
- Members: a ``MessageStore`` (its epoch file included) on each member's ``SimDisk``; as
  master the ``MasterReplication`` core with its ``SyncStateSet`` and all-ack waiters through
  ``MasterLink``, as slave ``SlaveLink``: the handshake with its epoch rounds, the cut to the
  consistent point, the appends (what ``broker/ha/service.py`` drives over TCP). They
  heartbeat to every controller peer, re-read their role when the leader notifies them
  and by polling, run the SyncStateSet expand / shrink (gated on the need offset, seed
  003) and acknowledge under ``all_ack_in_sync_state_set``. In some seeds one member
  starts late with ``ha_join = "tail"``: its log starts at the master's end then, so it
  is an unsynchronised mirror (the consumer commits no offsets: every record is needed)
  that must never enter the SyncStateSet. The few steps that live in the asyncio shells
  (``HAMaster.start_epoch`` / read cap / confirm shipping, ``HASlave.start``,
  ``ReplicasManager._take``) are restated here, each marked with the method it mirrors.
- Clients: a producer sending to whichever member claims to be master (a stale route
  included) and a consumer reading from any member with a role, which its store's read
  cap holds to the confirm offset.

Faults, drawn per seed: crashes of any member or controller peer (kill -9, or a power loss
that keeps only what was fsynced), partitions of any subset of the nodes (controller-only
and data-only splits among them, one-way or both), message loss, delays that reorder,
broken HA connections, heals. Then everything heals and restarts, and the checkers of
``controller_checkers.py`` run on the result.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hamq.broker.ha.service import MasterDeposed, MasterLink, SlaveLink
from hamq.broker.need_offset import group_need
from hamq.config import StoreConfig
from hamq.controller.core import Applied, ControllerCore, CoreSettings, Outcome, Request
from hamq.controller.errors import ControllerCodecError, ControllerError, ControllerRecoveryError
from hamq.controller.events import ElectMaster
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import BrokerGroup
from hamq.errors import HamqError
from hamq.protocol.message import decode_records, offset_msg_id
from hamq.raft import FileStorage, Message, RaftConfig, RaftError
from hamq.replication.master import AckCallback, MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.replication.sync_state_set import SyncStateSet
from hamq.sim.controller_checkers import ControllerModeCheckers, check_same_controller_state
from hamq.sim.fs import SimDisk
from hamq.sim.replica_checkers import AckedMessage, InvariantViolation, put_one
from hamq.store.disk import atomic_write
from hamq.store.message_store import UNCAPPED, GetStatus, MessageStore

TICK_MS = 10
FAULTS_MS = 2000  # faults run this long, then everything heals
HEALED_MS = 2000  # the healed world must have settled within this
CLUSTER, GROUP = "C", "G"
KEY = (CLUSTER, GROUP)
MEMBER_IDS = (1, 2, 3)
PEER_IDS = (1, 2, 3)
QUEUES = 2
TOPIC = "T"
STORE_DIR = "/store"
RAFT_DIR = Path("/controller")
SNAPSHOT_FILE = Path("/controller-snapshot/snapshot")
SNAPSHOT_INTERVAL_ENTRIES = 8  # small, so restarts load snapshots and replay the rest
WALL_CLOCK_EPOCH_MS = 1_700_000_000_000
# controller and member settings, scaled down with the world
HEARTBEAT_MS = 80  # controller_heartbeat_interval_ms
HEARTBEAT_TIMEOUT_MS = 250  # controller_heartbeat_timeout_ms
POLL_MS = 150  # sync_broker_metadata_period_ms
RPC_TIMEOUT_MS = 200
NOT_CATCHUP_MS = 300  # ha_max_time_slave_not_catchup_ms
HA_HEARTBEAT_MS = 50
HOUSEKEEPING_MS = 250
RECONNECT_MS = 40
SEND_TIMEOUT_MS = 250
WINDOW_BYTES = 32 * 1024
BATCH_BYTES = 8 * 1024
SEGMENT_BYTES = 16 * 1024
FLUSH_MS = 200  # the periodic fsync of what nobody waits for (production: 10 ms)
FSYNC_MS_MAX = 5  # a slave's group-commit fsync completes 1..this many ms after it starts
CHECKPOINT_MS = 400  # flush_interval_consume_queue_ms
RAFT_ELECTION_MS = 120
RAFT_HEARTBEAT_MS = 30
RAFT_PUSH_TIMEOUT_MS = 60


def _peer(i: int) -> str:
    return f"c{i}"


def _member(i: int) -> str:
    return f"b{i}"


CLIENT = "client"
NODES = (*map(_peer, PEER_IDS), *map(_member, MEMBER_IDS), CLIENT)


@dataclass(eq=False)
class _Conn:
    """A slave's HA session (TCP): frames in order per direction, none after a break."""

    slave_id: int
    master_id: int
    live: bool = True
    confirm_shipped: int | None = None
    clear_ms: dict[bool, int] = field(default_factory=dict)


@dataclass
class _MasterSide:
    """What a member holds while it is master (lost on a crash or a role change)."""

    epoch: int
    core: MasterReplication  # with the SyncStateSet rules and all-ack waiters
    link: MasterLink
    altering: bool = False  # an alter is in flight
    next_alter: int = 0


@dataclass
class _SlaveSide:
    master_id: int
    epoch: int
    link: SlaveLink
    conn: _Conn | None = None
    reconnect_at: int = 0


@dataclass
class _Member:
    broker_id: int
    disk: SimDisk
    store: MessageStore | None = None
    epoch: int = 0  # the highest master epoch it knows
    master: _MasterSide | None = None
    slave: _SlaveSide | None = None
    registered: bool = False
    rpc_deadline: int = 0  # one controller request at a time; a new one after this
    rpc_id: int = 0
    leader_hint: int = 0  # the leader the last answer named
    waiting: bool = False  # the last request is unanswered
    next_poll: int = 0
    next_beat: int = 0
    skew_ms: int = 0


@dataclass
class _Peer:
    peer_id: int
    disk: SimDisk
    process: ControllerCore | None = None


@dataclass
class ControllerResult:
    seed: int
    ok: bool
    failure: str | None
    acked: int = 0
    read: int = 0
    crashes: int = 0
    elections: int = 0
    cuts: int = 0
    partitions: int = 0


@dataclass(frozen=True)
class _Mix:
    """Per-seed fault rates (swarm testing: some seeds calm, some storms)."""

    member_crash: float
    master_crash: float  # the member that claims to be master, on top of member_crash
    peer_crash: float
    power_loss: float  # share of crashes that lose what was not fsynced
    partition: float
    drop: float
    delay_max: int
    conn_break: float
    send: float


def _draw_mix(rng: random.Random) -> _Mix:
    return _Mix(
        member_crash=rng.choice((0.0, 0.005, 0.01, 0.02)),
        master_crash=rng.choice((0.0, 0.005, 0.01)),
        peer_crash=rng.choice((0.0, 0.005, 0.01)),
        power_loss=rng.choice((0.0, 0.5, 1.0)),
        partition=rng.choice((0.0, 0.01, 0.03)),
        drop=rng.choice((0.0, 0.02, 0.1)),
        delay_max=rng.choice((2, 10, 60)),
        conn_break=rng.choice((0.0, 0.005)),
        send=rng.choice((0.3, 0.7)),
    )


class ControllerWorld:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        # fsync latencies of the slaves' group commits: a stream of their own, so they do
        # not move the rest of a seed's schedule
        self.fsync_rng = random.Random(seed ^ 0xF5C)
        self.mix = _draw_mix(self.rng)
        self.now = 0
        self.events: list[tuple[int, int, str, tuple]] = []
        self._seq = 0
        self.blocked: set[tuple[str, str]] = set()
        self.faulty = True
        self.checkers = ControllerModeCheckers()
        self.result = ControllerResult(seed, True, None)
        self.store_config = StoreConfig(
            store_dir=STORE_DIR,
            disk_min_free_bytes=1,
            mapped_file_size_commitlog=SEGMENT_BYTES,
            flush_disk_type="sync",
        )
        self.quorum = QuorumConfig(len(MEMBER_IDS), 1, 1, False)
        self.peers = {i: _Peer(i, SimDisk()) for i in PEER_IDS}
        self.members = {
            i: _Member(i, SimDisk(), skew_ms=self.rng.randint(-2000, 2000)) for i in MEMBER_IDS
        }
        self.consumed = dict.fromkeys(range(QUEUES), 0)  # the consumer's next queue offsets
        self.sends = 0
        # a stream of its own, so seeds without a tail member keep their schedule
        tail_rng = random.Random(seed ^ 0x7A11)
        self.tail_member = tail_rng.choice((None, *MEMBER_IDS))
        for peer in self.peers.values():
            self._start_peer(peer)
        for member in self.members.values():
            if member.broker_id == self.tail_member:
                self._at(tail_rng.randint(200, 1500), "restart_member", member.broker_id)
            else:
                self._start_member(member)

    # -- scheduling and the network -------------------------------------------------------
    def _at(self, delay: int, kind: str, *args: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (self.now + delay, self._seq, kind, args))

    def _delay(self) -> int:
        return self.rng.randint(1, self.mix.delay_max) if self.faulty else 1

    def _reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.blocked

    def _datagram(self, src: str, dst: str, payload: object) -> None:
        """Raft messages and controller requests: lost, delayed, reordered."""
        if not self._reachable(src, dst):
            return
        if self.faulty and self.rng.random() < self.mix.drop:
            return
        self._at(self._delay(), "deliver", src, dst, payload)

    def _over(self, conn: _Conn, to_master: bool, kind: str, payload: object) -> None:
        """An HA frame: in order per direction; a blocked link breaks the connection."""
        src, dst = (conn.slave_id, conn.master_id) if to_master else (conn.master_id, conn.slave_id)
        if not self._reachable(_member(src), _member(dst)):
            self._break(conn)
            return
        at = max(self.now + self._delay(), conn.clear_ms.get(to_master, 0))
        conn.clear_ms[to_master] = at
        self._at(at - self.now, "frame", conn, to_master, kind, payload)

    # -- controller peers -----------------------------------------------------------------
    def _start_peer(self, peer: _Peer) -> None:
        config = RaftConfig(
            node_id=peer.peer_id,
            member_ids=PEER_IDS,
            election_timeout_ms=RAFT_ELECTION_MS,
            heartbeat_interval_ms=RAFT_HEARTBEAT_MS,
            push_timeout_ms=RAFT_PUSH_TIMEOUT_MS,
        )
        disk = peer.disk
        if not disk.exists(SNAPSHOT_FILE.parent):
            disk.mkdir(SNAPSHOT_FILE.parent)
        snapshot = disk.read_bytes(SNAPSHOT_FILE) if disk.exists(SNAPSHOT_FILE) else None
        try:
            peer.process = ControllerCore(
                config,
                FileStorage(RAFT_DIR, disk=disk),
                random.Random(self.rng.getrandbits(64)),
                CoreSettings(HEARTBEAT_TIMEOUT_MS, SNAPSHOT_INTERVAL_ENTRIES, False),
                self.now,
                snapshot,
            )
        except (RaftError, ControllerRecoveryError, ControllerCodecError) as err:
            raise InvariantViolation(
                f"controller peer {peer.peer_id} cannot restart: {err}"
            ) from None

    def _drain_peer(self, peer: _Peer) -> None:
        while peer.process is not None and (out := peer.process.run_cycle(self.now)):
            if out.snapshot is not None:
                atomic_write(peer.disk, SNAPSHOT_FILE, out.snapshot.data)
            for msg in out.messages:
                self._datagram(_peer(msg.from_id), _peer(msg.to_id), msg.encode())
            for change in out.changes:
                group = change.group
                if not isinstance(change.event, ElectMaster) or group is None:
                    continue
                # NOTIFY_BROKER_ROLE_CHANGED, oneway, to every member
                for member_id in group.members:
                    self._datagram(_peer(peer.peer_id), _member(member_id), ("notify",))
            group = peer.process.group(KEY)
            if group is not None and group.master_epoch:
                self.checkers.on_elected(group.master_epoch, group.master_id)

    def _on_peer(self, peer: _Peer, src: str, payload: object) -> None:
        process = peer.process
        if process is None:
            return
        if isinstance(payload, bytes):
            process.step(Message.decode(payload))
        elif isinstance(payload, BrokerHeartbeat):
            process.heartbeat(payload, self.now)
        else:
            rpc_id, req = payload  # type: ignore[misc]
            here = _peer(peer.peer_id)

            def answer(outcome: Outcome | BrokerGroup) -> None:
                reply = outcome.group if isinstance(outcome, Applied) else outcome
                # a refusal names the leader this peer follows (CONTROLLER_NOT_LEADER)
                self._datagram(here, src, ("reply", rpc_id, reply, process.leader_id))

            if req != "read":
                process.submit(req, self.now, answer)
            elif not process.serving:  # GET_REPLICA_INFO: the serving leader's state
                answer(process.not_leader())
            else:
                answer(process.group(KEY) or process.not_leader("no such group"))
        self._drain_peer(peer)

    # -- members: processes ---------------------------------------------------------------
    def _wall(self, member: _Member) -> int:
        return WALL_CLOCK_EPOCH_MS + self.now + member.skew_ms

    def _start_member(self, member: _Member) -> None:
        member.disk.clock = lambda m=member: self._wall(m) / 1000
        try:
            member.store = MessageStore(
                self.store_config, lambda m=member: self._wall(m), disk=member.disk
            )
        except HamqError as err:
            raise InvariantViolation(
                f"member {member.broker_id} refused to start: {err.message}"
            ) from None
        member.epoch = member.store.epochs.last_epoch()
        member.registered = False
        member.rpc_deadline = member.next_poll = member.next_beat = self.now

    def _crash(self, disk: SimDisk) -> None:
        self.result.crashes += 1
        if self.rng.random() < self.mix.power_loss:
            disk.power_loss(self.rng)
        else:
            disk.kill()

    def _crash_member(self, member: _Member) -> None:
        self._crash(member.disk)
        self._stop_master(member)
        self._stop_slave(member)
        member.store = None
        self._at(self.rng.randint(50, 1000), "restart_member", member.broker_id)

    def _crash_peer(self, peer: _Peer) -> None:
        self._crash(peer.disk)
        peer.process = None
        self._at(self.rng.randint(50, 1000), "restart_peer", peer.peer_id)

    # -- members: the controller side -----------------------------------------------------
    def _ask(self, member: _Member, req: Request | str) -> None:
        """One controller request, to the known leader, else to a peer picked at random
        (ControllerClient follows the leader hint and tries the peers in turn)."""
        if member.waiting:
            member.leader_hint = 0  # the last one went unanswered
        member.waiting = True
        member.rpc_id += 1
        member.rpc_deadline = self.now + RPC_TIMEOUT_MS
        peer = member.leader_hint or self.rng.choice(PEER_IDS)
        self._datagram(_member(member.broker_id), _peer(peer), (member.rpc_id, req))

    def _member_tick(self, member: _Member) -> None:
        store = member.store
        assert store is not None
        if self.now >= member.next_beat:
            member.next_beat = self.now + HEARTBEAT_MS
            beat = BrokerHeartbeat(
                *KEY,
                member.broker_id,
                _member(member.broker_id),
                store.epochs.last_epoch(),  # its log's last epoch, as ReplicasManager says
                store.commitlog.max_offset,
            )
            for peer in PEER_IDS:
                self._datagram(_member(member.broker_id), _peer(peer), beat)
        if self.now < member.rpc_deadline:
            return
        if not member.registered:
            address, code = _member(member.broker_id), f"check-{member.broker_id}"
            self._ask(member, ApplyBrokerIdRequest(*KEY, member.broker_id, address, code))
        elif member.master is not None and self._propose_sync_state_set(member):
            pass
        elif self.now >= member.next_poll:
            member.next_poll = self.now + POLL_MS
            self._ask(member, "read")

    def _on_member_datagram(self, member: _Member, payload: tuple) -> None:
        if member.store is None:
            return
        if payload[0] == "notify":
            # a one-way frame anyone could send: only a hint to read the replica info from
            # the controller now (ReplicasManager.handle_role_changed)
            member.next_poll = self.now
            return
        _, rpc_id, reply, leader = payload
        if rpc_id != member.rpc_id:
            return  # an answer to a request it gave up on
        member.leader_hint = leader
        member.waiting = False
        member.rpc_deadline = self.now  # free for the next request
        if member.master is not None:
            member.master.altering = False
        if isinstance(reply, ControllerError):
            return
        if not member.registered:
            member.registered = True
            address = _member(member.broker_id)
            self._ask(member, RegisterBrokerRequest(*KEY, member.broker_id, address))
            return
        self._learn(member, reply)

    def _learn(self, member: _Member, group: BrokerGroup) -> None:
        """A member's role follows the controller's state, never an older epoch (what
        ``ReplicasManager._take`` does with every ReplicaInfo it reads)."""
        if group.master_epoch < member.epoch:
            return
        member.epoch = group.master_epoch
        if group.master_id is None:  # a slave following nobody, asking for an election
            self._stop_master(member)
            self._stop_slave(member)
            self._ask(member, ElectMasterRequest(*KEY, ElectTrigger.REGISTER, member.broker_id))
            return
        if group.master_id == member.broker_id:
            self._stop_slave(member)
            if member.master is None or member.master.epoch != group.master_epoch:
                self._stop_master(member)
                self._become_master(member, group)
            else:
                self._set_sync_state_set(member, group)
            return
        self._stop_master(member)
        slave = member.slave
        if slave is None or slave.master_id != group.master_id or slave.epoch != group.master_epoch:
            self._stop_slave(member)
            self._follow(member, group.master_id, group.master_epoch)

    # -- members: master ------------------------------------------------------------------
    def _become_master(self, member: _Member, group: BrokerGroup) -> None:
        """``HAMaster.start_epoch`` and ``set_sync_state_set``, as the broker calls them."""
        store = member.store
        assert store is not None
        end = store.commitlog.max_offset
        store.reset_log(end, end)  # a partial record a slave held in memory goes
        # the epoch file first (fsynced), before anything is acknowledged in the epoch; a
        # master restarted in its own epoch goes on with it
        if store.epochs.last_epoch() != group.master_epoch:
            store.epochs.append(group.master_epoch, end)
        # what this member knew confirmed as a slave, every old member held
        floor = min(store.read_cap, end)
        core = MasterReplication(
            self.quorum,
            WINDOW_BYTES,
            BATCH_BYTES,
            SyncStateSet(member.broker_id, NOT_CATCHUP_MS, floor),
            all_ack=True,
        )
        member.master = _MasterSide(group.master_epoch, core, MasterLink(core, store))
        self._refresh_need(member)
        self._set_sync_state_set(member, group)

    def _refresh_need(self, member: _Member) -> int:
        """``HAMaster._refresh_need``: the need offset gates the SyncStateSet."""
        master, store = member.master, member.store
        assert master is not None and store is not None and master.core.sync_state_set
        need = group_need(store).offset
        master.core.sync_state_set.set_need_offset(need)
        return need

    def _set_sync_state_set(self, member: _Member, group: BrokerGroup) -> None:
        master = member.master
        assert master is not None
        self._complete(
            master.core.apply_sync_state_set(group.sync_state_set, group.sync_state_set_epoch)
        )
        self._update_read_cap(member)
        need = self._refresh_need(member)
        self.checkers.check_synchronised(
            need,
            {
                i: store.commitlog.min_offset
                for i in group.sync_state_set
                if (store := self.members[i].store) is not None
            },
        )

    def _update_read_cap(self, member: _Member) -> None:
        """HAMaster's read cap: reads stop where every member of the effective set is."""
        master, store = member.master, member.store
        assert master is not None and store is not None and master.core.sync_state_set
        least = master.core.sync_state_set.min_member_ack()
        store.set_read_cap(UNCAPPED if least is None else least)

    def _stop_master(self, member: _Member) -> None:
        """Deposed, crashed or following another: its waiting sends are not acknowledged."""
        master = member.master
        if master is None:
            return
        member.master = None
        self._complete(master.core.fail_all())
        for conn in list(master.core.slaves):
            assert isinstance(conn, _Conn)
            self._break(conn)

    def _propose_sync_state_set(self, member: _Member) -> bool:
        """``HAMaster.sync_state_set_change``: the expand or shrink the master's rules want,
        sent one alter at a time, fenced by the master epoch and the set's epoch."""
        master, store = member.master, member.store
        assert master is not None and store is not None
        sync_state_set = master.core.sync_state_set
        assert sync_state_set is not None
        if master.altering or self.now < master.next_alter or master.core.deposed:
            return False
        self._refresh_need(member)
        new = sync_state_set.change(self.now, store.commitlog.max_offset)
        self._update_read_cap(member)
        if new is None:
            return False
        master.altering = True
        master.next_alter = self.now + POLL_MS // 2
        self._ask(
            member,
            AlterSyncStateSetRequest(
                *KEY, member.broker_id, master.epoch, new, sync_state_set.epoch
            ),
        )
        return True

    def _complete(self, done: list[tuple[AckCallback, ReplicaStatus]]) -> None:
        for callback, status in done:
            callback(status)

    def _answered(self, member_id: int, epoch: int, message: AckedMessage) -> AckCallback:
        def answered(status: ReplicaStatus) -> None:
            if status is ReplicaStatus.PUT_OK:
                self.checkers.on_ack(epoch, member_id, message)
                self.result.acked += 1

        return answered

    def _on_master_frame(self, member: _Member, conn: _Conn, kind: str, payload: dict) -> None:
        master, store = member.master, member.store
        if master is None or store is None:
            self._break(conn)
            return
        sync_state_set = master.core.sync_state_set
        assert sync_state_set is not None
        if kind == "ack":
            self._complete(master.link.on_ack(conn, payload, self.now))
            progress = master.core.slaves.get(conn)
            if progress is not None:
                sync_state_set.maybe_expand(progress.broker_id, store.commitlog.max_offset)
            self._update_read_cap(member)
            self._pump(member, conn)
            return
        try:
            answer, attached = master.link.handshake(conn, payload, self.now)
        except MasterDeposed as deposed:
            self._complete(deposed.failed)  # a newer epoch exists: it acknowledges no more
            self._break(conn)
            return
        except HamqError:
            self._break(conn)
            return
        if attached is not None:
            for stale in attached.replaced:
                assert isinstance(stale, _Conn)
                self._break(stale)
            self._update_read_cap(member)
        self._over(conn, False, "reply", answer)
        if attached is not None:
            self._pump(member, conn)

    def _pump(self, member: _Member, conn: _Conn) -> None:
        """Ship what the window allows, each transfer carrying the confirm offset (an empty
        one when only the confirm offset moved), as HAMaster does."""
        master = member.master
        if master is None:
            return
        confirm = self._confirm_offset(member)
        progress = master.core.slaves.get(conn)
        try:
            for offset, data in master.link.transfers(conn, self.now):
                if conn.live:
                    self._over(conn, False, "transfer", (offset, bytes(data), confirm))
        except HamqError:
            self._break(conn)
            return
        if progress is not None and conn.live and conn.confirm_shipped != confirm:
            conn.confirm_shipped = confirm
            self._over(conn, False, "transfer", (progress.sent_offset, b"", confirm))

    def _confirm_offset(self, member: _Member) -> int:
        master, store = member.master, member.store
        assert master is not None and store is not None
        return master.core.confirm_offset(store.commitlog.max_offset)

    # -- members: slave -------------------------------------------------------------------
    def _follow(self, member: _Member, master_id: int, epoch: int) -> None:
        """HASlave.start and follow_epoch: reads stop at what this member knew confirmed
        (nothing after a start) until its master ships a confirm offset."""
        store = member.store
        assert store is not None
        link = SlaveLink(store, member.broker_id, join_tail=member.broker_id == self.tail_member)
        link.known_master_epoch = max(link.known_master_epoch, epoch)
        cap = store.read_cap
        store.set_read_cap(0 if cap == UNCAPPED else min(cap, store.commitlog.max_offset))
        member.slave = _SlaveSide(master_id, epoch, link)

    def _stop_slave(self, member: _Member) -> None:
        slave = member.slave
        if slave is None:
            return
        member.slave = None
        if slave.conn is not None:
            self._break(slave.conn)

    def _connect(self, member: _Member) -> None:
        slave = member.slave
        assert slave is not None
        slave.conn = _Conn(member.broker_id, slave.master_id)
        self._over(slave.conn, True, "handshake", slave.link.begin())

    def _on_slave_frame(self, member: _Member, conn: _Conn, kind: str, payload: object) -> None:
        slave, store = member.slave, member.store
        if slave is None or slave.conn is not conn or store is None:
            self._break(conn)
            return
        try:
            if kind == "reply":
                assert isinstance(payload, dict)
                following = slave.link.on_handshake_reply(payload)
                if following is not None:
                    self._over(conn, True, "handshake", following)
                    return
                if slave.link.last_cut is not None:
                    self.result.cuts += 1
            else:
                offset, data, confirm = payload  # type: ignore[misc]
                slave.link.on_transfer(offset, data)
                store.set_read_cap(confirm)
        except HamqError:
            self._break(conn)
            return
        self._over(conn, True, "ack", slave.link.ack())
        self._wait_flushed(member, slave)

    def _wait_flushed(self, member: _Member, slave: _SlaveSide) -> None:
        """``HASlave._wait_flushed`` on the flush service's group commit (members run sync
        flush): an fsync of the log as written now, completing a little later; what arrives
        meanwhile waits for the next one."""
        store = member.store
        assert store is not None
        if slave.link.flush_target() is not None:
            job = store.commitlog.detach_flush()
            self._at(self.fsync_rng.randint(1, FSYNC_MS_MAX), "slave_flushed", member, slave, job)

    def _slave_flushed(self, member: _Member, slave: _SlaveSide, job: Callable[[], int]) -> None:
        """``HASlave._flushed``: the fsync completed; ack what is durable, wait again."""
        if member.slave is not slave:
            return  # crashed (the fsync never completed) or no longer following that master
        job()
        slave.link.flushed()
        if slave.conn is not None and slave.link.attached:
            self._over(slave.conn, True, "ack", slave.link.ack())
            self._wait_flushed(member, slave)

    def _break(self, conn: _Conn) -> None:
        if not conn.live:
            return
        conn.live = False
        slave = self.members[conn.slave_id].slave
        if slave is not None and slave.conn is conn:
            slave.conn = None
            slave.reconnect_at = self.now + RECONNECT_MS
        owner = self.members[conn.master_id]
        if owner.master is not None:
            self._complete(owner.master.core.disconnect(conn))
            self._update_read_cap(owner)

    # -- clients --------------------------------------------------------------------------
    def _masters(self) -> list[_Member]:
        return [m for m in self.members.values() if m.master is not None and m.store is not None]

    def _send(self) -> None:
        masters = self._masters()
        if not masters:
            return
        member = self.rng.choice(masters)  # a stale route may name a deposed master
        master, store = member.master, member.store
        assert master is not None and store is not None
        if master.core.deposed or not self._reachable(CLIENT, _member(member.broker_id)):
            return  # HAMaster.check_quorum refuses: another member leads a newer epoch
        self.sends += 1
        queue_id = self.rng.randrange(QUEUES)
        body = b"s%d-%d:" % (self.seed, self.sends) + bytes(self.rng.randrange(10, 600))
        put, message = put_one(store, TOPIC, queue_id, body, self.sends)
        store.commitlog.flush()  # sync flush: the master's copy is on disk before any answer
        master.core.wait_for_acks(
            put.end_offset,
            0,
            self.now,
            SEND_TIMEOUT_MS,
            self._answered(member.broker_id, master.epoch, message),
        )
        for conn in list(master.core.slaves):
            assert isinstance(conn, _Conn)
            self._pump(member, conn)

    def _consume(self) -> None:
        """Pull one queue from any running member with a role, master or slave (a consumer
        may be sent to a slave): the store's read cap holds it to the confirm offset."""
        members = [m for m in self.members.values() if m.master or m.slave]
        if not members:
            return
        member = self.rng.choice(members)
        store = member.store
        assert store is not None
        if not self._reachable(CLIENT, _member(member.broker_id)):
            return
        queue_id = self.rng.randrange(QUEUES)
        got = store.get_messages(TOPIC, queue_id, self.consumed[queue_id], 8, 1 << 20)
        if got.status is not GetStatus.FOUND:
            return
        records = decode_records(
            bytes(got.records),
            self.consumed[queue_id],
            lambda h, index, queue_offset, props, body: (h, queue_offset, bytes(body)),
        )
        for header, queue_offset, body in records:
            self.checkers.on_read(
                AckedMessage(
                    TOPIC,
                    queue_id,
                    queue_offset,
                    offset_msg_id(header.physical_offset, 0),
                    body,
                    header.physical_offset,
                )
            )
            self.consumed[queue_id] = queue_offset + 1
            self.result.read += 1

    # -- ticks and faults -----------------------------------------------------------------
    def _tick(self) -> None:
        for peer in self.peers.values():
            if peer.process is not None:
                peer.process.tick(self.now)
                peer.process.scan(self.now)
                self._drain_peer(peer)
        for member in self.members.values():
            if member.store is None:
                continue
            self._member_tick(member)
            self._ha_tick(member)
            self._background(member.store)
        if self.faulty:
            self._inject_faults()
        if self.rng.random() < self.mix.send:
            self._send()
        if self.rng.random() < 0.3:
            self._consume()
        self._at(TICK_MS, "tick")

    def _background(self, store: MessageStore) -> None:
        """The flush service's periodic duties: the commit log's fsync of what no ack waits
        for (a slave's appends past its last group commit), then consume queues and
        checkpoint."""
        if self.now % FLUSH_MS == 0:
            store.commitlog.flush()
        if self.now % CHECKPOINT_MS == 0:
            store.flush_consume_queues()

    def _ha_tick(self, member: _Member) -> None:
        master, slave = member.master, member.slave
        if master is not None:
            for key in master.core.expire_silent(self.now, HOUSEKEEPING_MS):
                assert isinstance(key, _Conn)
                self._break(key)
            self._complete(master.core.expire_waiters(self.now))
        if slave is not None:
            if slave.conn is None and self.now >= slave.reconnect_at:
                self._connect(member)
            elif slave.conn is not None and slave.link.attached and self.now % HA_HEARTBEAT_MS == 0:
                self._over(slave.conn, True, "ack", slave.link.ack())

    def _inject_faults(self) -> None:
        rng, mix = self.rng, self.mix
        roll = rng.random()
        if roll < mix.member_crash:
            member = self.members[rng.choice(MEMBER_IDS)]
            if member.store is not None:
                self._crash_member(member)
        elif roll < mix.member_crash + mix.peer_crash:
            peer = self.peers[rng.choice(PEER_IDS)]
            if peer.process is not None:
                self._crash_peer(peer)
        masters = self._masters()
        if masters and rng.random() < mix.master_crash:
            self._crash_member(rng.choice(masters))
        if not self.blocked and rng.random() < mix.partition:
            self._partition()
        if rng.random() < mix.conn_break:
            member = self.members[rng.choice(MEMBER_IDS)]
            if member.slave is not None and member.slave.conn is not None:
                self._break(member.slave.conn)

    def _partition(self) -> None:
        """Cut a random subset off the rest: any nodes, the controller peers only, the
        data path only (members and the client), or a master alone off the controller or
        off its slaves; one way or both."""
        rng = self.rng
        masters = [_member(m.broker_id) for m in self._masters()]
        scopes = [NODES, tuple(map(_peer, PEER_IDS)), (*map(_member, MEMBER_IDS), CLIENT)]
        if masters:
            scopes += [(*masters[:1], *map(_peer, PEER_IDS)), tuple(map(_member, MEMBER_IDS))]
        scope = rng.choice(scopes)
        side = (
            [n for n in scope if rng.random() < 0.5]
            if scope[0] not in masters or rng.random() < 0.5
            else [scope[0]]
        )
        rest = [n for n in scope if n not in side]
        one_way = rng.random() < 0.3
        for a in side:
            for b in rest:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))
        self.result.partitions += 1
        self._at(rng.randint(50, 800), "heal")

    # -- running --------------------------------------------------------------------------
    def _handle(self, kind: str, args: tuple) -> None:
        if kind == "tick":
            self._tick()
        elif kind == "deliver":
            src, dst, payload = args
            if not self._reachable(src, dst):
                return
            if dst.startswith("c"):
                self._on_peer(self.peers[int(dst[1:])], src, payload)
            else:
                self._on_member_datagram(self.members[int(dst[1:])], payload)
        elif kind == "frame":
            conn, to_master, frame_kind, payload = args
            if not conn.live:
                return
            if to_master:
                self._on_master_frame(self.members[conn.master_id], conn, frame_kind, payload)
            else:
                self._on_slave_frame(self.members[conn.slave_id], conn, frame_kind, payload)
        elif kind == "slave_flushed":
            self._slave_flushed(*args)
        elif kind == "restart_member":
            self._start_member(self.members[args[0]])
        elif kind == "restart_peer":
            self._start_peer(self.peers[args[0]])
        elif kind == "heal":
            self.blocked.clear()

    def _run_until(self, end: int) -> None:
        while self.events and self.events[0][0] <= end:
            at, _, kind, args = heapq.heappop(self.events)
            self.now = at
            self._handle(kind, args)

    def _heal(self) -> None:
        """Faults stop: links heal, every process runs again."""
        self.faulty = False
        self.blocked.clear()
        later = ("restart_member", "restart_peer", "heal")
        self.events = [e for e in self.events if e[2] not in later]
        heapq.heapify(self.events)
        for peer in self.peers.values():
            if peer.process is None:
                self._start_peer(peer)
        for member in self.members.values():
            if member.store is None:
                self._start_member(member)

    def _final(self) -> None:
        processes = [p.process for p in self.peers.values() if p.process is not None]
        check_same_controller_state((p.node.config.node_id, p.state) for p in processes)
        group = processes[0].group(KEY)
        if group is None or group.master_id is None:
            raise InvariantViolation(f"no master {HEALED_MS} ms after healing: {group}")
        final = self.members[group.master_id]
        if final.master is None or final.master.epoch != group.master_epoch:
            raise InvariantViolation(
                f"member {group.master_id} is not master of epoch {group.master_epoch} "
                f"{HEALED_MS} ms after healing"
            )
        stores = {i: m.store for i, m in self.members.items() if m.store is not None}
        assert final.store is not None
        self.checkers.check_final(final.store, stores, final.broker_id)

    def run(self) -> ControllerResult:
        self._at(0, "tick")
        try:
            self._run_until(FAULTS_MS)
            self._heal()
            self._run_until(FAULTS_MS + HEALED_MS)
            self._final()
        except InvariantViolation as err:
            self.result.ok = False
            self.result.failure = str(err)
        self.result.elections = len(self.checkers.elected)
        return self.result


def run_controller_seed(seed: int) -> ControllerResult:
    return ControllerWorld(seed).run()


def failed_controller_seeds(first: int, count: int) -> list[ControllerResult]:
    """Seeds first..first+count-1 that failed (a picklable unit for a process pool)."""
    return [r for r in map(run_controller_seed, range(first, first + count)) if not r.ok]
