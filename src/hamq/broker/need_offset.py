"""The broker side of the need offset (seed 003): gathers each queue's offsets and the
consumer groups' committed offsets from the store and applies the rule of
``replication/need_offset.py``. System topics (schedule, revive, half/op) count like any
other: with the offsets their services commit here, else whole, which only keeps the
need offset lower (conservative)."""

from __future__ import annotations

from dataclasses import dataclass

from hamq.replication.need_offset import QueueProgress, first_needed, need_offset
from hamq.store.message_store import MessageStore


@dataclass(frozen=True)
class GroupNeed:
    offset: int  # the need offset: the least commit-log offset a consumer may still need
    messages: int  # messages some consumer may still need, over every queue


def group_need(store: MessageStore) -> GroupNeed:
    """O(queues × consumer groups), no per-message work: run every check period."""
    committed: dict[tuple[str, int], list[int]] = {}
    for key, queues in store.offsets.table().items():
        topic = key.split("@", 1)[0]
        for queue_id, offset in queues.items():
            committed.setdefault((topic, int(queue_id)), []).append(offset)
    needed, messages = [], 0
    for (topic, queue_id), cq in store.queues.items():
        queue = QueueProgress(
            cq.min_offset, cq.max_offset, tuple(committed.get((topic, queue_id), ()))
        )
        first = first_needed(queue)
        if first is None:
            continue
        messages += queue.max_offset - first
        needed.append(cq.phys[cq.locate(first)])
    commitlog = store.commitlog
    return GroupNeed(need_offset(needed, commitlog.min_offset, commitlog.max_offset), messages)
