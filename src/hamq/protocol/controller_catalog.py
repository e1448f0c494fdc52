"""The wire contract of the controller's catalog (seed 003), codes 1030-1043: vhosts,
policies, declared topics, nodes, clean-shutdown notices; request and answer ``ext`` maps
both ways, every field checked.

As in ``protocol/controller.py``, a field with the wrong type or out of range is an
``InvalidArgument`` naming it before any state is read; a policy is checked whole by
``policy.definition.make_policy`` (its ``PolicyError`` names the key). List answers give a
policy's definition as the JSON object it was set with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hamq.config_check import NODE_NAME
from hamq.controller.events import (
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    RegisterNode,
    SetPolicy,
)
from hamq.controller.nodes import HostedMember, NodeHeartbeat, NodeLiveness, NodeReport
from hamq.controller.requests import BrokerShutdown
from hamq.controller.state import ControllerState
from hamq.errors import InvalidArgument
from hamq.policy.definition import (
    Policy,
    check_vhost,
    effective_policy,
    make_policy,
    wire_name,
)
from hamq.policy.world import TopicDecl
from hamq.protocol.address import address
from hamq.protocol.controller import check_bool, check_map, check_text
from hamq.protocol.frame import Frame, check_int, pack_body, require_name, unpack_body
from hamq.protocol.limits import (
    MAX_BROKER_ID,
    MAX_HEADER_BYTES,
    MAX_NAME_LENGTH,
    MAX_QUEUE_NUMS,
    MAX_TOPIC_LENGTH,
)
from hamq.protocol.message import validate_name

# A node hosts one member per broker group placed on it; more in one heartbeat is garbage.
MAX_NODE_MEMBERS = 4096
# Open declaring connections one node heartbeat lists (each an owner id, a declared
# topic's ``owner``, so at most MAX_NAME_LENGTH characters).
MAX_NODE_OWNERS = 65536
# Broker groups holding one topic: its writable group and the ones it drains from.
MAX_TOPIC_GROUPS = 64
# '%' joins a vhost and a name on the wire (policy.definition.wire_name).
_SEPARATOR = "%"

Ext = dict[str, Any]


def _vhost(ext: Mapping[str, Any]) -> str:
    if "vhost" not in ext:
        raise InvalidArgument("request field 'vhost' is required")
    return check_vhost(ext["vhost"])


def _node(ext: Mapping[str, Any], name: str) -> str:
    value = ext.get(name)
    if not isinstance(value, str) or not NODE_NAME.fullmatch(value):
        raise InvalidArgument(f"request field {name!r} must be a node name like hamq@host")
    return value


def _topic(ext: Mapping[str, Any], vhost: str) -> str:
    return check_topic(vhost, ext.get("topic"))


def check_topic(vhost: str, value: object) -> str:
    """A topic name in a vhost: a broker-safe name without the vhost separator, whose wire
    name (``vhost%topic``) still fits RocketMQ's topic length."""
    topic = validate_name(value, "request field 'topic'", MAX_TOPIC_LENGTH)
    if _SEPARATOR in topic:
        raise InvalidArgument(f"request field 'topic' must not contain {_SEPARATOR!r}")
    validate_name(wire_name(vhost, topic), "request field 'topic' with its vhost", MAX_TOPIC_LENGTH)
    return topic


def _pattern(ext: Mapping[str, Any]) -> str:
    """A policy's regular expression; ``make_policy`` compiles it."""
    value = ext.get("pattern")
    if not isinstance(value, str) or len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"request field 'pattern' must be a string of at most {MAX_NAME_LENGTH} characters"
        )
    return value


def vhost_filter(ext: object) -> str | None:
    """LIST_POLICIES and LIST_TOPICS: ``vhost`` absent or None lists every vhost."""
    checked = check_map(ext, "request ext")
    return None if checked.get("vhost") is None else _vhost(checked)


# -- vhosts ---------------------------------------------------------------------------------


def vhost_request(ext: object) -> str:
    """ADD_VHOST and DELETE_VHOST: ``{vhost}``."""
    return _vhost(check_map(ext, "request ext"))


def vhost_ext(vhost: str) -> Ext:
    return {"vhost": vhost}


def vhosts_result(ext: object) -> list[str]:
    value = check_map(ext, "answer").get("vhosts")
    if not isinstance(value, list):
        raise InvalidArgument("answer field 'vhosts' must be a list")
    return [check_vhost(v) for v in value]


# -- policies -------------------------------------------------------------------------------


def set_policy_request(ext: object) -> SetPolicy:
    """SET_POLICY: ``{vhost, name, pattern, definition, priority, apply_to}``."""
    checked = check_map(ext, "request ext")
    definition = checked.get("definition")
    if not isinstance(definition, dict):
        raise InvalidArgument("request field 'definition' must be a JSON object")
    return SetPolicy(
        make_policy(
            _vhost(checked),
            check_text(checked, "name"),
            _pattern(checked),
            definition,
            priority=check_int("priority", checked.get("priority"), -(2**31), 2**31 - 1),
            apply_to=check_text(checked, "apply_to"),
        )
    )


def set_policy_ext(
    vhost: str,
    name: str,
    pattern: str,
    definition: Mapping[str, object],
    priority: int,
    apply_to: str,
) -> Ext:
    return {
        "vhost": vhost,
        "name": name,
        "pattern": pattern,
        "definition": dict(definition),
        "priority": priority,
        "apply_to": apply_to,
    }


def clear_policy_request(ext: object) -> ClearPolicy:
    checked = check_map(ext, "request ext")
    return ClearPolicy(_vhost(checked), check_text(checked, "name"))


def policy_ext(policy: Policy) -> Ext:
    """One entry of LIST_POLICIES' ``policies``."""
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply_to": policy.apply_to,
        "priority": policy.priority,
        "definition": policy.definition.to_json(),
    }


def policies_ext(state: ControllerState, vhost: str | None) -> Ext:
    """LIST_POLICIES' answer: the policies of ``vhost`` (None: of every vhost)."""
    return {
        "policies": [
            policy_ext(policy)
            for (v, _), policy in sorted(state.policies.items())
            if vhost in (None, v)
        ]
    }


# -- declared topics ------------------------------------------------------------------------


def declare_topic_request(ext: object) -> DeclareTopic:
    """DECLARE_TOPIC: ``{vhost, topic, home_node, exclusive, queue_nums, owner}``."""
    checked = check_map(ext, "request ext")
    vhost = _vhost(checked)
    event = DeclareTopic(
        vhost,
        _topic(checked, vhost),
        _node(checked, "home_node"),
        check_bool(checked, "exclusive"),
        check_int("queue_nums", checked.get("queue_nums"), 1, MAX_QUEUE_NUMS),
        check_text(checked, "owner", empty=True),
    )
    if event.exclusive and not event.owner:
        # owned by "" it would be anyone's: every admin deletes as "" (DELETE_TOPIC)
        raise InvalidArgument("request field 'owner' is required for an exclusive topic")
    return event


def declare_topic_ext(event: DeclareTopic) -> Ext:
    return {
        "vhost": event.vhost,
        "topic": event.topic,
        "home_node": event.home_node,
        "exclusive": event.exclusive,
        "queue_nums": event.queue_nums,
        "owner": event.owner,
    }


def delete_topic_request(ext: object) -> tuple[DeleteTopic, str]:
    """DELETE_TOPIC: ``{vhost, topic, owner}``; ``owner`` (optional, "" = an admin) is the
    connection a client deletes through (an exclusive topic is its owner's alone)."""
    checked = check_map(ext, "request ext")
    vhost = _vhost(checked)
    owner = check_text(checked, "owner", empty=True) if "owner" in checked else ""
    return DeleteTopic(vhost, _topic(checked, vhost)), owner


def topic_ext(topic: TopicDecl, owner: str, policy: str | None) -> Ext:
    """One entry of LIST_TOPICS' ``topics``: ``owner`` declared it (exclusive ones),
    ``policy`` is the effective policy's name."""
    return {
        "vhost": topic.vhost,
        "name": topic.name,
        "wire_name": wire_name(topic.vhost, topic.name),
        "home_node": topic.home_node,
        "exclusive": topic.exclusive,
        "queue_nums": topic.queue_nums,
        "owner": owner,
        "groups": list(topic.groups),
        "policy": policy,
    }


def topics_ext(state: ControllerState, vhost: str | None) -> Ext:
    """LIST_TOPICS' answer: the topics declared in ``vhost`` (None: in every vhost), each
    with its owner and the name of the policy that applies to it."""
    topics = []
    for (v, name), topic in sorted(state.topics.items()):
        if vhost in (None, v):
            policy = effective_policy(state.policies.values(), v, name)
            owner = state.topic_owners.get((v, name), "")
            topics.append(topic_ext(topic, owner, None if policy is None else policy.name))
    return {"topics": topics}


# -- nodes ----------------------------------------------------------------------------------


def register_node_request(ext: object) -> RegisterNode:
    """REGISTER_NODE: ``{node, address}`` (the container's listen address)."""
    checked = check_map(ext, "request ext")
    return RegisterNode(_node(checked, "node"), address(checked.get("address"), "address"))


def register_node_ext(name: str, addr: str) -> Ext:
    return {"node": name, "address": addr}


def node_heartbeat(ext: object) -> NodeHeartbeat:
    """NODE_HEARTBEAT: ``{node, address, members: [{cluster_name, broker_name, broker_id,
    address}]}``."""
    checked = check_map(ext, "request ext")
    raw = checked.get("members")
    if not isinstance(raw, list) or len(raw) > MAX_NODE_MEMBERS:
        raise InvalidArgument(
            f"request field 'members' must be a list of at most {MAX_NODE_MEMBERS} members"
        )
    members = []
    for item in raw:
        member = dict(check_map(item, "an entry of field 'members'"))
        members.append(
            HostedMember(
                require_name(member, "cluster_name"),
                require_name(member, "broker_name"),
                check_int("broker_id", member.get("broker_id"), 0, MAX_BROKER_ID),
                address(member.get("address"), "address"),
            )
        )
    return NodeHeartbeat(
        _node(checked, "node"),
        address(checked.get("address"), "address"),
        tuple(members),
        _owners(checked.get("owners")),
    )


def _owners(raw: object) -> frozenset[str] | None:
    """NODE_HEARTBEAT's ``owners`` (optional: a node that does not send it reports none)."""
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) > MAX_NODE_OWNERS
        or not all(isinstance(o, str) and 0 < len(o) <= MAX_NAME_LENGTH for o in raw)
    ):
        raise InvalidArgument(
            f"request field 'owners' must be a list of at most {MAX_NODE_OWNERS} connection "
            f"ids of 1 to {MAX_NAME_LENGTH} characters"
        )
    return frozenset(raw)


def hosted_member_ext(member: HostedMember) -> Ext:
    return {
        "cluster_name": member.cluster_name,
        "broker_name": member.broker_name,
        "broker_id": member.broker_id,
        "address": member.address,
    }


def node_heartbeat_ext(heartbeat: NodeHeartbeat) -> Ext:
    ext: dict[str, Any] = {
        "node": heartbeat.node,
        "address": heartbeat.address,
        "members": [hosted_member_ext(m) for m in heartbeat.members],
    }
    if heartbeat.owners is not None:
        ext["owners"] = sorted(heartbeat.owners)
    return ext


def node_ext(name: str, addr: str, report: NodeReport | None, alive: bool) -> Ext:
    """One entry of LIST_NODES' ``nodes``: registered address, liveness, hosted members."""
    return {
        "node": name,
        "address": addr,
        "alive": alive,
        "members": [] if report is None else [hosted_member_ext(m) for m in report.members],
    }


def nodes_ext(state: ControllerState, nodes: NodeLiveness, now_ms: int) -> Ext:
    """LIST_NODES' answer: every registered node with its liveness and hosted members."""
    return {
        "nodes": [
            node_ext(name, addr, nodes.report(name), nodes.is_alive(name, now_ms))
            for name, addr in sorted(state.nodes.items())
        ]
    }


def broker_shutdown(ext: object) -> BrokerShutdown:
    """BROKER_SHUTDOWN: ``{cluster_name, broker_name, broker_id, epoch}``."""
    checked = dict(check_map(ext, "request ext"))
    return BrokerShutdown(
        require_name(checked, "cluster_name"),
        require_name(checked, "broker_name"),
        check_int("broker_id", checked.get("broker_id"), 1, MAX_BROKER_ID),
        check_int("epoch", checked.get("epoch"), 0),
    )


def broker_shutdown_ext(notice: BrokerShutdown) -> Ext:
    return {
        "cluster_name": notice.cluster_name,
        "broker_name": notice.broker_name,
        "broker_id": notice.broker_id,
        "epoch": notice.epoch,
    }


# A read's answer larger than this goes in the body: a frame header holds at most
# MAX_HEADER_BYTES (a few hundred topics' rows already pass it) and the rest of the
# header needs room too.
MAX_EXT_ANSWER_BYTES = MAX_HEADER_BYTES // 2


def answer_parts(ext: Ext) -> tuple[Ext | None, bytes]:
    """``(ext, body)`` of a read's answer: small ones in the header's ext as before, large
    ones as the msgpack body (``answer`` reads either)."""
    body = pack_body(ext)
    return (ext, b"") if len(body) <= MAX_EXT_ANSWER_BYTES else (None, body)


def answer(frame: Frame) -> object:
    """A read's answer map: the body when there is one, else the header's ext."""
    return unpack_body(frame.body) if frame.body else frame.ext


def list_result(ext: object, name: str) -> list[dict[str, Any]]:
    """A list answer's entries (``policies``, ``topics``, ``nodes``) as maps."""
    value = check_map(ext, "answer").get(name)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InvalidArgument(f"answer field {name!r} must be a list of maps")
    return value
