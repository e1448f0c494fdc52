"""Sends the producer refuses before touching the network: clear errors, nothing sent."""

from __future__ import annotations

import pytest

import hamq
from hamq import Message
from hamq.errors import InvalidArgument, MessageIllegal


@pytest.fixture
def producer():
    with hamq.Producer("127.0.0.1:1") as p:  # nothing listens there; nothing is sent
        yield p


def test_delayed_messages_are_not_batched(producer):
    with pytest.raises(InvalidArgument, match="cannot be batched"):
        producer.send_batch([Message("T", b"a"), Message("T", b"b", delay_level=2)])


def test_batch_topics_must_agree(producer):
    with pytest.raises(InvalidArgument, match="same topic"):
        producer.send_batch([Message("T", b"a"), Message("U", b"b")])


def test_empty_batch_and_oversized_body(producer):
    with pytest.raises(InvalidArgument):
        producer.send_batch([])
    with pytest.raises(MessageIllegal, match="limit"):
        producer.send(Message("T", b"x" * (4 * 1024 * 1024 + 1)))


def test_delay_and_timer_together_is_illegal(producer):
    with pytest.raises(MessageIllegal, match="either"):
        producer.send(Message("T", b"x", delay_level=1, deliver_time_ms=1))
