"""Events: the only way the controller state changes, and what a Raft entry carries.

Each event carries the epochs it was decided against (or will set), so ``apply`` can refuse
one that a concurrent event made stale: all peers refuse the same ones, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from hamq.policy.definition import Policy


@dataclass(frozen=True)
class ApplyBrokerId:
    """A new member takes ``broker_id`` in its group (creating the group if first)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_check_code: str
    register_time_ms: int


@dataclass(frozen=True)
class RegisterBroker:
    """A known member registers again, maybe from a new address."""

    cluster_name: str
    broker_name: str
    broker_id: int
    address: str
    register_time_ms: int


@dataclass(frozen=True)
class ElectMaster:
    """A new master epoch begins; ``new_master_id`` None records that no one could be elected.

    ``unclean`` says the master came from outside the SyncStateSet
    (``enable_elect_unclean_master``, or a policy's ``ha-promote-on-*`` = always), so
    drivers can warn and count the possible loss: the commit-log range from the elected
    member's reported max offset to the old master's last reported one (None where a
    report was missing; both None on clean elections).
    """

    cluster_name: str
    broker_name: str
    new_master_id: int | None
    new_master_epoch: int
    unclean: bool
    new_master_max_offset: int | None = None
    old_master_max_offset: int | None = None

    @property
    def lost_bytes(self) -> int | None:
        """How much of the old master's log the new one lacks (unclean elections only)."""
        if self.new_master_max_offset is None or self.old_master_max_offset is None:
            return None
        return max(0, self.old_master_max_offset - self.new_master_max_offset)


@dataclass(frozen=True)
class AlterSyncStateSet:
    """The current master's new SyncStateSet, fenced by its master epoch and set epoch."""

    cluster_name: str
    broker_name: str
    master_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    new_sync_state_set_epoch: int


@dataclass(frozen=True)
class CleanBrokerData:
    """Forget some members of a group, or the whole group when ``broker_ids`` is empty."""

    cluster_name: str
    broker_name: str
    broker_ids: frozenset[int]


GroupEvent = ApplyBrokerId | RegisterBroker | ElectMaster | AlterSyncStateSet | CleanBrokerData
GROUP_EVENTS = (ApplyBrokerId, RegisterBroker, ElectMaster, AlterSyncStateSet, CleanBrokerData)


# -- the catalog of mirrored-queue policies (seed 003) ------------------------------------
# These events are also the requests that ask for them: they carry nothing the leader
# adds, so ``catalog.decide`` checks one against the state and proposes it as it is.


@dataclass(frozen=True)
class AddVhost:
    vhost: str


@dataclass(frozen=True)
class DeleteVhost:
    """Drops the vhost with its policies and declared topics."""

    vhost: str


@dataclass(frozen=True)
class SetPolicy:
    """Adds a policy or replaces the one of that name in its vhost."""

    policy: Policy


@dataclass(frozen=True)
class ClearPolicy:
    vhost: str
    name: str


@dataclass(frozen=True)
class DeclareTopic:
    """A topic homed on ``home_node`` (the node its declaring client was connected to);
    ``owner`` is the connection that declared an exclusive one."""

    vhost: str
    topic: str
    home_node: str
    exclusive: bool = False
    queue_nums: int = 4
    owner: str = ""


@dataclass(frozen=True)
class DeleteTopic:
    vhost: str
    topic: str


@dataclass(frozen=True)
class SetTopicGroups:
    """The placement driver's record of the broker groups holding a topic, the writable
    one last."""

    vhost: str
    topic: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class RegisterNode:
    """A node (``hamq container`` with a node name) at its container's address."""

    name: str
    address: str


CatalogEvent = (
    AddVhost
    | DeleteVhost
    | SetPolicy
    | ClearPolicy
    | DeclareTopic
    | DeleteTopic
    | SetTopicGroups
    | RegisterNode
)
Event = GroupEvent | CatalogEvent
