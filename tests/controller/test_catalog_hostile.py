"""Hostile input to the controller's catalog, sans-IO: the catalog stays bounded, and
``apply`` is total (a decided event that raised in apply would stop that peer's Raft cycle
for good) and leaves a state its own snapshot decodes back to."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamq.controller.apply import apply_event
from hamq.controller.catalog import MAX_NODES, MAX_POLICIES, MAX_TOPICS, MAX_VHOSTS, decide_catalog
from hamq.controller.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from hamq.controller.errors import ControllerCodecError, ControllerError
from hamq.controller.events import (
    AddVhost,
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    DeleteVhost,
    RegisterNode,
    SetPolicy,
    SetTopicGroups,
)
from hamq.controller.state import ControllerState
from hamq.errors import InvalidArgument
from hamq.policy.definition import Policy, make_policy
from hamq.policy.world import TopicDecl
from hamq.protocol import controller_catalog as wire

NODE = "hamq@a"
ALL = {"ha-mode": "all"}


def _full_catalog() -> ControllerState:
    """A state at every bound (filled directly: deciding 20,000 declarations is slow)."""
    state = ControllerState()
    state.vhosts |= {f"v{i}" for i in range(MAX_VHOSTS - 1)}
    state.nodes = {f"hamq@n{i}": f"127.0.0.1:{i + 1}" for i in range(MAX_NODES)}
    state.policies = {
        ("/", f"p{i}"): make_policy("/", f"p{i}", "x", ALL) for i in range(MAX_POLICIES)
    }
    state.topics = {("/", f"t{i}"): TopicDecl("/", f"t{i}", "hamq@n0") for i in range(MAX_TOPICS)}
    return state


def test_the_catalog_refuses_a_new_name_past_each_bound_but_changes_existing_ones():
    state = _full_catalog()
    new = [
        AddVhost("one-more"),
        RegisterNode("hamq@one-more", "127.0.0.1:1"),
        SetPolicy(make_policy("/", "one-more", "x", ALL)),
        DeclareTopic("/", "one-more", "hamq@n0"),
    ]
    for event in new:
        decision = decide_catalog(state, event)
        assert isinstance(decision, ControllerError), event
        assert "its limit" in decision.remark
        assert not apply_event(state, event)  # a peer applying it refuses alike
    changed = [
        SetPolicy(make_policy("/", "p0", "y", ALL)),
        RegisterNode("hamq@n0", "127.0.0.1:9999"),
        DeclareTopic("/", "t0", "hamq@n1"),  # the same declaration again: nothing to do
    ]
    for event in changed:
        assert not isinstance(decide_catalog(state, event), ControllerError), event
    assert apply_event(state, DeleteTopic("/", "t1"))
    assert apply_event(state, DeclareTopic("/", "one-more", "hamq@n0"))  # room again


_NAMES = st.one_of(
    st.sampled_from(["/", "v1", "v2", "t", "p", NODE, "hamq@b", "", "é" * 3, "x" * 300, "a%b"]),
    st.text(max_size=6),
)
_POLICIES = st.builds(
    lambda vhost, name, pattern: Policy(
        vhost, name, pattern, "topics", 0, make_policy("/", "p", "x", ALL).definition
    ),
    _NAMES,
    _NAMES,
    st.sampled_from(["x", "(a+)+$", "(", "(?=a)"]),
)
_EVENTS = st.one_of(
    st.builds(AddVhost, _NAMES),
    st.builds(DeleteVhost, _NAMES),
    st.builds(SetPolicy, _POLICIES),
    st.builds(ClearPolicy, _NAMES, _NAMES),
    st.builds(
        DeclareTopic,
        _NAMES,
        _NAMES,
        _NAMES,
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        _NAMES,
    ),
    st.builds(DeleteTopic, _NAMES, _NAMES),
    st.builds(SetTopicGroups, _NAMES, _NAMES, st.lists(_NAMES, max_size=3).map(tuple)),
    st.builds(RegisterNode, _NAMES, _NAMES),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EVENTS, max_size=25))
def test_apply_is_total_and_its_state_survives_a_snapshot(events):
    """Events as a peer gets them from the log, decided against a state a concurrent event
    has since changed (vhost deleted, node unknown, names no request could carry): each
    decodes or is a codec error, applies or is refused, and never raises."""
    leader, follower = ControllerState(), ControllerState()
    for event in events:
        decide_catalog(leader, event)  # decide is total too
        try:
            decoded = decode_event(encode_event(event))
        except ControllerCodecError:
            continue  # skipped alike by every peer (ControllerCore._apply)
        assert apply_event(leader, decoded) == apply_event(follower, decoded)
        assert decode_snapshot(encode_snapshot(leader)) == leader
    assert leader == follower


def test_an_exclusive_declaration_needs_its_owner():
    ext = {"vhost": "/", "topic": "t", "home_node": NODE, "exclusive": True, "queue_nums": 4}
    with pytest.raises(InvalidArgument, match="'owner' is required"):
        wire.declare_topic_request({**ext, "owner": ""})
    assert wire.declare_topic_request({**ext, "owner": "conn-1"}).owner == "conn-1"
