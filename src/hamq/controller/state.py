"""The replicated state: per broker group, its members and its SyncStateSet.

RocketMQ keeps two tables (``BrokerReplicaInfo`` and ``SyncStateInfo``) that must always
change together; hamq keeps one frozen record per group so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# RocketMQ's MixAll.FIRST_BROKER_CONTROLLER_ID: controller-assigned ids start at 1.
FIRST_BROKER_CONTROLLER_ID = 1

GroupKey = tuple[str, str]
"""(cluster_name, broker_name)."""


@dataclass(frozen=True)
class BrokerMember:
    """One replica of a group as the controller knows it."""

    address: str
    register_check_code: str
    register_time_ms: int


@dataclass(frozen=True)
class BrokerGroup:
    """A group's replica info and sync-state info (master epoch 0 = never elected)."""

    members: dict[int, BrokerMember]
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0

    @property
    def next_broker_id(self) -> int:
        """The id a new member should apply for (RocketMQ's ``getNextAssignBrokerId``)."""
        return max(self.members, default=FIRST_BROKER_CONTROLLER_ID - 1) + 1


@dataclass
class ControllerState:
    """Every group the controller manages; mutated only by ``apply.apply_event``."""

    groups: dict[GroupKey, BrokerGroup] = field(default_factory=dict)

    def next_broker_id(self, key: GroupKey) -> int:
        group = self.groups.get(key)
        return FIRST_BROKER_CONTROLLER_ID if group is None else group.next_broker_id
