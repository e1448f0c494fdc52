"""Which nodes a broker group should have, where its master goes, and the safe next steps.

One group at a time, from its rules (the policy's definition) and what it has now. The
steps never remove the master and never leave the group without a synchronised member:
a member is added first, the master moves (election) only to a synchronised member on a
wanted node, and unwanted members go only once the master stands on a wanted node (with automatic
sync, an alive one only once every member that stays is synchronised).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

from hamq.policy.definition import HaDefinition, HaMode
from hamq.policy.world import (
    AddMember,
    ElectMaster,
    GroupPlan,
    GroupView,
    HaJoin,
    MemberView,
    RemoveMember,
    Step,
)


@dataclasses.dataclass
class Load:
    """Members and masters per node, counted over every group and updated as groups are
    planned, so groups placed in one round spread over the nodes instead of piling up."""

    members: Counter[str]
    masters: Counter[str]

    @classmethod
    def of(cls, groups: tuple[GroupView, ...]) -> Load:
        load = cls(Counter(), Counter())
        for group in groups:
            load.members.update(m.node for m in group.members)
            master = group.alive_master()
            if master is not None:
                load.masters[master.node] += 1
        return load


@dataclasses.dataclass(frozen=True)
class Nodes:
    """The cluster as the reconciler sees it: registered node names and the alive ones."""

    registered: frozenset[str]
    alive: tuple[str, ...]  # sorted


@dataclasses.dataclass(frozen=True)
class Placement:
    """``wanted``: nodes that should hold a member now (alive ones get one added);
    ``keep``: nodes whose members stay (``all`` and ``nodes`` keep a member on a node that is
    down, for when it comes back; ``exactly`` replaces it)."""

    wanted: tuple[str, ...]
    keep: frozenset[str]


def ha_join(rules: HaDefinition) -> HaJoin:
    return "history" if rules.ha_sync_mode == "automatic" else "tail"


def _exactly(
    count: int, view: GroupView | None, nodes: Nodes, first: str | None, load: Load
) -> tuple[str, ...]:
    members = view.members if view is not None else ()
    master_id = view.master_id if view is not None else None
    # the master first, then synchronised members, then the oldest (smallest broker id)
    ranked = sorted(
        (m for m in members if m.alive and m.node in nodes.alive),
        key=lambda m: (m.broker_id != master_id, not m.synchronised, m.broker_id),
    )
    chosen = list(dict.fromkeys(m.node for m in ranked))[:count]
    if first is not None and not chosen:  # a new group: its master's node is one of them
        chosen = [first]
    # a node with a member that is not kept gets no new one until that member is gone
    hosting = {m.node for m in members} | set(chosen)
    spare = sorted((n for n in nodes.alive if n not in hosting), key=lambda n: (load.members[n], n))
    chosen += spare[: max(0, count - len(chosen))]
    return tuple(sorted(chosen))


def _listed_alive(rules: HaDefinition, nodes: Nodes) -> tuple[str, ...]:
    assert isinstance(rules.ha_params, tuple)
    return tuple(sorted(n for n in rules.ha_params if n in nodes.alive))


def candidates(rules: HaDefinition, nodes: Nodes, home: str) -> tuple[str, ...]:
    """The alive nodes a new group's master may go on."""
    if rules.ha_mode in (HaMode.ALL, HaMode.EXACTLY):
        return nodes.alive
    listed = _listed_alive(rules, nodes) if rules.ha_mode is HaMode.NODES else ()
    # no listed node alive (RabbitMQ: the node the client is connected to), or no policy
    return listed or tuple(n for n in (home,) if n in nodes.alive)


def placement(
    rules: HaDefinition,
    view: GroupView | None,
    nodes: Nodes,
    home: str,
    first: str | None,
    load: Load,
) -> Placement:
    """``home``: the home node of the group's oldest topic (a node group's node);
    ``first``: where a new group's master goes."""
    if rules.ha_mode is HaMode.ALL:
        return Placement(nodes.alive, nodes.registered)
    if rules.ha_mode is HaMode.EXACTLY:
        assert isinstance(rules.ha_params, int)
        wanted = _exactly(rules.ha_params, view, nodes, first, load)
        return Placement(wanted, frozenset(wanted))
    if rules.ha_mode is HaMode.NODES and (listed := _listed_alive(rules, nodes)):
        assert isinstance(rules.ha_params, tuple)
        return Placement(listed, frozenset(rules.ha_params))
    return Placement((home,), frozenset((home,)))


def locate_master(
    locator: str, group: str, wanted: tuple[str, ...], home: str, load: Load
) -> str | None:
    """Where a new group's master goes (RabbitMQ's queue-master-locator)."""
    if not wanted:
        return None
    if locator == "min-masters":
        return min(wanted, key=lambda n: (load.masters[n], n))
    if locator == "random":  # random per group, the same on every controller and round
        digest = hashlib.sha256(group.encode()).digest()
        return wanted[int.from_bytes(digest[:8], "big") % len(wanted)]
    return home if home in wanted else wanted[0]


def _move_target(view: GroupView, wanted: tuple[str, ...]) -> MemberView | None:
    """The oldest alive synchronised member on a wanted node: where a master moves."""
    candidates = [
        m
        for m in view.members
        if m.alive and m.synchronised and m.node in wanted and m.broker_id != view.master_id
    ]
    return min(candidates, key=lambda m: m.broker_id, default=None)


def plan_group(
    name: str,
    policy: tuple[str, str] | None,
    rules: HaDefinition,
    view: GroupView | None,
    nodes: Nodes,
    home: str,
    locator: str,
    load: Load,
) -> tuple[GroupPlan, list[Step]]:
    join = ha_join(rules)
    if view is None or not view.members:
        # A new group: only its first member, on the locator's node, so that it wins the
        # group's first election; the others join once it is master.
        first = locate_master(locator, name, candidates(rules, nodes, home), home, load)
        where = placement(rules, view, nodes, home, first, load)
        plan = GroupPlan(name, policy, where.wanted, first, rules)
        if first is None:
            return plan, []
        load.members[first] += 1
        load.masters[first] += 1
        return plan, [AddMember(name, first, join)]

    where = placement(rules, view, nodes, home, None, load)
    master = view.alive_master()
    if master is None:  # the controller elects first; nothing moves without a master
        return GroupPlan(name, policy, where.wanted, None, rules), []

    alive_wanted = tuple(n for n in where.wanted if n in nodes.alive)
    hosting = {m.node for m in view.members}
    steps: list[Step] = []
    for node in alive_wanted:
        if node not in hosting:
            load.members[node] += 1
            steps.append(AddMember(name, node, join))

    if master.node not in where.keep:
        target = _move_target(view, alive_wanted)
        if target is not None:
            steps.append(ElectMaster(name, target.broker_id))
        master_node = target.node if target is not None else master.node
        return GroupPlan(name, policy, where.wanted, master_node, rules), steps

    leaving = [
        m for m in view.members if m.node not in where.keep and m.broker_id != master.broker_id
    ]
    staying = [m for m in view.members if m not in leaving]
    # With automatic sync an alive member leaves only once every alive member that stays
    # is synchronised, which they soon are: it may hold what a new mirror has not copied
    # yet (right after the master moved, the controller counts only the new master
    # synchronised, the old one is out of the SyncStateSet too), and removing it then
    # would leave fewer copies than before the change. With manual sync the new mirrors
    # may stay unsynchronised for good, and members leave as RabbitMQ's do.
    settled = rules.ha_sync_mode != "automatic" or all(m.synchronised for m in staying if m.alive)
    if any(m.alive and m.synchronised for m in staying):
        steps.extend(
            RemoveMember(name, m.broker_id, m.node) for m in leaving if settled or not m.alive
        )
    return GroupPlan(name, policy, where.wanted, master.node, rules), steps
