"""What the reconciler reads (a ``World``) and what it answers (a ``Plan`` of steps).

Plain frozen values, so the placement driver can build a world from the controller's state
and the nodes' heartbeats, and tests can write one by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from hamq.policy.definition import HaDefinition, Policy

HaJoin = Literal["history", "tail"]


@dataclasses.dataclass(frozen=True)
class TopicDecl:
    """A declared topic. ``groups`` are the broker groups holding it now; the last one is
    where it is writable, the others are draining after a move."""

    vhost: str
    name: str
    home_node: str
    exclusive: bool = False
    queue_nums: int = 4
    groups: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class MemberView:
    broker_id: int
    node: str
    alive: bool
    synchronised: bool  # in the group's SyncStateSet


@dataclasses.dataclass(frozen=True)
class GroupView:
    name: str
    members: tuple[MemberView, ...]
    master_id: int | None

    def member(self, broker_id: int | None) -> MemberView | None:
        return next((m for m in self.members if m.broker_id == broker_id), None)

    def alive_master(self) -> MemberView | None:
        master = self.member(self.master_id)
        return master if master is not None and master.alive else None


@dataclasses.dataclass(frozen=True)
class NodeView:
    name: str
    alive: bool


@dataclasses.dataclass(frozen=True)
class World:
    """``topics`` come in declaration order (the controller's state keeps it): the first
    topic of a group is its oldest, whose home node is a ``nodes`` group's fallback."""

    policies: tuple[Policy, ...]
    topics: tuple[TopicDecl, ...]
    nodes: tuple[NodeView, ...]
    groups: tuple[GroupView, ...]
    drained: frozenset[tuple[str, str, str]] = frozenset()  # (vhost, topic, group)
    default_locator: str = "client-local"


@dataclasses.dataclass(frozen=True)
class AddMember:
    group: str
    node: str
    ha_join: HaJoin


@dataclasses.dataclass(frozen=True)
class ElectMaster:
    group: str
    broker_id: int


@dataclasses.dataclass(frozen=True)
class RemoveMember:
    group: str
    broker_id: int
    node: str


@dataclasses.dataclass(frozen=True)
class PlaceTopic:
    """Create the topic read-write in ``group``; it becomes the last of the topic's groups."""

    vhost: str
    topic: str
    group: str
    queue_nums: int


@dataclasses.dataclass(frozen=True)
class _TopicInGroup:
    vhost: str
    topic: str
    group: str


@dataclasses.dataclass(frozen=True)
class RetireTopic(_TopicInGroup):
    """Make the topic read-only (perm 4) in a group it is moving out of."""


@dataclasses.dataclass(frozen=True)
class DropTopic(_TopicInGroup):
    """Delete the topic from a group it moved out of, now that it is drained there."""


Step = AddMember | ElectMaster | RemoveMember | PlaceTopic | RetireTopic | DropTopic


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    name: str
    policy: tuple[str, str] | None  # (vhost, name) of a policy group; None for a node group
    nodes: tuple[str, ...]
    master_node: str | None
    rules: HaDefinition


@dataclasses.dataclass(frozen=True)
class Plan:
    groups: dict[str, GroupPlan]
    topic_group: dict[tuple[str, str], str]
    steps: tuple[Step, ...]
