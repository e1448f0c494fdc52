"""The web API's history turns brokers' monotonic counters into rates: per topic and in
total, summed over brokers, a broker's first reading gives no rate, a counter that went
down (the broker restarted) counts from zero, and only ten minutes are kept."""

from __future__ import annotations

import pytest

from hamq.web.history import KEEP_S, History, rates, topic_counts


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
