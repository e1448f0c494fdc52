"""A message keeps its identity across copies (issue 11, item 15): a retried message reaches
the listener with its original topic and message id (RocketMQ restores both), and every
sent message carries a producer-generated UNIQ_KEY, the same on a send the producer retried
after a timeout, so the duplicate can be recognised."""

from __future__ import annotations

import os
import signal
import threading
import time

import hamq
from hamq import ConsumeConcurrentlyStatus, Message
from hamq.client.consumer import PullStatus
from hamq.errors import TopicNotExist
from helpers import wait_for

TOPIC = "Identity"
GROUP = "g-identity"
RETRY_TOPIC = f"%RETRY%{GROUP}"


def create_topic(cluster) -> None:
    with hamq.Admin(cluster.namesrv) as admin:
        wait_for(admin.master_addrs, 10.0, "the broker to register")
        admin.create_topic(TOPIC, 1)


def pull_at(consumer: hamq.PullConsumer, topic: str, offset: int) -> list[hamq.MessageExt]:
    """The messages from ``offset`` of ``topic``'s single queue, waiting for the topic
    (retry topics are created on demand) and for at least one message."""

    def found():
        try:
            mq = consumer.fetch_message_queues(topic)[0]
        except TopicNotExist:
            return None
        result = consumer.pull(mq, offset, 32, suspend_timeout_ms=500)
        return result.messages if result.status is PullStatus.FOUND else None

    return wait_for(found, 15.0, f"a message at {topic}:{offset}")


def test_a_retried_message_keeps_its_topic_id_and_uniq_key(cluster):
    create_topic(cluster)
    with hamq.Producer(cluster.namesrv) as producer:
        producer.send_batch([Message(TOPIC, b"fails", tags="T"), Message(TOPIC, b"other")])
    with hamq.PullConsumer(GROUP, cluster.namesrv) as consumer:
        original, other = pull_at(consumer, TOPIC, 0)
        assert len(original.uniq_key) == 32 and original.uniq_key != other.uniq_key
        consumer.send_back(original, delay_level=1)
        (retried,) = pull_at(consumer, RETRY_TOPIC, 0)
        assert (retried.topic, retried.msg_id, retried.uniq_key, retried.tags) == (
            TOPIC,
            original.msg_id,
            original.uniq_key,
            "T",
        )
        assert retried.queue.topic == RETRY_TOPIC  # where this copy is stored
        assert retried.reconsume_times == 1
        consumer.send_back(retried, delay_level=1)  # back again, from the retry queue
        (again,) = pull_at(consumer, RETRY_TOPIC, 1)
        assert (again.topic, again.msg_id, again.reconsume_times) == (TOPIC, original.msg_id, 2)


def test_the_push_listener_sees_the_original_topic_and_id(cluster):
    create_topic(cluster)
    seen: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def listener(messages):
        with lock:
            seen.extend((m.topic, m.msg_id, m.reconsume_times) for m in messages)
        return (
            ConsumeConcurrentlyStatus.RECONSUME_LATER
            if messages[0].reconsume_times == 0
            else ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        )

    consumer = hamq.PushConsumer(
        GROUP, cluster.namesrv, consume_from_where="first", pull_suspend_ms=500
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        with hamq.Producer(cluster.namesrv) as producer:
            producer.send(Message(TOPIC, b"later"))
        wait_for(lambda: len(seen) >= 2, 30.0, "the retried delivery")  # delay level 3
    finally:
        consumer.shutdown()
    (topic, msg_id, _), (retry_topic, retry_id, times) = seen[:2]
    assert (retry_topic, retry_id, times) == (topic, msg_id, 1) and topic == TOPIC


def test_a_send_retried_after_a_timeout_is_recognisable(cluster):
    """The broker hangs (SIGSTOP) past the send timeout: the producer sends again, and once
    the broker resumes both requests are stored — two copies with one UNIQ_KEY."""
    create_topic(cluster)
    broker = cluster.procs["broker"]
    with hamq.Producer(cluster.namesrv, send_timeout_s=0.5) as producer:
        producer.send(Message(TOPIC, b"warm-up"))  # route and connection ready
        os.kill(broker.pid, signal.SIGSTOP)
        resume = threading.Timer(0.8, os.kill, (broker.pid, signal.SIGCONT))
        resume.start()
        try:
            producer.send(Message(TOPIC, b"once"))
        finally:
            resume.join()
            os.kill(broker.pid, signal.SIGCONT)
    with hamq.PullConsumer(GROUP, cluster.namesrv) as consumer:
        deadline = time.monotonic() + 10.0
        copies: list[hamq.MessageExt] = []
        while len(copies) < 2 and time.monotonic() < deadline:
            copies = [m for m in pull_at(consumer, TOPIC, 1) if m.body == b"once"]
    assert len(copies) == 2 and copies[0].uniq_key == copies[1].uniq_key
    assert copies[0].msg_id != copies[1].msg_id  # two stored copies
