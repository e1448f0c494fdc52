"""The sans-IO reconciler: policies, declared topics and live nodes in, broker groups and
the steps to reach them out (no clock, no I/O; the controller's placement driver runs it
every round and carries the steps out).

Every topic whose effective policy has an ``ha-mode`` lives in that policy's broker group,
so 1,000 topics under one policy are one group; any other topic, and every exclusive one,
lives in the one-member group of its home node. A topic whose group changes *moves*: it is
placed read-write in the new group once that group has a master, retired (read-only) in
the old one, and dropped there when drained. Steps are idempotent: a round that finds its
steps already done asks for nothing, so a driver may repeat a step it is unsure of.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from hamq.policy.definition import HaDefinition, Policy, effective_policy
from hamq.policy.membership import Load, Nodes, plan_group
from hamq.policy.world import (
    AddMember,
    DropTopic,
    ElectMaster,
    GroupPlan,
    GroupView,
    MemberView,
    NodeView,
    PlaceTopic,
    Plan,
    RemoveMember,
    RetireTopic,
    Step,
    TopicDecl,
    World,
)

__all__ = [
    "AddMember",
    "DropTopic",
    "ElectMaster",
    "GroupPlan",
    "GroupView",
    "MemberView",
    "NodeView",
    "PlaceTopic",
    "Plan",
    "RemoveMember",
    "RetireTopic",
    "Step",
    "TopicDecl",
    "World",
    "group_for_node",
    "group_for_policy",
    "reconcile",
    "rules_for_group",
]

POLICY_GROUP_PREFIX = "ha_"
NODE_GROUP_PREFIX = "node_"
_SLUG_CHARS = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
# rules of a node group: no mirrors, the default promotion rules
_NODE_GROUP_RULES = HaDefinition()


def _name(prefix: str, readable: str, key: str) -> str:
    """A broker-name-safe group name: a readable slug, made unique by a hash of ``key``
    (two names that slug alike still get different groups)."""
    slug = _UNSAFE.sub("-", readable)[:_SLUG_CHARS].strip("-") or "x"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{prefix}{slug}-{digest}"


def group_for_policy(vhost: str, policy_name: str) -> str:
    return _name(POLICY_GROUP_PREFIX, policy_name, f"{vhost}\0{policy_name}")


def group_for_node(node: str) -> str:
    return _name(NODE_GROUP_PREFIX, node.replace("@", "_"), node)


def _mirror_policy(policies: Iterable[Policy], topic: TopicDecl) -> Policy | None:
    if topic.exclusive:  # never mirrored, ignored by policies
        return None
    policy = effective_policy(policies, topic.vhost, topic.name)
    return policy if policy is not None and policy.definition.ha_mode is not None else None


def rules_for_group(policies: Iterable[Policy], group_name: str) -> HaDefinition | None:
    """The definition governing a policy group (its promotion rules), None for others."""
    for policy in policies:
        if policy.definition.ha_mode is not None and (
            group_for_policy(policy.vhost, policy.name) == group_name
        ):
            return policy.definition
    return None


def _topic_steps(
    world: World, topic: TopicDecl, target: str, views: dict[str, GroupView]
) -> list[Step]:
    """Place the topic in its group once that group has a master; retire it elsewhere,
    and drop it where it is drained. The writable group is never retired."""
    steps: list[Step] = []
    placed = bool(topic.groups) and topic.groups[-1] == target
    target_view = views.get(target)
    if not placed and target_view is not None and target_view.alive_master() is not None:
        steps.append(PlaceTopic(topic.vhost, topic.name, target, topic.queue_nums))
    for group in topic.groups[:-1]:
        if group == target:
            continue
        if (topic.vhost, topic.name, group) in world.drained:
            steps.append(DropTopic(topic.vhost, topic.name, group))
        else:
            steps.append(RetireTopic(topic.vhost, topic.name, group))
    return steps


def reconcile(world: World) -> Plan:
    """The groups the world should have, each topic's group, and the next safe steps."""
    policies = tuple(p for p in world.policies if p.apply_to in ("topics", "all"))
    views = {g.name: g for g in world.groups}
    nodes = Nodes(
        registered=frozenset(n.name for n in world.nodes),
        alive=tuple(sorted(n.name for n in world.nodes if n.alive)),
    )
    topic_group: dict[tuple[str, str], str] = {}
    # group -> (policy key, rules, home node of its oldest topic), in first-topic order
    wanted: dict[str, tuple[tuple[str, str] | None, HaDefinition, str]] = {}
    for topic in world.topics:
        policy = _mirror_policy(policies, topic)
        if policy is None:
            group = group_for_node(topic.home_node)
            wanted.setdefault(group, (None, _NODE_GROUP_RULES, topic.home_node))
        else:
            group = group_for_policy(policy.vhost, policy.name)
            owner = (policy.vhost, policy.name)
            wanted.setdefault(group, (owner, policy.definition, topic.home_node))
        topic_group[(topic.vhost, topic.name)] = group

    load = Load.of(world.groups)
    groups: dict[str, GroupPlan] = {}
    steps: list[Step] = []
    for name in sorted(wanted):  # a fixed order: the load tally decides ties the same way
        key, rules, home = wanted[name]
        locator = rules.queue_master_locator or world.default_locator
        plan, group_steps = plan_group(
            name, key, rules, views.get(name), nodes, home, locator, load
        )
        groups[name] = plan
        steps.extend(group_steps)

    # A group no topic targets or holds any more is kept as it is (its members, store and
    # master): removing its master is never safe to automate (the master is never
    # removed), so an abandoned group stays until an admin removes it (REMOVE_BROKER on its
    # nodes, then CleanBrokerData of the whole group). A policy set again uses it again.
    for topic in world.topics:
        target = topic_group[(topic.vhost, topic.name)]
        steps.extend(_topic_steps(world, topic, target, views))
    return Plan(groups=groups, topic_group=topic_group, steps=tuple(steps))
