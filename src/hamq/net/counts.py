"""Counts a server process keeps on its hot paths: plain integers, read by the metrics
collector at scrape time (``net/metrics.py``) and importable without prometheus_client."""

from __future__ import annotations


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
