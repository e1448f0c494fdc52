"""Soft state: what each member last reported and when (RocketMQ's ``BrokerLiveInfo``).

Every controller peer records every heartbeat it receives, but nothing here is
replicated: it decides only liveness and which member an election prefers, and only the
Raft leader acts on it. Time comes in as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from hamq.controller.elect import BrokerLiveInfo
from hamq.controller.requests import BrokerHeartbeat
from hamq.controller.state import GroupKey


@dataclass(frozen=True)
class BrokerLiveState:
    """A member's last report: its address, epoch, log end and confirm offset."""

    address: str
    epoch: int
    max_offset: int
    confirm_offset: int
    last_seen_ms: int


class BrokerLiveness:
    """Last reports per group and member; a member is alive while its last report is
    younger than ``timeout_ms``."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._groups: dict[GroupKey, dict[int, BrokerLiveState]] = {}

    def record(self, heartbeat: BrokerHeartbeat, now_ms: int) -> None:
        key = (heartbeat.cluster_name, heartbeat.broker_name)
        self._groups.setdefault(key, {})[heartbeat.broker_id] = BrokerLiveState(
            heartbeat.address,
            heartbeat.epoch,
            heartbeat.max_offset,
            heartbeat.confirm_offset,
            now_ms,
        )

    def members(self, key: GroupKey) -> dict[int, BrokerLiveState]:
        return dict(self._groups.get(key, {}))

    def is_alive(self, state: BrokerLiveState, now_ms: int) -> bool:
        return now_ms - state.last_seen_ms < self.timeout_ms

    def alive(self, key: GroupKey, now_ms: int) -> frozenset[int]:
        members = self._groups.get(key, {})
        return frozenset(i for i, s in members.items() if self.is_alive(s, now_ms))

    def live_info(self, key: GroupKey) -> dict[int, BrokerLiveInfo]:
        members = self._groups.get(key, {})
        return {
            i: BrokerLiveInfo(s.epoch, s.max_offset, s.last_seen_ms) for i, s in members.items()
        }

    def forget(self, key: GroupKey, broker_ids: frozenset[int]) -> None:
        """A cleaned member (or the whole group, for an empty ``broker_ids``)."""
        if not broker_ids:
            self._groups.pop(key, None)
            return
        members = self._groups.get(key, {})
        for broker_id in broker_ids:
            members.pop(broker_id, None)
