"""Soft state: what each member last reported and when (RocketMQ's ``BrokerLiveInfo``),
and when the serving leader last saw it register.

Every controller peer records every heartbeat it receives, but nothing here is
replicated: it decides only liveness and which member an election prefers, and only the
Raft leader acts on it. Time comes in as an argument, always this peer's own monotonic
clock: a time taken on another peer's clock is never compared with these.
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
        # when this peer, leading, last handled each member's registration
        self._registered: dict[GroupKey, dict[int, int]] = {}
        # the master epoch each group's master ended with a clean shutdown (its notice)
        self._shutdown_epochs: dict[GroupKey, int] = {}

    def record(self, heartbeat: BrokerHeartbeat, now_ms: int) -> None:
        key = (heartbeat.cluster_name, heartbeat.broker_name)
        self._groups.setdefault(key, {})[heartbeat.broker_id] = BrokerLiveState(
            heartbeat.address,
            heartbeat.epoch,
            heartbeat.max_offset,
            heartbeat.confirm_offset,
            now_ms,
        )

    def registered(self, key: GroupKey, broker_id: int, now_ms: int) -> None:
        """The member registered with this peer while it led (a restarted master's
        election trusts only reports that arrived after this)."""
        self._registered.setdefault(key, {})[broker_id] = now_ms

    def forget_registrations(self) -> None:
        """This peer begins a term as leader: the registrations it saw before may predate
        a member's later restart that another leader handled, so it waits for new ones."""
        self._registered.clear()

    def shut_down(self, key: GroupKey, epoch: int) -> None:
        """The master of ``epoch`` said it is stopping cleanly (CONTROLLER_BROKER_SHUTDOWN)."""
        self._shutdown_epochs[key] = epoch

    def shutdown_epoch(self, key: GroupKey) -> int | None:
        """The last master epoch of the group that ended with a clean-shutdown notice."""
        return self._shutdown_epochs.get(key)

    def members(self, key: GroupKey) -> dict[int, BrokerLiveState]:
        return dict(self._groups.get(key, {}))

    def is_alive(self, state: BrokerLiveState, now_ms: int) -> bool:
        return now_ms - state.last_seen_ms < self.timeout_ms

    def alive(self, key: GroupKey, now_ms: int) -> frozenset[int]:
        members = self._groups.get(key, {})
        return frozenset(i for i, s in members.items() if self.is_alive(s, now_ms))

    def live_info(self, key: GroupKey) -> dict[int, BrokerLiveInfo]:
        members = self._groups.get(key, {})
        registered = self._registered.get(key, {})
        info = {
            i: BrokerLiveInfo(s.epoch, s.max_offset, s.last_seen_ms, registered.get(i))
            for i, s in members.items()
        }
        for i, registered_ms in registered.items():
            info.setdefault(i, BrokerLiveInfo(-1, -1, None, registered_ms))
        return info

    def forget(self, key: GroupKey, broker_ids: frozenset[int]) -> None:
        """A cleaned member (or the whole group, for an empty ``broker_ids``)."""
        if not broker_ids:
            self._shutdown_epochs.pop(key, None)
        for table in (self._groups, self._registered):
            if not broker_ids:
                table.pop(key, None)
                continue
            members = table.get(key, {})
            for broker_id in broker_ids:
                members.pop(broker_id, None)
