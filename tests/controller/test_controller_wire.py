"""The controller wire contract: every request round-trips, and a bad field is refused
with an InvalidArgument naming it (before any state is read)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamq.controller.errors import ControllerCode
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import BrokerGroup, BrokerMember
from hamq.errors import (
    ControllerFenced,
    ControllerNotLeader,
    ControllerRefused,
    HamqError,
    InvalidArgument,
)
from hamq.protocol import controller as wire
from hamq.protocol.codes import ResponseCode

KEY = ("DefaultCluster", "broker-a")


def _wire(ext: dict) -> dict:
    """What the peer receives: the ext through msgpack, as the frame header carries it."""
    return msgpack.unpackb(msgpack.packb(ext), raw=False, strict_map_key=True)


def test_the_core_refusal_codes_are_the_wire_codes():
    """The sans-IO core names its refusals without importing the protocol; the processor
    sends ``ControllerCode`` values as response codes, so the two tables must agree."""
    wire_codes = {c.name: c.value for c in ResponseCode if c.name.startswith("CONTROLLER_")}
    assert {c.name: c.value for c in ControllerCode} == wire_codes


def test_replica_info_of_a_group_round_trips():
    group = BrokerGroup(
        members={
            2: BrokerMember("127.0.0.1:10912", "b", 7),
            1: BrokerMember("127.0.0.1:10911", "a", 5),
        },
        master_id=2,
        master_epoch=3,
        sync_state_set=frozenset({1, 2}),
        sync_state_set_epoch=4,
    )
    info = wire.ReplicaInfo.of_group(group)
    assert info.master_addr == "127.0.0.1:10912"
    assert info.members == ((1, "127.0.0.1:10911"), (2, "127.0.0.1:10912"))
    assert wire.ReplicaInfo.from_ext(_wire(info.to_ext())) == info
    key, back = wire.role_changed(_wire(wire.role_changed_ext(KEY, info)))
    assert (key, back) == (KEY, info)


def test_replica_info_without_master():
    info = wire.ReplicaInfo(None, None, 0, frozenset(), 0, ((1, "h:1"),))
    assert wire.ReplicaInfo.from_ext(_wire(info.to_ext())) == info


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"master_epoch": -1}, "master_epoch"),
        ({"master_epoch": True}, "master_epoch"),
        ({"sync_state_set": [1, 1]}, "sync_state_set"),
        ({"sync_state_set": "1"}, "sync_state_set"),
        ({"members": [[1, "nohost"]]}, "members"),
        ({"members": [[0, "h:1"]]}, "members"),
        ({"master_addr": None}, "master_addr"),
        ({"master_id": 5000}, "master_id"),
    ],
)
def test_replica_info_refuses_a_bad_field(change, field):
    ext = {**wire.ReplicaInfo(1, "h:1", 1, frozenset({1}), 1, ((1, "h:1"),)).to_ext(), **change}
    with pytest.raises(InvalidArgument, match=field):
        wire.ReplicaInfo.from_ext(ext)


def test_requests_round_trip():
    apply = ApplyBrokerIdRequest(*KEY, 2, "127.0.0.1:10911", "127.0.0.1:10911;abc")
    assert wire.apply_broker_id_request(_wire(wire.apply_broker_id_ext(apply))) == apply
    beat = BrokerHeartbeat(*KEY, 2, "127.0.0.1:10911", 3, 1000, 900)
    assert wire.broker_heartbeat(_wire(wire.broker_heartbeat_ext(beat))) == beat
    register = wire.register_broker_ext(beat, "127.0.0.1:10911;abc")
    assert "confirm_offset" not in register
    who, request = wire.register_broker_request(_wire(register))
    assert who.confirm_offset == 0 and (who.epoch, who.max_offset) == (3, 1000)
    assert request == RegisterBrokerRequest(*KEY, 2, "127.0.0.1:10911", "127.0.0.1:10911;abc")
    # a registration carries the register check code an address change needs
    del register["register_check_code"]
    with pytest.raises(InvalidArgument, match="register_check_code"):
        wire.register_broker_request(_wire(register))
    for elect in (
        ElectMasterRequest(*KEY, ElectTrigger.ADMIN, 2),
        ElectMasterRequest(*KEY, ElectTrigger.REGISTER, None),
    ):
        assert wire.elect_master_request(_wire(wire.elect_master_ext(elect))) == elect
    alter = AlterSyncStateSetRequest(*KEY, 1, 2, frozenset({1, 3}), 5)
    assert wire.alter_sync_state_set_request(_wire(wire.alter_sync_state_set_ext(alter))) == alter
    clean = CleanBrokerDataRequest(*KEY, frozenset({3}), True)
    assert wire.clean_broker_data_request(_wire(wire.clean_broker_data_ext(clean))) == clean
    assert wire.group_key(_wire(wire.group_key_ext(KEY))) == KEY
    assert wire.sync_state_set_result(_wire(wire.sync_state_set_ext(frozenset({2, 1}), 9))) == (
        frozenset({1, 2}),
        9,
    )
    assert wire.broker_names({}) == [] and wire.broker_names({"broker_names": ["a"]}) == ["a"]


@pytest.mark.parametrize(
    ("decode", "ext", "field"),
    [
        (wire.group_key, {"cluster_name": "c"}, "broker_name"),
        (wire.group_key, {"cluster_name": "../x", "broker_name": "b"}, "cluster_name"),
        (wire.elect_master_request, {"cluster_name": "c", "broker_name": "b"}, "trigger"),
        (
            wire.elect_master_request,
            {"cluster_name": "c", "broker_name": "b", "trigger": "master_timeout"},
            "trigger",
        ),
        (
            wire.elect_master_request,
            {"cluster_name": "c", "broker_name": "b", "trigger": ["admin"]},
            "trigger",
        ),
        (
            wire.elect_master_request,
            {"cluster_name": "c", "broker_name": "b", "trigger": "admin", "broker_id": "1"},
            "broker_id",
        ),
        (
            wire.alter_sync_state_set_request,
            {
                "cluster_name": "c",
                "broker_name": "b",
                "master_id": 1,
                "master_epoch": 1,
                "sync_state_set": [1, 2**70],
                "sync_state_set_epoch": 1,
            },
            "sync_state_set",
        ),
        (
            wire.apply_broker_id_request,
            {
                "cluster_name": "c",
                "broker_name": "b",
                "broker_id": 1,
                "broker_addr": "h:1",
                "register_check_code": "",
            },
            "register_check_code",
        ),
        (
            wire.broker_heartbeat,
            {
                "cluster_name": "c",
                "broker_name": "b",
                "broker_id": 1,
                "broker_addr": "h:99999",
                "epoch": 1,
                "max_offset": 0,
                "confirm_offset": 0,
            },
            "broker_addr",
        ),
        (
            wire.clean_broker_data_request,
            {"cluster_name": "c", "broker_name": "b", "broker_ids": []},
            "clean_living_broker",
        ),
        (wire.broker_names, {"broker_names": ["ok", 3]}, "broker_names"),
    ],
)
def test_a_bad_request_field_is_named(decode, ext, field):
    with pytest.raises(InvalidArgument, match=field):
        decode(ext)


def test_leader_hint_is_only_a_hint():
    assert wire.leader_addr({"leader_addr": "127.0.0.1:9878"}) == "127.0.0.1:9878"
    assert wire.leader_addr({"leader_addr": None}) is None
    assert wire.leader_addr({"leader_addr": 5}) is None
    assert wire.leader_addr({}) is None


def test_controller_codes_map_to_controller_errors():
    fenced = HamqError.for_code(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, "stale")
    assert isinstance(fenced, ControllerFenced)
    assert fenced.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert isinstance(HamqError.for_code(ResponseCode.CONTROLLER_NOT_LEADER), ControllerNotLeader)
    failed = HamqError.for_code(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, "nobody")
    assert type(failed) is ControllerRefused and failed.message == "nobody"
    assert failed.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED


# Hostile exts: every field name the decoders read, with values of any shape — wrong
# types, huge and negative integers, nested lists, maps with int keys (the frame layer
# lets them through).
_FIELDS = [
    "cluster_name",
    "broker_name",
    "broker_id",
    "broker_addr",
    "register_check_code",
    "epoch",
    "max_offset",
    "confirm_offset",
    "trigger",
    "master_id",
    "master_epoch",
    "sync_state_set",
    "sync_state_set_epoch",
    "broker_ids",
    "clean_living_broker",
    "broker_names",
    "master_addr",
    "members",
    "next_broker_id",
]
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=8)
    | st.sampled_from([*KEY, "127.0.0.1:1", "admin", "register", 0, 1, 1023, 1024, -1])
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3)
    ),
    max_leaves=10,
)
_DECODERS = (
    wire.group_key,
    wire.apply_broker_id_request,
    wire.broker_heartbeat,
    wire.elect_master_request,
    wire.alter_sync_state_set_request,
    wire.sync_state_set_result,
    wire.clean_broker_data_request,
    wire.broker_names,
    wire.next_broker_id,
    wire.role_changed,
    wire.ReplicaInfo.from_ext,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=12) | _VALUES)
def test_hostile_exts_are_refused_as_invalid_argument_only(ext):
    for decode in _DECODERS:
        try:
            decode(ext)
        except InvalidArgument:
            pass
    assert wire.leader_addr(ext) is None or isinstance(wire.leader_addr(ext), str)
