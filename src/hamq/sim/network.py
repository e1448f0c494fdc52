"""The simulated network: delays, drops, duplicates and (one-way) partitions.

Messages travel as bytes, so every run also exercises the wire codec.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from hamq.raft.messages import Message


class SimNetwork:
    def __init__(self, rng: random.Random, schedule: Callable[[int, int, bytes], None]) -> None:
        """`schedule(delay_ms, to_id, payload)` queues one delivery in the world."""
        self._rng = rng
        self._schedule = schedule
        self.drop_probability = 0.0
        self.duplicate_probability = 0.0
        self.delay_ms_max = 1
        self._blocked: set[tuple[int, int]] = set()  # (from, to) links that lose everything
        self.sent = 0

    def send(self, msg: Message) -> None:
        self.sent += 1
        if (msg.from_id, msg.to_id) in self._blocked:
            return
        rng = self._rng
        if rng.random() < self.drop_probability:
            return
        payload = msg.encode()
        copies = 2 if rng.random() < self.duplicate_probability else 1
        for _ in range(copies):
            self._schedule(rng.randint(1, self.delay_ms_max), msg.to_id, payload)

    def split(self, side_a: Iterable[int], side_b: Iterable[int], one_way: bool) -> None:
        """Cut links from side A to side B (and back, unless `one_way`)."""
        for a in side_a:
            for b in side_b:
                self._blocked.add((a, b))
                if not one_way:
                    self._blocked.add((b, a))

    def heal(self) -> None:
        self._blocked.clear()
