"""Under sync flush, what the broker writes itself — delivered delay messages, retry copies,
transaction commits — is fsynced before anything that depends on it moves: the persisted
delay progress, the send-back answer (after which the consumer commits its offset), the
END_TRANSACTION answer. Each test lets only that write happen and then reads the broker's
fsynced offset (GET_BROKER_RUNTIME_INFO)."""

from __future__ import annotations

import json

import pytest

import hamq
from hamq import Message, TransactionState
from hamq.client.consumer import PullStatus
from hamq.protocol.codes import RequestCode
from helpers import wait_for

TOPIC = "Durable"
SYNC = {"flush_disk_type": "sync", "flush_delay_offset_interval_ms": 100}


@pytest.fixture
def sync_cluster(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(**SYNC)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    return c


def log_offsets(c) -> tuple[int, int]:
    """(commit-log end, fsynced up to) of the broker."""
    with hamq.Admin(c.namesrv) as admin:
        info = admin.broker_runtime_info(c.broker_addr())
    return info["commitlog_max_offset"], info["commitlog_flushed_offset"]


def persisted_delay_offset(c, level: int) -> int:
    path = c.root / "broker" / "delay_offsets.json"
    if not path.exists():
        return 0
    return json.loads(path.read_bytes())["table"]["delay_offsets"].get(str(level), 0)


def pull_one(namesrv: str) -> hamq.MessageExt:
    with hamq.PullConsumer("g-durable", namesrv) as consumer:
        mq = consumer.fetch_message_queues(TOPIC)[0]
        result = wait_for(
            lambda: (
                (r := consumer.pull(mq, 0, 1, suspend_timeout_ms=500)).status is PullStatus.FOUND
                and r
            ),
            10.0,
            "the message",
        )
        return result.messages[0]


def test_delay_progress_is_persisted_only_for_fsynced_deliveries(sync_cluster):
    c = sync_cluster
    with hamq.Producer(c.namesrv) as producer:
        producer.send(Message(TOPIC, b"later", delay_level=1))  # 1 s
    wait_for(lambda: persisted_delay_offset(c, 1) == 1, 10.0, "delay progress on disk")
    end, flushed = log_offsets(c)
    assert flushed == end  # the delivered copy, the only write since the send, is on disk
    assert pull_one(c.namesrv).body == b"later"


def test_send_back_answers_once_the_retry_copy_is_fsynced(sync_cluster):
    c = sync_cluster
    with hamq.Producer(c.namesrv) as producer:
        producer.send(Message(TOPIC, b"fails"))
    msg = pull_one(c.namesrv)
    with hamq.PullConsumer("g-durable", c.namesrv) as consumer:
        consumer.send_back(msg)
        end, flushed = log_offsets(c)
    assert flushed == end


def test_end_transaction_answers_once_the_commit_is_fsynced(sync_cluster):
    c = sync_cluster
    with hamq.TransactionProducer(
        c.namesrv,
        "pg-durable",
        lambda msg, arg: TransactionState.UNKNOW,
        lambda msg: TransactionState.UNKNOW,
    ) as producer:
        half = producer.send_message_in_transaction(Message(TOPIC, b"tx"))
        with hamq.Admin(c.namesrv) as admin:
            admin.submit(
                admin.core.invoke(
                    c.broker_addr(),
                    RequestCode.END_TRANSACTION,
                    {
                        "group": "pg-durable",
                        "tran_state_table_offset": half.send_result.queue_offset,
                        "commit_or_rollback": TransactionState.COMMIT_MESSAGE.value,
                    },
                )
            ).result()
        end, flushed = log_offsets(c)
    assert flushed == end
    assert pull_one(c.namesrv).body == b"tx"
