"""The master's side of master–slave HA, sans-IO: the consistency check at the handshake,
slave progress, the in-sync count, flow control, and the group-commit waiters of sync
replication.

Time comes in as ``now_ms``; outputs are return values (what to send, which waiters
finished); the commit log is read through a ``RecordLog``. The asyncio shell
(``broker/ha/service.py``) and the simulator (``sim/master_slave.py``) drive the same object.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from itertools import pairwise
from typing import Protocol

from hamq.errors import InvalidArgument
from hamq.replication.consistent_point import EpochEntry
from hamq.replication.quorum import AckDecision, QuorumConfig, decide, is_in_sync
from hamq.replication.sync_state_set import SyncStateSet


class HAConnectionState(IntEnum):
    """RocketMQ's HAConnectionState names."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class ReplicaStatus(Enum):
    """How a waiting send ended (``PutMessageStatus`` subset)."""

    PUT_OK = "PUT_OK"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


# Records compared per handshake round: finding where two logs part takes
# log_(MAX_PROBES + 1)(records) rounds (four for a million records).
MAX_PROBES = 64


class HandshakeError(InvalidArgument):
    """A handshake request no slave core would send (the peer broke the protocol)."""


@dataclass(frozen=True)
class Probe:
    """One record as two members compare it: where it starts and ends, and the CRC of its
    header. The header covers the payload CRC, the offsets and the store time, so equal
    probes mean equal records, and a record written again after a master lost its tail
    (a later store time) differs from the one a slave kept."""

    offset: int
    end: int
    fingerprint: int

    def to_wire(self) -> list[int]:
        return [self.offset, self.end, self.fingerprint]

    @classmethod
    def from_wire(cls, raw: object) -> Probe:
        if not (
            isinstance(raw, list)
            and len(raw) == 3
            and all(type(v) is int for v in raw)
            and 0 <= raw[0] < raw[1]
        ):
            raise HandshakeError(f"malformed record probe {raw!r}")
        return cls(*raw)


def epochs_to_wire(entries: Sequence[EpochEntry]) -> list[list[int]]:
    return [[entry.epoch, entry.start_offset] for entry in entries]


def epochs_from_wire(raw: object) -> tuple[EpochEntry, ...]:
    """A peer's epoch entries off the wire: ascending epochs and start offsets."""
    if not isinstance(raw, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and v >= 0 for v in pair)
        for pair in raw
    ):
        raise HandshakeError(f"epoch entries must be [[epoch, start offset], ...], not {raw!r}")
    entries = tuple(EpochEntry(epoch, start) for epoch, start in raw)
    for before, entry in pairwise(entries):
        if entry.epoch <= before.epoch or entry.start_offset < before.start_offset:
            raise HandshakeError(f"epoch entries out of order: {raw!r}")
    return entries


class RecordLog(Protocol):
    """What the HA cores read of a member's commit log (``broker/ha/service.py`` adapts the
    store)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def probe(self, offset: int) -> Probe | None:
        """The whole, valid record starting at ``offset``, or None."""

    def record_starts(self, lo: int, hi: int) -> Sequence[int]:
        """Start offsets of the records known to begin in [lo, hi), ascending."""

    def last_record_start(self) -> int | None:
        """Start of the log's last record, or None for an empty log."""


@dataclass(frozen=True)
class SlaveAttached:
    start: int  # where transfer starts: the slave cuts or restarts its log here
    replaced: list[Hashable]  # older sessions of the same broker id, dropped: close them


@dataclass(frozen=True)
class Restart:
    """What a slave's next attach does instead of continuing its log (seed 003's
    sync-queue and cancel-sync-queue): restart it at ``offset`` (None: at the master's
    end, a tail join) and ship at most ``batch_records`` records per transfer (0: no
    limit)."""

    offset: int | None
    batch_records: int = 0


@dataclass
class SlaveProgress:
    key: Hashable
    broker_id: int
    state: HAConnectionState
    ack_offset: int  # its whole records written: what counts for quorum and in sync
    # What it has taken in, a partial last record included: what flow control counts. A
    # record (a whole producer batch) can be larger than the window, and the slave acks it
    # only once all of it has arrived.
    received_offset: int
    sent_offset: int  # next byte the master sends it
    last_heard_ms: int
    log_start: int = 0  # its commit-log min offset
    batch_records: int = 0  # records per transfer at most (0: bytes alone bound it)
    sync_start: int | None = None  # where a sync-queue restarted its log (None: no sync)
    sync_batches: int = 0  # transfers its batch of records cut short since that restart
    # Its replication lag in time (RocketMQ's lastCaughtUpTime): the master's max offset and
    # the time at the last transfer; an ack reaching that offset means it had caught up then.
    transfer_max_offset: int = 0
    transfer_ms: int = 0
    caught_up_ms: int = 0


AckCallback = Callable[[ReplicaStatus], None]


@dataclass
class AckWaiter:
    offset: int  # commit-log end of the send
    need_slaves: int  # acks needed besides the master's own copy
    deadline_ms: int
    callback: AckCallback


class MasterReplication:
    """``sync_state_set`` (controller mode) tracks the SyncStateSet; with ``all_ack`` too
    (``all_ack_in_sync_state_set``) every send waits for each member of its effective set
    instead of a count of slaves, in one more ordered deque."""

    def __init__(
        self,
        quorum: QuorumConfig,
        window_bytes: int,
        transfer_batch_bytes: int,
        sync_state_set: SyncStateSet | None = None,
        all_ack: bool = False,
    ) -> None:
        assert transfer_batch_bytes <= window_bytes
        assert sync_state_set is not None or not all_ack
        self.quorum = quorum
        self.window_bytes = window_bytes
        self.transfer_batch_bytes = transfer_batch_bytes
        self.sync_state_set = sync_state_set
        self.all_ack = all_ack
        self.slaves: dict[Hashable, SlaveProgress] = {}
        # Group commit per distinct need: each deque is ordered by offset and deadline, so a
        # waiter needing more acks never holds back a later one needing fewer.
        self.waiters: dict[int, deque[AckWaiter]] = {}
        # all-ack: done once every member of the effective set holds the offset. Not
        # failed when a member disconnects: the shrink that drops it lets them complete.
        self.all_ack_waiters: deque[AckWaiter] = deque()
        # Controller mode: the master epoch this member leads, and the highest it heard
        # of. A higher one means another member was elected: this one is deposed and
        # acknowledges nothing more (apache/rocketmq #7017, #6316).
        self.epoch = 0
        self.highest_epoch = 0
        # A slave holds records of this master's own epoch that its log no longer has (a
        # power loss took them after they were acknowledged): it must not lead on.
        self.lost_records = False
        # Slaves whose next attach restarts their log (sync-queue, cancel), by broker id.
        self.restarts: dict[int, Restart] = {}

    # -- epochs -------------------------------------------------------------------------------
    @property
    def deposed(self) -> bool:
        return self.highest_epoch > self.epoch or self.lost_records

    def start_epoch(self, epoch: int) -> None:
        """This member leads ``epoch`` (its epoch file has it already)."""
        if epoch < self.epoch:
            raise ValueError(f"master epoch {epoch} is older than this member's {self.epoch}")
        self.epoch = epoch
        self.highest_epoch = max(self.highest_epoch, epoch)
        self.lost_records = False

    def lose_records(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        """A slave holds records of this master's epoch past where the two logs agree:
        only this master could have shipped them, so its own log lost them. Cutting them
        from the slave would lose acknowledged sends; this master stops acknowledging
        instead, and every waiting send fails."""
        self.lost_records = True
        return self.fail_all()

    def learn_epoch(self, epoch: int) -> list[tuple[AckCallback, ReplicaStatus]]:
        """A peer knows master epoch ``epoch``. One above ours deposes this master: every
        waiting send fails now (and ``wait_for_acks`` refuses new ones)."""
        self.highest_epoch = max(self.highest_epoch, epoch)
        return self.fail_all() if self.deposed else []

    # -- slave lifecycle --------------------------------------------------------------------
    def compare(
        self, log: RecordLog, probes: Sequence[Probe], limit: int | None = None
    ) -> list[bool]:
        """Which of a slave's records this master holds identically (a handshake round).
        ``limit``: the consistent point of the two members' epochs; no record ending past
        it agrees, whatever its bytes."""
        if len(probes) > MAX_PROBES:
            raise HandshakeError(
                f"{len(probes)} probes in one handshake round; at most {MAX_PROBES}"
            )
        return [(limit is None or p.end <= limit) and log.probe(p.offset) == p for p in probes]

    def attach(
        self,
        key: Hashable,
        broker_id: int,
        offset: int,
        proof: Probe | None,
        log: RecordLog,
        now_ms: int,
        limit: int | None = None,
        log_start: int | None = None,
        tail: bool = False,
    ) -> SlaveAttached | None:
        """Register a slave whose log agrees with ours up to ``offset``: ``proof`` is its
        record ending there, or None when ``offset`` is its log's start. None if the proof
        does not match our record (the slave then looks further back). A slave's older
        session (half-open after a crash) is replaced, so each broker id counts once.
        ``limit`` as for ``compare``. ``log_start``: where the slave's log starts (None:
        its start is ``offset`` if empty, else unknown, taken as 0). ``tail``: an empty
        slave asks to start at our end (``ha_join = "tail"``). A pending ``Restart`` of
        this broker id overrides both (sync-queue, cancel-sync-queue)."""
        if proof is not None:
            if (
                proof.end != offset
                or (limit is not None and offset > limit)
                or log.probe(proof.offset) != proof
            ):
                return None
            start = max(offset, log.min_offset)
        elif log.min_offset < offset and (
            offset == log.max_offset or log.probe(offset) is not None
        ):
            start = offset  # an empty slave log starting at one of our record boundaries
        else:
            start = log.min_offset  # nothing agrees: the slave restarts from our first byte
        if proof is None and tail:
            start = log.max_offset  # a new mirror: only what is published from now on
        held_from = start if proof is None or start != offset else (log_start or 0)
        restart = None if self.may_be_elected(broker_id) else self.restarts.pop(broker_id, None)
        sync_start, batch_records = None, 0
        if restart is not None:
            if restart.offset is None:
                target = log.max_offset
            else:
                target = max(restart.offset, log.min_offset)
            # a sync only ever lowers where the log starts; a cancel always restarts
            if restart.offset is None or target < held_from:
                start = held_from = target
                sync_start = None if restart.offset is None else target
                batch_records = restart.batch_records
        replaced = [k for k, s in self.slaves.items() if s.broker_id == broker_id and k != key]
        for k in replaced:
            self.slaves.pop(k).state = HAConnectionState.SHUTDOWN
        self.slaves[key] = SlaveProgress(
            key,
            broker_id,
            HAConnectionState.TRANSFER,
            start,
            start,
            start,
            now_ms,
            held_from,
            batch_records,
            sync_start,
            caught_up_ms=now_ms,  # its lag in time counts from its attach
        )
        if self.sync_state_set is not None:
            self.sync_state_set.on_connect(broker_id, start, now_ms, held_from)
        return SlaveAttached(start, replaced)

    def restart(self, broker_id: int, restart: Restart) -> None:
        """The slave's next attach restarts its log as ``restart`` says; the shell closes
        its session now so that it attaches again (for a member the controller may still
        elect, once it may not: ``may_be_elected``)."""
        self.restarts[broker_id] = restart

    def may_be_elected(self, broker_id: int) -> bool:
        """Whether the controller may hold ``broker_id`` in the SyncStateSet (the effective
        set: a shrink counts only once applied). Such a member's log is never restarted,
        however stale its place (the need offset dropped below its start just now): an
        election in between would promote an emptied log. Its pending restart waits."""
        sss = self.sync_state_set
        return sss is not None and broker_id in sss.effective

    def syncing(self) -> set[int]:
        """Slaves filling the history toward synchronised: a sync-queue restart pending, or
        attached outside the effective set with their log starting at or below the need
        offset. Judged from the state, not from the session a sync began: a slave killed
        and restarted mid-sync (or reattached to a new master) refills from where its log
        starts as an ordinary catch-up, and is still syncing (cancel-sync-queue stops it)."""
        sss = self.sync_state_set
        pending = {b for b, r in self.restarts.items() if r.offset is not None}
        if sss is None or sss.need_offset is None:
            return pending
        filling = {
            s.broker_id
            for s in self.slaves.values()
            if s.broker_id not in sss.effective and s.log_start <= sss.need_offset
        }
        return pending | filling

    def disconnect(self, key: Hashable) -> list[tuple[AckCallback, ReplicaStatus]]:
        """A slave went away; waiters that can no longer be satisfied end now."""
        progress = self.slaves.pop(key, None)
        if progress is not None:
            progress.state = HAConnectionState.SHUTDOWN
            if self.sync_state_set is not None and progress.broker_id not in self._connected():
                self.sync_state_set.on_disconnect(progress.broker_id)
        return self._fail_unreachable()

    # -- transfer ---------------------------------------------------------------------------
    def next_transfer(
        self,
        key: Hashable,
        master_max_offset: int,
        now_ms: int,
        clip: Callable[[int, int, int], int] | None = None,
    ) -> tuple[int, int] | None:
        """The next range [start, end) to ship to a slave, within its flow-control window:
        the bytes on the wire, shipped but not yet received. (Counting those not yet in whole
        records, a record larger than the window never got its last bytes shipped.) A
        slave syncing in batches gets at most its ``batch_records`` records:
        ``clip(start, end, n)`` is where the n-th whole record after ``start`` ends, at
        most ``end`` (the log's record walk)."""
        s = self.slaves.get(key)
        if s is None or s.state is not HAConnectionState.TRANSFER:
            return None
        room = self.window_bytes - (s.sent_offset - s.received_offset)
        end = min(master_max_offset, s.sent_offset + min(room, self.transfer_batch_bytes))
        if end <= s.sent_offset:
            return None
        if s.batch_records and clip is not None:
            batch_end = clip(s.sent_offset, end, s.batch_records)
            if batch_end < end:
                end = batch_end
                s.sync_batches += 1
        start, s.sent_offset = s.sent_offset, end
        s.transfer_max_offset, s.transfer_ms = master_max_offset, now_ms
        if self.sync_state_set is not None:
            self.sync_state_set.on_transfer(s.broker_id, master_max_offset, now_ms)
        return start, end

    def on_ack(
        self,
        key: Hashable,
        ack_offset: int,
        now_ms: int,
        received_offset: int | None = None,
        log_start: int | None = None,
    ) -> list[tuple[AckCallback, ReplicaStatus]]:
        """A slave wrote whole records up to ``ack_offset`` and received bytes up to
        ``received_offset`` (None: as far as it wrote); its log starts at ``log_start``
        (None: the ack does not say). Both count only as far as they were
        shipped: a slave holds nothing else, and an ack past that (a broken peer) must not
        complete sends, count in sync or open the window."""
        s = self.slaves.get(key)
        if s is None:
            return []
        s.last_heard_ms = now_ms
        ack_offset = min(ack_offset, s.sent_offset)
        received = ack_offset if received_offset is None else max(ack_offset, received_offset)
        s.received_offset = max(s.received_offset, min(received, s.sent_offset))
        if ack_offset > s.ack_offset:
            s.ack_offset = ack_offset
        if s.ack_offset >= s.transfer_max_offset:
            s.caught_up_ms = max(s.caught_up_ms, s.transfer_ms)
        if log_start is not None:
            s.log_start = log_start
        if self.sync_state_set is not None:
            self.sync_state_set.on_ack(s.broker_id, s.ack_offset, log_start)
        return self._complete_satisfied()

    def expire_silent(self, now_ms: int, timeout_ms: int) -> list[Hashable]:
        """Slaves not heard from within ``timeout_ms`` (RocketMQ haHousekeepingInterval)."""
        return [k for k, s in self.slaves.items() if now_ms - s.last_heard_ms > timeout_ms]

    # -- quorum -------------------------------------------------------------------------------
    def in_sync_slave_nums(self, master_offset: int) -> int:
        gap = self.quorum.ha_max_gap_not_in_sync
        return len(
            {
                s.broker_id
                for s in self.slaves.values()
                if s.state is HAConnectionState.TRANSFER
                and is_in_sync(master_offset, s.ack_offset, gap)
            }
        )

    def decide(self, alive_replicas_in_group: int, master_offset: int) -> AckDecision:
        return decide(self.quorum, alive_replicas_in_group, self.in_sync_slave_nums(master_offset))

    def wait_for_acks(
        self, offset: int, need_ack_nums: int, now_ms: int, timeout_ms: int, callback: AckCallback
    ) -> None:
        """Group commit: ordered waiters, woken as ack offsets advance. Under all-ack,
        ``need_ack_nums`` is not used: the effective SyncStateSet decides."""
        waiter = AckWaiter(offset, need_ack_nums - 1, now_ms + timeout_ms, callback)
        if self.deposed:
            callback(ReplicaStatus.SLAVE_NOT_AVAILABLE)
        elif self.all_ack:
            if self._all_acked() >= offset:
                callback(ReplicaStatus.PUT_OK)
            else:
                self.all_ack_waiters.append(waiter)
        elif self._acked_by(offset) >= waiter.need_slaves:
            callback(ReplicaStatus.PUT_OK)
        else:
            waiters = self.waiters.get(waiter.need_slaves)
            if waiters is None:
                waiters = self.waiters[waiter.need_slaves] = deque()
            waiters.append(waiter)

    def expire_waiters(self, now_ms: int) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = []
        for waiters in (*self.waiters.values(), self.all_ack_waiters):
            # One timeout for all, so deadlines grow with offsets: expired waiters are a prefix.
            while waiters and waiters[0].deadline_ms <= now_ms:
                done.append((waiters.popleft().callback, ReplicaStatus.FLUSH_SLAVE_TIMEOUT))
        return done

    def fail_all(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = [
            (w.callback, ReplicaStatus.SLAVE_NOT_AVAILABLE)
            for waiters in (*self.waiters.values(), self.all_ack_waiters)
            for w in waiters
        ]
        self.waiters.clear()
        self.all_ack_waiters.clear()
        return done

    def apply_sync_state_set(
        self, ids: frozenset[int], epoch: int
    ) -> list[tuple[AckCallback, ReplicaStatus]]:
        """The controller applied a SyncStateSet: a member that left no longer holds
        all-ack sends back."""
        assert self.sync_state_set is not None
        self.sync_state_set.apply(ids, epoch)
        return self._complete_satisfied()

    def refuse_sync_state_set(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        """The controller refused the proposals (``SyncStateSet.refused``): members only
        they added no longer hold all-ack sends back."""
        assert self.sync_state_set is not None
        self.sync_state_set.refused()
        return self._complete_satisfied()

    def confirm_offset(self, master_max_offset: int) -> int:
        """What every member of the effective SyncStateSet holds (controller mode); the
        whole log outside it."""
        if self.sync_state_set is None:
            return master_max_offset
        return self.sync_state_set.confirm_offset(master_max_offset)

    # -- internals ----------------------------------------------------------------------------
    def _acked_by(self, offset: int) -> int:
        return len(
            {
                s.broker_id
                for s in self.slaves.values()
                if s.state is HAConnectionState.TRANSFER and s.ack_offset >= offset
            }
        )

    def _all_acked(self) -> int | float:
        """The offset every member of the effective SyncStateSet holds (infinite when the
        master is alone in it)."""
        assert self.sync_state_set is not None
        least = self.sync_state_set.min_member_ack()
        return float("inf") if least is None else least

    def _complete_satisfied(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = []
        for need, waiters in self.waiters.items():
            while waiters and self._acked_by(waiters[0].offset) >= need:
                done.append((waiters.popleft().callback, ReplicaStatus.PUT_OK))
        if self.all_ack_waiters:
            all_acked = self._all_acked()
            waiters = self.all_ack_waiters
            while waiters and waiters[0].offset <= all_acked:
                done.append((waiters.popleft().callback, ReplicaStatus.PUT_OK))
        return done

    def _connected(self) -> set[int]:
        return {s.broker_id for s in self.slaves.values() if s.state is HAConnectionState.TRANSFER}

    def _fail_unreachable(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        connected = len(self._connected())
        done = []
        for need, waiters in self.waiters.items():
            if need > connected:
                done += [(w.callback, ReplicaStatus.SLAVE_NOT_AVAILABLE) for w in waiters]
                waiters.clear()
        return done + self._complete_satisfied()
