"""Decide and apply for the catalog of mirrored-queue policies: vhosts, policies,
declared topics and nodes (seed 003).

A catalog request is the event it asks for (nothing the leader adds), so deciding is only
checking it against the applied state: the event to propose, None when the state already
says it (answered without a Raft entry: nodes register and clients declare again at every
start), or a refusal naming what is wrong. ``apply`` checks the same again, so of two
conflicting requests decided together the second is refused on every peer alike.
Field shapes (names, ranges, the policy definition) are checked earlier, on the wire.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Final

from hamq.controller.errors import ControllerCode, ControllerError
from hamq.controller.events import (
    AddVhost,
    CatalogEvent,
    ClearPolicy,
    DeclareTopic,
    DeleteTopic,
    DeleteVhost,
    RegisterNode,
    SetPolicy,
    SetTopicGroups,
)
from hamq.controller.state import ControllerState
from hamq.policy.definition import DEFAULT_VHOST
from hamq.policy.world import TopicDecl

# Bounds on the replicated catalog: every peer holds it in memory, writes it in each
# snapshot and matches every policy against every topic of its vhost each placement round,
# so requests from anyone must not grow it without limit (RabbitMQ's per-vhost max-queues
# is the same idea). Reaching one refuses the new name; existing ones still change.
MAX_VHOSTS: Final = 256
MAX_POLICIES: Final = 1024
MAX_TOPICS: Final = 20_000
MAX_NODES: Final = 256


def _refused(remark: str) -> ControllerError:
    return ControllerError(ControllerCode.CONTROLLER_INVALID_REQUEST, remark)


def _vhost_of(event: CatalogEvent) -> str | None:
    """The vhost that must exist for ``event`` (None: an event outside any vhost)."""
    if isinstance(event, (AddVhost, RegisterNode)):
        return None
    if isinstance(event, SetPolicy):
        return event.policy.vhost
    return event.vhost


def decide_catalog(
    state: ControllerState, event: CatalogEvent
) -> CatalogEvent | ControllerError | None:
    """The event to propose, None when nothing would change, or why it is refused."""
    vhost = _vhost_of(event)
    if vhost is not None and vhost not in state.vhosts:
        return _refused(f"vhost {vhost!r} does not exist (add it first: hamq admin add-vhost)")
    refusal = _refusal(state, event)
    if refusal is not None:
        return refusal
    return None if _already(state, event) else event


def _over_limit(state: ControllerState, event: CatalogEvent) -> ControllerError | None:
    """A new vhost, policy, topic or node past its bound (one already there may change)."""
    held: Collection[object]
    key: object
    if isinstance(event, AddVhost):
        held, key, limit, what = state.vhosts, event.vhost, MAX_VHOSTS, "vhosts"
    elif isinstance(event, SetPolicy):
        held, key = state.policies, (event.policy.vhost, event.policy.name)
        limit, what = MAX_POLICIES, "policies"
    elif isinstance(event, DeclareTopic):
        held, key, limit, what = state.topics, (event.vhost, event.topic), MAX_TOPICS, "topics"
    elif isinstance(event, RegisterNode):
        held, key, limit, what = state.nodes, event.name, MAX_NODES, "nodes"
    else:
        return None
    if key in held or len(held) < limit:
        return None
    return _refused(f"the controller already holds {limit} {what}, its limit")


def _refusal(state: ControllerState, event: CatalogEvent) -> ControllerError | None:
    limit = _over_limit(state, event)
    if limit is not None:
        return limit
    if isinstance(event, DeleteVhost) and event.vhost == DEFAULT_VHOST:
        return _refused(f"vhost {DEFAULT_VHOST!r} is the default and cannot be deleted")
    if isinstance(event, ClearPolicy) and (event.vhost, event.name) not in state.policies:
        return _refused(f"policy {event.name!r} does not exist in vhost {event.vhost!r}")
    if isinstance(event, (DeleteTopic, SetTopicGroups)):
        if (event.vhost, event.topic) not in state.topics:
            return _refused(f"topic {event.topic!r} is not declared in vhost {event.vhost!r}")
    if isinstance(event, DeclareTopic):
        if event.home_node not in state.nodes:
            return _refused(f"node {event.home_node!r} is not registered with the controller")
        old = state.topics.get((event.vhost, event.topic))
        owner = state.topic_owners.get((event.vhost, event.topic), "")
        if old is not None and not same_declaration(old, owner, event):
            return _refused(
                f"topic {event.topic!r} in vhost {event.vhost!r} is already declared with "
                f"exclusive={old.exclusive}, queue_nums={old.queue_nums}"
                + (" by another connection" if old.exclusive and owner != event.owner else "")
            )
    return None


def same_declaration(old: TopicDecl, owner: str, event: DeclareTopic) -> bool:
    """A declaration again with the same arguments (RabbitMQ's redeclare): nothing to do.
    An exclusive topic is its ``owner``'s only, as RabbitMQ's RESOURCE_LOCKED says."""
    return (
        old.exclusive == event.exclusive
        and old.queue_nums == event.queue_nums
        and (not old.exclusive or owner == event.owner)
    )


def _already(state: ControllerState, event: CatalogEvent) -> bool:
    if isinstance(event, AddVhost):
        return event.vhost in state.vhosts
    if isinstance(event, SetPolicy):
        return state.policies.get((event.policy.vhost, event.policy.name)) == event.policy
    if isinstance(event, DeclareTopic):
        return (event.vhost, event.topic) in state.topics
    if isinstance(event, SetTopicGroups):
        return state.topics[(event.vhost, event.topic)].groups == event.groups
    if isinstance(event, RegisterNode):
        return state.nodes.get(event.name) == event.address
    return False


def apply_catalog(state: ControllerState, event: CatalogEvent) -> bool:
    """Apply a catalog event; False (nothing changes) where the state no longer allows it."""
    vhost = _vhost_of(event)
    if vhost is not None and vhost not in state.vhosts:
        return False
    if _refusal(state, event) is not None:
        return False
    if isinstance(event, AddVhost):
        state.vhosts.add(event.vhost)
    elif isinstance(event, DeleteVhost):
        state.vhosts.discard(event.vhost)
        for table in (state.policies, state.topics, state.topic_owners):
            for key in [k for k in table if k[0] == event.vhost]:
                del table[key]
    elif isinstance(event, SetPolicy):
        state.policies[(event.policy.vhost, event.policy.name)] = event.policy
    elif isinstance(event, ClearPolicy):
        del state.policies[(event.vhost, event.name)]
    elif isinstance(event, DeclareTopic):
        # a same declaration committed twice keeps the first (its home node)
        key = (event.vhost, event.topic)
        if key not in state.topics:
            state.topics[key] = declared_topic(event)
            if event.exclusive:
                state.topic_owners[key] = event.owner
    elif isinstance(event, DeleteTopic):
        del state.topics[(event.vhost, event.topic)]
        state.topic_owners.pop((event.vhost, event.topic), None)
    elif isinstance(event, SetTopicGroups):
        key = (event.vhost, event.topic)
        state.topics[key] = replace(state.topics[key], groups=event.groups)
    else:
        state.nodes[event.name] = event.address
    return True


def declared_topic(event: DeclareTopic) -> TopicDecl:
    return TopicDecl(
        vhost=event.vhost,
        name=event.topic,
        home_node=event.home_node,
        exclusive=event.exclusive,
        queue_nums=event.queue_nums,
    )
