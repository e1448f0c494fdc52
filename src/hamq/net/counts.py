"""Counts a server process keeps on its hot paths: plain integers (histograms too: a list
of ints and a ``bisect``), read by the metrics collector at scrape time
(``net/metrics.py``) and importable without prometheus_client."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Counts:
    """Request, message and byte counts since the process started, and what went wrong."""

    __slots__ = (
        "bytes_in",
        "connections_refused",
        "connections_timed_out",
        "escaped_local",
        "escaped_remote",
        "internal_errors",
        "messages_in",
        "pull_requests",
        "records_skipped",
        "send_requests",
    )

    def __init__(self) -> None:
        self.send_requests = self.messages_in = self.bytes_in = self.pull_requests = 0
        # A request that failed with something other than a HamqError: a bug.
        self.internal_errors = 0
        self.connections_refused = 0  # over max_connections(_per_address)
        self.connections_timed_out = 0  # idle, or a frame not finished in time
        self.records_skipped = 0  # stored records a background service could not read
        # messages an acting master put into another group's master (seed 004's escape):
        # into one in this process (a broker container), or over the network
        self.escaped_local = self.escaped_remote = 0


COUNTS = Counts()


# Upper bounds (µs) of the latency histograms' buckets: send answers, fsyncs.
LATENCY_US_BOUNDS = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
)  # fmt: skip


class Histogram:
    """Fixed buckets as a list of ints: ``counts[i]`` holds observations at most
    ``bounds[i]`` and above the bound before it; the last, those above every bound."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0

    def observe(self, value: int, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def cumulative(self, per_unit: int) -> list[tuple[float, int]]:
        """(upper bound / ``per_unit``, observations up to it), ending with (inf, all)."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound / per_unit, running))
        return out
