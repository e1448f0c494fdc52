"""The broker side of the need offset (seed 003): gathers each queue's offsets, the
consumer groups' committed offsets and the groups known to consume each topic, and applies
the rule of ``replication/need_offset.py``. System topics (schedule, revive, half/op) count
like any other: with the offsets their services commit here, else whole, which only keeps
the need offset lower (conservative).

A group is known to consume a topic when it subscribes to it in a heartbeat (the consumer
manager) or pops from it (its pop state, rebuilt from the revive log's INIT records on a
new master). Such a group with no offset on a queue yet may start at the queue's first
entry, so the queue counts whole even when other groups have offsets there: after a
failover to a mirror whose log starts later, its first messages would be gone."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from hamq.broker.clients import ClientManager
from hamq.replication.need_offset import QueueProgress, first_needed, need_offset
from hamq.store.message_store import MessageStore


@dataclass(frozen=True)
class GroupNeed:
    offset: int  # the need offset: the least commit-log offset a consumer may still need
    messages: int  # messages some consumer may still need, every queue (RabbitMQ's ``messages``)


def known_consumers(
    clients: ClientManager, pop_states: Iterable[tuple[str, str, int]]
) -> dict[str, set[str]]:
    """Topic -> the consumer groups known to consume it: subscribed in a heartbeat of a
    live channel, or holding pop state (group, topic, queue id) on it."""
    known: dict[str, set[str]] = {}
    for group, members in clients.consumers.items():
        for channel in members.values():
            for topic in channel.subscriptions:
                known.setdefault(topic, set()).add(group)
    for group, topic, _ in pop_states:
        known.setdefault(topic, set()).add(group)
    return known


def group_need(
    store: MessageStore, consumers: Mapping[str, Collection[str]] | None = None
) -> GroupNeed:
    """O(queues × consumer groups), no per-message work: run every check period.
    ``consumers``: topic -> the groups known to consume it (``known_consumers``)."""
    committed: dict[tuple[str, int], dict[str, int]] = {}
    for key, queues in store.offsets.table().items():
        topic, group = key.split("@", 1)
        for queue_id, offset in queues.items():
            committed.setdefault((topic, int(queue_id)), {})[group] = offset
    consumers = consumers or {}
    needed, messages = [], 0
    for (topic, queue_id), cq in store.queues.items():
        offsets = committed.get((topic, queue_id), {})
        queue = QueueProgress(
            cq.min_offset,
            cq.max_offset,
            tuple(offsets.values()),
            any(group not in offsets for group in consumers.get(topic, ())),
        )
        first = first_needed(queue)
        if first is None:
            continue
        messages += queue.max_offset - first
        needed.append(cq.phys[cq.locate(first)])
    commitlog = store.commitlog
    return GroupNeed(need_offset(needed, commitlog.min_offset, commitlog.max_offset), messages)
