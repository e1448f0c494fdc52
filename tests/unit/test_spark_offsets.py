"""The Spark source's planning maths and options, without brokers: offset specs, how a
read limit is shared among queues, how ranges are split, which offsets count as data
loss, and which options are taken."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.spark.offsets import (
    OffsetSpec,
    QueueBounds,
    TopicQueue,
    cap_to_limit,
    clamp,
    from_stream_offset,
    plan_ranges,
    plan_starts,
    stream_offset,
)
from hamq.spark.options import READ_OPTIONS, ReadOptions, TopicSelection, WriteOptions


def q(n: int, topic: str = "T") -> TopicQueue:
    return TopicQueue(topic, "b", n)


def read_options(**options: str) -> ReadOptions:
    """As Spark hands them over: lower-cased keys."""
    return ReadOptions.parse({k.lower(): v for k, v in {"namesrv": "ns", **options}.items()})


# -- offset specs ------------------------------------------------------------------------
def test_offset_specs_name_queues_of_several_topics():
    topics = TopicSelection(topics=("T", "U"))
    spec = OffsetSpec.parse('{"T": {"b:0": 7, "b:1": -1}, "U": {"b:0": 3}}', topics, "x", "o")
    bounds = QueueBounds(5, 50)
    wanted = [spec.wanted(k, None, missing=-2) for k in (q(0), q(1), q(2), q(0, "U"))]
    assert [clamp(w, bounds) for w in wanted] == [7, 50, 5, 5]
    group = OffsetSpec.parse("group", topics, "earliest", "o")
    assert group.wanted(q(0), 20, missing=-2) == 20 and group.wanted(q(0), None, -2) == -2
    for bad in ("nope", '{"T": {"b:0": "x"}}', '{"T": 3}', '{"T": {"b:0": -3}}', '{"T": {"b": 1}}'):
        with pytest.raises(ValueError, match=r"option o|bad queue name"):
            OffsetSpec.parse(bad, topics, "earliest", "o")
    with pytest.raises(ValueError, match="names topic 'V', which this read does not cover"):
        OffsetSpec.parse('{"V": {"b:0": 1}}', topics, "earliest", "o")
    pattern = TopicSelection(pattern="orders-.*")
    assert OffsetSpec.parse('{"orders-eu": {"b:0": 1}}', pattern, "x", "o").per_queue
    with pytest.raises(ValueError, match="does not cover"):
        OffsetSpec.parse('{"xorders-eu": {"b:0": 1}}', pattern, "x", "o")


def test_stream_offsets_round_trip_sorted_per_topic():
    offsets = {q(1, "U"): 4, q(0, "T"): 1, q(10, "T"): 2, q(2, "T"): 3}
    assert stream_offset(offsets) == {"T": {"b:0": 1, "b:10": 2, "b:2": 3}, "U": {"b:1": 4}}
    assert from_stream_offset(stream_offset(offsets)) == offsets


# -- the read limit (maxRecordsPerTrigger / maxOffsetsPerTrigger) ------------------------
def test_a_large_backlog_does_not_starve_the_other_queues():
    """One queue with a million waiting and nine with a few: every queue moves each trigger
    (it used to give the limit away in key order, so queues late in it never moved)."""
    start = {q(i): 0 for i in range(10)}
    latest = {q(0): 1_000_000, **{q(i): 5 for i in range(1, 10)}}
    end = cap_to_limit(start, latest, 20)
    assert all(end[k] > start[k] for k in start)
    assert sum(end[k] - start[k] for k in start) == 20
    assert end[q(0)] - start[q(0)] == 11  # the rest of the limit goes to the backlog


def test_the_limit_is_shared_in_proportion_to_what_waits():
    start = {q(0): 0, q(1): 0, q(2): 0}
    latest = {q(0): 900, q(1): 100, q(2): 0}
    assert cap_to_limit(start, latest, 100) == {q(0): 89, q(1): 11, q(2): 0}
    assert cap_to_limit(start, latest, 5_000) == latest
    # below one row per queue each queue with data still gets one, as Kafka rounds up
    assert cap_to_limit(start, {q(0): 1, q(1): 1, q(2): 1}, 2) == {q(0): 1, q(1): 1, q(2): 1}


offsets_st = st.dictionaries(
    st.integers(0, 12), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1
)


@given(offsets_st, st.integers(1, 10**6))
def test_read_limit_properties(queues, limit):
    """Never past latest nor before start; at most ``max(limit, queues with data)`` rows
    (the limit itself once it covers one row per such queue; Kafka may read one row per
    queue more); every queue with data moves; all is read when all fits."""
    start = {q(i): min(a, b) for i, (a, b) in queues.items()}
    latest = {q(i): max(a, b) for i, (a, b) in queues.items()}
    end = cap_to_limit(start, latest, limit)
    waiting = [k for k in start if latest[k] > start[k]]
    total = sum(end[k] - start[k] for k in start)
    assert all(start[k] <= end[k] <= latest[k] for k in start)
    assert total <= max(limit, len(waiting))
    assert total == min(sum(latest[k] - start[k] for k in start), max(limit, len(waiting)))
    assert all(end[k] > start[k] for k in waiting)


# -- ranges -------------------------------------------------------------------------------
def test_ranges_split_by_max_records_and_min_partitions():
    ranges = plan_ranges({q(0): 0, q(1): 5}, {q(0): 10, q(1): 5}, 4)
    assert [(r.topic, r.queue_id, r.start, r.end) for r in ranges] == [
        ("T", 0, 0, 3),
        ("T", 0, 3, 6),
        ("T", 0, 6, 10),
    ]
    ranges = plan_ranges({q(0): 0, q(1): 0}, {q(0): 90, q(1): 10}, None, min_partitions=5)
    assert [(r.queue_id, r.end - r.start) for r in ranges] == [(0, 18)] * 5 + [(1, 10)]


small_offsets_st = st.dictionaries(  # a range per row must stay cheap to list
    st.integers(0, 12), st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1
)


@given(small_offsets_st, st.none() | st.integers(1, 600), st.none() | st.integers(1, 200))
def test_range_properties(queues, max_records, min_partitions):
    start = {q(i): min(a, b) for i, (a, b) in queues.items()}
    end = {q(i): max(a, b) for i, (a, b) in queues.items()}
    ranges = plan_ranges(start, end, max_records, min_partitions)
    rows = sum(end[k] - start[k] for k in start)
    for k in start:  # each queue's ranges tile [start, end) in order, none empty
        mine = [(r.start, r.end) for r in ranges if TopicQueue(r.topic, r.broker, r.queue_id) == k]
        cuts = [start[k]] + [b for _, b in mine]
        assert [a for a, _ in mine] == cuts[:-1] and cuts[-1] == end[k]
    assert all(0 < r.end - r.start <= (max_records or rows) for r in ranges)
    assert len(ranges) >= min(min_partitions or 1, rows)


# -- data loss ---------------------------------------------------------------------------
def test_offsets_that_went_backwards_or_were_removed_are_data_loss():
    reached = {q(0): 100, q(1): 40, q(2): 10, q(3): 7}
    bounds = {
        q(0): QueueBounds(0, 10),  # topic re-created: 10 new messages
        q(1): QueueBounds(60, 60),  # retention emptied it past where the stream is
        q(2): QueueBounds(0, 25),  # fine
        q(4): QueueBounds(30, 35),  # new, but its first 30 offsets are gone already
        q(5): QueueBounds(0, 3),  # new
    }  # q(3): its group is unreachable
    starts, losses = plan_starts(reached, bounds)
    assert starts == {q(0): 0, q(1): 60, q(2): 10, q(3): 7, q(4): 30, q(5): 0}
    assert losses == [
        "queue b:0 of T: offset was changed from 100 to 10 (the topic was re-created, or its "
        "master lost messages it had not replicated); reading it again from 0",
        "queue b:1 of T no longer holds offsets 40..59 (it holds 60..60): removed by "
        "retention before they were read",
        "queue b:4 of T is new and starts at offset 30, not 0",
    ]


def test_a_slave_behind_its_master_is_not_offsets_going_backwards():
    starts, losses = plan_starts({q(0): 100}, {q(0): QueueBounds(0, 90, from_master=False)})
    assert starts == {q(0): 100} and losses == []


def test_a_replayed_batch_that_went_backwards_reads_what_the_queue_holds():
    """After a restart Spark replays the batch with its planned end below its start (the
    offsets went backwards and failOnDataLoss=false let it be planned)."""
    starts, losses = plan_starts(
        {q(0): 100, q(1): 5}, {q(0): QueueBounds(0, 12), q(1): QueueBounds(0, 9)}, {q(0): 10}
    )
    assert starts == {q(0): 0} and "changed from 100 to 10" in losses[0]


# -- options -----------------------------------------------------------------------------
def test_unknown_options_are_refused_naming_them_and_the_known_ones():
    with pytest.raises(ValueError) as info:
        read_options(topic="T", maxRecordsPerTriger="10")
    message = str(info.value)
    assert "unknown option 'maxrecordspertriger' of the hamq source" in message
    assert all(name in message for name in READ_OPTIONS)
    with pytest.raises(ValueError, match="unknown option 'includeheaders' of the hamq sink"):
        WriteOptions.parse({"namesrv": "ns", "includeheaders": "true"})


def test_kafka_option_names():
    o = read_options(
        subscribe="A, B,A",
        maxOffsetsPerTrigger="500",
        minPartitions="8",
        startingTimestamp="1700000000000",
        includeHeaders="false",
        **{"kafkaConsumer.pollTimeoutMs": "30000"},
    )
    assert o.topics == TopicSelection(topics=("A", "B"))
    assert o.max_records_per_trigger == 500 and o.min_partitions == 8
    assert o.starting_timestamp_ms == 1_700_000_000_000 and not o.include_headers
    assert o.poll_timeout_s == 30.0
    assert read_options(topic="T").poll_timeout_s == 120.0  # outlives a master restart
    assert read_options(subscribePattern="ord.*").topics.pattern == "ord.*"
    assigned = read_options(assign='{"T": ["b:1", "b:0"], "U": ["c:3"]}').topics
    assert assigned.assigned == (("T", ("b:1", "b:0")), ("U", ("c:3",)))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs one of the options topic, subscribe, subscribePattern, assign"),
        ({"topic": "T", "subscribe": "U"}, "options topic and subscribe exclude each other"),
        ({"subscribe": "A,,B"}, "an empty topic name"),
        ({"subscribePattern": "(("}, "bad regex"),
        ({"assign": '{"T": [0]}'}, "a queue is named '<broker>:<queue id>'"),
        ({"assign": '{"T": []}'}, "non-empty lists of queues"),
        ({"assign": "[1"}, "option assign: expected JSON"),
        (
            {"topic": "T", "maxRecordsPerTrigger": "5", "maxOffsetsPerTrigger": "5"},
            "exclude each other",
        ),
        ({"topic": "T", "startingOffsets": "latest", "startingTimestamp": "5"}, "exclude"),
        ({"topic": "T", "startingTimestamp": "-1"}, "non-negative integer"),
        ({"topic": "T", "minPartitions": "0"}, "minPartitions must be a positive integer"),
        ({"topic": "T", "includeHeaders": "yes"}, "includeHeaders must be true or false"),
    ],
)
def test_bad_options_fail_with_a_message(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        read_options(**options)
