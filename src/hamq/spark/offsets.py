"""Where a read starts and ends, in Spark's Kafka-source terms.

A queue is named ``"<broker>:<queue id>"``. Offsets travel as JSON shaped like Kafka's,
``{"<topic>": {"broker-a:0": 42, ...}, ...}``, with ``-2`` meaning earliest and ``-1``
latest in ``startingOffsets`` / ``endingOffsets``. Stream offsets are built with sorted
keys, since Spark compares offsets as JSON text. Everything here is pure: the reader asks
the brokers and hands the answers in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from pyspark.sql.datasource import InputPartition

from hamq.spark.options import TopicSelection, check_queue_key

EARLIEST = -2
LATEST = -1


class TopicQueue(NamedTuple):
    """One queue of one topic; orders by topic, then broker, then queue id."""

    topic: str
    broker: str
    queue_id: int

    @property
    def key(self) -> str:
        return f"{self.broker}:{self.queue_id}"

    @classmethod
    def of(cls, topic: str, key: str) -> TopicQueue:
        broker, _, queue_id = check_queue_key(key, "offsets").rpartition(":")
        return cls(topic, broker, int(queue_id))

    def __str__(self) -> str:
        return f"queue {self.key} of {self.topic}"


Offsets = dict[TopicQueue, int]


@dataclass(frozen=True)
class QueueBounds:
    """What a queue holds right now, as its master says (or, with none, a slave, which
    may lag: its offsets are not a sign of offsets going backwards)."""

    min_offset: int
    max_offset: int
    from_master: bool = True


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest``, ``group`` (the consumer group's committed offsets),
    ``timestamp`` (the offsets the brokers found for ``startingTimestamp``) or an explicit
    offset per queue."""

    kind: str
    per_queue: Offsets

    @classmethod
    def parse(
        cls, text: str | None, topics: TopicSelection, default: str, option: str
    ) -> OffsetSpec:
        text = (text or default).strip()
        if text in ("earliest", "latest", "group"):
            return cls(text, {})
        example = '{"<topic>": {"broker-a:0": 42}}'
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"option {option}: expected 'earliest', 'latest' or JSON like "
                f"{example}, got {text!r} ({err})"
            ) from None
        if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
            raise ValueError(
                f"option {option}: the JSON must map topics to objects of queues and offsets "
                f"like {example}, got {text!r}"
            )
        per_queue = {}
        for topic, queues in parsed.items():
            if not topics.covers(topic):
                raise ValueError(
                    f"option {option} names topic {topic!r}, which this read does not "
                    f"cover (it reads {topics.describe()})"
                )
            for key, value in queues.items():
                if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
                    raise ValueError(
                        f"option {option}: offset of {key} must be an integer >= -2, got {value!r}"
                    )
                per_queue[TopicQueue.of(topic, key)] = value
        return cls("json", per_queue)

    def wanted(self, queue: TopicQueue, committed: int | None, missing: int) -> int:
        """The offset asked for ``queue``: EARLIEST, LATEST or a number."""
        if self.kind in ("json", "timestamp"):
            return self.per_queue.get(queue, missing)
        if self.kind == "group":
            return EARLIEST if committed is None else committed
        return EARLIEST if self.kind == "earliest" else LATEST


def clamp(wanted: int, bounds: QueueBounds) -> int:
    if wanted == EARLIEST:
        return bounds.min_offset
    if wanted == LATEST:
        return bounds.max_offset
    return min(max(wanted, bounds.min_offset), bounds.max_offset)


def below_minimum(queue: TopicQueue, wanted: int, bounds: QueueBounds) -> str | None:
    """The data loss of a read asked to start at ``wanted``, if the queue no longer holds
    it (retention removed it): what Kafka's source reports instead of clamping."""
    if 0 <= wanted < bounds.min_offset:
        return (
            f"{queue} no longer holds offsets {wanted}..{bounds.min_offset - 1} "
            f"(it holds {bounds.min_offset}..{bounds.max_offset})"
        )
    return None


def plan_starts(
    reached: Offsets, bounds: dict[TopicQueue, QueueBounds], ends: Offsets | None = None
) -> tuple[Offsets, list[str]]:
    """Where a stream reads each queue from next, given the offsets it ``reached`` and
    what the queues hold now, and the data losses found on the way: a queue whose offsets
    went backwards (the topic deleted and re-created, a master that lost an unreplicated
    tail) restarts from what it holds; one whose unread offsets retention removed resumes
    at its minimum; a new queue starts at its minimum, which should be 0. A queue absent
    from ``bounds`` (its group unreachable) stays where it is. With ``ends`` (a planned
    batch, replayed after a restart), only its queues, and an end below the start is the
    offsets going backwards."""
    queues = set(ends) if ends is not None else set(reached) | set(bounds)
    starts: Offsets = {}
    losses: list[str] = []
    for queue in sorted(queues):
        at, now = reached.get(queue), bounds.get(queue)
        end = ends.get(queue) if ends is not None else None
        if now is None:
            starts[queue] = at if at is not None else 0
        elif at is None:
            starts[queue] = now.min_offset
            if now.min_offset > 0:
                losses.append(f"{queue} is new and starts at offset {now.min_offset}, not 0")
        elif now.max_offset < at and not now.from_master and (end is None or end >= at):
            # a slave behind its master (a replayed batch too): wait for the master
            starts[queue] = at
        elif now.max_offset < at or (end is not None and end < at):
            starts[queue] = now.min_offset
            changed_to = now.max_offset if end is None else min(end, now.max_offset)
            losses.append(
                f"{queue}: offset was changed from {at} to {changed_to} (the topic was "
                f"re-created, or its master lost messages it had not replicated); reading "
                f"it again from {now.min_offset}"
            )
        else:
            starts[queue] = max(at, now.min_offset)
            loss = below_minimum(queue, at, now)
            if loss:
                losses.append(f"{loss}: removed by retention before they were read")
        if end is not None:
            starts[queue] = min(starts[queue], end)
    return starts, losses


def stream_offset(offsets: Offsets) -> dict:
    out: dict[str, dict[str, int]] = {}
    for queue in sorted(offsets):
        out.setdefault(queue.topic, {})[queue.key] = offsets[queue]
    return out


def from_stream_offset(offset: dict) -> Offsets:
    return {
        TopicQueue.of(topic, key): value
        for topic, queues in offset.items()
        for key, value in queues.items()
    }


def cap_to_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets of a trigger reading at most ``max_rows`` (Kafka's
    ``maxOffsetsPerTrigger``), shared in proportion to what each queue has waiting.

    No queue with data starves: each gets at least one row, as Kafka's ``rateLimit``
    rounds a share below one row up. Kafka floors the other shares and so may read up to
    one row per queue more than the limit; here every queue first gets its one row and
    the rest of the limit is shared by largest remainder, so a trigger reads exactly
    ``min(max_rows, waiting)`` rows once the limit covers one row per queue with data, and
    one row per such queue (more than the limit, as Kafka does) below that."""
    waiting = {q: latest[q] - start[q] for q in sorted(latest) if latest[q] > start[q]}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(latest)
    end = dict(latest)
    rest = max(max_rows - len(waiting), 0)
    shares = dict.fromkeys(waiting, 0)
    if rest:
        spread = total - len(waiting)  # > rest, so no share reaches what its queue has
        shares = {q: rest * (n - 1) // spread for q, n in waiting.items()}
        by_remainder = sorted(waiting, key=lambda q: (-(rest * (waiting[q] - 1) % spread), q))
        for queue in by_remainder[: rest - sum(shares.values())]:
            shares[queue] += 1
    for queue in waiting:
        end[queue] = start[queue] + 1 + shares[queue]
    return end


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: offsets ``[start, end)`` of one queue of ``topic``."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int


def plan_ranges(
    start: Offsets, end: Offsets, max_records: int | None, min_partitions: int | None = None
) -> list[QueueRange]:
    """A partition per queue with something to read, split in even parts so none holds
    more than ``max_records`` and there are at least ``min_partitions`` (Kafka's
    ``minPartitions``; a queue's parts in proportion to its share of the rows, never more
    parts than rows)."""
    sizes = {q: end[q] - start.get(q, 0) for q in sorted(end) if end[q] > start.get(q, 0)}
    total = sum(sizes.values())
    ranges = []
    for queue, size in sizes.items():
        parts = max(
            1,
            -(-size // max_records) if max_records else 1,
            -(-size * min_partitions // total) if min_partitions else 1,
        )
        parts = min(parts, size)
        lo = start.get(queue, 0)
        cuts = [lo + size * i // parts for i in range(parts + 1)]
        ranges.extend(QueueRange(*queue, a, b) for a, b in pairwise(cuts))
    return ranges
