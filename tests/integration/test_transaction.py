"""Transaction messages on a real broker: a committed message becomes visible once, a
rolled-back one never; an UNKNOW outcome is resolved by the broker checking back with a
live producer, also after a broker restart, and rolled back after transaction_check_max
checks; a batch half (TRAN_BATCH) commits as one batch; CHECK_IMMUNITY_TIME_IN_SECONDS
defers checks; a restarted producer is checked rather than its transaction rolled back; a
decision whose write failed is checked again."""

from __future__ import annotations

import resource
import threading
import time
from pathlib import Path

import pytest

import hamq
from hamq import Message, TransactionState
from hamq.client.consumer import PullStatus
from hamq.errors import MessageIllegal, TransactionRolledBack
from hamq.protocol.codes import RequestCode
from hamq.protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_PREPARED,
)
from helpers import wait_for

TOPIC = "Tx"
FAST_CHECKS = {"transaction_check_interval_ms": 300, "transaction_timeout_ms": 1000}
HEARTBEAT_S = 0.3


def visible(namesrv: str, wait_s: float = 0.0, until_count: int | None = None) -> list[str]:
    """Keys of the messages of TOPIC (one queue), pulling for up to ``wait_s`` or until
    ``until_count`` messages arrived."""
    keys: list[str] = []
    deadline = time.monotonic() + wait_s
    with hamq.PullConsumer("g-tx", namesrv) as consumer:
        mq = consumer.fetch_message_queues(TOPIC)[0]
        offset = 0
        while True:
            result = consumer.pull(mq, offset, 32, suspend_timeout_ms=200)
            if result.status is PullStatus.FOUND:
                keys += [m.keys for m in result.messages]
                offset = result.next_begin_offset
            if (
                until_count is not None and len(keys) >= until_count
            ) or time.monotonic() >= deadline:
                return keys


class LocalTransactions:
    """Outcomes by message key, and a record of every check the broker made."""

    def __init__(
        self,
        outcomes: dict[str, TransactionState],
        checked: dict[str, TransactionState] | None = None,
    ) -> None:
        self.outcomes = outcomes
        self.checked = checked or {}
        self.checks: list[str] = []
        self.lock = threading.Lock()

    def execute(self, msg: Message, arg) -> TransactionState:
        assert arg == "arg"
        return self.outcomes[msg.keys]

    def check(self, msg: Message) -> TransactionState:
        with self.lock:
            self.checks.append(msg.keys)
        assert msg.body == f"body-{msg.keys}".encode() and msg.topic == TOPIC
        return self.checked.get(msg.keys, TransactionState.UNKNOW)

    def producer(self, namesrv: str) -> hamq.TransactionProducer:
        return hamq.TransactionProducer(
            namesrv, "pg-tx", self.execute, self.check, heartbeat_interval_s=HEARTBEAT_S
        )


def send(producer: hamq.TransactionProducer, key: str) -> hamq.TransactionSendResult:
    result = producer.send_message_in_transaction(
        Message(TOPIC, f"body-{key}".encode(), keys=key, tags="T"), "arg"
    )
    assert result.send_result.status is hamq.SendStatus.SEND_OK
    return result


def start(cluster_factory, **settings):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(**FAST_CHECKS, **settings)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    return c


def test_commit_is_visible_and_rollback_never(cluster_factory):
    c = start(cluster_factory)
    local = LocalTransactions(
        {"commit": TransactionState.COMMIT_MESSAGE, "rollback": TransactionState.ROLLBACK_MESSAGE}
    )
    with local.producer(c.namesrv) as producer:
        assert (
            send(producer, "rollback").local_transaction_state is TransactionState.ROLLBACK_MESSAGE
        )
        send(producer, "commit")
        # Past the transaction timeout and several check rounds: decided messages are
        # never checked, and nothing else appears.
        assert visible(c.namesrv, wait_s=2.5) == ["commit"]
    assert local.checks == []


def test_unknown_is_resolved_by_check_back(cluster_factory):
    c = start(cluster_factory)
    local = LocalTransactions(
        {"unknown": TransactionState.UNKNOW}, {"unknown": TransactionState.COMMIT_MESSAGE}
    )
    with local.producer(c.namesrv) as producer:
        sent = time.monotonic()
        send(producer, "unknown")
        assert visible(c.namesrv, wait_s=0.5) == []  # invisible while undecided
        assert visible(c.namesrv, wait_s=5.0, until_count=1) == ["unknown"]
        assert time.monotonic() - sent >= 1.0  # not before transaction_timeout_ms
        assert visible(c.namesrv, wait_s=1.0) == ["unknown"]  # committed once
    assert local.checks == ["unknown"]


def test_rolled_back_after_transaction_check_max(cluster_factory):
    c = start(cluster_factory, transaction_check_max=2)
    local = LocalTransactions({"never": TransactionState.UNKNOW})
    with local.producer(c.namesrv) as producer:
        send(producer, "never")
        undecided = log_end(c)
        wait_for(lambda: log_end(c) > undecided, 10, "the half rolled back")
        # Five more check rounds: no third check, and the half stays rolled back.
        assert visible(c.namesrv, wait_s=1.5) == []
    assert local.checks == ["never", "never"]


def test_decisions_and_checks_survive_a_broker_restart(cluster_factory):
    c = start(cluster_factory)
    local = LocalTransactions(
        {
            "commit": TransactionState.COMMIT_MESSAGE,
            "rollback": TransactionState.ROLLBACK_MESSAGE,
            "unknown": TransactionState.UNKNOW,
        }
    )
    with local.producer(c.namesrv) as producer:
        for key in ("commit", "rollback", "unknown"):
            send(producer, key)
        c.restart("broker")
        restarted = len(local.checks)
        local.checked["unknown"] = TransactionState.COMMIT_MESSAGE  # decided meanwhile
        assert visible(c.namesrv, wait_s=8.0, until_count=2) == ["commit", "unknown"]
        assert visible(c.namesrv, wait_s=1.0) == ["commit", "unknown"]  # each once
    assert len(local.checks) > restarted  # the check came after the restart
    assert set(local.checks) == {"unknown"}


def half_batch(
    producer: hamq.Producer,
    keys: list[str],
    count: int | None = None,
    immunity_s: int | None = None,
) -> int:
    """A half message carrying a whole batch (hamq's TRAN_BATCH); returns its half offset."""
    payload = b"".join(Message(TOPIC, f"body-{k}".encode(), keys=k).encode() for k in keys)
    properties = {
        PROPERTY_TRANSACTION_PREPARED: "true",
        PROPERTY_PRODUCER_GROUP: "pg-batch",
        PROPERTY_TRANSACTION_BATCH: str(count or len(keys)),
    }
    if immunity_s is not None:
        properties[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(immunity_s)
    return producer.send(Message(TOPIC, payload, properties=properties)).queue_offset


def log_end(c) -> int:
    """The broker's commit-log end: once the halves are stored, only a decision (its op
    record, and for a commit the message) writes more; a check writes nothing."""
    with hamq.Admin(c.namesrv) as admin:
        return admin.broker_runtime_info(c.broker_addr())["commitlog_max_offset"]


def end(c, half_offset: int, state: TransactionState) -> None:
    with hamq.Admin(c.namesrv) as admin:
        admin.submit(
            admin.core.invoke(
                c.broker_addr(),
                RequestCode.END_TRANSACTION,
                {
                    "group": "pg-batch",
                    "tran_state_table_offset": half_offset,
                    "commit_or_rollback": state.value,
                },
            )
        ).result()


def test_a_batch_half_commits_as_one_batch_and_rolls_back_whole(cluster_factory):
    c = start(cluster_factory)
    with hamq.Producer(c.namesrv, "pg-batch") as producer:
        committed = half_batch(producer, ["a", "b", "c"])
        rolled_back = half_batch(producer, ["x", "y"])
        assert visible(c.namesrv, wait_s=0.3) == []
        end(c, rolled_back, TransactionState.ROLLBACK_MESSAGE)
        end(c, committed, TransactionState.COMMIT_MESSAGE)
        end(c, committed, TransactionState.COMMIT_MESSAGE)  # a repeat changes nothing
        assert visible(c.namesrv, wait_s=1.0) == ["a", "b", "c"]
        with pytest.raises(MessageIllegal, match="batch declares 5 messages but holds 2"):
            half_batch(producer, ["p", "q"], count=5)


def test_check_immunity_keeps_a_half_from_check_and_rollback(cluster_factory):
    c = start(cluster_factory, transaction_check_max=1)
    unknown = LocalTransactions({})  # a live producer of the group, never sure
    with (
        hamq.Producer(c.namesrv, "pg-batch") as producer,
        hamq.TransactionProducer(
            c.namesrv,
            "pg-batch",
            unknown.execute,
            lambda msg: TransactionState.UNKNOW,
            heartbeat_interval_s=HEARTBEAT_S,
        ),
    ):
        immune = half_batch(producer, ["kept"], immunity_s=4)
        doomed = half_batch(producer, ["lost"])
        undecided = log_end(c)
        # checked once, then rolled back (transaction_check_max=1) by the same rounds
        # that passed over the immune half
        wait_for(lambda: log_end(c) > undecided, 10, "the half without immunity rolled back")
        with pytest.raises(TransactionRolledBack):  # too late: the check rolled it back
            end(c, doomed, TransactionState.COMMIT_MESSAGE)
        end(c, immune, TransactionState.COMMIT_MESSAGE)
        assert visible(c.namesrv, wait_s=1.0) == ["kept"]


def test_a_restarted_producer_is_checked_instead_of_rolled_back(cluster_factory):
    """The producer dies before telling the broker its commit; while no producer of the
    group is connected, check rounds pass without counting, and the restarted producer
    heartbeats at start (before any transaction of its own), so it is asked and commits."""
    c = start(cluster_factory, transaction_check_max=2)
    crashed = LocalTransactions({"committed": TransactionState.UNKNOW})
    with crashed.producer(c.namesrv) as producer:
        send(producer, "committed")
    undecided = log_end(c)
    # Time is the point: past the transaction timeout and well over transaction_check_max
    # check rounds with no producer to ask, which must not count (nothing else to wait on).
    time.sleep(FAST_CHECKS["transaction_timeout_ms"] / 1000 + 5 * 0.3)
    assert log_end(c) == undecided  # not rolled back
    restarted = LocalTransactions({}, {"committed": TransactionState.COMMIT_MESSAGE})
    with restarted.producer(c.namesrv):
        assert visible(c.namesrv, wait_s=5.0, until_count=1) == ["committed"]
    assert restarted.checks == ["committed"]


class FileLimitAfterHalf(LocalTransactions):
    """Commits locally, but first caps the broker's file size just above its commit log,
    so END_TRANSACTION's write fails (EFBIG, like ENOSPC) after the half was stored."""

    def __init__(self, broker_pid: int, segment: Path) -> None:
        super().__init__({}, {"first": TransactionState.COMMIT_MESSAGE})
        self.broker_pid = broker_pid
        self.segment = segment
        self.size_at_decision = -1

    def execute(self, msg: Message, arg) -> TransactionState:
        self.size_at_decision = self.segment.stat().st_size
        resource.prlimit(
            self.broker_pid,
            resource.RLIMIT_FSIZE,
            (self.size_at_decision + 16, resource.RLIM_INFINITY),
        )
        return TransactionState.COMMIT_MESSAGE


def test_a_decision_lost_with_its_write_is_checked_again(cluster_factory):
    """A decision counts only once its op-log write succeeded: the half whose
    END_TRANSACTION write failed is checked again once the broker can write."""
    c = start(cluster_factory)
    broker = c.procs["broker"]
    segment = next((c.root / "broker" / "commitlog").iterdir())
    local = FileLimitAfterHalf(broker.pid, segment)
    with local.producer(c.namesrv) as producer:
        send(producer, "first")  # returns once END_TRANSACTION failed (connection closed)
        assert segment.stat().st_size == local.size_at_decision  # nothing of it written
        resource.prlimit(
            broker.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        )
        assert visible(c.namesrv, wait_s=8.0, until_count=1) == ["first"]
        assert visible(c.namesrv, wait_s=1.0) == ["first"]  # committed once
    assert local.checks == ["first"]
