"""What a bench run shows while it runs (a progress bar) and keeps for ``--plot`` (throughput
and latency per interval, and its events).

A bench already counts what it finished and appends one latency per request to an array;
the timeline only looks at those every ``INTERVAL_S`` from one task (the count's growth and
the array's new tail), so it adds no work per message and the bench's own numbers stay as
they were.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hamq.net.tasks import PeriodicTask
from hamq.plot import Panel, plot_series

INTERVAL_S = 0.25


def _percentile(sorted_s: list[float], q: float) -> float:
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000


@dataclass
class _Counters:
    """Where a bench keeps its counts, and what they were at the last sample."""

    count: Callable[[], int]
    latencies_s: array | None
    errors: Callable[[], int] | None
    at: float
    done: int
    looked: int = 0  # latencies already sampled
    failed: int = 0


@dataclass
class Timeline:
    """Per-interval samples of a running bench. ``advance`` moves its progress bar by the
    count's growth (``None``: the bar counts something else, or there is none); ``plot`` is
    the PNG to draw at the end (``None``: keep nothing)."""

    plot: str | None = None
    advance: Callable[[int], None] | None = None
    interval_s: float = INTERVAL_S
    clock: Callable[[], float] = time.perf_counter  # the one the bench times its events by
    started: float = 0.0  # clock() at follow()
    rate: list[tuple[float, float]] = field(default_factory=list)  # (s, msgs/s)
    error_rate: list[tuple[float, float]] = field(default_factory=list)
    p50_ms: list[tuple[float, float]] = field(default_factory=list)
    p99_ms: list[tuple[float, float]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    _counters: _Counters | None = None
    _sampler: PeriodicTask | None = None

    def follow(
        self,
        count: Callable[[], int],
        latencies_s: array | None = None,
        errors: Callable[[], int] | None = None,
    ) -> None:
        """Starts sampling now (time 0 of the plot): ``count()`` is what finished so far,
        ``latencies_s`` the bench's array of request latencies, ``errors()`` failures."""
        self.started = self.clock()
        if self.plot is None and self.advance is None:
            return
        self._counters = _Counters(
            count, latencies_s, errors, self.started, count(), failed=errors() if errors else 0
        )
        self._sampler = PeriodicTask("bench timeline", self.interval_s, self._sample)
        self._sampler.start()

    def _sample(self, last: bool = False) -> None:
        c = self._counters
        assert c is not None
        now, done = self.clock(), c.count()
        if now <= c.at:
            return
        if self.advance is not None:
            self.advance(done - c.done)
        if last and now - c.at < self.interval_s / 4 and self.rate:
            return  # a sliver of an interval: its rate and percentiles would be noise
        fresh = None
        if c.latencies_s is not None:
            fresh = c.latencies_s[c.looked :]
            c.looked = len(c.latencies_s)
        failed = None
        if c.errors is not None:
            so_far = c.errors()
            failed, c.failed = so_far - c.failed, so_far
        self.add_interval(now - c.at, now - self.started, done - c.done, fresh, failed)
        c.at, c.done = now, done

    def add_interval(
        self,
        dt: float,
        t: float,
        done: int,
        latencies_s: Iterable[float] | None,
        failed: int | None = None,
    ) -> None:
        """One interval of ``dt`` seconds ending at ``t``: ``done`` finished in it, with
        these latencies, and ``failed`` failures (None: the bench does not count that)."""
        t = round(t, 3)
        self.rate.append((t, done / dt))
        if failed is not None:
            self.error_rate.append((t, failed / dt))
        if latencies_s is not None:
            fresh = sorted(latencies_s)
            # an interval where nothing finished is a gap in the line, not a zero
            self.p50_ms.append((t, _percentile(fresh, 0.5) if fresh else math.nan))
            self.p99_ms.append((t, _percentile(fresh, 0.99) if fresh else math.nan))

    def mark(self, label: str, at: float | None = None) -> None:
        """An event at ``at`` on ``clock`` (default: now), drawn as a labelled line."""
        self.events.append((round((at or self.clock()) - self.started, 3), label))

    async def stop(self) -> None:
        """Stops sampling, with a last sample of the unfinished interval."""
        if self._sampler is not None:
            await self._sampler.stop()
            self._sampler = None
            self._sample(last=True)

    def draw(self, title: str, rate_label: str = "msgs/s") -> None:
        """Writes ``plot`` (if asked for): throughput, then latency when there is any."""
        if self.plot is None:
            return
        rates = {rate_label: self.rate}
        if any(v for _, v in self.error_rate):
            rates["errors/s"] = self.error_rate
        panels = [Panel("throughput (msgs/s)", rates, self.events)]
        if any(not math.isnan(v) for _, v in self.p50_ms):
            latency = {"p50": self.p50_ms, "p99": self.p99_ms}
            panels.append(Panel("latency (ms)", latency, self.events))
        plot_series(self.plot, title, panels)


def timeline_of(
    sends: Iterable[tuple[float, float]],
    started: float,
    plot: str | None,
    interval_s: float = INTERVAL_S,
) -> Timeline:
    """The timeline of sends recorded as (begun, acknowledged) on one clock, from
    ``started``: for runs that keep every acknowledgement anyway (the chaos suite's steady
    producer), so plotting them costs nothing while they run."""
    timeline = Timeline(plot, interval_s=interval_s, started=started)
    bins: dict[int, list[float]] = {}
    for begun, acked in sends:
        bins.setdefault(int((acked - started) // interval_s), []).append(acked - begun)
    for i in range(max(bins, default=-1) + 1):
        latencies = bins.get(i, [])
        timeline.add_interval(interval_s, (i + 1) * interval_s, len(latencies), latencies)
    return timeline
