"""Every server exposes Prometheus metrics on ``metrics_listen`` (DESIGN.md §2)."""

from __future__ import annotations

import urllib.request

import hamq
from hamq import Message
from helpers import free_port


def scrape(addr: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_broker_and_name_server_metrics(cluster_factory):
    c = cluster_factory()
    ns_metrics = f"127.0.0.1:{free_port()}"
    broker_metrics = f"127.0.0.1:{free_port()}"
    c.start_namesrv(metrics_listen=ns_metrics)
    c.start_broker(metrics_listen=broker_metrics)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("Metered", 1)
    with hamq.Producer(c.namesrv) as producer:
        producer.send_batch([Message("Metered", b"x" * 100)] * 10)
        producer.send(Message("Metered", b"y"))
    m = scrape(broker_metrics)
    assert m["hamq_send_requests_total"] == 2
    assert m["hamq_messages_in_total"] == 11
    assert m["hamq_bytes_in_total"] > 1000
    assert m["hamq_commitlog_max_offset"] > 1000
    assert scrape(ns_metrics)["hamq_namesrv_live_brokers"] == 1
