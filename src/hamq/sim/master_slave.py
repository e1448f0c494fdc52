"""Master–slave replication (seed 000) under the simulator.

The same ``MasterReplication`` core the broker runs, driven in virtual time: slaves that
hang (SIGSTOP) and come back, crash and reconnect from their log end, a network that delays
and breaks connections, a name server that drops silent members after a timeout, and a
workload of quorum sends. Invariants, checked at every event:
- a send acknowledged PUT_OK with ``needAckNums = k`` is held by at least k members at that
  moment, so it survives the loss of any k - 1 of them;
- no slave ever holds bytes the master does not (slaves only append what was shipped);
- a refused send (IN_SYNC_REPLICAS_NOT_ENOUGH) is never stored; a waiting send ends once;
- once faults stop, with automatic degradation, sends are acknowledged again within a bound.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from hamq.replication.master import MasterReplication, Probe, ReplicaStatus
from hamq.replication.quorum import QuorumConfig

TICK_MS = 10
SEND_TIMEOUT_MS = 300         # the waiting send's deadline (sync_flush_timeout_ms)
NS_TIMEOUT_MS = 400           # name server drops a member silent this long
HEARTBEAT_MS = 100            # slave ack heartbeat (ha_send_heartbeat_interval_ms)
WINDOW_BYTES = 64 * 1024
BATCH_BYTES = 16 * 1024
SAFETY_MS = 4000
LIVENESS_BOUND_MS = 3000


class InvariantViolation(AssertionError):
    pass


@dataclass
class _OffsetsOnly:
    """The master's log as offsets without records: every slave end is a boundary."""
    max_offset: int
    min_offset: int = 0

    def probe(self, offset: int) -> Probe | None:
        return Probe(offset, offset + 1, 0) if offset < self.max_offset else None


@dataclass
class _Slave:
    member_id: int
    log_end: int = 0
    session: int = 0            # bumps on every reconnect: frames of old sessions are dropped
    hung_until: int = 0
    down_until: int = 0
    last_heard_ms: int = 0      # by the name server
    inbox: list = field(default_factory=list)  # frames waiting while the process is stopped

    def active(self, now: int) -> bool:
        return now >= self.hung_until and now >= self.down_until


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


class MasterSlaveWorld:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        slaves = self.rng.choice([1, 2, 4])
        total = slaves + 1
        in_sync = self.rng.randint(1, total)
        minimum = self.rng.randint(1, in_sync)
        self.quorum = QuorumConfig(total, in_sync, minimum, self.rng.random() < 0.7,
                                   ha_max_gap_not_in_sync=self.rng.choice([4096, 65536]))
        self.core = MasterReplication(self.quorum, WINDOW_BYTES, BATCH_BYTES)
        self.slaves = {i: _Slave(i) for i in range(1, slaves + 1)}
        self.master_end = 0
        self.now = 0
        self.events: list[_Event] = []
        self._link_clear: dict[tuple, int] = {}
        self._seq = 0
        self.acked = self.refused = self.timed_out = 0
        self.outstanding: dict[int, tuple[int, int]] = {}  # send id -> (end, need)
        self.last_ok_ms = 0
        self.faults_until = SAFETY_MS
        for s in self.slaves.values():
            self._connect(s)

    # -- scheduling ------------------------------------------------------------------------
    def _at(self, delay: int, kind: str, *args) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(self.now + delay, self._seq, kind, args))

    def _delay(self) -> int:
        return self.rng.choice([1, 1, 2, 3, 5, 20]) if self.now < self.faults_until else 1

    def _over_link(self, link: tuple, kind: str, *args) -> None:
        """Deliver after a random delay, but in order per connection and direction (TCP)."""
        at = max(self.now + self._delay(), self._link_clear.get(link, 0))
        self._link_clear[link] = at
        self._at(at - self.now, kind, *args)

    # -- the world -------------------------------------------------------------------------
    def _connect(self, s: _Slave) -> None:
        s.session += 1
        attached = self.core.attach((s.member_id, s.session), s.member_id, s.log_end, None,
                                    _OffsetsOnly(self.master_end), self.now)
        assert attached.start == s.log_end
        self._pump()

    def _alive_replicas(self) -> int:
        return 1 + sum(1 for s in self.slaves.values()
                       if self.now - s.last_heard_ms <= NS_TIMEOUT_MS)

    def _pump(self) -> None:
        for (member_id, session) in list(self.core.slaves):
            while (span := self.core.next_transfer((member_id, session), self.master_end)):
                self._over_link((member_id, session, "down"), "transfer", member_id, session,
                                *span)

    def _send(self) -> None:
        decision = self.core.decide(self._alive_replicas(), self.master_end)
        if not decision.enough:
            self.refused += 1
            return
        self.master_end += self.rng.randint(100, 3000)
        send_id = self._seq
        end, need = self.master_end, decision.need_ack_nums
        self.outstanding[send_id] = (end, need)
        self.core.wait_for_acks(end, need, self.now, SEND_TIMEOUT_MS,
                                lambda status, i=send_id: self._done(i, status))
        self._pump()

    def _done(self, send_id: int, status: ReplicaStatus) -> None:
        if send_id not in self.outstanding:
            raise InvariantViolation(f"send {send_id} completed twice")
        end, need = self.outstanding.pop(send_id)
        if status is ReplicaStatus.PUT_OK:
            holders = 1 + sum(1 for s in self.slaves.values() if s.log_end >= end)
            if holders < need:
                raise InvariantViolation(f"PUT_OK for offset {end} with needAckNums={need} "
                                         f"but only {holders} members hold it")
            self.acked += 1
            self.last_ok_ms = self.now
        else:
            self.timed_out += 1

    def _handle(self, ev: _Event) -> None:
        if ev.kind == "tick":
            self._tick()
        elif ev.kind == "transfer":
            member_id, session, start, end = ev.args
            s = self.slaves[member_id]
            if session != s.session:
                return  # sent on a connection that broke meanwhile
            if self.now < s.hung_until or s.inbox:
                # TCP keeps it for the stopped process, in order, until it reads again.
                if not s.inbox:
                    self._at(s.hung_until - self.now, "resume", member_id)
                s.inbox.append(ev)
                return
            if start != s.log_end:
                raise InvariantViolation(f"slave {member_id} got bytes at {start} but its "
                                         f"log ends at {s.log_end} on one connection")
            s.log_end = end
            if s.log_end > self.master_end:
                raise InvariantViolation(f"slave {member_id} is ahead of its master")
            self._over_link((member_id, session, "up"), "ack", member_id, session, end)
        elif ev.kind == "resume":
            inbox, self.slaves[ev.args[0]].inbox = self.slaves[ev.args[0]].inbox, []
            for held in inbox:
                self._handle(held)
        elif ev.kind == "ack":
            member_id, session, end = ev.args
            if (member_id, session) in self.core.slaves:
                for callback, status in self.core.on_ack((member_id, session), end, self.now):
                    callback(status)
                self._pump()

    def _tick(self) -> None:
        for callback, status in self.core.expire_waiters(self.now):
            callback(status)
        for s in self.slaves.values():
            if not s.active(self.now):
                continue
            if (s.member_id, s.session) not in self.core.slaves:
                self._connect(s)  # back from a crash or a broken connection
            s.last_heard_ms = self.now
            if self.now % HEARTBEAT_MS == 0:
                self._over_link((s.member_id, s.session, "up"), "ack", s.member_id, s.session,
                                s.log_end)
        if self.now < self.faults_until:
            self._inject_faults()
        if self.rng.random() < 0.6:
            self._send()
        self._at(TICK_MS, "tick")

    def _inject_faults(self) -> None:
        roll = self.rng.random()
        s = self.slaves[self.rng.choice(list(self.slaves))]
        if roll < 0.01:  # SIGSTOP for a while: connection stays, nothing is read
            s.hung_until = self.now + self.rng.randint(100, 1500)
        elif roll < 0.015:  # crash: the connection breaks; it reconnects from its log end
            s.down_until = self.now + self.rng.randint(50, 800)
            self._disconnect(s)
        elif roll < 0.02:  # the network breaks the connection
            self._disconnect(s)

    def _disconnect(self, s: _Slave) -> None:
        for callback, status in self.core.disconnect((s.member_id, s.session)):
            callback(status)
        s.session += 1

    # -- running ---------------------------------------------------------------------------
    def run(self) -> MasterSlaveResult:
        self._at(0, "tick")
        try:
            while self.events:
                ev = heapq.heappop(self.events)
                self.now = ev.at
                self._handle(ev)
                if self.now > self.faults_until + LIVENESS_BOUND_MS:
                    break
            if self.quorum.enable_auto_in_sync_replicas and \
                    self.last_ok_ms < self.faults_until and \
                    self.quorum.min_in_sync_replicas <= 1 + len(self.slaves):
                raise InvariantViolation("no send acknowledged in the fault-free phase")
        except InvariantViolation as err:
            return MasterSlaveResult(self.seed, False, str(err), self.acked, self.refused,
                                     self.timed_out)
        return MasterSlaveResult(self.seed, True, None, self.acked, self.refused,
                                 self.timed_out)


def run_master_slave_seed(seed: int) -> MasterSlaveResult:
    return MasterSlaveWorld(seed).run()
