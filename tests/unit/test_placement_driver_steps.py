"""The placement driver's pure parts: what it observes of the nodes, the world it hands the
reconciler, which steps a round takes, the safety checks it makes right before acting, the
drained check and the settings of a new member."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from hamq.clock import monotonic_ms
from hamq.config import ControllerSettings
from hamq.controller.nodes import HostedMember, NodeHeartbeat, NodeLiveness
from hamq.controller.requests import (
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    ElectMasterRequest,
    ElectTrigger,
)
from hamq.controller.state import BrokerGroup, BrokerMember, ControllerState
from hamq.controller_server.placement import (
    MAX_COMPLAINTS,
    Complaints,
    Observed,
    QueueState,
    StepRefused,
    build_world,
    election_refusal,
    member_settings,
    observe,
    placement_ext,
    removal_refusal,
    round_steps,
    topic_drained,
    unplaced_groups,
)
from hamq.controller_server.service import ControllerService
from hamq.policy import placement as policy
from hamq.policy.definition import make_policy

sys.path.insert(0, str(Path(__file__).parents[1]))
from helpers import until

CLUSTER = "hamq"
TIMEOUT_MS = 5000


def group(*ids: int, master: int | None = None, synced: tuple[int, ...] = ()) -> BrokerGroup:
    members = {i: BrokerMember(f"127.0.0.1:{10000 + i}", "code", 0) for i in ids}
    return BrokerGroup(members, master_id=master, master_epoch=1, sync_state_set=frozenset(synced))


def beat(nodes: NodeLiveness, node: str, now_ms: int, *members: tuple[str, int]) -> None:
    hosted = tuple(HostedMember(CLUSTER, name, i, f"127.0.0.1:{i}") for name, i in members)
    nodes.record(NodeHeartbeat(node, f"{node}:9000", hosted), now_ms)


def state_with(**groups: BrokerGroup) -> ControllerState:
    state = ControllerState()
    state.nodes = {"hamq@a": "a:9000", "hamq@b": "b:9000", "hamq@c": "c:9000"}
    state.groups = {(CLUSTER, name): g for name, g in groups.items()}
    return state


def test_observe_places_members_on_the_node_whose_heartbeat_lists_them() -> None:
    nodes = NodeLiveness(TIMEOUT_MS)
    beat(nodes, "hamq@a", 0, ("ha_g", 1))
    beat(nodes, "hamq@b", 9000, ("ha_g", 2), ("ha_g", 1))  # b took member 1 over later
    beat(nodes, "hamq@x", 9000, ("ha_g", 3))  # not in the replicated state: ignored
    seen = observe(state_with(), nodes, CLUSTER, 10000)
    assert seen.alive == {"hamq@b"}
    assert seen.where == {("ha_g", 1): "hamq@b", ("ha_g", 2): "hamq@b"}
    assert seen.addresses == {"hamq@a": "hamq@a:9000", "hamq@b": "hamq@b:9000", "hamq@c": "c:9000"}


def test_observe_ignores_members_of_other_clusters() -> None:
    nodes = NodeLiveness(TIMEOUT_MS)
    hosted = (HostedMember("other", "broker-a", 0, "x:1"),)
    nodes.record(NodeHeartbeat("hamq@a", "a:9000", hosted), 0)
    assert observe(state_with(), nodes, CLUSTER, 1).where == {}


def test_world_shows_members_with_their_node_liveness_and_sync() -> None:
    state = state_with(ha_g=group(1, 2, 3, master=1, synced=(1, 2)))
    state.groups[("other", "broker-a")] = group(1, master=1, synced=(1,))
    seen = Observed(frozenset({"hamq@a", "hamq@b"}), state.nodes, {("ha_g", 1): "hamq@a"})
    world = build_world(state, seen, lambda key: frozenset({1, 3}), CLUSTER, frozenset(), "random")
    assert world.groups == (
        policy.GroupView(
            "ha_g",
            (
                policy.MemberView(1, "hamq@a", True, True),
                policy.MemberView(2, "", False, True),
                policy.MemberView(3, "", True, False),
            ),
            1,
        ),
    )
    assert world.nodes == (
        policy.NodeView("hamq@a", True),
        policy.NodeView("hamq@b", True),
        policy.NodeView("hamq@c", False),
    )
    assert world.default_locator == "random"


def test_a_group_with_an_alive_member_no_node_lists_waits() -> None:
    state = state_with(ha_g=group(1, 2, master=1, synced=(1,)), ha_h=group(1, master=1))
    seen = Observed(frozenset({"hamq@a"}), state.nodes, {("ha_g", 1): "hamq@a", ("ha_h", 1): "a"})
    alive = {(CLUSTER, "ha_g"): frozenset({1, 2}), (CLUSTER, "ha_h"): frozenset({1})}
    assert unplaced_groups(state, seen, alive.__getitem__, CLUSTER) == {"ha_g"}


def test_member_settings_make_a_controller_mode_member_that_acks_with_its_set() -> None:
    settings = member_settings("ha_g", "tail", CLUSTER, ["n1:9876", "n2:9876"])
    assert settings == {
        "broker_name": "ha_g",
        "cluster_name": CLUSTER,
        "enable_controller_mode": True,
        "controller_addr": ["n1:9876", "n2:9876"],
        "all_ack_in_sync_state_set": True,
        "ha_join": "tail",
    }


@pytest.mark.parametrize(
    ("broker_id", "synced", "alive", "refused"),
    [
        (1, (1, 2), {1, 2, 3}, "is the master"),
        (2, (1, 2), {1, 2, 3}, None),  # the master stays synchronised
        (3, (1, 2), {1, 2, 3}, None),  # unsynchronised: takes no copy with it
        (2, (2,), {2, 3}, "no other synchronised member is alive"),
        (
            2,
            (2, 3),
            {2},
            "no other synchronised member is alive",
        ),  # the other synchronised one is dead
        (3, (2,), {3}, None),
    ],
)
def test_removal_never_takes_the_master_or_the_last_synchronised_member(
    broker_id: int, synced: tuple[int, ...], alive: set[int], refused: str | None
) -> None:
    why = removal_refusal(group(1, 2, 3, master=1, synced=synced), broker_id, frozenset(alive))
    assert (why is None) if refused is None else (refused in (why or ""))


@pytest.mark.parametrize(
    ("broker_id", "refused"),
    [(2, None), (3, "not synchronised"), (4, "not alive"), (9, "not in the group")],
)
def test_master_moves_only_to_an_alive_synchronised_member(
    broker_id: int, refused: str | None
) -> None:
    g = group(1, 2, 3, 4, master=1, synced=(1, 2, 4))
    why = election_refusal(g, broker_id, frozenset({1, 2, 3}))
    assert (why is None) if refused is None else (refused in (why or ""))


def test_drained_when_every_queue_is_empty_or_consumed_by_every_group() -> None:
    queues = [QueueState(0, 5, 5), QueueState(1, 0, 10)]
    offsets = {"t@g1": {1: 10}, "t@g2": {"1": 10}, "other@g3": {1: 0}}
    assert topic_drained("t", queues, offsets)


@pytest.mark.parametrize(
    "offsets",
    [
        {"t@g1": {1: 10}, "t@g2": {1: 9}},  # one group is behind
        {"t@g1": {0: 10}},  # nobody has an offset on queue 1: a consumer may still come
        {},
    ],
)
def test_not_drained_while_a_queue_holds_messages_someone_may_need(offsets: dict) -> None:
    assert not topic_drained("t", [QueueState(0, 0, 0), QueueState(1, 0, 10)], offsets)


ADD_A = policy.AddMember("ha_g", "hamq@a", "history")
ADD_B = policy.AddMember("ha_g", "hamq@b", "history")
PLACE = policy.PlaceTopic("/", "t", "ha_g", 4)
RETIRE = policy.RetireTopic("/", "t", "node_a")
DROP = policy.DropTopic("/", "u", "node_a")


def test_a_round_takes_one_membership_step_per_group_first_then_its_topic_steps() -> None:
    taken = round_steps([PLACE, ADD_A, ADD_B, RETIRE, DROP], busy=(), unplaced=frozenset())
    assert taken == {"ha_g": (ADD_A, PLACE), "node_a": (RETIRE, DROP)}


def test_a_busy_group_waits_and_an_unplaced_one_does_topic_steps_only() -> None:
    steps = [PLACE, ADD_A, RETIRE]
    assert round_steps(steps, busy=("node_a",), unplaced=frozenset()) == {"ha_g": (ADD_A, PLACE)}
    assert round_steps(steps, busy=(), unplaced=frozenset({"ha_g"})) == {
        "ha_g": (PLACE,),
        "node_a": (RETIRE,),
    }
    assert round_steps([ADD_A], busy=(), unplaced=frozenset({"ha_g"})) == {}


def test_placement_answer_lists_the_plan_and_its_pending_steps() -> None:
    rules = make_policy("/", "two", "^t$", {"ha-mode": "exactly", "ha-params": 2}).definition
    plan = policy.Plan(
        groups={
            "ha_g": policy.GroupPlan("ha_g", ("/", "two"), ("hamq@a", "hamq@b"), "hamq@a", rules)
        },
        topic_group={("/", "t"): "ha_g"},
        steps=(ADD_B,),
    )
    ext = placement_ext(plan, ["ha_g"])
    assert ext["groups"] == [
        {
            "name": "ha_g",
            "policy": ["/", "two"],
            "nodes": ["hamq@a", "hamq@b"],
            "master_node": "hamq@a",
        }
    ]
    assert ext["topics"] == [{"vhost": "/", "topic": "t", "group": "ha_g"}]
    assert ext["pending"] == ["AddMember(group='ha_g', node='hamq@b', ha_join='history')"]
    assert ext["in_flight"] == ["ha_g"]
    assert placement_ext(None, [])["groups"] == []


def test_a_failing_step_is_logged_once_per_cause(caplog: pytest.LogCaptureFixture) -> None:
    complaints = Complaints()
    with caplog.at_level(logging.INFO, logger="hamq.controller_server.placement"):
        for _ in range(5):
            complaints.failed("AddMember(x)", "node down")
        complaints.failed("AddMember(x)", "port in use")
        complaints.succeeded("AddMember(x)")
        complaints.succeeded("AddMember(x)")
    assert [r.getMessage() for r in caplog.records] == [
        "placement: AddMember(x) not done: node down (retried every round)",
        "placement: AddMember(x) not done: port in use (retried every round)",
        "placement: AddMember(x) done",
    ]


def test_causes_of_steps_that_left_the_plan_do_not_pile_up() -> None:
    """A step that failed and then left the plan (its topic deleted) never succeeds: the
    causes kept are bounded, the oldest forgotten first."""
    complaints = Complaints()
    for i in range(MAX_COMPLAINTS + 10):
        complaints.failed(f"PlaceTopic(t{i})", "no alive master")
    assert len(complaints) == MAX_COMPLAINTS


def test_the_driver_rechecks_the_group_before_removing_whatever_the_plan_says(tmp_path) -> None:
    """A real controller peer (one, in this process) with a group of two: master 1 and an
    unsynchronised member 2 that stopped reporting. A plan to remove the master is refused
    with no request sent; removing member 2 from a node that is down only forgets it."""

    async def scenario() -> None:
        settings = ControllerSettings(
            controller_election_timeout_ms=100, mirror_cluster_name=CLUSTER
        )
        service = ControllerService(settings, "127.0.0.1:1", tmp_path)
        service.driver.start()
        try:
            await until(lambda: service.driver.core.serving, 10.0, "the peer serves")
            for broker_id in (1, 2):
                addr = f"127.0.0.1:{20000 + broker_id}"
                await service.propose(ApplyBrokerIdRequest(CLUSTER, "ha_g", broker_id, addr, "c"))
            service.driver.core.heartbeat(
                BrokerHeartbeat(CLUSTER, "ha_g", 1, "127.0.0.1:20001", 0, 0), monotonic_ms()
            )
            await service.propose(ElectMasterRequest(CLUSTER, "ha_g", ElectTrigger.ADMIN, 1))
            core, placement = service.driver.core, service.placement
            nobody = Observed(frozenset(), {}, {})

            with pytest.raises(StepRefused, match="member 1 is the master"):
                await placement._take(policy.RemoveMember("ha_g", 1, "hamq@a"), nobody)
            await placement._take(policy.RemoveMember("ha_g", 2, "hamq@b"), nobody)
            assert set(core.state.groups[(CLUSTER, "ha_g")].members) == {1}
            await placement._take(policy.RemoveMember("ha_g", 2, "hamq@b"), nobody)  # again: done
        finally:
            await service.stop()

    asyncio.run(scenario())
