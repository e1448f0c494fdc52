"""CONSUMER_SEND_MSG_BACK on a real broker: a message handed back returns through
%RETRY%<group> with reconsume_times + 1, and after max_reconsume_times lands in
%DLQ%<group>, with body, keys and tags intact."""

from __future__ import annotations

import time

import hamq
from hamq import Message
from hamq.client.consumer import PullStatus
from hamq.errors import TopicNotExist

GROUP = "g-retry"
WAIT_S = 10.0


def next_message(consumer: hamq.PullConsumer, topic: str, offset: int) -> hamq.MessageExt:
    """The message at ``offset`` of the topic's single queue, waiting for the topic's route
    (retry and DLQ topics are created on demand) and for the message."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            mq = consumer.fetch_message_queues(topic)[0]
            break
        except TopicNotExist:
            assert time.monotonic() < deadline, f"{topic} never got a route"
            time.sleep(0.1)
    while time.monotonic() < deadline:
        result = consumer.pull(mq, offset, 1, suspend_timeout_ms=1000)
        if result.status is PullStatus.FOUND:
            return result.messages[0]
    raise AssertionError(f"no message at {topic}:{offset} within {WAIT_S} s")


def test_send_back_retries_then_dead_letters(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Work", 1)
    with hamq.Producer(cluster.namesrv) as producer:
        sent = producer.send(
            Message("Work", b"payload", keys="order-7", tags="Created", properties={"trace": "abc"})
        )
    retry_topic, dlq_topic = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"
    with hamq.PullConsumer(GROUP, cluster.namesrv) as consumer:
        msg = next_message(consumer, "Work", 0)
        assert msg.reconsume_times == 0
        seen = []
        for attempt in range(1, 3):
            handed_back = time.time()
            consumer.send_back(msg, delay_level=1, max_reconsume_times=2)
            msg = next_message(consumer, retry_topic, attempt - 1)
            assert msg.store_timestamp_ms / 1000 >= handed_back + 1.0 - 0.01  # delay level 1
            assert msg.reconsume_times == attempt
            seen.append(msg)
        consumer.send_back(msg, delay_level=1, max_reconsume_times=2)
        dead = next_message(consumer, dlq_topic, 0)
    for m in (*seen, dead):
        assert (m.body, m.keys, m.tags, m.properties["trace"]) == (
            b"payload",
            "order-7",
            "Created",
            "abc",
        )
        assert m.properties["RETRY_TOPIC"] == "Work"
        assert m.properties["ORIGIN_MESSAGE_ID"] == sent.msg_id
    assert dead.topic == dlq_topic
    assert dead.reconsume_times == 3


def test_send_back_of_a_message_whose_producer_set_a_bad_reconsume_time(cluster):
    """A plain message's properties are not decoded at send, so a producer can store any
    RECONSUME_TIME; its send-back counts it as 0 (it used to fail with an internal error
    and the message could never be handed back)."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("BadCount", 1)
    with hamq.Producer(cluster.namesrv) as producer:
        for bad in ("x", "-5", "١", "9" * 5000):
            producer.send(
                Message("BadCount", bad.encode()[:16], properties={"RECONSUME_TIME": bad})
            )
    with hamq.PullConsumer("g-bad-count", cluster.namesrv) as consumer:
        for offset in range(4):
            msg = next_message(consumer, "BadCount", offset)
            assert msg.reconsume_times == 0
            consumer.send_back(msg, delay_level=1, max_reconsume_times=2)
            again = next_message(consumer, "%RETRY%g-bad-count", offset)
            assert again.reconsume_times == 1 and again.body == msg.body
