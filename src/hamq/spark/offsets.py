"""Where a read starts and ends, in Spark's Kafka-source terms.

A queue is named ``"<broker>:<queue id>"``. Offsets travel as JSON shaped like Kafka's,
``{"<topic>": {"broker-a:0": 42, ...}}``, with ``-2`` meaning earliest and ``-1`` latest
in ``startingOffsets`` / ``endingOffsets``. Stream offsets are built with sorted keys,
since Spark compares offsets as JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

EARLIEST = -2
LATEST = -1


def queue_key(broker: str, queue_id: int) -> str:
    return f"{broker}:{queue_id}"


def parse_queue_key(key: str) -> tuple[str, int]:
    broker, sep, queue_id = key.rpartition(":")
    if not sep or not broker or not queue_id.isdigit():
        raise ValueError(f"bad queue name {key!r} in offsets: expected '<broker>:<queue id>'")
    return broker, int(queue_id)


@dataclass(frozen=True)
class QueueBounds:
    """What a queue holds right now."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest``, ``group`` (the consumer group's committed offsets) or an
    explicit offset per queue."""

    kind: str
    per_queue: dict[str, int]

    @classmethod
    def parse(cls, text: str | None, topic: str, default: str, option: str) -> OffsetSpec:
        text = (text or default).strip()
        if text in ("earliest", "latest", "group"):
            return cls(text, {})
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"option {option}: expected 'earliest', 'latest' or JSON like "
                f'{{"{topic}": {{"broker-a:0": 42}}}}, got {text!r} ({err})'
            ) from None
        if (
            not isinstance(parsed, dict)
            or set(parsed) != {topic}
            or not isinstance(parsed[topic], dict)
        ):
            raise ValueError(
                f"option {option}: the JSON must be an object with the one key "
                f"{topic!r} mapping queues to offsets, got {text!r}"
            )
        per_queue = {}
        for key, value in parsed[topic].items():
            parse_queue_key(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
                raise ValueError(
                    f"option {option}: offset of {key} must be an integer >= -2, got {value!r}"
                )
            per_queue[key] = value
        return cls("json", per_queue)

    def resolve(
        self, key: str, bounds: QueueBounds, committed: int | None = None, missing: int = EARLIEST
    ) -> int:
        """The concrete offset for one queue, clamped into what it holds."""
        if self.kind == "json":
            wanted = self.per_queue.get(key, missing)
        elif self.kind == "group":
            wanted = EARLIEST if committed is None else committed
        else:
            wanted = EARLIEST if self.kind == "earliest" else LATEST
        if wanted == EARLIEST:
            return bounds.min_offset
        if wanted == LATEST:
            return bounds.max_offset
        return min(max(wanted, bounds.min_offset), bounds.max_offset)


def stream_offset(topic: str, offsets: dict[str, int]) -> dict:
    return {topic: {key: offsets[key] for key in sorted(offsets)}}


def from_stream_offset(topic: str, offset: dict) -> dict[str, int]:
    return dict(offset.get(topic, {}))


def cap_to_limit(start: dict[str, int], latest: dict[str, int], max_rows: int) -> dict[str, int]:
    """End offsets reading at most ``max_rows`` in all, shared among queues in proportion
    to what each has waiting (Kafka's ``maxOffsetsPerTrigger``), at least one row for a
    queue with data while the limit lasts so no queue starves."""
    waiting = {k: latest[k] - start.get(k, 0) for k in latest if latest[k] > start.get(k, 0)}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(latest)
    end = {k: max(start.get(k, 0), 0) for k in latest}
    left = max_rows
    for key in sorted(waiting):
        share = min(waiting[key], max(1, waiting[key] * max_rows // total), left)
        end[key] += share
        left -= share
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
    topic: str, start: dict[str, int], end: dict[str, int], max_records: int | None
) -> list[QueueRange]:
    """One partition per queue with something to read, split every ``max_records``."""
    ranges = []
    for key in sorted(end):
        lo, hi = start.get(key, 0), end[key]
        broker, queue_id = parse_queue_key(key)
        step = max_records or max(hi - lo, 1)
        ranges.extend(
            QueueRange(topic, broker, queue_id, a, min(a + step, hi)) for a in range(lo, hi, step)
        )
    return ranges
