"""Broker-side queue locks for ordered consumption (RocketMQ's RebalanceLockManager): a
queue of a consumer group is locked by at most one client at a time; a lock lapses if not
renewed within ``REBALANCE_LOCK_MAX_LIVE_TIME_MS``, measured on the monotonic clock
(``hamq.clock``): a step of the wall clock (NTP, a resumed VM) neither lapses every lock
at once (another member would take a queue its owner still consumes) nor keeps a dead
member's locks.

A lock is never released because a connection closed (RocketMQ does not either): the client
trusts its lock for its own, shorter lease (30 s against 60 s) and may still be working
through the batch in hand, reconnecting meanwhile. Only an unlock or the lapse frees it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

REBALANCE_LOCK_MAX_LIVE_TIME_MS = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime

QueueKey = tuple[str, int]  # (topic, queue id) on this broker


@dataclass
class LockEntry:
    client_id: str
    last_update_ms: int


class RebalanceLockManager:
    def __init__(self, max_live_time_ms: int = REBALANCE_LOCK_MAX_LIVE_TIME_MS) -> None:
        self.max_live_time_ms = max_live_time_ms
        self._locks: dict[str, dict[QueueKey, LockEntry]] = {}

    def __len__(self) -> int:
        """Lock entries kept, lapsed ones not yet removed included."""
        return sum(len(table) for table in self._locks.values())

    def try_lock_batch(
        self, group: str, queues: list[QueueKey], client_id: str, now_ms: int
    ) -> list[QueueKey]:
        """Lock (or renew) what is free, expired or already ours; returns what we hold."""
        table = self._locks.setdefault(group, {})
        held = []
        for key in queues:
            entry = table.get(key)
            if (
                entry is None
                or entry.client_id == client_id
                or now_ms - entry.last_update_ms > self.max_live_time_ms
            ):
                table[key] = LockEntry(client_id, now_ms)
                held.append(key)
        return held

    def unlock_batch(self, group: str, queues: list[QueueKey], client_id: str) -> None:
        table = self._locks.get(group, {})
        for key in queues:
            entry = table.get(key)
            if entry is not None and entry.client_id == client_id:
                del table[key]

    def remove_expired(self, now_ms: int) -> None:
        """Forget lapsed locks (and groups left without any), so locks of clients that went
        away do not stay in memory for good."""
        for group, table in list(self._locks.items()):
            for key in [
                k for k, e in table.items() if now_ms - e.last_update_ms > self.max_live_time_ms
            ]:
                del table[key]
            if not table:
                del self._locks[group]

    def owner(self, group: str, key: QueueKey, now_ms: int) -> str | None:
        entry = self._locks.get(group, {}).get(key)
        if entry is None or now_ms - entry.last_update_ms > self.max_live_time_ms:
            return None
        return entry.client_id

    def owners(self, now_ms: int) -> dict[str, dict[str, str]]:
        """Group -> "topic:queue_id" -> client holding it, live locks only: who holds a
        queue on this member, for operators (and tests) comparing the members of a group."""
        out: dict[str, dict[str, str]] = {}
        for group, table in self._locks.items():
            live = {
                f"{topic}:{queue_id}": e.client_id
                for (topic, queue_id), e in table.items()
                if now_ms - e.last_update_ms <= self.max_live_time_ms
            }
            if live:
                out[group] = live
        return out


def lock_quorum(total_replicas: int, alive_replicas: int) -> int:
    """Members that must grant a queue in strict mode: a majority of the group. The
    configured size counts (RocketMQ's ``totalReplicas / 2 + 1``), raised by the members the
    name servers hold alive, never lowered by them: two majorities of the same group share
    a member, which holds the lock for one client only; a majority of whoever is alive
    would not (two members alive on each side of a partition would each be a majority)."""
    return max(total_replicas, alive_replicas) // 2 + 1


def granted_by_quorum(
    queues: list[QueueKey], grants: Iterable[Iterable[QueueKey]], quorum: int
) -> list[QueueKey]:
    """The queues (in request order) that at least ``quorum`` of the members' grants hold."""
    votes: Counter[QueueKey] = Counter()
    for held in grants:
        votes.update(set(held))
    return [key for key in queues if votes[key] >= quorum]
