"""Every server exposes Prometheus metrics on ``metrics_listen`` (DESIGN.md §2)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import hamq
from hamq import Message
from harness import Cluster
from helpers import free_port, wait_for


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
        # refused by the broker (no such delay level): nothing stored, so nothing counted
        with pytest.raises(hamq.errors.MessageIllegal):
            producer.send(Message("Metered", b"z", delay_level=99))
    m = scrape(broker_metrics)
    assert m["hamq_send_requests_total"] == 2
    assert m["hamq_messages_in_total"] == 11
    assert m['hamq_topic_messages_in_total{topic="Metered"}'] == 11
    assert m["hamq_bytes_in_total"] > 1000
    assert m["hamq_commitlog_max_offset"] > 1000
    assert scrape(ns_metrics)["hamq_namesrv_live_brokers"] == 1


# -- a controller-mode group of two, a DLedger group and the controller, on one board ----

GROUP = "ctl"
TOPIC = "Metered"
DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "hamq.json"
MEMBER_SETTINGS = {
    "broker_name": GROUP,
    "enable_controller_mode": True,
    "controller_heartbeat_interval_ms": 300,
    "check_sync_state_set_period_ms": 300,
    "ha_send_heartbeat_interval_ms": 200,
    "sync_broker_member_group_period_ms": 300,
    "sync_broker_metadata_period_ms": 500,
    "broker_heartbeat_interval_ms": 500,
}


def samples(addr: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, as Prometheus parses a scrape."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float | None:
    return scraped.get((name, tuple(sorted(labels.items()))))


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    """Name server with the controller embedded, the two members of group ``ctl`` and
    a one-member DLedger group, each serving /metrics; yields (cluster, metrics addrs)."""
    c = Cluster(tmp_path_factory.mktemp("metrics"))
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("namesrv", "m1", "m2", "d1")}
    try:
        controller = f"127.0.0.1:{free_port()}"
        c.start_embedded_controller(
            "namesrv", controller, controller_self_id=1, metrics_listen=metrics["namesrv"]
        )
        for member in ("m1", "m2"):
            c.start_broker(
                member,
                controller_addr=[controller],
                metrics_listen=metrics[member],
                **MEMBER_SETTINGS,
            )
        raft = f"127.0.0.1:{free_port()}"
        c.start_broker(
            "d1",
            broker_name="broker-d",
            broker_id=1,
            replication_mode="dledger",
            dledger_self_id=1,
            dledger_peers=[f"1@{raft}"],
            metrics_listen=metrics["d1"],
        )
        with hamq.Admin(c.namesrv) as admin:
            wait_for(lambda: len(admin.master_addrs()) == 2, 30, "both groups' masters")
            admin.create_topic(TOPIC, 1)
        yield c, metrics
    finally:
        c.stop_all()


def test_traffic_lag_latency_replication_and_raft_series_of_real_servers(metered):
    c, metrics = metered
    with hamq.Admin(c.namesrv) as admin:
        master = admin.master_addrs()[GROUP]
    queue = hamq.MessageQueue(TOPIC, GROUP, 0)
    with hamq.Producer(c.namesrv) as producer:
        producer.send_batch([Message(TOPIC, b"x" * 100)] * 10, queue)
        producer.send(Message(TOPIC, b"y"), queue)
        producer.send(Message(TOPIC, b"z"), hamq.MessageQueue(TOPIC, "broker-d", 0))
    master_name = next(m for m in ("m1", "m2") if c.broker_addr(m) == master)
    slave_name = ({"m1", "m2"} - {master_name}).pop()

    # the slave catches up and joins the SyncStateSet; the log is fsynced meanwhile
    def replicated() -> bool:
        now = samples(metrics[master_name])
        lag = [v for (name, _), v in now.items() if name == "hamq_replication_lag_bytes"]
        return (
            lag == [0]
            and value(now, "hamq_replication_lag_seconds", slave_id=_slave_id(now)) == 0
            and value(now, "hamq_sync_state_set_size") == 2
            and value(now, "hamq_flush_seconds_count") > 0
        )

    wait_for(replicated, 20, "the slave caught up, in the SyncStateSet, a flush timed")
    # reads stop at the confirm offset (what the whole SyncStateSet holds): pulled now
    with hamq.PullConsumer("g-metered", c.namesrv) as consumer:
        pulled = consumer.pull(queue, 0, 32, commit_offset=4)
    assert len(pulled.messages) == 11
    on = {name: samples(addr) for name, addr in metrics.items()}
    m = on[master_name]
    assert value(m, "hamq_topic_messages_in_total", topic=TOPIC) == 11
    assert value(m, "hamq_topic_bytes_in_total", topic=TOPIC) > 1000
    assert value(m, "hamq_topic_messages_out_total", topic=TOPIC) == 11
    assert value(m, "hamq_group_messages_out_total", group="g-metered", topic=TOPIC) == 11
    assert value(m, "hamq_consumer_lag", group="g-metered", topic=TOPIC, queue_id="0") == 7
    assert value(m, "hamq_send_latency_seconds_count") == 2
    assert value(m, "hamq_send_latency_seconds_bucket", le="+Inf") == 2
    assert value(m, "hamq_end_to_end_latency_seconds_count") == 1
    assert value(m, "hamq_end_to_end_latency_seconds_sum") < 60
    assert value(m, "hamq_store_bytes") > 1000
    assert 0 < value(m, "hamq_disk_free_ratio") <= 1
    with hamq.Admin(c.namesrv) as admin:
        stats = admin.broker_runtime_info(master)["stats"]
    assert stats["topics"][TOPIC]["messages_in"] == 11
    assert stats["groups"]["g-metered"][TOPIC] == {
        "messages_out": 11,
        "bytes_out": value(m, "hamq_group_bytes_out_total", group="g-metered", topic=TOPIC),
    }
    assert value(on[slave_name], "hamq_topic_messages_in_total", topic=TOPIC) is None
    controller = on["namesrv"]
    assert value(controller, "hamq_controller_term") >= 1
    assert value(controller, "hamq_controller_elections") >= 1
    assert value(controller, "hamq_controller_unclean_elections") == 0
    assert value(controller, "hamq_controller_failed_elections") == 0
    assert value(controller, "hamq_controller_commit_index") >= 1
    assert value(controller, "hamq_controller_last_index") >= value(
        controller, "hamq_controller_commit_index"
    )
    dledger = on["d1"]
    assert value(dledger, "hamq_dledger_term") >= 1
    assert value(dledger, "hamq_dledger_commit_index") >= 1
    assert value(dledger, "hamq_topic_messages_in_total", topic=TOPIC) == 1  # a Raft proposal
    assert value(dledger, "hamq_send_latency_seconds_count") == 1
    # every series the Grafana board queries is one these servers export
    on = {name: samples(addr) for name, addr in metrics.items()}
    exported = {name for scraped in on.values() for name, _ in scraped}
    board = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in board["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"hamq_\w+", target["expr"])
    }
    assert queried - exported == set()


def _slave_id(scraped: dict) -> str:
    (labels,) = [dict(k) for name, k in scraped if name == "hamq_replication_lag_bytes"]
    return labels["slave_id"]
