"""Delay/timer building blocks without processes: the send path's O(1) test, the
persisted delivery progress and the retry delay choice."""

from __future__ import annotations

import pytest

from hamq import Message
from hamq.broker.send_back import retry_delay_level
from hamq.cli.tools import _deliver_time_ms
from hamq.errors import MessageIllegal
from hamq.protocol.message import encode_batch, encode_message
from hamq.protocol.properties import (
    MAX_DELAY_LEVEL,
    decode_single_message,
    first_message_is_held_back,
)
from hamq.store.delay_offset import DelayOffsetManager, TimerProgress


@pytest.mark.parametrize(
    "message, scheduled",
    [
        (Message("T", b"x"), False),
        (Message("T", b"x", keys="k", tags="t"), False),
        (Message("T", b"x", properties={"DELAYED": "1"}), False),
        (Message("T", b"x", delay_level=2), True),
        (Message("T", b"x", keys="k", tags="t", deliver_time_ms=123), True),
        # more than 15 properties: a map16 header in front of the first key
        (Message("T", b"x", delay_level=1, properties={f"p{i}": "v" for i in range(40)}), True),
        # a user-set DELAY property is moved to the front too
        (Message("T", b"x", properties={"a": "1", "DELAY": "3"}), True),
    ],
)
def test_first_message_is_held_back(message, scheduled):
    payload, _ = encode_batch([message.encode()])
    assert first_message_is_held_back(payload) is scheduled


def test_schedule_properties_survive_encoding():
    props, body = decode_single_message(Message("T", b"body", keys="k", delay_level=4).encode())
    assert body == b"body"
    assert props == {"DELAY": "4", "KEYS": "k"}
    with pytest.raises(MessageIllegal, match="either"):
        Message("T", b"x", delay_level=1, deliver_time_ms=5).encode()


def test_only_the_first_message_is_looked_at():
    payload, _ = encode_batch(
        [Message("T", b"a").encode(), Message("T", b"b", delay_level=1).encode()]
    )
    assert not first_message_is_held_back(payload)  # documented: delay is never batched


def test_delay_offsets_persist_and_merge_by_max(tmp_path):
    progress = DelayOffsetManager(tmp_path, 1)
    progress.set_delay_offset(1, 5, 2)
    timer = TimerProgress(queue_offset=7, read_ms=9000, slot_pos=3, slot_done=2, log_id="a")
    progress.set_timer(timer, 3)
    progress.persist()
    version = progress.data_version

    reloaded = DelayOffsetManager(tmp_path, 10)
    assert reloaded.delay_offset(1) == 5 and reloaded.delay_offset(2) == 0
    assert reloaded.timer == timer
    assert reloaded.data_version == version
    reloaded.set_timer(timer, 11)
    assert reloaded.data_version == version  # unchanged: no version step

    other = DelayOffsetManager(tmp_path / "other", 1)
    other.set_delay_offset(1, 3, 1)
    other.set_delay_offset(2, 7, 1)
    other.merge(reloaded.table(), reloaded.data_version)
    assert (other.delay_offset(1), other.delay_offset(2), other.timer) == (5, 7, timer)
    version = other.data_version
    other.merge(reloaded.table(), reloaded.data_version)
    assert other.data_version == version  # nothing new: the same version
    reloaded.set_timer(TimerProgress(read_ms=8000), 14)
    other.merge(reloaded.table(), reloaded.data_version)
    assert other.timer == timer  # the timer cursor never moves back


def test_retry_delay_level_grows_with_reconsume_times_and_is_capped():
    assert [retry_delay_level(n) for n in (0, 1, 14, 15, 100)] == [3, 4, 17, 18, MAX_DELAY_LEVEL]


def test_deliver_at_accepts_epoch_ms_and_iso8601():
    assert _deliver_time_ms("1700000000123") == 1700000000123
    assert _deliver_time_ms("2023-11-14T22:13:20") == 1700000000000
    assert _deliver_time_ms("2023-11-14T23:13:20+01:00") == 1700000000000


def test_held_back_test_looks_inside_the_properties_only():
    assert not first_message_is_held_back(encode_message(b"\xa5DELAY...", b"\x80"))  # {}
    with pytest.raises(MessageIllegal, match="msgpack map"):
        decode_single_message(encode_message(b"x", b"\xa5DELAY"))  # a string, not a map
