"""The controller's wire contract: request and response ``ext`` maps of the CONTROLLER_*
codes, both ways, every field checked.

Brokers, admins and controller peers all go through these functions, so a field a peer
sends with the wrong type or out of range is an ``InvalidArgument`` naming it before any
state is read or changed. Maps use string keys only (msgpack refuses int map keys), so
members travel as ``[[id, addr], ...]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hamq.controller.liveness import BrokerLiveState
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import BrokerGroup, GroupKey
from hamq.errors import InvalidArgument
from hamq.protocol.address import address
from hamq.protocol.frame import check_int, require_name
from hamq.protocol.limits import MAX_BROKER_ID, MAX_NAME_LENGTH

# Triggers a peer may send; MASTER_TIMEOUT is the controller's own and never on the wire.
_WIRE_TRIGGERS = {
    t.value: t for t in (ElectTrigger.ADMIN, ElectTrigger.REGISTER, ElectTrigger.MASTER_RESTART)
}
# GET_SYNC_STATE_DATA names at most this many groups (an admin asks for a few, or all).
MAX_GROUPS_PER_REQUEST = 4096

Ext = dict[str, Any]


# -- field checks ---------------------------------------------------------------------------


def _broker_id(ext: Mapping[str, Any], name: str) -> int:
    return check_int(name, ext.get(name), 1, MAX_BROKER_ID)


def _opt_broker_id(ext: Mapping[str, Any], name: str) -> int | None:
    value = ext.get(name)
    return None if value is None else check_int(name, value, 1, MAX_BROKER_ID)


def _count(ext: Mapping[str, Any], name: str) -> int:
    """An epoch or an offset: 0..INT64_MAX."""
    return check_int(name, ext.get(name), 0)


def _ids(ext: Mapping[str, Any], name: str) -> frozenset[int]:
    value = ext.get(name)
    if not isinstance(value, list) or len(value) > MAX_BROKER_ID:
        raise InvalidArgument(f"request field {name!r} must be a list of broker ids")
    ids = frozenset(check_int(name, item, 1, MAX_BROKER_ID) for item in value)
    if len(ids) != len(value):
        raise InvalidArgument(f"request field {name!r} names a broker id twice")
    return ids


def check_bool(ext: Mapping[str, Any], name: str) -> bool:
    value = ext.get(name)
    if not isinstance(value, bool):
        raise InvalidArgument(f"request field {name!r} must be true or false")
    return value


def check_text(ext: Mapping[str, Any], name: str, *, empty: bool = False) -> str:
    """A printable string of at most MAX_NAME_LENGTH characters (``empty``: may be "")."""
    value = ext.get(name)
    low = 0 if empty else 1
    if not isinstance(value, str) or not low <= len(value) <= MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"request field {name!r} must be a string of {low}..{MAX_NAME_LENGTH} characters"
        )
    if not value.isprintable():
        raise InvalidArgument(f"request field {name!r} must be printable")
    return value


def check_map(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a map, got {type(value).__name__}")
    return value


def group_key(ext: Mapping[str, Any]) -> GroupKey:
    """``{cluster_name, broker_name}``: GET_NEXT_BROKER_ID, GET_REPLICA_INFO."""
    ext = dict(check_map(ext, "request ext"))
    return require_name(ext, "cluster_name"), require_name(ext, "broker_name")


def group_key_ext(key: GroupKey) -> Ext:
    return {"cluster_name": key[0], "broker_name": key[1]}


# -- ReplicaInfo -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaInfo:
    """A group as members and admins see it: who is master in which epoch, the
    SyncStateSet with its epoch, and every member's address (sorted by id)."""

    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    members: tuple[tuple[int, str], ...]

    @classmethod
    def of_group(cls, group: BrokerGroup) -> ReplicaInfo:
        master = group.members.get(group.master_id) if group.master_id is not None else None
        return cls(
            group.master_id,
            None if master is None else master.address,
            group.master_epoch,
            group.sync_state_set,
            group.sync_state_set_epoch,
            tuple((i, m.address) for i, m in sorted(group.members.items())),
        )

    def to_ext(self) -> Ext:
        return {
            "master_id": self.master_id,
            "master_addr": self.master_addr,
            "master_epoch": self.master_epoch,
            "sync_state_set": sorted(self.sync_state_set),
            "sync_state_set_epoch": self.sync_state_set_epoch,
            "members": [[i, addr] for i, addr in self.members],
        }

    @classmethod
    def from_ext(cls, ext: Mapping[str, Any]) -> ReplicaInfo:
        ext = check_map(ext, "replica info")
        master_id = _opt_broker_id(ext, "master_id")
        raw_addr = ext.get("master_addr")
        master_addr = None if raw_addr is None else address(raw_addr, "master_addr")
        if (master_id is None) != (master_addr is None):
            raise InvalidArgument("fields 'master_id' and 'master_addr' must be set together")
        return cls(
            master_id,
            master_addr,
            _count(ext, "master_epoch"),
            _ids(ext, "sync_state_set"),
            _count(ext, "sync_state_set_epoch"),
            _members(ext.get("members")),
        )


def _members(value: object) -> tuple[tuple[int, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_BROKER_ID:
        raise InvalidArgument("field 'members' must be a list of [broker_id, address]")
    members: dict[int, str] = {}
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise InvalidArgument("field 'members' must be a list of [broker_id, address]")
        broker_id = check_int("members", item[0], 1, MAX_BROKER_ID)
        if broker_id in members:
            raise InvalidArgument(f"field 'members' names broker id {broker_id} twice")
        members[broker_id] = address(item[1], "members")
    return tuple(sorted(members.items()))


# -- requests: decode (controller side) and encode (client side) ----------------------------


def apply_broker_id_request(ext: Mapping[str, Any]) -> ApplyBrokerIdRequest:
    cluster_name, broker_name = group_key(ext)
    return ApplyBrokerIdRequest(
        cluster_name,
        broker_name,
        _broker_id(ext, "broker_id"),
        address(ext.get("broker_addr"), "broker_addr"),
        check_text(ext, "register_check_code"),
    )


def apply_broker_id_ext(request: ApplyBrokerIdRequest) -> Ext:
    return {
        "cluster_name": request.cluster_name,
        "broker_name": request.broker_name,
        "broker_id": request.broker_id,
        "broker_addr": request.address,
        "register_check_code": request.register_check_code,
    }


def broker_heartbeat(
    ext: Mapping[str, Any], *, with_confirm_offset: bool = True
) -> BrokerHeartbeat:
    """CONTROLLER_BROKER_HEARTBEAT, and (without a confirm offset) the report part of
    CONTROLLER_REGISTER_BROKER: both say who the member is and how far its log goes."""
    cluster_name, broker_name = group_key(ext)
    return BrokerHeartbeat(
        cluster_name,
        broker_name,
        _broker_id(ext, "broker_id"),
        address(ext.get("broker_addr"), "broker_addr"),
        _count(ext, "epoch"),
        _count(ext, "max_offset"),
        _count(ext, "confirm_offset") if with_confirm_offset else 0,
    )


def broker_heartbeat_ext(heartbeat: BrokerHeartbeat, *, with_confirm_offset: bool = True) -> Ext:
    ext: Ext = {
        "cluster_name": heartbeat.cluster_name,
        "broker_name": heartbeat.broker_name,
        "broker_id": heartbeat.broker_id,
        "broker_addr": heartbeat.address,
        "epoch": heartbeat.epoch,
        "max_offset": heartbeat.max_offset,
    }
    if with_confirm_offset:
        ext["confirm_offset"] = heartbeat.confirm_offset
    return ext


def register_broker_request(
    ext: Mapping[str, Any],
) -> tuple[BrokerHeartbeat, RegisterBrokerRequest]:
    """CONTROLLER_REGISTER_BROKER: who the member is and how far its log goes (recorded as
    a heartbeat), and the registration with its register check code."""
    who = broker_heartbeat(ext, with_confirm_offset=False)
    code = check_text(ext, "register_check_code")
    return who, RegisterBrokerRequest(
        who.cluster_name, who.broker_name, who.broker_id, who.address, code
    )


def register_broker_ext(who: BrokerHeartbeat, register_check_code: str) -> Ext:
    return {
        **broker_heartbeat_ext(who, with_confirm_offset=False),
        "register_check_code": register_check_code,
    }


def elect_master_request(ext: Mapping[str, Any]) -> ElectMasterRequest:
    cluster_name, broker_name = group_key(ext)
    raw = ext.get("trigger")
    trigger = _WIRE_TRIGGERS.get(raw) if isinstance(raw, str) else None
    if trigger is None:
        raise InvalidArgument(
            f"request field 'trigger' must be one of {sorted(_WIRE_TRIGGERS)}, got {raw!r:.40}"
        )
    # a restart names the epoch it ends (a retry after a lost answer is then fenced)
    epoch = _count(ext, "master_epoch") if trigger is ElectTrigger.MASTER_RESTART else None
    return ElectMasterRequest(
        cluster_name, broker_name, trigger, _opt_broker_id(ext, "broker_id"), epoch
    )


def elect_master_ext(request: ElectMasterRequest) -> Ext:
    ext: Ext = {
        "cluster_name": request.cluster_name,
        "broker_name": request.broker_name,
        "broker_id": request.broker_id,
        "trigger": request.trigger.value,
    }
    if request.master_epoch is not None:
        ext["master_epoch"] = request.master_epoch
    return ext


def alter_sync_state_set_request(ext: Mapping[str, Any]) -> AlterSyncStateSetRequest:
    cluster_name, broker_name = group_key(ext)
    return AlterSyncStateSetRequest(
        cluster_name,
        broker_name,
        _broker_id(ext, "master_id"),
        _count(ext, "master_epoch"),
        _ids(ext, "sync_state_set"),
        _count(ext, "sync_state_set_epoch"),
    )


def alter_sync_state_set_ext(request: AlterSyncStateSetRequest) -> Ext:
    return {
        "cluster_name": request.cluster_name,
        "broker_name": request.broker_name,
        "master_id": request.master_id,
        "master_epoch": request.master_epoch,
        "sync_state_set": sorted(request.new_sync_state_set),
        "sync_state_set_epoch": request.sync_state_set_epoch,
    }


def sync_state_set_ext(sync_state_set: frozenset[int], epoch: int) -> Ext:
    """The answer to an alter: the set now in force and its epoch."""
    return {"sync_state_set": sorted(sync_state_set), "sync_state_set_epoch": epoch}


def sync_state_set_result(ext: Mapping[str, Any]) -> tuple[frozenset[int], int]:
    ext = check_map(ext, "alter answer")
    return _ids(ext, "sync_state_set"), _count(ext, "sync_state_set_epoch")


def clean_broker_data_request(ext: Mapping[str, Any]) -> CleanBrokerDataRequest:
    cluster_name, broker_name = group_key(ext)
    return CleanBrokerDataRequest(
        cluster_name,
        broker_name,
        _ids(ext, "broker_ids"),
        check_bool(ext, "clean_living_broker"),
    )


def clean_broker_data_ext(request: CleanBrokerDataRequest) -> Ext:
    return {
        "cluster_name": request.cluster_name,
        "broker_name": request.broker_name,
        "broker_ids": sorted(request.broker_ids),
        "clean_living_broker": request.clean_living_broker,
    }


def broker_names(ext: Mapping[str, Any]) -> list[str]:
    """GET_SYNC_STATE_DATA's ``broker_names`` (empty or absent: every group)."""
    value = check_map(ext, "request ext").get("broker_names", [])
    if not isinstance(value, list) or len(value) > MAX_GROUPS_PER_REQUEST:
        raise InvalidArgument(
            f"request field 'broker_names' must be a list of at most {MAX_GROUPS_PER_REQUEST} names"
        )
    return [require_name({"broker_names": name}, "broker_names") for name in value]


def next_broker_id(ext: Mapping[str, Any]) -> int:
    return _broker_id(check_map(ext, "answer"), "next_broker_id")


def leader_addr(ext: Mapping[str, Any]) -> str | None:
    """CONTROLLER_NOT_LEADER's hint; a malformed one counts as unknown (it is only a hint)."""
    value = ext.get("leader_addr") if isinstance(ext, dict) else None
    try:
        return None if value is None else address(value, "leader_addr")
    except InvalidArgument:
        return None


def sync_state_group_ext(
    key: GroupKey,
    group: BrokerGroup,
    reports: Mapping[int, BrokerLiveState],
    alive: frozenset[int],
    shutdown_epoch: int | None = None,
) -> Ext:
    """One group of GET_SYNC_STATE_DATA: its replica info, per member what it last
    reported (None where it never did) and whether it is alive, and the last master epoch
    its master ended with a clean-shutdown notice (None: none heard)."""
    info = ReplicaInfo.of_group(group).to_ext()
    members = []
    for broker_id, addr in info.pop("members"):
        report = reports.get(broker_id)
        members.append(
            {
                "broker_id": broker_id,
                "address": addr,
                "alive": broker_id in alive,
                "epoch": None if report is None else report.epoch,
                "max_offset": None if report is None else report.max_offset,
                "confirm_offset": None if report is None else report.confirm_offset,
            }
        )
    return {**group_key_ext(key), **info, "members": members, "shutdown_epoch": shutdown_epoch}


# -- the role-change notification ------------------------------------------------------------


def role_changed_ext(key: GroupKey, info: ReplicaInfo) -> Ext:
    """NOTIFY_BROKER_ROLE_CHANGED: the group's replica info and which group it is."""
    return {**group_key_ext(key), **info.to_ext()}


def role_changed(ext: Mapping[str, Any]) -> tuple[GroupKey, ReplicaInfo]:
    return group_key(ext), ReplicaInfo.from_ext(ext)
