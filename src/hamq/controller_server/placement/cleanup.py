"""What a group holds that it should not keep (topics no declaration accounts for, and
retired placements with nothing left to consume) and what it lacks (the topics it is the
writable group of). Pure readings of what a group's master answers; the driver acts on
them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hamq.broker.topics import is_system_topic
from hamq.controller.state import ControllerState
from hamq.policy.definition import PolicyError, split_wire_name, wire_name
from hamq.protocol.properties import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from hamq.store.metadata import PERM_READ_WRITE


def declared_name(wire: str) -> tuple[str, str] | None:
    """(vhost, topic) of a topic a client declares, or None for the ones the brokers keep
    themselves (system topics, a group's retry and dead-letter topics) and names of no
    vhost: those are never collected."""
    if is_system_topic(wire) or wire.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
        return None
    try:
        return split_wire_name(wire)
    except PolicyError:
        return None


@dataclass(frozen=True)
class Strays:
    undeclared: tuple[tuple[str, str], ...]
    untracked: tuple[tuple[str, str], ...]


def strays(state: ControllerState, group: str, held: Iterable[str]) -> Strays:
    """The client topics among ``held`` (a group master's topic names) that no
    declaration names, and the declared ones whose declaration does not list ``group``."""
    undeclared, untracked = [], []
    for wire in sorted(held):
        name = declared_name(wire)
        decl = None if name is None else state.topics.get(name)
        if name is not None and decl is None:
            undeclared.append(name)
        elif decl is not None and group not in decl.groups:
            untracked.append((decl.vhost, decl.name))
    return Strays(tuple(undeclared), tuple(untracked))


def unwritable(
    state: ControllerState, group: str, perms: Mapping[str, int]
) -> tuple[tuple[str, str], ...]:
    """The declared topics ``group`` is the writable group of (last of their groups) that
    its master, whose topics and their perms are ``perms`` (wire name -> perm), does not
    hold read-write. A deposed leader's step still in flight can delete or retire a topic
    in a group the next leader has just made its writable one again; no plan places it
    there again (it is placed already), so producers would be refused until it moves."""
    return tuple(
        (decl.vhost, decl.name)
        for decl in sorted(state.topics.values(), key=lambda d: (d.vhost, d.name))
        if decl.groups[-1:] == (group,)
        and perms.get(wire_name(decl.vhost, decl.name), 0) & PERM_READ_WRITE != PERM_READ_WRITE
    )


@dataclass(frozen=True)
class QueueState:
    queue_id: int
    min_offset: int
    max_offset: int


def topic_drained(
    topic: str, queues: Iterable[QueueState], offsets: Mapping[str, Mapping[Any, int]]
) -> bool:
    """Whether a retired placement of ``topic`` (its wire name) has nothing left to give:
    every queue empty, or consumed to its end by every consumer group with an offset on
    it. A queue with messages that no group has an offset on is not drained: a consumer
    may still come for them. ``offsets`` is GET_ALL_CONSUMER_OFFSET's table
    ("topic@group" -> {queue id: offset})."""
    mine = [table for key, table in offsets.items() if key.partition("@")[0] == topic]
    for queue in queues:
        if queue.max_offset <= queue.min_offset:
            continue
        committed = [
            int(table[key])
            for table in mine
            for key in (queue.queue_id, str(queue.queue_id))
            if key in table
        ]
        if not committed or min(committed) < queue.max_offset:
            return False
    return True
