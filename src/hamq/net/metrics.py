"""Prometheus metrics of a server process, served on ``metrics_listen`` (empty = off).

The hot path only adds to plain integers (``COUNTS``, ``net/counts.py``); they are turned
into Prometheus counters when scraped, by a collector — a prometheus_client ``Counter``
takes a lock per increment, which cost a quarter of the single-message send rate.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hamq.net.connection import split_address
from hamq.net.counts import COUNTS

_COUNTER_HELP = {
    "send_requests": "Send requests stored (one per batch)",
    "messages_in": "Messages stored by send requests",
    "bytes_in": "Message bytes stored by send requests",
    "pull_requests": "Pull requests answered",
    "internal_errors": "Requests that failed on a bug (answered SYSTEM_ERROR, logged)",
    "connections_refused": "Connections closed at once: over max_connections(_per_address)",
    "connections_timed_out": "Connections closed idle or with a frame unfinished in time",
    "records_skipped": "Stored records a background service could not read (logged, skipped)",
}


class _HamqCollector(Collector):
    def __init__(self) -> None:
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}

    def collect(self) -> Iterator:
        for name, help_text in _COUNTER_HELP.items():
            yield CounterMetricFamily(f"hamq_{name}", help_text, value=getattr(COUNTS, name))
        for name, (help_text, read) in self.gauges.items():
            yield GaugeMetricFamily(name, help_text, value=read())


_COLLECTOR = _HamqCollector()
REGISTRY.register(_COLLECTOR)


def gauge(name: str, documentation: str, read: Callable[[], float]) -> None:
    """A gauge read at scrape time (no work between scrapes)."""
    _COLLECTOR.gauges[name] = (documentation, read)


def serve_metrics(listen: str) -> WSGIServer | None:
    if not listen:
        return None
    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host)
    return server
