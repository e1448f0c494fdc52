"""Bytes for Raft: events as log entries and the whole state as a snapshot (msgpack).

Every field is checked on decode: a corrupt or hostile entry raises ``ControllerCodecError``
instead of reaching ``apply`` with the wrong types. Sets are written sorted and groups in key
order, so equal states encode to equal bytes on every peer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import astuple, replace
from typing import Any

import msgpack

from hamq.controller.catalog import declared_topic
from hamq.controller.errors import ControllerCodecError
from hamq.controller.events import (
    AddVhost,
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    DeleteVhost,
    ElectMaster,
    Event,
    RegisterBroker,
    RegisterNode,
    SetPolicy,
    SetTopicGroups,
)
from hamq.controller.state import BrokerGroup, BrokerMember, ControllerState
from hamq.errors import InvalidArgument
from hamq.policy.definition import DEFAULT_VHOST, Policy, check_vhost, make_policy

# 2: groups carry their first epoch, and the epochs of groups cleaned away are kept.
# 3: the catalog of mirrored-queue policies: vhosts, policies, declared topics, nodes.
SNAPSHOT_VERSION = 3
_READABLE_VERSIONS = {2: 3, 3: 7}  # version -> how many top-level fields it has

# A value checker takes the decoded value and returns it converted (frozenset for id sets).
Check = Callable[[object], Any]


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ControllerCodecError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: object) -> int:
    # bool is an int subclass; a bool where an id or epoch belongs is a malformed entry.
    if type(value) is not int:
        raise ControllerCodecError(f"expected an integer, got {type(value).__name__}")
    return value


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ControllerCodecError(f"expected a boolean, got {type(value).__name__}")
    return value


def _ids(value: object) -> frozenset[int]:
    items = _list(value)
    ids = frozenset(_int(item) for item in items)
    if len(ids) != len(items):
        raise ControllerCodecError("duplicate broker ids in a set")
    return ids


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ControllerCodecError(f"expected an array, got {type(value).__name__}")
    return value


def _map(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ControllerCodecError(f"expected a map, got {type(value).__name__}")
    return value


def _strs(value: object) -> tuple[str, ...]:
    return tuple(_str(item) for item in _list(value))


def _vhost(value: object) -> str:
    return check_vhost(_str(value))


def _policy_fields(policy: Policy) -> list[object]:
    return [
        policy.vhost,
        policy.name,
        policy.pattern,
        policy.apply_to,
        policy.priority,
        policy.definition.to_json(),
    ]


_POLICY_CHECKS: tuple[Check, ...] = (_vhost, _str, _str, _str, _int, _map)


def _policy(values: list[Any]) -> Policy:
    """A policy checked again as ``make_policy`` checks one being set (PolicyError), but
    for the name: an older version may have stored one the creation rules now refuse."""
    vhost, name, pattern, apply_to, priority, definition = values
    return make_policy(
        vhost, name, pattern, definition, priority=priority, apply_to=apply_to, stored=True
    )


# Wire tags are part of the Raft log format: never renumber them.
_EVENT_FIELDS: dict[int, tuple[type[Event], tuple[Check, ...]]] = {
    1: (ApplyBrokerId, (_str, _str, _int, _str, _str, _int)),
    2: (RegisterBroker, (_str, _str, _int, _str, _int)),
    3: (ElectMaster, (_str, _str, _opt_int, _int, _bool, _opt_int, _opt_int)),
    4: (AlterSyncStateSet, (_str, _str, _int, _int, _ids, _int)),
    5: (CleanBrokerData, (_str, _str, _ids)),
    6: (AddVhost, (_vhost,)),
    7: (DeleteVhost, (_vhost,)),
    8: (SetPolicy, _POLICY_CHECKS),
    9: (ClearPolicy, (_vhost, _str)),
    10: (DeclareTopic, (_vhost, _str, _str, _bool, _int, _str)),
    11: (DeleteTopic, (_vhost, _str)),
    12: (SetTopicGroups, (_vhost, _str, _strs)),
    13: (RegisterNode, (_str, _str)),
}
# Fields added to an event after entries of it were written: older entries lack them and
# decode with the defaults (ElectMaster's lost range, seed 003).
_OLDER_FIELD_COUNTS: dict[type[Event], int] = {ElectMaster: 5}
_EVENT_TAGS = {cls: tag for tag, (cls, _) in _EVENT_FIELDS.items()}


def _plain(value: object) -> object:
    return sorted(value) if isinstance(value, frozenset) else value


def encode_event(event: Event) -> bytes:
    if isinstance(event, SetPolicy):
        fields = _policy_fields(event.policy)
    else:
        fields = [_plain(value) for value in astuple(event)]
    data: bytes = msgpack.packb([_EVENT_TAGS[type(event)], *fields])
    return data


def decode_event(data: bytes) -> Event:
    items = _list(_unpack(data))
    if not items:
        raise ControllerCodecError("empty event")
    tag = _int(items[0])
    if tag not in _EVENT_FIELDS:
        raise ControllerCodecError(f"unknown event tag {tag}")
    cls, checks = _EVENT_FIELDS[tag]
    values = items[1:]
    older = _OLDER_FIELD_COUNTS.get(cls)
    if len(values) not in (len(checks), older):
        raise ControllerCodecError(
            f"{cls.__name__} needs {len(checks)} fields"
            + ("" if older is None else f" ({older} in older entries)")
            + f", got {len(values)}"
        )
    try:
        checked = [check(value) for check, value in zip(checks, values, strict=False)]
        return SetPolicy(_policy(checked)) if cls is SetPolicy else cls(*checked)
    except InvalidArgument as err:  # a vhost name or a policy that could never be set
        raise ControllerCodecError(err.message) from None


def encode_snapshot(state: ControllerState) -> bytes:
    groups = []
    for (cluster_name, broker_name), group in sorted(state.groups.items()):
        members = [
            [broker_id, m.address, m.register_check_code, m.register_time_ms]
            for broker_id, m in sorted(group.members.items())
        ]
        groups.append(
            [
                cluster_name,
                broker_name,
                members,
                group.master_id,
                group.master_epoch,
                sorted(group.sync_state_set),
                group.sync_state_set_epoch,
                group.first_epoch,
            ]
        )
    retired = [[c, b, epoch] for (c, b), epoch in sorted(state.retired_epochs.items())]
    policies = [_policy_fields(policy) for _, policy in sorted(state.policies.items())]
    topics = [
        [
            *key,
            t.home_node,
            t.exclusive,
            t.queue_nums,
            state.topic_owners.get(key, ""),
            list(t.groups),
        ]
        for key, t in sorted(state.topics.items())
    ]
    nodes = [[name, addr] for name, addr in sorted(state.nodes.items())]
    data: bytes = msgpack.packb(
        [SNAPSHOT_VERSION, groups, retired, sorted(state.vhosts), policies, topics, nodes]
    )
    return data


def decode_snapshot(data: bytes) -> ControllerState:
    top = _list(_unpack(data))
    version = top[0] if top and type(top[0]) is int else None
    if version not in _READABLE_VERSIONS or len(top) != _READABLE_VERSIONS[version]:
        raise ControllerCodecError(
            f"not a version {'/'.join(map(str, _READABLE_VERSIONS))} controller snapshot"
        )
    state = ControllerState()
    for raw in _list(top[1]):
        fields = _list(raw)
        if len(fields) != 8:
            raise ControllerCodecError(f"a group needs 8 fields, got {len(fields)}")
        key = (_str(fields[0]), _str(fields[1]))
        if key in state.groups:
            raise ControllerCodecError(f"group {key} appears twice")
        state.groups[key] = _consistent(
            key,
            BrokerGroup(
                members=_members(fields[2]),
                master_id=_opt_int(fields[3]),
                master_epoch=_int(fields[4]),
                sync_state_set=_ids(fields[5]),
                sync_state_set_epoch=_int(fields[6]),
                first_epoch=_int(fields[7]),
            ),
        )
    for raw in _list(top[2]):
        fields = _list(raw)
        if len(fields) != 3:
            raise ControllerCodecError(f"a retired group needs 3 fields, got {len(fields)}")
        key = (_str(fields[0]), _str(fields[1]))
        if key in state.groups or key in state.retired_epochs:
            raise ControllerCodecError(f"retired group {key} is listed twice")
        epoch = _int(fields[2])
        if epoch <= 0:
            raise ControllerCodecError(f"retired group {key} has epoch {epoch}")
        state.retired_epochs[key] = epoch
    if version >= 3:
        try:
            _decode_catalog(state, top[3], top[4], top[5], top[6])
        except InvalidArgument as err:
            raise ControllerCodecError(err.message) from None
    return state


def _decode_catalog(
    state: ControllerState, vhosts: object, policies: object, topics: object, nodes: object
) -> None:
    """The catalog of a version 3 snapshot, refused where ``apply`` could never have made
    it: a policy or topic outside the vhosts, a topic homed on an unknown node."""
    names = [_vhost(v) for v in _list(vhosts)]
    state.vhosts = set(names)
    if len(state.vhosts) != len(names) or DEFAULT_VHOST not in state.vhosts:
        raise ControllerCodecError("the vhosts repeat a name or lack the default vhost")
    for raw in _list(nodes):
        fields = _fields(raw, 2, "a node")
        name = _str(fields[0])
        if name in state.nodes:
            raise ControllerCodecError(f"node {name!r} appears twice")
        state.nodes[name] = _str(fields[1])
    for raw in _list(policies):
        values = _fields(raw, len(_POLICY_CHECKS), "a policy")
        policy = _policy([check(v) for check, v in zip(_POLICY_CHECKS, values, strict=True)])
        _catalog_key(state, state.policies, (policy.vhost, policy.name), "policy")
        state.policies[(policy.vhost, policy.name)] = policy
    for raw in _list(topics):
        fields = _fields(raw, 7, "a topic")
        event = DeclareTopic(
            _vhost(fields[0]),
            _str(fields[1]),
            _str(fields[2]),
            _bool(fields[3]),
            _int(fields[4]),
            _str(fields[5]),
        )
        key = (event.vhost, event.topic)
        _catalog_key(state, state.topics, key, "topic")
        if event.home_node not in state.nodes:
            raise ControllerCodecError(
                f"topic {event.topic!r} is homed on unknown node {event.home_node!r}"
            )
        state.topics[key] = replace(declared_topic(event), groups=_strs(fields[6]))
        if event.exclusive:
            state.topic_owners[key] = event.owner
        elif event.owner:
            raise ControllerCodecError(f"topic {event.topic!r} is not exclusive but has an owner")


def _fields(raw: object, count: int, what: str) -> list[object]:
    fields = _list(raw)
    if len(fields) != count:
        raise ControllerCodecError(f"{what} needs {count} fields, got {len(fields)}")
    return fields


def _catalog_key(
    state: ControllerState, table: Mapping[tuple[str, str], object], key: tuple[str, str], what: str
) -> None:
    if key[0] not in state.vhosts:
        raise ControllerCodecError(f"{what} {key[1]!r} is in unknown vhost {key[0]!r}")
    if key in table:
        raise ControllerCodecError(f"{what} {key[1]!r} of vhost {key[0]!r} appears twice")


def _consistent(key: tuple[str, str], group: BrokerGroup) -> BrokerGroup:
    """Refuse a group that ``apply`` could never have produced: a peer restoring it would
    elect from, or fence against, a state no other peer has."""
    if not group.members:
        raise ControllerCodecError(f"group {key} has no members")
    if not group.sync_state_set <= group.members.keys():
        raise ControllerCodecError(f"group {key}: SyncStateSet names unknown members")
    if group.master_id is not None and group.master_id not in group.sync_state_set:
        raise ControllerCodecError(f"group {key}: master {group.master_id} is not in its set")
    if group.master_epoch < 0 or group.sync_state_set_epoch < 0:
        raise ControllerCodecError(f"group {key}: negative epoch")
    if not 0 <= group.first_epoch <= group.master_epoch:
        raise ControllerCodecError(f"group {key}: first epoch {group.first_epoch} out of range")
    return group


def _members(value: object) -> dict[int, BrokerMember]:
    members: dict[int, BrokerMember] = {}
    for raw in _list(value):
        fields = _list(raw)
        if len(fields) != 4:
            raise ControllerCodecError(f"a member needs 4 fields, got {len(fields)}")
        broker_id = _int(fields[0])
        if broker_id in members:
            raise ControllerCodecError(f"member {broker_id} appears twice")
        members[broker_id] = BrokerMember(_str(fields[1]), _str(fields[2]), _int(fields[3]))
    return members


def _unpack(data: bytes) -> object:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ControllerCodecError(f"not valid msgpack: {exc}") from exc


def encode_snapshot_at(applied_index: int, state: ControllerState) -> bytes:
    """A snapshot file: the state with the Raft index it was taken at, so a restarted peer
    applies only the entries after it."""
    data: bytes = msgpack.packb([applied_index, encode_snapshot(state)])
    return data


def decode_snapshot_at(data: bytes) -> tuple[int, ControllerState]:
    top = _list(_unpack(data))
    if len(top) != 2 or not isinstance(top[1], bytes):
        raise ControllerCodecError("not a controller snapshot file")
    applied_index = _int(top[0])
    if applied_index < 0:
        raise ControllerCodecError(f"snapshot at a negative Raft index {applied_index}")
    return applied_index, decode_snapshot(top[1])
