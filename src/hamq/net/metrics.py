"""Prometheus metrics of a server process, served on ``metrics_listen`` (empty = off).

The hot path only adds to plain integers (``COUNTS``, ``net/counts.py``); they are turned
into Prometheus counters when scraped, by a collector — a prometheus_client ``Counter``
takes a lock per increment, which cost a quarter of the single-message send rate.

The HTTP server is prometheus_client's (a thread per request) with two limits, because a
client that opens connections and sends half a request held a thread each, without end:
2000 such connections made 1000 threads, the scrape hung, and SIGTERM no longer stopped
the process. A request must arrive within ``SCRAPE_TIMEOUT_S`` and at most
``MAX_SCRAPES`` are served at once (more are closed unanswered).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from hamq.net.connection import split_address
from hamq.net.counts import COUNTS, Histogram

_COUNTER_HELP = {
    "send_requests": "Send requests stored (one per batch)",
    "messages_in": "Messages stored by send requests",
    "bytes_in": "Message bytes stored by send requests",
    "pull_requests": "Pull requests answered",
    "internal_errors": "Requests that failed on a bug (answered SYSTEM_ERROR, logged)",
    "connections_refused": "Connections closed at once: over max_connections(_per_address)",
    "connections_timed_out": "Connections closed idle or with a frame unfinished in time",
    "records_skipped": "Stored records a background service could not read (logged, skipped)",
    "escaped_local": "Messages an acting master put into a master in this process (seed 004)",
    "escaped_remote": "Messages an acting master put into another process's master (seed 004)",
}


# A gauge's series by its labels, as sorted (name, value) pairs: () for a process's only
# server; ``broker_name`` and ``broker_id`` for each member of a broker container, whose
# members share one process and one /metrics (``broker/container.py``).
Labels = tuple[tuple[str, str], ...]


class Families:
    """The labelled series of one scrape, by family name: every source (each member of a
    broker container, say) adds its series to the one family of that name, as the
    exposition format wants each family once."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def _family(self, name: str, documentation: str, kind: str) -> Metric:
        family = self.by_name.get(name)
        if family is None:
            family = self.by_name[name] = Metric(name, documentation, kind)
        return family

    def counter(self, name: str, documentation: str, labels: dict[str, str], value: float) -> None:
        self._family(name, documentation, "counter").add_sample(f"{name}_total", labels, value)

    def gauge(self, name: str, documentation: str, labels: dict[str, str], value: float) -> None:
        self._family(name, documentation, "gauge").add_sample(name, labels, value)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        histogram: Histogram,
        per_unit: int,
    ) -> None:
        """``histogram`` counts in units of 1 / ``per_unit`` of the metric's (µs: 1_000_000
        for seconds)."""
        family = self._family(name, documentation, "histogram")
        buckets = histogram.cumulative(per_unit)
        for bound, count in buckets:
            family.add_sample(f"{name}_bucket", {**labels, "le": _bound_text(bound)}, count)
        family.add_sample(f"{name}_count", labels, buckets[-1][1])
        family.add_sample(f"{name}_sum", labels, histogram.total / per_unit)


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# A source adds its series to a scrape's families; it gets the labels it was added with.
Source = Callable[[Families, dict[str, str]], None]


class _HamqCollector(Collector):
    def __init__(self) -> None:
        self.gauges: dict[str, tuple[str, dict[Labels, Callable[[], float]]]] = {}
        self.sources: dict[tuple[str, Labels], Source] = {}

    def collect(self) -> Iterator:
        for name, help_text in _COUNTER_HELP.items():
            yield CounterMetricFamily(f"hamq_{name}", help_text, value=getattr(COUNTS, name))
        # copies: the event loop adds and removes gauges while a scrape thread reads them
        for name, (help_text, series) in list(self.gauges.items()):
            family = GaugeMetricFamily(name, help_text)
            for labels, read in list(series.items()):
                family.add_sample(name, dict(labels), read())
            yield family
        families = Families()
        for (_, labels), add in list(self.sources.items()):
            add(families, dict(labels))
        yield from families.by_name.values()


_COLLECTOR = _HamqCollector()
REGISTRY.register(_COLLECTOR)


def gauge(
    name: str,
    documentation: str,
    read: Callable[[], float],
    labels: dict[str, str] | None = None,
) -> None:
    """A gauge read at scrape time (no work between scrapes); ``labels`` tell apart the
    series of several servers in one process."""
    _COLLECTOR.gauges.setdefault(name, (documentation, {}))[1][
        tuple(sorted((labels or {}).items()))
    ] = read


def source(name: str, add: Source, labels: dict[str, str] | None = None) -> None:
    """Series that ``add`` puts into each scrape's families (labelled counters and
    histograms, series that come and go); ``labels`` as for ``gauge``."""
    _COLLECTOR.sources[(name, tuple(sorted((labels or {}).items())))] = add


def remove_gauges(labels: dict[str, str]) -> None:
    """Drop every series carrying these labels (a container member that stopped), whatever
    other labels it has (``hamq_alarm``'s resource), and the sources added with them."""
    wanted = set(labels.items())
    for key in [key for key in _COLLECTOR.sources if wanted <= set(key[1])]:
        del _COLLECTOR.sources[key]
    for name, (_, series) in list(_COLLECTOR.gauges.items()):
        for key in [key for key in series if wanted <= set(key)]:
            del series[key]
        if not series:
            _COLLECTOR.gauges.pop(name, None)


MAX_SCRAPES = 8
SCRAPE_TIMEOUT_S = 5.0


class _MetricsServer(ThreadingWSGIServer):
    """At most ``MAX_SCRAPES`` requests in their threads at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_SCRAPES)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it will not give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # per socket operation: a silent client lets go of its slot

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        """Scrapes are not logged (prometheus_client's handler is silent too)."""


def serve_metrics(listen: str) -> WSGIServer | None:
    if not listen:
        return None
    host, port = split_address(listen)
    server = make_server(
        host, port, make_wsgi_app(REGISTRY), _MetricsServer, handler_class=_Handler
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
