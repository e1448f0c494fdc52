"""The broker's traffic counters and histograms (broker/stats.py, net/counts.py) and how a
scrape renders them (net/metrics.py's Families), without a process; the Grafana board's
shape. tests/integration/test_metrics.py checks the same series on real servers."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamq.broker.ha.service import StoreRecords
from hamq.broker.scrape import STORE_BYTES_TTL_MS, StoreBytes
from hamq.broker.stats import (
    MAX_GROUP_ROWS,
    MAX_TOPIC_SERIES,
    OTHER_TOPICS,
    BrokerStats,
)
from hamq.config import StoreConfig
from hamq.net.counts import Histogram
from hamq.net.metrics import Families
from hamq.protocol.message import encode_batch, encode_message
from hamq.replication.master import MasterReplication
from hamq.replication.quorum import QuorumConfig
from hamq.store.message_store import GetStatus, MessageStore
from hamq.store.metadata import TopicConfig

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "hamq.json"


def test_histogram_puts_each_value_in_the_first_bucket_bounding_it():
    h = Histogram((10, 100))
    for value in (0, 10, 11, 100, 101, 5_000):
        h.observe(value)
    h.observe(50, times=3)  # a read's three sends answered together
    assert h.counts == [2, 5, 2]  # ≤10: 0, 10; ≤100: 11, 100, 3 × 50; above: 101, 5000
    assert h.total == 5_372
    assert h.cumulative(1_000) == [(0.01, 2), (0.1, 7), (float("inf"), 9)]


def records_stored_at(tmp_path: Path, store_ms: int, bodies: list[bytes]) -> bytes:
    """One real stored record (a batch of ``bodies``) as a pull reads it."""
    store = MessageStore(StoreConfig(store_dir=str(tmp_path)), clock_ms=lambda: store_ms)
    store.topics.put(TopicConfig("T", 1, 1), 0)
    payload, crc = encode_batch([encode_message(b) for b in bodies])
    store.put_batch("T", 0, payload, len(bodies), crc, 0)
    store.commit()
    result = store.get_messages("T", 0, 0, 32, 1 << 20)
    assert result.status is GetStatus.FOUND
    records = bytes(result.records)
    store.close()
    return records


def test_traffic_counts_per_topic_and_group_and_end_to_end_latency(tmp_path):
    records = records_stored_at(tmp_path, 1_000_000, [b"x" * 10, b"y" * 10, b"z" * 10])
    stats = BrokerStats()
    stats.produced("T", 3, 300)
    stats.produced("T", 1, 100)
    stats.consumed("g1", "T", 3, records, now_ms=1_000_040)  # 40 ms after it was stored
    stats.consumed(None, "T", 2, records, now_ms=1_000_000)  # a pull naming no group
    stats.consumed(["not", "a", "name"], "T", 1, records, now_ms=1_000_000)  # a broken client
    info = stats.runtime_info()
    assert info["topics"] == {
        "T": {
            "messages_in": 4,
            "bytes_in": 400,
            "messages_out": 6,
            "bytes_out": 3 * len(records),
        }
    }
    assert info["groups"] == {"g1": {"T": {"messages_out": 3, "bytes_out": len(records)}}}
    json.dumps(info)  # the runtime info body is JSON-able
    e2e = stats.end_to_end_ms
    assert sum(e2e.counts) == 3 and e2e.total == 40
    assert e2e.counts[e2e.bounds.index(50)] == 1  # 40 ms: the (25, 50] bucket


def test_consumer_groups_past_the_cap_count_only_in_their_topic(tmp_path):
    records = records_stored_at(tmp_path, 0, [b"m"])
    stats = BrokerStats()
    for i in range(MAX_GROUP_ROWS + 5):
        stats.consumed(f"g{i}", "T", 1, records, now_ms=0)
    assert len(stats.groups) == MAX_GROUP_ROWS
    assert stats.groups_dropped == 5
    assert stats.topics["T"][2] == MAX_GROUP_ROWS + 5


def test_a_group_no_offset_could_be_committed_under_gets_no_row(tmp_path):
    """A pull's group is not checked (a tool may read a queue under any name), but the row
    is kept for ever, in every scrape and in each runtime info the console samples every
    2 s: 1000 pulls with 60 KB group names held 60 MB and a 120 MB scrape."""
    records = records_stored_at(tmp_path, 0, [b"m"])
    stats = BrokerStats()
    for junk in ("g" * 60_000, 'a"b', "a\nb", "", ".."):
        stats.consumed(junk, "T", 1, records, now_ms=0)
    stats.consumed("good-group_1.%RETRY%", "T", 1, records, now_ms=0)
    assert list(stats.groups) == [("good-group_1.%RETRY%", "T")]
    assert stats.topics["T"][2] == 6  # every answer counts in its topic


def test_a_slave_caught_up_at_the_last_transfer_its_ack_covers(tmp_path):
    """hamq_replication_lag_seconds counts from ``caught_up_ms`` (RocketMQ's
    lastCaughtUpTime): the time of the last transfer whose master end the slave acked."""
    kb = 1024
    store = MessageStore(StoreConfig(store_dir=str(tmp_path), disk_min_free_bytes=1))
    m = MasterReplication(QuorumConfig(), window_bytes=64 * kb, transfer_batch_bytes=16 * kb)
    m.attach("s1", 1, 0, None, StoreRecords(store), 100)
    slave = m.slaves["s1"]
    assert slave.caught_up_ms == 100  # counts from its attach
    assert m.next_transfer("s1", 10 * kb, 1_000) == (0, 10 * kb)  # all the master has
    m.on_ack("s1", 4 * kb, 1_500)
    assert slave.caught_up_ms == 100  # part of it only
    m.on_ack("s1", 10 * kb, 2_000)
    assert slave.caught_up_ms == 1_000  # it held all the master had at that transfer
    assert m.next_transfer("s1", 40 * kb, 3_000) == (10 * kb, 26 * kb)  # one batch of 30 KB
    m.on_ack("s1", 26 * kb, 3_500)
    assert slave.caught_up_ms == 1_000  # behind the 40 KB the master had at 3000
    store.close()


class _Source:
    def __init__(self, stats: BrokerStats) -> None:
        self.stats = stats

    def collect(self):
        families = Families()
        self.stats.export(families, {"broker_name": "a"})
        return list(families.by_name.values())


def test_export_renders_labelled_counters_and_histograms_prometheus_parses(tmp_path):
    records = records_stored_at(tmp_path, 0, [b"m"])
    stats = BrokerStats()
    stats.produced("T", 2, 20)
    stats.consumed("g", "T", 2, records, now_ms=3)
    stats.send_latency_us.observe(150)  # 0.15 ms: the (100, 250] µs bucket
    registry = CollectorRegistry()
    registry.register(_Source(stats))
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    topic = (("broker_name", "a"), ("topic", "T"))
    assert samples[("hamq_topic_messages_in_total", topic)] == 2
    assert samples[("hamq_topic_bytes_out_total", topic)] == len(records)
    group = (("broker_name", "a"), ("group", "g"), ("topic", "T"))
    assert samples[("hamq_group_messages_out_total", group)] == 2
    send = "hamq_send_latency_seconds"
    assert samples[(f"{send}_bucket", (("broker_name", "a"), ("le", "0.0001")))] == 0
    assert samples[(f"{send}_bucket", (("broker_name", "a"), ("le", "0.00025")))] == 1
    assert samples[(f"{send}_bucket", (("broker_name", "a"), ("le", "+Inf")))] == 1
    assert samples[(f"{send}_sum", (("broker_name", "a"),))] == 0.00015
    assert samples[("hamq_end_to_end_latency_seconds_count", (("broker_name", "a"),))] == 1


def test_grafana_dashboard_is_a_board_with_a_prometheus_datasource_variable():
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36
    (variable,) = board["templating"]["list"]
    assert (variable["type"], variable["query"], variable["name"]) == (
        "datasource",
        "prometheus",
        "datasource",
    )
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all("hamq_" in t["expr"] for t in panel["targets"])


def test_topics_past_the_cap_are_summed_into_one_series_and_counted():
    stats = BrokerStats()
    for i in range(MAX_TOPIC_SERIES + 5):
        stats.produced(f"T{i}", 1, 10)
    families = Families()
    stats.export(families, {})
    topics = {s.labels["topic"]: s.value for s in families.by_name["hamq_topic_bytes_in"].samples}
    assert len(topics) == MAX_TOPIC_SERIES + 1
    assert (topics["T0"], topics[OTHER_TOPICS]) == (10, 50)
    (dropped,) = families.by_name["hamq_topic_series_dropped"].samples
    assert dropped.value == 5


def test_store_bytes_are_summed_again_only_after_their_ttl(tmp_path):
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / "0").write_bytes(b"x" * 100)
    store_bytes = StoreBytes(tmp_path)
    assert store_bytes.read(now_ms=1_000) == 100
    (tmp_path / "index").write_bytes(b"y" * 20)
    assert store_bytes.read(now_ms=1_000 + STORE_BYTES_TTL_MS - 1) == 100
    assert store_bytes.read(now_ms=1_000 + STORE_BYTES_TTL_MS) == 120
