"""The chaos histories, message bodies and send outcomes: a body survives its round
trip, garbage never raises and is never valid, a flipped byte is caught, a torn last
history line (the runner killed mid-write) is dropped while a torn line before it is an
error, and only a refusal before storing is a failed send."""

from __future__ import annotations

import itertools
import json
import random
import threading

import pytest

from hamq.chaos.history import HistoryWriter, make_body, parse_body, read_history
from hamq.chaos.workload import QueueRead, SendPlan, key_of, send_outcome
from hamq.client.message import MessageQueue, SendResult, SendStatus
from hamq.errors import (
    ConnectionLost,
    InSyncReplicasNotEnough,
    NoPermission,
    NotLeader,
    RequestTimeout,
    SystemBusy,
)


def test_body_round_trip_and_is_deterministic():
    body = make_body("p1-42", 42, 100, seed=7)
    assert parse_body(body) == ("p1-42", 42, True)
    assert body == make_body("p1-42", 42, 100, seed=7)
    assert body != make_body("p1-42", 42, 100, seed=8)
    assert len(body) == len(b"p1-42|42|00000000|") + 100


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"|",
        b"|||",
        b"no separators at all",
        b"p1-1|x|00000000|payload",  # seq not a number
        b"p1-1|1|zzzzzzzz|payload",  # crc not hex
        b"\xff\xfe|1|00000000|payload",  # id not ascii
        bytes(range(256)) * 3,
    ],
)
def test_garbage_is_invalid_and_never_raises(garbage):
    assert parse_body(garbage)[2] is False


def test_flipped_payload_byte_keeps_id_but_is_invalid():
    body = bytearray(make_body("p0-3", 3, 64, seed=1))
    body[-5] ^= 0x01
    assert parse_body(bytes(body)) == ("p0-3", 3, False)


def test_flipped_id_or_seq_bit_is_invalid_not_another_message():
    # one bit turns p0-3 into p1-3 (a message producer 1 really sent) or seq 3 into 2
    for flip_at in (1, 5):
        body = bytearray(make_body("p0-3", 3, 64, seed=1))
        body[flip_at] ^= 0x01
        assert parse_body(bytes(body))[2] is False


def test_crc_field_not_eight_digits_is_invalid():
    message_id, seq, crc, payload = make_body("p0-3", 3, 64, seed=1).split(b"|", 3)
    # the same number, but not in the form a producer writes it
    assert parse_body(b"|".join([message_id, seq, b"0" + crc, payload]))[2] is False


def test_id_with_separator_refused():
    with pytest.raises(ValueError):
        make_body("p0|1", 1, 64, seed=1)


def test_writer_numbers_lines_and_times_them(tmp_path):
    path = tmp_path / "h" / "producer-0.jsonl"
    writer = HistoryWriter(path)
    threads = [
        threading.Thread(
            target=lambda i=i: [writer.record(op="ack", id=f"{i}-{j}") for j in range(200)]
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # line-buffered: readable before close, as after a kill of the runner
    lines = read_history(path)
    writer.close()
    assert [line["n"] for line in lines] == list(range(800))
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(lines))
    assert len({line["id"] for line in lines}) == 800


def test_torn_last_line_dropped_torn_middle_line_refused(tmp_path):
    path = tmp_path / "consumer-pull-0.jsonl"
    good = [json.dumps({"n": i, "op": "ack", "id": f"p0-{i}"}) for i in range(3)]
    path.write_text("\n".join(good) + "\n" + good[0][:7])
    assert [line["n"] for line in read_history(path)] == [0, 1, 2]
    path.write_text(good[0] + "\n" + good[1][:7] + "\n" + good[2] + "\n")
    with pytest.raises(ValueError, match=":2:"):
        read_history(path)


def test_send_outcomes():
    queue = MessageQueue("chaos-normal", "broker-a", 0)
    assert send_outcome(SendResult(SendStatus.SEND_OK, "id", queue, 5), None) == ("ok", "")
    stored_not_durable = SendResult(SendStatus.FLUSH_DISK_TIMEOUT, "id", queue, 5)
    assert send_outcome(stored_not_durable, None) == ("info", "FLUSH_DISK_TIMEOUT")
    refused = send_outcome(None, InSyncReplicasNotEnough("2 needed"))
    assert refused == ("fail", "InSyncReplicasNotEnough: 2 needed")
    assert send_outcome(None, NoPermission("slave"))[0] == "fail"
    never_left = ConnectionLost("cannot connect to 10.0.0.2:10911: [Errno 111] refused")
    assert send_outcome(None, never_left)[0] == "fail"
    # may have been stored: a timeout, a lost connection, a DLedger proposal not seen commit
    for unknown in (RequestTimeout(), ConnectionLost(), NotLeader(), SystemBusy(), TimeoutError()):
        assert send_outcome(None, unknown)[0] == "info", unknown


def test_plans_alternate_topics_and_keys():
    rng = random.Random(3)
    plans = [SendPlan.of(1, seq, 9, rng) for seq in range(16)]
    assert [p.topic for p in plans[:2]] == ["chaos-normal", "chaos-ordered"]
    assert {p.key for p in plans if p.topic == "chaos-ordered"} == {f"k1-{j}" for j in range(4)}
    for p in plans:
        assert parse_body(p.body) == (p.message_id, p.seq, True)
        assert key_of(p.topic, p.message_id, p.seq) == p.key


def test_queue_read_complete_only_without_holes():
    assert QueueRead(3, 6, [(3, b"a"), (4, b"b"), (5, b"c")]).complete
    assert QueueRead(3, 3, []).complete
    assert not QueueRead(3, 6, [(3, b"a"), (5, b"c")]).complete  # offset 4 never read
    assert not QueueRead(3, 6, [(4, b"b"), (5, b"c")]).complete  # from past the minimum
