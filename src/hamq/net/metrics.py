"""Prometheus metrics of a server process, served on ``metrics_listen`` (empty = off).

Counters are per request, never per message (a batch of 64 is one increment of
``hamq_send_requests_total`` and one of ``hamq_messages_in_total`` by 64), so the hot path
pays two lock-protected additions per send.
"""
from __future__ import annotations

from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, start_http_server

from hamq.net.connection import split_address

SEND_REQUESTS = Counter("hamq_send_requests", "Send requests stored (one per batch)")
MESSAGES_IN = Counter("hamq_messages_in", "Messages stored by send requests")
BYTES_IN = Counter("hamq_bytes_in", "Message bytes stored by send requests")
PULL_REQUESTS = Counter("hamq_pull_requests", "Pull requests answered")


def gauge(name: str, documentation: str, read: Callable[[], float]) -> None:
    """A gauge read at scrape time (no work between scrapes)."""
    Gauge(name, documentation).set_function(read)


def serve_metrics(listen: str) -> WSGIServer | None:
    if not listen:
        return None
    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host)
    return server
