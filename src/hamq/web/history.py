"""The last ten minutes of throughput and lag, for the overview's rates and the console's
charts. A sampler task of the app reads every broker group's runtime info (its ``stats``
counters: monotonic since the broker started) and the consumer groups' lag every
``interval_s``; a rate is the difference of two readings of the same broker over the time
between them, so nothing on the brokers keeps time series.

A broker without ``stats`` (an older one) counts as zero; a reading lower than the last
one of the same broker (it restarted) starts that broker's counting again."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from hamq.client.admin import AsyncAdmin
from hamq.clock import monotonic_s, wall_ms
from hamq.errors import HamqError
from hamq.manage.queues import consumer_lag

log = logging.getLogger(__name__)

KEEP_S = 600.0
# Topics a sample keeps the rates of: its busiest with traffic (the totals count every
# topic). Idle topics' zeros, kept for ten minutes, held 177 MB for 3000 topics and made
# each console refresh a 36 MB answer built on the name server's event loop.
TOPICS_KEPT = 50
# A stats counter as the sampler reads it: (messages in, messages out) per wire topic.
Counts = dict[str, tuple[int, int]]
Series = list[tuple[int, float]]


@dataclass(frozen=True)
class Sample:
    """One round: messages published and delivered (every broker's counters as they grew:
    a failover or a restart never takes them down), rates in messages per second (totals,
    and per wire topic for the ``TOPICS_KEPT`` busiest with traffic) and total lag."""

    at_ms: int
    published: int
    delivered: int
    publish_rate: float
    deliver_rate: float
    lag: int
    topics: Mapping[str, tuple[float, float]]


def topic_counts(runtime_info: Mapping[str, Any]) -> Counts:
    """A broker's per-topic counters from its runtime info (none without ``stats``)."""
    topics = (runtime_info.get("stats") or {}).get("topics") or {}
    return {
        topic: (int(row.get("messages_in", 0)), int(row.get("messages_out", 0)))
        for topic, row in topics.items()
    }


def growth(before: Counts, after: Counts) -> Counts:
    """Per topic (published, delivered) between two readings of one broker; a counter that
    went down restarted from zero."""
    out = {}
    for topic, (now_in, now_out) in after.items():
        was_in, was_out = before.get(topic, (0, 0))
        got_in = now_in - was_in if now_in >= was_in else now_in
        got_out = now_out - was_out if now_out >= was_out else now_out
        out[topic] = (got_in, got_out)
    return out


def rates(before: Counts, after: Counts, seconds: float) -> dict[str, tuple[float, float]]:
    """Per topic (publish, deliver) per second between two readings of one broker."""
    return {topic: (i / seconds, o / seconds) for topic, (i, o) in growth(before, after).items()}


@dataclass
class History:
    """Samples kept for ``KEEP_S``; ``record`` turns raw readings into one sample."""

    interval_s: float
    samples: deque[Sample] = field(init=False)
    # broker address -> (when it was read, its counters)
    _last: dict[str, tuple[float, Counts]] = field(default_factory=dict, init=False)
    # every broker address ever read -> its last counters, and the totals of their growth:
    # the sum of the current masters' counters dropped at a failover to a fresh slave
    _counted: dict[str, Counts] = field(default_factory=dict, init=False)
    _published: int = field(default=0, init=False)
    _delivered: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.samples = deque(maxlen=max(1, math.ceil(KEEP_S / self.interval_s)))

    def record(self, now_s: float, at_ms: int, readings: Mapping[str, Counts], lag: int) -> Sample:
        """``readings``: broker address -> its counters now. A broker read for the first
        time gives no rate until its next reading."""
        topics: dict[str, tuple[float, float]] = {}
        for addr, counts in readings.items():
            for got_in, got_out in growth(self._counted.get(addr, {}), counts).values():
                self._published += got_in
                self._delivered += got_out
            self._counted[addr] = counts
            last = self._last.get(addr)
            self._last[addr] = (now_s, counts)
            if last is None or now_s <= last[0]:
                continue
            for topic, (pub, dlv) in rates(last[1], counts, now_s - last[0]).items():
                was_pub, was_dlv = topics.get(topic, (0.0, 0.0))
                topics[topic] = (was_pub + pub, was_dlv + dlv)
        for gone in set(self._last) - set(readings):
            del self._last[gone]
        busiest = heapq.nlargest(
            TOPICS_KEPT, (item for item in topics.items() if item[1] != (0.0, 0.0)),
            key=lambda item: item[1][0] + item[1][1],
        )  # fmt: skip
        sample = Sample(
            at_ms=at_ms,
            published=self._published,
            delivered=self._delivered,
            publish_rate=sum(p for p, _ in topics.values()),
            deliver_rate=sum(d for _, d in topics.values()),
            lag=lag,
            topics=dict(busiest),
        )
        self.samples.append(sample)
        return sample

    def since(self, age_s: float, now_ms: int) -> list[Sample]:
        oldest = now_ms - age_s * 1000
        return [s for s in self.samples if s.at_ms >= oldest]

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


def history_of(request: Request) -> History:
    """FastAPI dependency: the app's history."""
    history: History = request.app.state.history
    return history


async def read_cluster(admin: AsyncAdmin) -> tuple[dict[str, Counts], int]:
    """Every broker group's counters (by the address read) and the total consumer lag; a
    group that does not answer is left out of this round."""
    addrs = sorted(set((await admin.read_addrs()).values()))
    infos = await asyncio.gather(
        *(admin.broker_runtime_info(a) for a in addrs), return_exceptions=True
    )
    readings = {}
    for addr, info in zip(addrs, infos):
        if isinstance(info, HamqError):
            continue
        if isinstance(info, BaseException):
            raise info
        readings[addr] = topic_counts(info)
    lag = sum((await consumer_lag(admin)).values())
    return readings, lag


async def sample_forever(history: History, admin: AsyncAdmin) -> None:
    """The app's sampler: one round every ``interval_s`` until cancelled; a round the
    cluster cannot answer is skipped (the charts show a gap, not a zero)."""
    while True:
        try:
            readings, lag = await read_cluster(admin)
        except HamqError as err:
            log.debug("history sample skipped: %s", err)
        else:
            history.record(monotonic_s(), wall_ms(), readings, lag)
        await asyncio.sleep(history.interval_s)
