"""The replicated state: per broker group, its members and its SyncStateSet; and the
catalog of mirrored-queue policies (seed 003): vhosts, policies, declared topics, nodes.

RocketMQ keeps two tables (``BrokerReplicaInfo`` and ``SyncStateInfo``) that must always
change together; hamq keeps one frozen record per group so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hamq.policy.definition import DEFAULT_VHOST, Policy
from hamq.policy.world import TopicDecl

# RocketMQ's MixAll.FIRST_BROKER_CONTROLLER_ID: controller-assigned ids start at 1.
FIRST_BROKER_CONTROLLER_ID = 1

GroupKey = tuple[str, str]
"""(cluster_name, broker_name)."""
VhostKey = tuple[str, str]
"""(vhost, name) of a policy or a declared topic."""


@dataclass(frozen=True)
class BrokerMember:
    """One replica of a group as the controller knows it. ``register_time_ms`` is when its
    id was granted or its address last changed, on the clock of the controller leader of
    that moment (RocketMQ keeps it for display): informational, never compared with
    anything, since another peer's monotonic clock means nothing here."""

    address: str
    register_check_code: str
    register_time_ms: int


@dataclass(frozen=True)
class BrokerGroup:
    """A group's replica info and sync-state info. ``first_epoch`` is the master epoch it
    was created with: 0, or the last epoch of a group of that name cleaned away, so its
    members (whose epoch files hold those epochs) never see an epoch again."""

    members: dict[int, BrokerMember]
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0
    first_epoch: int = 0

    @property
    def elected(self) -> bool:
        """Whether any election happened since the group was created (each bumps the epoch)."""
        return self.master_epoch > self.first_epoch

    @property
    def next_broker_id(self) -> int:
        """The id a new member should apply for (RocketMQ's ``getNextAssignBrokerId``)."""
        return max(self.members, default=FIRST_BROKER_CONTROLLER_ID - 1) + 1


@dataclass
class ControllerState:
    """Every group the controller manages; mutated only by ``apply.apply_event``."""

    groups: dict[GroupKey, BrokerGroup] = field(default_factory=dict)
    # The last master epoch of each group cleaned away whole: a group created again under
    # the name starts from it (kept until then; admins clean whole groups rarely).
    retired_epochs: dict[GroupKey, int] = field(default_factory=dict)
    # The catalog the placement driver reconciles; the default vhost always exists, since
    # a wire name without a vhost prefix is in it.
    vhosts: set[str] = field(default_factory=lambda: {DEFAULT_VHOST})
    policies: dict[VhostKey, Policy] = field(default_factory=dict)
    topics: dict[VhostKey, TopicDecl] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> container address
    # the connection that declared each exclusive topic: only it may declare it again (its
    # node deletes the topic when that connection closes); the reconciler never needs it
    topic_owners: dict[VhostKey, str] = field(default_factory=dict)

    def next_broker_id(self, key: GroupKey) -> int:
        group = self.groups.get(key)
        return FIRST_BROKER_CONTROLLER_ID if group is None else group.next_broker_id
