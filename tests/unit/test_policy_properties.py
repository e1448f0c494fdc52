"""Properties of the placement reconciler over random worlds: the safety rules hold in
every plan, every topic has exactly one group, and a driver that carries the steps out
reaches a plan with nothing left to do within a few rounds while the nodes stay as they
are. The driver is the one the data-driven scripts use (tests/datadriven/policy)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from datadriven.policy.test_policy_scripts import Harness, SimGroup
from hamq.policy.definition import DEFAULT_VHOST, HaMode, make_policy
from hamq.policy.placement import (
    DropTopic,
    ElectMaster,
    MemberView,
    PlaceTopic,
    Plan,
    RemoveMember,
    RetireTopic,
    TopicDecl,
    World,
    group_for_node,
    group_for_policy,
    reconcile,
)

NODES = ("hamq@a", "hamq@b", "hamq@c", "hamq@d", "hamq@e")
TOPICS = ("a1", "a2", "b1", "ab", "c")
PATTERNS = ("^a", "b", ".", "^c$")
DEFINITIONS = (
    {"ha-mode": "all"},
    {"ha-mode": "exactly", "ha-params": 1},
    {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"},
    {"ha-mode": "exactly", "ha-params": 3, "queue-master-locator": "min-masters"},
    {"ha-mode": "nodes", "ha-params": ["hamq@a", "hamq@b"]},
    {"ha-mode": "nodes", "ha-params": ["hamq@c"], "ha-sync-mode": "automatic"},
    {"ha-mode": "nodes", "ha-params": ["hamq@d", "hamq@x"], "queue-master-locator": "random"},
    {"queue-master-locator": "client-local"},
)
CONVERGE_ROUNDS_MAX = 8


@st.composite
def harnesses(draw: st.DrawFn) -> Harness:
    """A world as the placement driver might find it: some nodes down, policies changed
    since groups were built, topics in the middle of moves, members unsynchronised."""
    harness = Harness()
    for node in draw(st.lists(st.sampled_from(NODES), min_size=1, unique=True)):
        harness.nodes[node] = draw(st.booleans())
    node_names = sorted(harness.nodes)
    for i in range(draw(st.integers(1, 3))):
        policy = make_policy(
            DEFAULT_VHOST,
            f"p{i}",
            draw(st.sampled_from(PATTERNS)),
            draw(st.sampled_from(DEFINITIONS)),
            priority=draw(st.integers(0, 2)),
        )
        harness.policies[(DEFAULT_VHOST, policy.name)] = policy
    group_names = [group_for_policy(DEFAULT_VHOST, f"p{i}") for i in range(3)]
    group_names += [group_for_node(n) for n in node_names]
    for name in draw(st.lists(st.sampled_from(group_names), unique=True)):
        group = SimGroup()
        for node in draw(st.lists(st.sampled_from(node_names), min_size=1, unique=True)):
            alive = harness.nodes[node] and draw(st.booleans())
            bid = group.next_id
            group.members[bid] = MemberView(bid, node, alive, draw(st.booleans()))
            group.next_id += 1
        group.master_id = draw(st.sampled_from([None, *group.members]))
        if group.master_id is not None:  # the SyncStateSet always holds the master
            master = group.members[group.master_id]
            group.members[group.master_id] = dataclasses.replace(master, synchronised=True)
        harness.groups[name] = group
    for topic in draw(st.lists(st.sampled_from(TOPICS), min_size=1, unique=True)):
        held = draw(st.lists(st.sampled_from(list(harness.groups) or [""]), unique=True))
        harness.topics[(DEFAULT_VHOST, topic)] = TopicDecl(
            DEFAULT_VHOST,
            topic,
            draw(st.sampled_from(node_names)),
            exclusive=draw(st.booleans()),
            groups=tuple(g for g in held if g),
        )
        for group in held[:-1]:  # some placements it is moving out of are drained
            if group and draw(st.booleans()):
                harness.drained.add((DEFAULT_VHOST, topic, group))
    return harness


def wound_down(world: World, plan: Plan) -> set[str]:
    held = {g for t in world.topics for g in t.groups}
    return {g.name for g in world.groups if g.name not in plan.groups and g.name not in held}


def check_safety(world: World, plan: Plan) -> None:
    views = {g.name: g for g in world.groups}
    closing = wound_down(world, plan)
    topics = {(t.vhost, t.name): t for t in world.topics}
    for step in plan.steps:
        if isinstance(step, ElectMaster):
            target = views[step.group].member(step.broker_id)
            assert target is not None and target.alive and target.synchronised, step
        elif isinstance(step, PlaceTopic):  # only where a master can take it
            assert views[step.group].alive_master() is not None, step
        elif isinstance(step, RetireTopic | DropTopic):  # never where it is writable
            assert topics[(step.vhost, step.topic)].groups[-1] != step.group, step
            if isinstance(step, DropTopic):
                assert (step.vhost, step.topic, step.group) in world.drained, step
    for name, view in views.items():
        removed = {
            s.broker_id for s in plan.steps if isinstance(s, RemoveMember) and s.group == name
        }
        if not removed:
            continue
        staying = [m for m in view.members if m.broker_id not in removed]
        if name in closing:  # a group no topic uses: the master goes last, alone
            assert view.master_id not in removed or not staying
            continue
        assert view.master_id not in removed, (name, removed)
        assert any(m.synchronised for m in staying), (name, removed)


def check_settled(world: World, plan: Plan) -> None:
    """Nothing left to do: each group with a master has a member on every alive node it
    wants, its master on one of them, and an ``exactly`` group its count of alive ones."""
    views = {g.name: g for g in world.groups}
    alive = {n.name for n in world.nodes if n.alive}
    for name, group in plan.groups.items():
        view = views.get(name)
        if view is None or view.alive_master() is None:  # the controller elects first
            continue
        hosted = {m.node: m for m in view.members}
        master = view.alive_master()
        assert master is not None
        # the master moved onto a wanted node, unless no member there could take it
        assert master.node in group.nodes or not any(
            m.alive for m in view.members if m.node in group.nodes
        ), (name, group, view)
        assert all(n in hosted for n in group.nodes if n in alive), (name, group, view)
        if group.rules.ha_mode is HaMode.EXACTLY:
            assert isinstance(group.rules.ha_params, int)
            assert len(group.nodes) == min(group.rules.ha_params, len(alive)), (group, view)
            assert all(hosted[n].alive for n in group.nodes), (name, group, view)


@settings(max_examples=200, deadline=None)
@given(harnesses())
def test_plans_are_safe_and_converge(harness: Harness) -> None:
    for _ in range(CONVERGE_ROUNDS_MAX):
        world = harness.world()
        plan = reconcile(world)
        check_safety(world, plan)
        assert set(plan.topic_group) == {(t.vhost, t.name) for t in world.topics}
        for topic in world.topics:
            group = plan.topic_group[(topic.vhost, topic.name)]
            assert group in plan.groups
            if topic.exclusive:
                assert group == group_for_node(topic.home_node)
        if not plan.steps:
            check_settled(world, plan)
            return
        for step in plan.steps:
            harness.apply(step)
        harness.catch_up()
    raise AssertionError(f"no convergence in {CONVERGE_ROUNDS_MAX} rounds: {plan.steps}")
