"""Bytes for Raft: events as log entries and the whole state as a snapshot (msgpack).

Every field is checked on decode: a corrupt or hostile entry raises ``ControllerCodecError``
instead of reaching ``apply`` with the wrong types. Sets are written sorted and groups in key
order, so equal states encode to equal bytes on every peer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple
from typing import Any

import msgpack

from hamq.controller.errors import ControllerCodecError
from hamq.controller.events import (
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ElectMaster,
    Event,
    RegisterBroker,
)
from hamq.controller.state import BrokerGroup, BrokerMember, ControllerState

# 2: groups carry their first epoch, and the epochs of groups cleaned away are kept.
SNAPSHOT_VERSION = 2

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


# Wire tags are part of the Raft log format: never renumber them.
_EVENT_FIELDS: dict[int, tuple[type[Event], tuple[Check, ...]]] = {
    1: (ApplyBrokerId, (_str, _str, _int, _str, _str, _int)),
    2: (RegisterBroker, (_str, _str, _int, _str, _int)),
    3: (ElectMaster, (_str, _str, _opt_int, _int, _bool)),
    4: (AlterSyncStateSet, (_str, _str, _int, _int, _ids, _int)),
    5: (CleanBrokerData, (_str, _str, _ids)),
}
_EVENT_TAGS = {cls: tag for tag, (cls, _) in _EVENT_FIELDS.items()}


def _plain(value: object) -> object:
    return sorted(value) if isinstance(value, frozenset) else value


def encode_event(event: Event) -> bytes:
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
    if len(values) != len(checks):
        raise ControllerCodecError(f"{cls.__name__} needs {len(checks)} fields, got {len(values)}")
    return cls(*(check(value) for check, value in zip(checks, values, strict=True)))


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
    data: bytes = msgpack.packb([SNAPSHOT_VERSION, groups, retired])
    return data


def decode_snapshot(data: bytes) -> ControllerState:
    top = _list(_unpack(data))
    if len(top) != 3 or top[0] != SNAPSHOT_VERSION:
        raise ControllerCodecError(f"not a version {SNAPSHOT_VERSION} controller snapshot")
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
    return state


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
