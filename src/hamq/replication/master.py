"""The master's side of master–slave HA, sans-IO: slave progress, the in-sync count, flow
control, and the group-commit waiters of sync replication.

Time comes in as ``now_ms``; outputs are return values (what to send, which waiters
finished). The asyncio shell (``broker/ha.py``) does the I/O; the simulator can drive the
same object.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum, IntEnum

from hamq.replication.quorum import AckDecision, QuorumConfig, decide, is_in_sync


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


class Diverged(Exception):
    """The slave holds bytes the master never had; continuing would corrupt it."""


@dataclass
class SlaveProgress:
    key: Hashable
    broker_id: int
    state: HAConnectionState
    ack_offset: int         # what the slave has written
    sent_offset: int        # next byte the master sends it
    last_heard_ms: int


AckCallback = Callable[[ReplicaStatus], None]


@dataclass
class AckWaiter:
    offset: int             # commit-log end of the send
    need_slaves: int        # acks needed besides the master's own copy
    deadline_ms: int
    callback: AckCallback


class MasterReplication:
    def __init__(self, quorum: QuorumConfig, window_bytes: int, transfer_batch_bytes: int) -> None:
        assert transfer_batch_bytes <= window_bytes
        self.quorum = quorum
        self.window_bytes = window_bytes
        self.transfer_batch_bytes = transfer_batch_bytes
        self.slaves: dict[Hashable, SlaveProgress] = {}
        self.waiters: deque[AckWaiter] = deque()

    # -- slave lifecycle --------------------------------------------------------------------
    def handshake(self, key: Hashable, broker_id: int, slave_max_offset: int,
                  master_min_offset: int, master_max_offset: int, now_ms: int) -> int:
        """Register a slave that reports ``slave_max_offset``; returns where transfer
        starts. Raises ``Diverged`` for a slave ahead of its master."""
        if slave_max_offset > master_max_offset:
            raise Diverged(f"slave {broker_id} has {slave_max_offset} bytes of commit log but "
                           f"the master only {master_max_offset}: the slave diverged (it holds "
                           "messages the master never had) and must be rebuilt or truncated")
        start = max(slave_max_offset, master_min_offset)
        self.slaves[key] = SlaveProgress(key, broker_id, HAConnectionState.TRANSFER, start,
                                         start, now_ms)
        return start

    def disconnect(self, key: Hashable) -> list[tuple[AckCallback, ReplicaStatus]]:
        """A slave went away; waiters that can no longer be satisfied end now."""
        progress = self.slaves.pop(key, None)
        if progress is not None:
            progress.state = HAConnectionState.SHUTDOWN
        return self._fail_unreachable()

    # -- transfer ---------------------------------------------------------------------------
    def next_transfer(self, key: Hashable, master_max_offset: int) -> tuple[int, int] | None:
        """The next range [start, end) to ship to a slave, within its flow-control window."""
        s = self.slaves.get(key)
        if s is None or s.state is not HAConnectionState.TRANSFER:
            return None
        room = self.window_bytes - (s.sent_offset - s.ack_offset)
        end = min(master_max_offset, s.sent_offset + min(room, self.transfer_batch_bytes))
        if end <= s.sent_offset:
            return None
        start, s.sent_offset = s.sent_offset, end
        return start, end

    def on_ack(self, key: Hashable, ack_offset: int, now_ms: int
               ) -> list[tuple[AckCallback, ReplicaStatus]]:
        s = self.slaves.get(key)
        if s is None:
            return []
        s.last_heard_ms = now_ms
        if ack_offset > s.ack_offset:
            s.ack_offset = ack_offset
        return self._complete_satisfied()

    def expire_silent(self, now_ms: int, timeout_ms: int) -> list[Hashable]:
        """Slaves not heard from within ``timeout_ms`` (RocketMQ haHousekeepingInterval)."""
        return [k for k, s in self.slaves.items() if now_ms - s.last_heard_ms > timeout_ms]

    # -- quorum -------------------------------------------------------------------------------
    def in_sync_slave_nums(self, master_offset: int) -> int:
        gap = self.quorum.ha_max_gap_not_in_sync
        return sum(1 for s in self.slaves.values()
                   if s.state is HAConnectionState.TRANSFER
                   and is_in_sync(master_offset, s.ack_offset, gap))

    def decide(self, alive_replicas_in_group: int, master_offset: int) -> AckDecision:
        return decide(self.quorum, alive_replicas_in_group, self.in_sync_slave_nums(master_offset))

    def wait_for_acks(self, offset: int, need_ack_nums: int, now_ms: int, timeout_ms: int,
                      callback: AckCallback) -> None:
        """Group commit: one ordered structure of waiters, woken as ack offsets advance."""
        waiter = AckWaiter(offset, need_ack_nums - 1, now_ms + timeout_ms, callback)
        if self._acked_by(offset) >= waiter.need_slaves:
            callback(ReplicaStatus.PUT_OK)
        else:
            self.waiters.append(waiter)

    def expire_waiters(self, now_ms: int) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = []
        waiters = self.waiters
        # One timeout for all, so deadlines grow with offsets: expired waiters are a prefix.
        while waiters and waiters[0].deadline_ms <= now_ms:
            done.append((waiters.popleft().callback, ReplicaStatus.FLUSH_SLAVE_TIMEOUT))
        return done

    def fail_all(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = [(w.callback, ReplicaStatus.SLAVE_NOT_AVAILABLE) for w in self.waiters]
        self.waiters.clear()
        return done

    # -- internals ----------------------------------------------------------------------------
    def _acked_by(self, offset: int) -> int:
        return sum(1 for s in self.slaves.values()
                   if s.state is HAConnectionState.TRANSFER and s.ack_offset >= offset)

    def _complete_satisfied(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        done = []
        waiters = self.waiters
        while waiters and self._acked_by(waiters[0].offset) >= waiters[0].need_slaves:
            done.append((waiters.popleft().callback, ReplicaStatus.PUT_OK))
        return done

    def _fail_unreachable(self) -> list[tuple[AckCallback, ReplicaStatus]]:
        connected = sum(1 for s in self.slaves.values() if s.state is HAConnectionState.TRANSFER)
        done = []
        kept: deque[AckWaiter] = deque()
        for w in self.waiters:
            if w.need_slaves > connected:
                done.append((w.callback, ReplicaStatus.SLAVE_NOT_AVAILABLE))
            else:
                kept.append(w)
        self.waiters = kept
        return done + self._complete_satisfied()
