"""The web API's history turns brokers' monotonic counters into rates: per topic and in
total, summed over brokers, a broker's first reading gives no rate, a counter that went
down (the broker restarted) counts from zero, and only ten minutes are kept."""

from __future__ import annotations

import pytest

from hamq.web.history import KEEP_S, TOPICS_KEPT, History, rates, topic_counts


def test_counters_from_runtime_info_with_and_without_stats():
    info = {"stats": {"topics": {"t": {"messages_in": 5, "bytes_in": 50, "messages_out": 2}}}}
    assert topic_counts(info) == {"t": (5, 2)}
    assert topic_counts({"broker_name": "b"}) == {}  # a broker without stats


def test_rates_count_a_restarted_counter_from_zero():
    got = rates({"t": (100, 40), "u": (10, 0)}, {"t": (120, 50), "u": (4, 0), "v": (6, 2)}, 2.0)
    assert got == {"t": (10.0, 5.0), "u": (2.0, 0.0), "v": (3.0, 1.0)}


def test_record_sums_brokers_and_skips_a_first_reading():
    history = History(interval_s=2.0)
    first = history.record(10.0, 1_000, {"a": {"t": (10, 0)}}, lag=7)
    assert (first.publish_rate, first.published, first.lag) == (0.0, 10, 7)
    second = history.record(12.0, 3_000, {"a": {"t": (30, 10)}, "b": {"t": (4, 0)}}, lag=3)
    assert second.topics == {"t": (10.0, 5.0)}  # b read for the first time
    assert (second.publish_rate, second.deliver_rate, second.published) == (10.0, 5.0, 34)
    third = history.record(14.0, 5_000, {"b": {"t": (8, 2)}}, lag=0)
    assert third.topics == {"t": (2.0, 1.0)}  # a is gone: no longer counted
    assert [s.at_ms for s in history.since(3.0, now_ms=5_000)] == [3_000, 5_000]


@pytest.mark.parametrize("interval_s", [0.5, 2.0, 7.0])
def test_only_ten_minutes_are_kept(interval_s):
    history = History(interval_s=interval_s)
    for i in range(int(2 * KEEP_S / interval_s)):
        history.record(i * interval_s, int(i * interval_s * 1000), {}, lag=0)
    assert len(history.samples) * interval_s == pytest.approx(KEEP_S, abs=interval_s)


def test_a_sample_keeps_only_its_busiest_topics_with_traffic():
    """Each sample kept every topic's rates, idle ones too, for ten minutes: 3000 idle
    topics held 177 MB in the name server and each console refresh of /api/history
    (every 5 s) built a 36 MB answer for 4 s on its event loop."""
    history = History(interval_s=2.0)
    idle = {f"idle{i}": (7, 3) for i in range(3_000)}
    busy = {f"busy{i}": (0, 0) for i in range(TOPICS_KEPT + 5)}
    history.record(0.0, 0, {"a": {**idle, **busy}}, lag=0)
    # busy{i} publishes 2*(i+1) messages in the 2 s: busy0..busy4 are the quietest
    grown = {topic: (2 * (i + 1), 0) for i, topic in enumerate(busy)}
    sample = history.record(2.0, 2_000, {"a": {**idle, **grown}}, lag=0)
    assert set(sample.topics) == set(list(busy)[5:])  # the busiest, no idle topic
    assert sample.publish_rate == sum(range(1, TOPICS_KEPT + 6))  # totals count every topic


def test_published_and_delivered_totals_never_go_down_across_a_failover():
    """The overview's publish / deliver_get counts (RabbitMQ's: monotonic) were the current
    masters' counters summed: a failover to a slave that had counted nothing dropped them
    from 100 to 5. Each broker's growth is added instead (a restarted one's from zero)."""
    history = History(interval_s=2.0)
    assert history.record(0.0, 0, {"a": {"t": (100, 40)}}, lag=0).published == 100
    after_failover = history.record(2.0, 2_000, {"b": {"t": (5, 1)}}, lag=0)
    assert (after_failover.published, after_failover.delivered) == (105, 41)
    # a back as master after a restart (its counters from zero): b's and a's new ones added
    back = history.record(4.0, 4_000, {"a": {"t": (3, 0)}, "b": {"t": (7, 1)}}, lag=0)
    assert (back.published, back.delivered) == (110, 41)
