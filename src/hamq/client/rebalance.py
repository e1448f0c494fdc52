"""Pure pieces of the push consumer: queue allocation and tag expressions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from hamq.errors import InvalidArgument

T = TypeVar("T")


def allocate_averagely(queues: Sequence[T], client_ids: Sequence[str], client_id: str) -> list[T]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, fair, disjoint shares of the
    sorted queues over the sorted client ids (the first ``len % n`` clients get one more)."""
    if client_id not in client_ids or not queues:
        return []
    queues, client_ids = sorted(queues), sorted(client_ids)
    index, n = client_ids.index(client_id), len(client_ids)
    mod = len(queues) % n
    size = 1 if len(queues) <= n else len(queues) // n + (1 if mod > 0 and index < mod else 0)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % len(queues)] for i in range(min(size, len(queues) - start))]


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """``"*"`` (or empty) means every tag (None); ``"TagA || TagB"`` a set of tags."""
    expression = (expression or "*").strip()
    if expression == "*":
        return None
    tags = frozenset(t.strip() for t in expression.split("||"))
    if "" in tags or any(" " in t for t in tags):
        raise InvalidArgument(f"bad tag expression {expression!r}: use '*' or 'TagA || TagB'")
    return tags
