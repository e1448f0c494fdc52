"""The controller's catalog of mirrored-queue policies (seed 003): vhosts, policies,
declared topics and nodes decided, encoded, decoded and applied as a Raft peer would; every
refusal; snapshots of format 3 and 2; and the promotion rules a policy gives its group's
elections, for a clean shutdown and a failure, each rule both ways."""

from __future__ import annotations

import random

import msgpack
import pytest

from hamq.controller.apply import apply_event
from hamq.controller.catalog import decide_catalog
from hamq.controller.codec import (
    decode_event,
    decode_snapshot,
    encode_event,
    encode_snapshot,
)
from hamq.controller.core import Applied, ControllerCore, CoreSettings, Outcome, Request
from hamq.controller.errors import ControllerCode, ControllerCodecError, ControllerError
from hamq.controller.events import (
    AddVhost,
    CatalogEvent,
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    DeleteVhost,
    ElectMaster,
    RegisterNode,
    SetPolicy,
    SetTopicGroups,
)
from hamq.controller.nodes import HostedMember, NodeHeartbeat
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    BrokerShutdown,
    ElectMasterRequest,
    ElectTrigger,
)
from hamq.controller.state import ControllerState
from hamq.errors import InvalidArgument
from hamq.policy.definition import make_policy
from hamq.policy.placement import group_for_policy
from hamq.protocol import controller_catalog as wire
from hamq.raft import MemoryStorage, RaftConfig

NODE_A, NODE_B = "hamq@a", "hamq@b"
HA_TWO = make_policy("/", "ha-two", "^two\\.", {"ha-mode": "exactly", "ha-params": 2})
HA_NODES = make_policy(
    "v1",
    "ha-nodes",
    "^nodes\\.",
    {"ha-mode": "nodes", "ha-params": [NODE_A, NODE_B], "ha-sync-mode": "automatic"},
    priority=3,
    apply_to="queues",
)


def commit(state: ControllerState, request: CatalogEvent) -> CatalogEvent | None:
    """Decide, then apply through the event's bytes as every peer does; None when the
    state already said it (answered without a Raft entry)."""
    decision = decide_catalog(state, request)
    assert not isinstance(decision, ControllerError), decision
    if decision is None:
        return None
    event = decode_event(encode_event(decision))
    assert event == decision
    assert apply_event(state, event)
    return event


def refused(state: ControllerState, request: CatalogEvent) -> str:
    """The refusal's remark; the state is unchanged and so is its snapshot."""
    before = encode_snapshot(state)
    decision = decide_catalog(state, request)
    assert isinstance(decision, ControllerError), decision
    assert decision.code == ControllerCode.CONTROLLER_INVALID_REQUEST
    assert not apply_event(state, request)  # apply refuses it alike
    assert encode_snapshot(state) == before
    return decision.remark


@pytest.fixture
def catalog() -> ControllerState:
    """Vhosts / and v1, nodes a and b, both policies, a topic in each vhost."""
    state = ControllerState()
    commit(state, AddVhost("v1"))
    commit(state, RegisterNode(NODE_A, "127.0.0.1:10911"))
    commit(state, RegisterNode(NODE_B, "127.0.0.1:10912"))
    commit(state, SetPolicy(HA_TWO))
    commit(state, SetPolicy(HA_NODES))
    commit(state, DeclareTopic("/", "two.orders", NODE_A))
    commit(state, DeclareTopic("v1", "nodes.x", NODE_B, queue_nums=8))
    return state


def test_the_catalog_applies_and_survives_a_snapshot(catalog):
    assert catalog.vhosts == {"/", "v1"}
    assert catalog.policies == {("/", "ha-two"): HA_TWO, ("v1", "ha-nodes"): HA_NODES}
    assert catalog.topics[("v1", "nodes.x")].queue_nums == 8
    assert catalog.topics[("/", "two.orders")].home_node == NODE_A
    commit(catalog, SetTopicGroups("/", "two.orders", ("old", "new")))
    assert catalog.topics[("/", "two.orders")].groups == ("old", "new")
    restored = decode_snapshot(encode_snapshot(catalog))
    assert restored == catalog
    assert restored.policies[("v1", "ha-nodes")].definition.to_json() == {
        "ha-mode": "nodes",
        "ha-params": [NODE_A, NODE_B],
        "ha-sync-mode": "automatic",
    }
    assert encode_snapshot(restored) == encode_snapshot(catalog)


def test_asking_again_for_what_the_state_says_is_answered_without_an_entry(catalog):
    assert commit(catalog, AddVhost("v1")) is None
    assert commit(catalog, SetPolicy(HA_TWO)) is None
    assert commit(catalog, RegisterNode(NODE_A, "127.0.0.1:10911")) is None
    # a declaration again alike, even through another node, keeps the first home
    assert commit(catalog, DeclareTopic("/", "two.orders", NODE_B)) is None
    assert catalog.topics[("/", "two.orders")].home_node == NODE_A
    assert commit(catalog, SetTopicGroups("/", "two.orders", ())) is None
    # a changed policy or a node at a new address is a change
    changed = make_policy("/", "ha-two", "^two\\.", {"ha-mode": "exactly", "ha-params": 3})
    assert commit(catalog, SetPolicy(changed)) == SetPolicy(changed)
    assert catalog.policies[("/", "ha-two")].definition.ha_params == 3
    assert commit(catalog, RegisterNode(NODE_A, "127.0.0.1:20911")) is not None
    assert catalog.nodes[NODE_A] == "127.0.0.1:20911"


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (SetPolicy(make_policy("v9", "p", ".*", {"ha-mode": "all"})), "vhost 'v9' does not exist"),
        (ClearPolicy("v9", "p"), "vhost 'v9' does not exist"),
        (DeclareTopic("v9", "t", NODE_A), "vhost 'v9' does not exist"),
        (DeleteTopic("v9", "t"), "vhost 'v9' does not exist"),
        (SetTopicGroups("v9", "t", ("g",)), "vhost 'v9' does not exist"),
        (DeleteVhost("v9"), "vhost 'v9' does not exist"),
        (DeleteVhost("/"), "is the default and cannot be deleted"),
        (ClearPolicy("/", "nope"), "policy 'nope' does not exist in vhost '/'"),
        (DeleteTopic("/", "nope"), "topic 'nope' is not declared in vhost '/'"),
        (SetTopicGroups("/", "nope", ("g",)), "topic 'nope' is not declared"),
        (DeclareTopic("/", "t", "hamq@nowhere"), "node 'hamq@nowhere' is not registered"),
        (DeclareTopic("/", "two.orders", NODE_A, queue_nums=8), "already declared"),
        (DeclareTopic("/", "two.orders", NODE_A, exclusive=True), "already declared"),
    ],
)
def test_every_refusal_names_what_is_wrong_and_changes_nothing(catalog, request_, words):
    assert words in refused(catalog, request_)


def test_an_exclusive_topic_is_its_owners_alone(catalog):
    commit(catalog, DeclareTopic("/", "mine", NODE_A, exclusive=True, owner="conn-1"))
    assert (
        commit(catalog, DeclareTopic("/", "mine", NODE_A, exclusive=True, owner="conn-1")) is None
    )
    remark = refused(catalog, DeclareTopic("/", "mine", NODE_A, exclusive=True, owner="conn-2"))
    assert "by another connection" in remark
    assert catalog.topic_owners == {("/", "mine"): "conn-1"}
    commit(catalog, DeleteTopic("/", "mine"))
    assert catalog.topic_owners == {}


def test_deleting_a_vhost_drops_its_policies_and_topics_only(catalog):
    commit(catalog, DeleteVhost("v1"))
    assert catalog.vhosts == {"/"}
    assert list(catalog.policies) == [("/", "ha-two")]
    assert list(catalog.topics) == [("/", "two.orders")]
    commit(catalog, ClearPolicy("/", "ha-two"))
    commit(catalog, DeleteTopic("/", "two.orders"))
    assert not catalog.policies and not catalog.topics


def test_of_two_conflicting_declarations_decided_together_the_second_is_refused(catalog):
    first = DeclareTopic("/", "race", NODE_A, queue_nums=4)
    second = DeclareTopic("/", "race", NODE_B, queue_nums=16)
    assert decide_catalog(catalog, first) == first
    assert decide_catalog(catalog, second) == second  # both decided before either applies
    assert apply_event(catalog, first)
    assert not apply_event(catalog, second)
    assert catalog.topics[("/", "race")].queue_nums == 4
    # the same declaration committed twice keeps the first
    assert apply_event(catalog, DeclareTopic("/", "race", NODE_B, queue_nums=4))
    assert catalog.topics[("/", "race")].home_node == NODE_A


# -- codec -------------------------------------------------------------------------------------


def _entry(tag: int, *fields: object) -> bytes:
    return msgpack.packb([tag, *fields])


@pytest.mark.parametrize(
    "data",
    [
        _entry(6, "bad vhost!"),  # AddVhost with a name no vhost may have
        _entry(7, 7),  # DeleteVhost of a number
        _entry(8, "/", "p", ".*", "topics", 0, {"ha-mode": "sometimes"}),
        _entry(8, "/", "p", "(", "topics", 0, {"ha-mode": "all"}),  # not a regex
        _entry(8, "/", "p", ".*", "exchanges", 0, {"ha-mode": "all"}),
        _entry(8, "/", "p", ".*", "topics", True, {"ha-mode": "all"}),
        _entry(8, "/", "p", ".*", "topics", 0, ["ha-mode", "all"]),
        _entry(10, "/", "t", NODE_A, 1, 4, ""),  # exclusive must be a boolean
        _entry(10, "/", "t", NODE_A, False, "4", ""),
        _entry(10, "/", "t", NODE_A, False, 4),  # a field short
        _entry(12, "/", "t", "g"),  # groups must be a list
        _entry(12, "/", "t", [1]),
        _entry(13, "hamq@a"),
        _entry(3, "c", "b", 1, 2, True, 5),  # ElectMaster with one of its two new fields
    ],
)
def test_a_malformed_catalog_entry_is_a_codec_error(data):
    with pytest.raises(ControllerCodecError):
        decode_event(data)


def test_an_election_entry_from_before_the_lost_range_still_decodes():
    old = _entry(3, "c", "b", 2, 5, True)
    assert decode_event(old) == ElectMaster("c", "b", 2, 5, True, None, None)
    new = ElectMaster("c", "b", 2, 5, True, 100, 500)
    assert decode_event(encode_event(new)) == new
    assert new.lost_bytes == 400


def test_a_version_2_snapshot_reads_with_the_default_vhost_only():
    group = [[1, "127.0.0.1:1", "code", 7]]
    v2 = msgpack.packb([2, [["c", "b", group, 1, 3, [1], 2, 0]], [["c", "gone", 4]]])
    state = decode_snapshot(v2)
    assert state.vhosts == {"/"} and not state.policies and not state.topics
    assert state.groups[("c", "b")].master_epoch == 3
    assert state.retired_epochs == {("c", "gone"): 4}
    assert decode_snapshot(encode_snapshot(state)) == state  # written back as version 3


def _v3(vhosts, policies, topics, nodes) -> bytes:
    return msgpack.packb([3, [], [], vhosts, policies, topics, nodes])


POLICY_ROW = ["/", "p", ".*", "topics", 0, {"ha-mode": "all"}]
TOPIC_ROW = ["/", "t", NODE_A, False, 4, "", []]
NODE_ROW = [NODE_A, "127.0.0.1:1"]


@pytest.mark.parametrize(
    "data",
    [
        _v3(["v1"], [], [], []),  # no default vhost
        _v3(["/", "/"], [], [], []),
        _v3(["/"], [["v1", *POLICY_ROW[1:]]], [], []),  # a policy outside the vhosts
        _v3(["/"], [POLICY_ROW, POLICY_ROW], [], []),
        _v3(["/"], [], [TOPIC_ROW], []),  # homed on an unknown node
        _v3(["/"], [], [TOPIC_ROW, TOPIC_ROW], [NODE_ROW]),
        _v3(["/"], [], [TOPIC_ROW[:6]], [NODE_ROW]),
        _v3(["/"], [], [], [NODE_ROW, NODE_ROW]),
        _v3(["/"], [], [], [[NODE_A]]),
        msgpack.packb([4, [], [], ["/"], [], [], []]),  # a version this code cannot read
        msgpack.packb([3, [], []]),  # version 3 without its catalog
    ],
)
def test_a_snapshot_apply_could_never_have_made_is_refused(data):
    with pytest.raises(ControllerCodecError):
        decode_snapshot(data)


def test_a_well_formed_version_3_catalog_decodes():
    state = decode_snapshot(_v3(["/"], [POLICY_ROW], [TOPIC_ROW], [NODE_ROW]))
    assert state.policies[("/", "p")].definition.to_json() == {"ha-mode": "all"}
    assert state.topics[("/", "t")].home_node == NODE_A


# -- promotion rules (ha-promote-on-shutdown / ha-promote-on-failure) ---------------------------

CLUSTER = "hamq"
TIMEOUT_MS = 1000


class OnePeer:
    """A single controller peer on virtual time: it leads alone and serves at once."""

    def __init__(self, enable_elect_unclean_master: bool = False) -> None:
        self.now_ms = 0
        settings = CoreSettings(TIMEOUT_MS, 1000, enable_elect_unclean_master, TIMEOUT_MS)
        config = RaftConfig(1, (1,), election_timeout_ms=100, push_timeout_ms=40)
        self.core = ControllerCore(config, MemoryStorage(), random.Random(1), settings, 0)
        self.changes: list = []
        for _ in range(100):
            if self.core.serving:
                break
            self.advance(10)
        assert self.core.serving

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.core.tick(self.now_ms)
        self.pump()

    def pump(self) -> None:
        while (out := self.core.run_cycle(self.now_ms)) is not None:
            self.changes += out.changes

    def commit(self, request: Request) -> Outcome:
        outcomes: list[Outcome] = []
        self.core.submit(request, self.now_ms, outcomes.append)
        self.pump()
        assert len(outcomes) == 1, outcomes
        return outcomes[0]

    def beat(self, group: str, broker_id: int, epoch: int, max_offset: int) -> None:
        address = f"127.0.0.1:{11000 + broker_id}"
        heartbeat = BrokerHeartbeat(CLUSTER, group, broker_id, address, epoch, max_offset)
        assert self.core.heartbeat(heartbeat, self.now_ms)


def _policy_group(peer: OnePeer, shutdown: str, failure: str) -> str:
    """A policy group of three: 1 master (epoch 1, log end 500), 2 synchronised (in the
    set), 3 not (log end 100)."""
    definition = {
        "ha-mode": "exactly",
        "ha-params": 3,
        "ha-promote-on-shutdown": shutdown,
        "ha-promote-on-failure": failure,
    }
    assert isinstance(peer.commit(SetPolicy(make_policy("/", "ha", ".*", definition))), Applied)
    group = group_for_policy("/", "ha")
    for broker_id in (1, 2, 3):
        address = f"127.0.0.1:{11000 + broker_id}"
        request = ApplyBrokerIdRequest(CLUSTER, group, broker_id, address, f"code-{broker_id}")
        assert isinstance(peer.commit(request), Applied)
        peer.beat(group, broker_id, 0, 0)
    first = peer.commit(ElectMasterRequest(CLUSTER, group, ElectTrigger.REGISTER, 1))
    assert isinstance(first, Applied) and first.group is not None and first.group.master_id == 1
    grow = AlterSyncStateSetRequest(CLUSTER, group, 1, 1, frozenset({1, 2}), 1)
    assert isinstance(peer.commit(grow), Applied)
    peer.advance(TIMEOUT_MS)  # the peer has led a whole heartbeat timeout: the scan may act
    return group


def _master_leaves(peer: OnePeer, group: str, clean: bool) -> ElectMaster:
    """1 and 2 stop (1 after a clean-shutdown notice or by failing), 3 keeps reporting;
    the scan's election after the timeout."""
    peer.beat(group, 1, 1, 500)
    peer.beat(group, 3, 1, 100)
    if clean:
        assert peer.core.broker_shutdown(BrokerShutdown(CLUSTER, group, 1, 1))
    for _ in range(3):
        peer.advance(TIMEOUT_MS // 2)
        peer.beat(group, 3, 1, 100)
        peer.core.scan(peer.now_ms)
        peer.pump()
    (elected,) = [c.event for c in peer.changes if isinstance(c.event, ElectMaster)][1:]
    return elected


@pytest.mark.parametrize("clean", [True, False], ids=["shutdown", "failure"])
@pytest.mark.parametrize("rule", ["when-synced", "always"])
def test_a_policy_groups_promotion_rule_decides_whether_an_unsynchronised_member_may_win(
    clean, rule
):
    other = "always" if rule == "when-synced" else "when-synced"  # the rule that must not count
    peer = OnePeer(enable_elect_unclean_master=rule == "when-synced")  # ignored for the group
    group = _policy_group(peer, shutdown=rule if clean else other, failure=other if clean else rule)
    elected = _master_leaves(peer, group, clean)
    state = peer.core.state.groups[(CLUSTER, group)]
    assert elected.new_master_epoch == 2 and state.master_epoch == 2
    if rule == "always":
        # promoted although unsynchronised, and the election says what it may lose
        assert (elected.new_master_id, elected.unclean) == (3, True)
        assert (elected.new_master_max_offset, elected.old_master_max_offset) == (100, 500)
        assert elected.lost_bytes == 400
        assert state.master_id == 3
    else:
        # the topic is unavailable rather than served by a mirror that lacks messages
        assert (elected.new_master_id, elected.unclean) == (None, False)
        assert state.master_id is None and state.sync_state_set == {1, 2}
        # and it stays so: later scans decide the same rule for the epoch that ended
        peer.advance(TIMEOUT_MS * 3)
        peer.beat(group, 3, 1, 100)
        assert peer.core.scan(peer.now_ms) == []


def test_promoting_after_a_failed_election_still_reports_what_is_lost():
    """RabbitMQ's recovery: the master failed under when-synced (no master), then the
    operator allows promotion on failure. The old master is no longer named by the group,
    but its last report still says how far the log went: the election must say so."""
    peer = OnePeer()
    group = _policy_group(peer, shutdown="when-synced", failure="when-synced")
    assert _master_leaves(peer, group, clean=False).new_master_id is None
    allow = {"ha-mode": "exactly", "ha-params": 3, "ha-promote-on-failure": "always"}
    assert isinstance(peer.commit(SetPolicy(make_policy("/", "ha", ".*", allow))), Applied)
    peer.beat(group, 3, 1, 100)
    peer.core.scan(peer.now_ms)
    peer.pump()
    elected = [c.event for c in peer.changes if isinstance(c.event, ElectMaster)][-1]
    assert (elected.new_master_id, elected.unclean) == (3, True)
    assert (elected.new_master_max_offset, elected.old_master_max_offset) == (100, 500)


def test_a_shutdown_notice_counts_only_from_the_master_at_its_epoch():
    peer = OnePeer()
    group = _policy_group(peer, shutdown="always", failure="when-synced")
    assert not peer.core.broker_shutdown(BrokerShutdown(CLUSTER, group, 2, 1))  # a slave
    assert not peer.core.broker_shutdown(BrokerShutdown(CLUSTER, group, 1, 0))  # an old epoch
    assert not peer.core.broker_shutdown(BrokerShutdown(CLUSTER, "other", 1, 1))
    elected = _master_leaves(peer, group, clean=False)
    assert elected.new_master_id is None  # treated as the failure it was


def test_a_group_without_a_policy_keeps_the_global_switch():
    peer = OnePeer(enable_elect_unclean_master=True)
    group = _policy_group(peer, shutdown="when-synced", failure="when-synced")
    assert isinstance(peer.commit(ClearPolicy("/", "ha")), Applied)
    elected = _master_leaves(peer, group, clean=True)
    assert (elected.new_master_id, elected.unclean) == (3, True)


def test_node_heartbeats_are_kept_for_registered_nodes_and_expire():
    peer = OnePeer()
    member = HostedMember(CLUSTER, "g", 1, "127.0.0.1:1")
    beat = NodeHeartbeat(NODE_A, "127.0.0.1:10911", (member,))
    assert not peer.core.node_heartbeat(beat, peer.now_ms)  # not registered: not kept
    assert isinstance(peer.commit(RegisterNode(NODE_A, "127.0.0.1:10911")), Applied)
    assert peer.core.node_heartbeat(beat, peer.now_ms)
    assert peer.core.nodes.alive(peer.now_ms) == {NODE_A}
    assert peer.core.nodes.node_of(CLUSTER, "g", 1) == NODE_A
    assert peer.core.nodes.node_of(CLUSTER, "g", 2) is None
    peer.advance(TIMEOUT_MS)
    assert peer.core.nodes.alive(peer.now_ms) == frozenset()
    report = peer.core.nodes.report(NODE_A)
    assert report is not None and report.members == (member,)


# -- the wire: every field checked, the error naming it ------------------------------------------

GOOD_POLICY = {
    "vhost": "/",
    "name": "p",
    "pattern": ".*",
    "definition": {"ha-mode": "all"},
    "priority": 0,
    "apply_to": "topics",
}
GOOD_DECLARE = {
    "vhost": "/",
    "topic": "t",
    "home_node": NODE_A,
    "exclusive": False,
    "queue_nums": 4,
    "owner": "",
}
GOOD_BEAT = {
    "node": NODE_A,
    "address": "127.0.0.1:1",
    "members": [
        {"cluster_name": "c", "broker_name": "b", "broker_id": 1, "address": "127.0.0.1:2"}
    ],
}
GOOD_SHUTDOWN = {"cluster_name": "c", "broker_name": "b", "broker_id": 1, "epoch": 3}


def _with(good: dict, **changes: object) -> dict:
    ext = {**good, **changes}
    return {k: v for k, v in ext.items() if v is not _ABSENT}


_ABSENT = object()


@pytest.mark.parametrize(
    ("decode", "ext", "field"),
    [
        (wire.vhost_request, {}, "vhost"),
        (wire.vhost_request, {"vhost": "a b"}, "vhost"),
        (wire.vhost_request, [], "request ext"),
        (wire.set_policy_request, _with(GOOD_POLICY, vhost=_ABSENT), "vhost"),
        (wire.set_policy_request, _with(GOOD_POLICY, name=""), "name"),
        (wire.set_policy_request, _with(GOOD_POLICY, pattern=3), "pattern"),
        (wire.set_policy_request, _with(GOOD_POLICY, pattern="("), "pattern"),
        (wire.set_policy_request, _with(GOOD_POLICY, definition="all"), "definition"),
        (wire.set_policy_request, _with(GOOD_POLICY, definition={"ha-mod": "all"}), "ha-mod"),
        (wire.set_policy_request, _with(GOOD_POLICY, priority="1"), "priority"),
        (wire.set_policy_request, _with(GOOD_POLICY, apply_to="exchanges"), "apply-to"),
        (wire.clear_policy_request, {"vhost": "/"}, "name"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, topic="a b"), "topic"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, topic="v%t"), "topic"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, vhost="v", topic="t" * 127), "topic"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, home_node="a"), "home_node"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, exclusive=0), "exclusive"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, queue_nums=0), "queue_nums"),
        (wire.declare_topic_request, _with(GOOD_DECLARE, owner=_ABSENT), "owner"),
        (wire.delete_topic_request, {"vhost": "/"}, "topic"),
        (wire.register_node_request, {"node": NODE_A, "address": "nowhere"}, "address"),
        (wire.register_node_request, {"node": "x", "address": "127.0.0.1:1"}, "node"),
        (wire.node_heartbeat, _with(GOOD_BEAT, members={}), "members"),
        (wire.node_heartbeat, _with(GOOD_BEAT, members=[1]), "members"),
        (wire.node_heartbeat, _with(GOOD_BEAT, members=[{"broker_id": 1}]), "cluster_name"),
        (wire.node_heartbeat, _with(GOOD_BEAT, node=_ABSENT), "node"),
        (wire.broker_shutdown, _with(GOOD_SHUTDOWN, broker_id=0), "broker_id"),
        (wire.broker_shutdown, _with(GOOD_SHUTDOWN, epoch=-1), "epoch"),
        (wire.broker_shutdown, _with(GOOD_SHUTDOWN, broker_name=_ABSENT), "broker_name"),
        (wire.vhost_filter, {"vhost": 5}, "vhost"),
    ],
)
def test_a_malformed_request_is_invalid_argument_naming_the_field(decode, ext, field):
    with pytest.raises(InvalidArgument, match=field):
        decode(ext)


def test_well_formed_requests_decode_to_their_events():
    assert wire.set_policy_request(GOOD_POLICY) == SetPolicy(
        make_policy("/", "p", ".*", {"ha-mode": "all"})
    )
    event = DeclareTopic("v1", "t", NODE_A, True, 8, "conn")
    assert wire.declare_topic_request(wire.declare_topic_ext(event)) == event
    beat = wire.node_heartbeat(GOOD_BEAT)
    assert wire.node_heartbeat(wire.node_heartbeat_ext(beat)) == beat
    notice = wire.broker_shutdown(GOOD_SHUTDOWN)
    assert notice == BrokerShutdown("c", "b", 1, 3)
    assert wire.broker_shutdown(wire.broker_shutdown_ext(notice)) == notice
    assert wire.vhost_filter({}) is None and wire.vhost_filter({"vhost": "v1"}) == "v1"
