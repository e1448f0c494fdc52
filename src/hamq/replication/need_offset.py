"""The need offset of a mirrored group (seed 003), sans-IO: the smallest commit-log offset
of a message some consumer may still need. A mirror whose log starts at or below it holds
everything a consumer can ask for, so it may replace the master without anyone missing a
message: that, with being caught up, is what *synchronised* means (docs/ARCHITECTURE.md,
"Mirrored-queue policies").

Per queue, what is still needed starts at the least offset committed by the consumer
groups that have one there (never past the queue's end), or at the queue's first entry
when no group has one (a consumer that comes later starts there) or when a group known to
consume the queue has none yet (connected and not yet committed, or new with
consume-from-first): the whole queue counts. The broker maps that queue offset to the
physical offset of its consume-queue entry (``broker/need_offset.py``); this module keeps
the rule itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueProgress:
    """One queue as the rule reads it: its offsets and the groups' committed offsets."""

    min_offset: int
    max_offset: int
    committed: tuple[int, ...]  # one per consumer group with an offset in this queue
    # a group known to consume the queue (subscribed, or popping) has no offset here yet:
    # it may start at the queue's first entry
    unstarted: bool = False


def first_needed(queue: QueueProgress) -> int | None:
    """The first queue offset a consumer may still need, or None when every consumer
    group known here has consumed the whole queue."""
    if queue.committed and not queue.unstarted:
        first = max(queue.min_offset, min(min(queue.committed), queue.max_offset))
    else:
        first = queue.min_offset
    return first if first < queue.max_offset else None


def need_offset(needed_physical: Iterable[int], log_min: int, log_end: int) -> int:
    """The group's need offset from the physical offsets where each queue's needed
    messages start: the least of them, the log's end when nothing is needed, and never
    below the log's first byte (retention removed what is below it on every member)."""
    return max(log_min, min(needed_physical, default=log_end))
