"""Master–slave replication (seed 000) under the simulator, on the production code of both
sides: the master's ``MessageStore`` + ``MasterReplication`` and each slave's
``MessageStore`` + slave handshake core, each store on its own ``SimDisk``, driven through
``MasterLink`` / ``SlaveLink`` exactly as ``broker/ha/service.py`` drives them over TCP.

One seed draws the group (1, 2 or 4 slaves), the quorum settings, the flush type, and
the faults: slaves that hang (SIGSTOP: frames wait, nothing is read), slaves and the
master killed (page cache survives) or losing power (unfsynced data lost or torn) and
restarted with store recovery, half-open sessions the master does not notice, broken
connections and delays; slaves dying at a disk step inside a cut, an append, a flush or
a checkpoint; retention on any member; each member's wall clock (store times, file times)
is skewed and steps at restarts. The workload is quorum sends, in some seeds all of one
size (records the master writes again after a loss land on the old boundaries), in some
with records larger than the flow-control window (a slave acks only whole records).
Checkers run at every event (see ``replica_checkers.py``); after the faults stop, every
slave must be attached again, sends acknowledged, and every slave must hold what the
master held halfway through the fault-free phase.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from hamq.broker.ha.service import MasterLink, SlaveLink
from hamq.config import StoreConfig
from hamq.errors import HamqError
from hamq.replication.master import MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.sim.fs import ProcessCrash, SimDisk
from hamq.sim.replica_checkers import (
    AckedMessage,
    InvariantViolation,
    check_held,
    check_readable,
    check_same_bytes,
    check_same_queues,
    put_one,
)
from hamq.store.message_store import MessageStore

TICK_MS = 10
SEND_TIMEOUT_MS = 300  # the waiting send's deadline (sync_flush_timeout_ms)
NS_TIMEOUT_MS = 400  # name server drops a member silent this long
HEARTBEAT_MS = 100  # slave ack heartbeat (ha_send_heartbeat_interval_ms)
HOUSEKEEPING_MS = 500  # master closes a silent session (ha_housekeeping_interval_ms)
RECONNECT_MS = 50  # slave waits this long before a new session
FLUSH_MS = 200  # async flush interval (flush_interval_commitlog_ms)
FSYNC_MS_MAX = 5  # a slave's group-commit fsync completes 1..this many ms after it starts
CHECKPOINT_MS = 400  # consume queues + checkpoint (flush_interval_consume_queue_ms)
WINDOW_BYTES = 64 * 1024
BATCH_BYTES = 16 * 1024
SEGMENT_BYTES = 32 * 1024  # small segments, so rolls and cuts across them happen
SAFETY_MS = 2500
LIVENESS_BOUND_MS = 2500
TOPIC = "T"
QUEUES = 4
STORE_DIR = "/store"
WALL_CLOCK_EPOCH_MS = 1_700_000_000_000
CLOCK_SKEW_MS_MAX = 5000
RETENTION_MS = 400  # file_reserved_hours: segments last written this long ago go
FIXED_BODY_BYTES = 600  # some seeds send one size: a rewrite lands on old boundaries


@dataclass(eq=False)  # compared and hashed by identity, like a socket
class _Conn:
    """One HA session's TCP connection; frames of a broken one are never delivered."""

    id: int
    member_id: int
    live: bool = True
    link_clear_ms: dict[str, int] = field(default_factory=dict)  # per direction: TCP order


@dataclass
class _Member:
    member_id: int
    disk: SimDisk
    store: MessageStore | None = None
    down_until: int = 0
    clock_skew_ms: int = 0  # its wall clock minus the world's; steps at restarts

    def up(self, now: int) -> bool:
        return self.store is not None and now >= self.down_until


@dataclass
class _Slave(_Member):
    link: SlaveLink | None = None
    conn: _Conn | None = None
    hung_until: int = 0
    reconnect_at: int = 0
    last_heard_ms: int = 0
    acked_end: int = 0  # its highest ack since it last attached: what it surely holds
    checked_upto: int = 0  # its log agrees with the master's up to here (while attached)
    inbox: list = field(default_factory=list)  # frames waiting while the process is stopped

    def active(self, now: int) -> bool:
        return self.up(now) and now >= self.hung_until


@dataclass(order=True)
class _Event:
    at: int
    seq: int
    kind: str = field(compare=False)
    args: tuple = field(compare=False, default=())


@dataclass
class MasterSlaveResult:
    seed: int
    ok: bool
    failure: str | None
    acked: int
    refused: int
    timed_out: int
    crashes: int = 0
    cuts: int = 0
    large_records: int = 0  # sends larger than the HA window


class MasterSlaveWorld:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        slaves = self.rng.choice([1, 2, 2, 4])
        total = slaves + 1
        in_sync = self.rng.randint(1, total)
        minimum = self.rng.randint(1, in_sync)
        self.quorum = QuorumConfig(
            total,
            in_sync,
            minimum,
            self.rng.random() < 0.7,
            ha_max_gap_not_in_sync=self.rng.choice([4096, 65536]),
        )
        self.sync_flush = self.rng.random() < 0.5
        self.config = StoreConfig(
            store_dir=STORE_DIR,
            disk_min_free_bytes=1,
            mapped_file_size_commitlog=SEGMENT_BYTES,
            file_reserved_hours=RETENTION_MS / 3_600_000,
            flush_disk_type="sync" if self.sync_flush else "async",
        )
        self.crash_probability = self.rng.choice([0.002, 0.005, 0.01])
        self.master_crash_probability = self.rng.choice([0.0, 0.002, 0.005])
        # Faults added later draw from their own stream, so older seeds replay unchanged.
        self.later_rng = random.Random(seed ^ 0x5EED)
        self.retention_probability = self.later_rng.choice([0.0, 0.005, 0.02, 0.05])
        self.fixed_body = self.later_rng.random() < 0.3
        # a slave dies inside a cut, an append, a flush or a checkpoint, at a disk step
        self.mid_crash_rng = random.Random(seed ^ 0xC4A5)
        # fsync latencies of the slaves' group commits: a stream of their own, so they do
        # not move the rest of a seed's schedule
        self.fsync_rng = random.Random(seed ^ 0xF5C)
        self.mid_crash_probability = self.mid_crash_rng.choice([0.0, 0.005, 0.02])
        # some seeds send records larger than the window, which reach a slave in pieces
        self.large_rng = random.Random(seed ^ 0xB16)
        self.large_probability = self.large_rng.choice([0.0, 0.0, 0.02, 0.05])
        self.large_records = 0
        self.caught_up_mark = 0  # the master's log end halfway through the fault-free phase
        self.now = 0
        self.events: list[_Event] = []
        self._seq = 0
        self._conn_ids = 0
        self.acked = self.refused = self.timed_out = self.crashes = self.cuts = 0
        self.acked_messages: list[AckedMessage] = []  # under sync flush: must survive
        self.outstanding: dict[int, tuple[int, int, AckedMessage]] = {}  # send -> end, need
        self.last_ok_ms = 0
        self.faults_until = SAFETY_MS
        self.master = _Member(0, SimDisk(), clock_skew_ms=self._skew())
        self.slaves = {i: _Slave(i, SimDisk(), clock_skew_ms=self._skew()) for i in range(1, total)}
        for member in (self.master, *self.slaves.values()):
            member.disk.clock = lambda m=member: self._wall_clock_ms(m) / 1000
        self._start_master()
        for s in self.slaves.values():
            self._start_slave(s)

    def _skew(self) -> int:
        return self.rng.randint(-CLOCK_SKEW_MS_MAX, CLOCK_SKEW_MS_MAX)

    def _wall_clock_ms(self, member: _Member) -> int:
        """What a member's wall clock reads (store times, file times): skewed, and stepped
        (possibly backwards) when it restarts."""
        return WALL_CLOCK_EPOCH_MS + self.now + member.clock_skew_ms

    # -- scheduling ------------------------------------------------------------------------
    def _at(self, delay: int, kind: str, *args) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(self.now + delay, self._seq, kind, args))

    def _over(self, conn: _Conn, to_master: bool, kind: str, payload) -> None:
        """Deliver after a random delay, in order per connection and direction (TCP)."""
        direction = "up" if to_master else "down"
        delay = self.rng.choice([1, 1, 2, 3, 5, 20]) if self.now < self.faults_until else 1
        at = max(self.now + delay, conn.link_clear_ms.get(direction, 0))
        conn.link_clear_ms[direction] = at
        self._at(at - self.now, "to_master" if to_master else "to_slave", conn, kind, payload)

    # -- processes -------------------------------------------------------------------------
    def _open_store(self, member: _Member) -> MessageStore:
        try:
            return MessageStore(self.config, lambda: self._wall_clock_ms(member), disk=member.disk)
        except HamqError as err:
            raise InvariantViolation(
                f"member {member.member_id} refused to start after a crash: {err.message}"
            ) from None

    def _start_master(self) -> None:
        self.master.store = self._open_store(self.master)
        self.core = MasterReplication(self.quorum, WINDOW_BYTES, BATCH_BYTES)
        self.link = MasterLink(self.core, self.master.store)
        self.sessions: dict[_Conn, int] = {}  # attached connections -> member id
        if self.sync_flush:
            check_readable(self.master.store, self.acked_messages)

    def _start_slave(self, s: _Slave) -> None:
        s.store = self._open_store(s)
        s.link = SlaveLink(s.store, s.member_id)
        s.reconnect_at = self.now

    def _crash(self, member: _Member, restart_ms: int) -> None:
        """kill -9, or (one time in two) a power loss: the store is reopened later."""
        self.crashes += 1
        if self.rng.random() < 0.5:
            member.disk.kill()
        else:
            member.disk.power_loss(self.rng)
        member.store = None
        member.down_until = self.now + restart_ms
        member.clock_skew_ms = self._skew()  # the clock may step at reboot, even backwards
        self._at(restart_ms, "restart", member.member_id)

    def _crash_master(self) -> None:
        self._crash(self.master, self.rng.randint(50, 600))
        for conn in list(self.sessions):
            self._break(conn, master_notices=False)
        for s in self.slaves.values():
            if s.conn is not None:
                self._break(s.conn, master_notices=False)
        self.outstanding.clear()  # their clients time out: not acknowledged

    def _crash_slave(self, s: _Slave) -> None:
        self._crash(s, self.rng.randint(50, 800))
        s.link = None
        s.inbox.clear()
        if s.conn is not None:
            # Half the time the master does not notice (a half-open session): it stays
            # until housekeeping drops it or the slave's next handshake replaces it.
            self._break(s.conn, master_notices=self.rng.random() < 0.5)

    def _restart(self, member_id: int) -> None:
        if member_id == 0:
            self._start_master()
        else:
            self._start_slave(self.slaves[member_id])

    # -- connections -----------------------------------------------------------------------
    def _connect(self, s: _Slave) -> None:
        self._conn_ids += 1
        s.conn = _Conn(self._conn_ids, s.member_id)
        self._over(s.conn, True, "handshake", s.link.begin())

    def _break(self, conn: _Conn, master_notices: bool = True) -> None:
        conn.live = False
        s = self.slaves[conn.member_id]
        if s.conn is conn:
            s.conn = None
            s.reconnect_at = self.now + RECONNECT_MS
        if master_notices and self.master.up(self.now):
            self.sessions.pop(conn, None)
            self._complete(self.core.disconnect(conn))

    # -- the master's side (HAMaster) ------------------------------------------------------
    def _on_master_frame(self, conn: _Conn, kind: str, payload) -> None:
        if not self.master.up(self.now):
            return
        if kind == "ack":
            self._complete(self.link.on_ack(conn, payload, self.now))
            self._pump(conn)
            return
        try:
            reply, attached = self.link.handshake(conn, payload, self.now)
        except HamqError:
            self._break(conn)
            return
        if attached is not None:
            # The master counts the slave as holding its log up to where it attached (the
            # slave's claim, proven by its last record), before the slave reads the reply.
            self.slaves[conn.member_id].acked_end = attached.start
            for stale in attached.replaced:
                self.sessions.pop(stale, None)
                self._break(stale)
            self.sessions[conn] = conn.member_id
        self._over(conn, False, "reply", reply)
        if attached is not None:
            self._pump(conn)

    def _pump(self, conn: _Conn) -> None:
        try:
            for offset, data in self.link.transfers(conn, self.now):
                if conn.live:
                    self._over(conn, False, "transfer", (offset, bytes(data)))
        except HamqError:  # retention removed what it needs: HAMaster closes the session
            self._break(conn)

    def _send(self) -> None:
        store = self.master.store
        decision = self.core.decide(self._alive_replicas(), store.commitlog.max_offset)
        if not decision.enough:
            self.refused += 1
            return
        self._seq += 1
        send_id, queue_id = self._seq, self.rng.randrange(QUEUES)
        size = self.rng.randrange(20, 1500)
        if not self.fixed_body and self.large_rng.random() < self.large_probability:
            size = self.large_rng.randrange(WINDOW_BYTES, 2 * WINDOW_BYTES)
            self.large_records += 1
        body = (
            (b"m%d:" % send_id).ljust(FIXED_BODY_BYTES, b"\0")
            if self.fixed_body
            else b"m%d:" % send_id + bytes(size)
        )
        put, message = put_one(store, TOPIC, queue_id, body, send_id)
        if self.sync_flush:
            store.commitlog.flush()  # group commit: this send's fsync, before any answer
        self.outstanding[send_id] = (put.end_offset, decision.need_ack_nums, message)
        self.core.wait_for_acks(
            put.end_offset,
            decision.need_ack_nums,
            self.now,
            SEND_TIMEOUT_MS,
            lambda status: self._done(send_id, status),
        )
        for conn in list(self.sessions):
            self._pump(conn)

    def _done(self, send_id: int, status: ReplicaStatus) -> None:
        if send_id not in self.outstanding:
            raise InvariantViolation(f"send {send_id} completed twice")
        end, need, message = self.outstanding.pop(send_id)
        if status is ReplicaStatus.PUT_OK:
            check_held(end, need, {i: s.acked_end for i, s in self.slaves.items()})
            self.acked += 1
            self.last_ok_ms = self.now
            if self.sync_flush:
                self.acked_messages.append(message)
        else:
            self.timed_out += 1

    def _complete(self, done) -> None:
        for callback, status in done:
            callback(status)

    def _alive_replicas(self) -> int:
        return 1 + sum(
            1 for s in self.slaves.values() if self.now - s.last_heard_ms <= NS_TIMEOUT_MS
        )

    # -- the slave's side (HASlave) --------------------------------------------------------
    def _on_slave_frame(self, conn: _Conn, kind: str, payload) -> None:
        s = self.slaves[conn.member_id]
        if s.conn is not conn:
            return
        if self.now < s.hung_until or s.inbox:
            # TCP keeps it for the stopped process, in order, until it reads again.
            if not s.inbox:
                self._at(s.hung_until - self.now, "resume", s.member_id)
            s.inbox.append((conn, kind, payload))
            return
        if (
            self.now < self.faults_until
            and self.mid_crash_rng.random() < self.mid_crash_probability
        ):
            s.disk.crash_after(self.mid_crash_rng.randrange(12))
        try:
            if kind == "reply":
                following = s.link.on_handshake_reply(payload)
                if following is not None:
                    self._over(conn, True, "handshake", following)
                    return
                self._attached(s)
            else:
                s.link.on_transfer(*payload)
        except HamqError:
            self._break(conn)
            return
        except ProcessCrash:
            self._crash_slave(s)
            return
        self._ack(s, conn)
        self._wait_flushed(s)

    def _ack(self, s: _Slave, conn: _Conn) -> None:
        s.acked_end = max(s.acked_end, s.link.ack_offset)
        self._over(conn, True, "ack", s.link.ack())

    def _wait_flushed(self, s: _Slave) -> None:
        """``HASlave._wait_flushed`` under sync flush: the group commit's fsync of the log
        as written now completes a little later; the slave acks then (its acks vouch for
        fsynced records only)."""
        if s.link.flush_target() is not None:
            job = s.store.commitlog.detach_flush()
            self._at(self.fsync_rng.randint(1, FSYNC_MS_MAX), "slave_flushed", s, s.link, job)

    def _slave_flushed(self, s: _Slave, link: SlaveLink, job: Callable[[], int]) -> None:
        """``HASlave._flushed``: ack what the fsync made durable, then wait again."""
        if s.link is not link:
            return  # crashed before the fsync completed
        if self.now < s.hung_until:  # stopped: its fsync thread completes when it runs
            self._at(s.hung_until - self.now, "slave_flushed", s, link, job)
            return
        if not self._survives(s, job):
            return
        link.flushed()
        if s.conn is not None and link.attached:
            self._ack(s, s.conn)
            self._wait_flushed(s)

    def _attached(self, s: _Slave) -> None:
        if s.link.last_cut is not None:
            self.cuts += 1
        s.acked_end = s.link.ack_offset
        s.checked_upto = check_same_bytes(self.master.store, s.store, s.member_id, 0)
        check_same_queues(self.master.store, s.store, s.member_id)

    def _resume(self, member_id: int) -> None:
        s = self.slaves[member_id]
        inbox, s.inbox = s.inbox, []
        for held in inbox:
            self._on_slave_frame(*held)

    # -- ticks -----------------------------------------------------------------------------
    def _tick(self) -> None:
        if self.master.up(self.now):
            self._complete(self.core.expire_waiters(self.now))
            for conn in self.core.expire_silent(self.now, HOUSEKEEPING_MS):
                self._break(conn)
            self._background(self.master.store)
        for s in self.slaves.values():
            if not s.active(self.now):
                continue
            s.last_heard_ms = self.now
            if not self._survives(s, self._background, s.store):
                continue
            if s.conn is None and self.now >= s.reconnect_at and self.master.up(self.now):
                self._connect(s)
            elif s.conn is not None and s.link.attached and self.now % HEARTBEAT_MS == 0:
                self._ack(s, s.conn)
        self._check_attached()
        if self.now < self.faults_until:
            self._inject_faults()
        elif self.now == self.faults_until + LIVENESS_BOUND_MS // 2 and self.master.up(self.now):
            self.caught_up_mark = self.master.store.commitlog.max_offset
        if self.master.up(self.now) and self.rng.random() < 0.5:
            self._send()
        self._at(TICK_MS, "tick")

    def _survives(self, s: _Slave, duty, *args) -> bool:
        """Run a slave's store duty; False if the slave died in it (an armed crash)."""
        try:
            duty(*args)
            return True
        except ProcessCrash:
            self._crash_slave(s)
            return False

    def _background(self, store: MessageStore) -> None:
        """The flush service's periodic duties (async fsync, queue checkpoint)."""
        if self.now % FLUSH_MS == 0:
            store.commitlog.flush()
        if self.now % CHECKPOINT_MS == 0:
            store.flush_consume_queues()

    def _check_attached(self) -> None:
        if not self.master.up(self.now):
            return
        for s in self.slaves.values():
            if s.up(self.now) and s.conn is not None and s.link.attached:
                s.checked_upto = check_same_bytes(
                    self.master.store, s.store, s.member_id, s.checked_upto
                )

    def _inject_faults(self) -> None:
        if self.later_rng.random() < self.retention_probability:
            # retention runs on any member, whatever its slaves or its master still need
            member = self.later_rng.choice([self.master, *self.slaves.values()])
            if member is self.master and member.up(self.now):
                member.store.delete_expired()
            elif member.up(self.now):
                self._survives(member, member.store.delete_expired)
        roll = self.rng.random()
        s = self.slaves[self.rng.choice(list(self.slaves))]
        if roll < 0.01:
            if s.active(self.now):  # SIGSTOP for a while: connection stays, nothing is read
                s.hung_until = self.now + self.rng.randint(100, 1500)
        elif roll < 0.01 + self.crash_probability:
            if s.up(self.now):
                self._crash_slave(s)
        elif roll < 0.015 + self.crash_probability:
            if s.conn is not None:  # the network breaks the connection
                self._break(s.conn)
        elif roll < 0.015 + self.crash_probability + self.master_crash_probability:
            if self.master.up(self.now):
                self._crash_master()

    # -- running ---------------------------------------------------------------------------
    def _handle(self, ev: _Event) -> None:
        if ev.kind == "tick":
            self._tick()
        elif ev.kind == "to_master":
            conn, kind, payload = ev.args
            if conn.live:
                self._on_master_frame(conn, kind, payload)
        elif ev.kind == "to_slave":
            conn, kind, payload = ev.args
            if conn.live:
                self._on_slave_frame(conn, kind, payload)
        elif ev.kind == "slave_flushed":
            self._slave_flushed(*ev.args)
        elif ev.kind == "resume":
            self._resume(ev.args[0])
        elif ev.kind == "restart":
            self._restart(ev.args[0])

    def _finish(self) -> None:
        """Faults are over and the group had time to heal: every member agrees."""
        if (
            self.quorum.enable_auto_in_sync_replicas
            and self.last_ok_ms < self.faults_until
            and self.quorum.min_in_sync_replicas <= len(self.slaves) + 1
        ):
            raise InvariantViolation("no send acknowledged in the fault-free phase")
        for s in self.slaves.values():
            if not (s.up(self.now) and s.conn is not None and s.link.attached):
                raise InvariantViolation(
                    f"slave {s.member_id} is not attached "
                    f"{LIVENESS_BOUND_MS} ms after the faults stopped"
                )
            if s.store.commitlog.max_offset < self.caught_up_mark:
                raise InvariantViolation(
                    f"slave {s.member_id} holds the log up to "
                    f"{s.store.commitlog.max_offset} only; the master held "
                    f"{self.caught_up_mark} {LIVENESS_BOUND_MS // 2} ms before the end"
                )
            check_same_bytes(self.master.store, s.store, s.member_id, 0)
            check_same_queues(self.master.store, s.store, s.member_id)
        if self.sync_flush:
            check_readable(self.master.store, self.acked_messages)

    def run(self) -> MasterSlaveResult:
        self._at(0, "tick")
        failure = None
        try:
            while self.events:
                ev = heapq.heappop(self.events)
                self.now = ev.at
                self._handle(ev)
                if self.now > self.faults_until + LIVENESS_BOUND_MS:
                    break
            self._finish()
        except InvariantViolation as err:
            failure = str(err)
        return MasterSlaveResult(
            self.seed,
            failure is None,
            failure,
            self.acked,
            self.refused,
            self.timed_out,
            self.crashes,
            self.cuts,
            self.large_records,
        )


def run_master_slave_seed(seed: int) -> MasterSlaveResult:
    return MasterSlaveWorld(seed).run()


def failed_master_slave_seeds(first: int, count: int) -> list[MasterSlaveResult]:
    """Seeds first..first+count-1 that failed (for a process pool)."""
    return [r for r in map(run_master_slave_seed, range(first, first + count)) if not r.ok]
