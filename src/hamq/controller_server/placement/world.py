"""A round's view of the nodes and the mirror cluster, turned into the reconciler's
``World``: built afresh from the replicated state and the nodes' latest heartbeats every
round, so nothing a former leader believed carries over."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hamq.controller.nodes import NodeLiveness
from hamq.controller.state import ControllerState, GroupKey
from hamq.policy import placement as policy


@dataclass(frozen=True)
class Observed:
    """The nodes as the leader sees them at one moment: which are alive (heard within
    ``node_heartbeat_timeout_ms``), where their containers listen, and which node hosts
    each member of the mirror cluster (the last heartbeat that lists it)."""

    alive: frozenset[str]
    addresses: Mapping[str, str]
    where: Mapping[tuple[str, int], str]  # (group, broker id) -> node


def observe(state: ControllerState, nodes: NodeLiveness, cluster: str, now_ms: int) -> Observed:
    """Only nodes the replicated state knows count. A member two nodes list (a report from
    before a move) is placed on the alive one, then the first by name."""
    alive = frozenset(name for name in state.nodes if nodes.is_alive(name, now_ms))
    where: dict[tuple[str, int], str] = {}
    for name in sorted(state.nodes, key=lambda n: (n not in alive, n), reverse=True):
        report = nodes.report(name)
        for member in report.members if report is not None else ():
            if member.cluster_name == cluster:
                where[(member.broker_name, member.broker_id)] = name
    addresses = {
        name: report.address if (report := nodes.report(name)) is not None else address
        for name, address in state.nodes.items()
    }
    return Observed(alive, addresses, where)


def orphans(state: ControllerState, seen: Observed, cluster: str) -> list[policy.RemoveMember]:
    """Members alive nodes still run that their group no longer counts: cleaned by a
    removal whose REMOVE_BROKER did not reach the node. Counted for nothing (outside the
    SyncStateSet, never elected), such a member still holds the group's place on its
    node, where a new member of the group would be refused."""
    return [
        policy.RemoveMember(name, broker_id, node)
        for (name, broker_id), node in sorted(seen.where.items())
        if node in seen.alive
        and (group := state.groups.get((cluster, name))) is not None
        and broker_id not in group.members
    ]


def build_world(
    state: ControllerState,
    seen: Observed,
    alive_members: Callable[[GroupKey], frozenset[int]],
    cluster: str,
    drained: frozenset[tuple[str, str, str]],
    default_locator: str,
) -> policy.World:
    """The reconciler's input. A group's members are the controller's; a member's node is
    the one whose heartbeat lists it ("" when no node does: the reconciler sees it as
    lost); synchronised = in the SyncStateSet (the master admits only caught-up members
    holding everything from the need offset)."""
    groups = []
    for (group_cluster, name), group in sorted(state.groups.items()):
        if group_cluster != cluster:
            continue
        alive = alive_members((group_cluster, name))
        members = tuple(
            policy.MemberView(
                broker_id,
                seen.where.get((name, broker_id), ""),
                broker_id in alive,
                broker_id in group.sync_state_set,
            )
            for broker_id in sorted(group.members)
        )
        groups.append(policy.GroupView(name, members, group.master_id))
    return policy.World(
        policies=tuple(state.policies.values()),
        topics=tuple(state.topics.values()),
        nodes=tuple(policy.NodeView(name, name in seen.alive) for name in sorted(state.nodes)),
        groups=tuple(groups),
        drained=drained,
        default_locator=default_locator,
    )


def unplaced_groups(
    state: ControllerState,
    seen: Observed,
    alive_members: Callable[[GroupKey], frozenset[int]],
    cluster: str,
) -> frozenset[str]:
    """Groups with an alive member no node lists yet (a member just added, before its
    node's next heartbeat): their membership waits a round, or the reconciler would count
    that member lost and add or remove one for it."""
    return frozenset(
        name
        for (group_cluster, name) in state.groups
        if group_cluster == cluster
        and any((name, i) not in seen.where for i in alive_members((group_cluster, name)))
    )
