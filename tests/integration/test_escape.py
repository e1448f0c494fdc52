"""Secondary-message escape (seed 004) on real processes: groups broker-a and broker-b, each
a master and a slave, slave acting master on. broker-a's master is killed with kill -9 (by
PID) while a delay message sent to it waits and three of its half messages are undecided.
With remote escape, the acting master (broker-a's slave) delivers the delay message once,
as it falls due, into broker-b's master, commits one half there on END_TRANSACTION, rolls
one back, commits the third when its check-back reaches a producer, and never appends to
its own commit log. Without remote escape (and
no master in its process) nothing is delivered or decided meanwhile, and the returning
master delivers the delay message itself: nothing lost."""

from __future__ import annotations

import asyncio
import time

import hamq
from hamq import Message, SendStatus, TransactionState
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageQueue
from hamq.client.transaction import AsyncTransactionProducer
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from helpers import free_port, scrape_metrics, wait_for

DELAY_TOPIC = "EscapeDelay"
TX_TOPIC = "EscapeTx"
TX_GROUP = "pg-escape"
# halves in broker-a: decided by END_TRANSACTION to the acting master, or by its check-back
HALF_ROLES = ("commit", "rollback", "checked")
DELAY_LEVEL = 3  # 10 s: due well after the acting master took over
WAIT_S = 40.0
ACTING = {
    "enable_slave_acting_master": True,
    "skip_pre_online": True,
    "sync_broker_member_group_period_ms": 300,
    "slave_sync_interval_ms": 500,
    "transaction_check_interval_ms": 300,
    "transaction_timeout_ms": 1000,
}


def start_groups(cluster_factory, remote_escape: bool, pre_online: bool = False):
    c = cluster_factory()
    c.start_namesrv(
        scan_not_active_broker_interval_ms=300,
        broker_not_active_timeout_ms=2000,
        support_acting_master=True,
    )
    escape = {**ACTING, "enable_remote_escape": remote_escape, "skip_pre_online": not pre_online}
    c.start_broker("a-master", broker_role="sync_master", total_replicas=2, **escape)
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker("a-slave", broker_id=1, broker_role="slave", metrics_listen=metrics, **escape)
    for name, role, broker_id in (("b-master", "async_master", 0), ("b-slave", "slave", 1)):
        c.start_broker(
            name, broker_name="broker-b", broker_id=broker_id, broker_role=role, **escape
        )
    return c, metrics


def master_of(admin: hamq.Admin, topic: str, group: str) -> str | None:
    """The master address of ``group`` if it takes writes of ``topic``."""
    route = admin.topic_route(topic)
    writable = {q.broker_name for q in route.write_queues}
    return route.master_addr(group) if group in writable else None


def read_group(namesrv: str, topic: str, group: str, want: int, wait_s: float) -> list[str]:
    """Keys of ``topic``'s messages in ``group``'s queues, pulled until ``want`` arrived or
    ``wait_s`` passed."""
    keys: list[str] = []
    deadline = time.monotonic() + wait_s
    with hamq.PullConsumer("g-escape", namesrv) as consumer:
        queues = [q for q in consumer.fetch_message_queues(topic) if q.broker_name == group]
        offsets = dict.fromkeys(queues, 0)
        while True:
            for mq in queues:
                result = consumer.pull(mq, offsets[mq], 32, suspend_timeout_ms=100)
                if result.status is PullStatus.FOUND:
                    keys += [m.keys for m in result.messages]
                    offsets[mq] = result.next_begin_offset
            if len(keys) >= want or time.monotonic() >= deadline:
                return keys


async def send_halves(namesrv: str) -> dict[str, tuple[str, int]]:
    """Half messages left undecided (UNKNOW) until one per role is in broker-a: role -> (its
    key, its half offset). Keys are unique: the halves in broker-b are never decided."""
    producer = AsyncTransactionProducer(
        namesrv,
        TX_GROUP,
        lambda msg, arg: TransactionState.UNKNOW,
        lambda msg: TransactionState.UNKNOW,
    )
    halves: dict[str, tuple[str, int]] = {}
    try:
        for i in range(30):
            role = HALF_ROLES[len(halves)]
            key = f"{role}-{i}"
            sent = await producer.send_message_in_transaction(
                Message(TX_TOPIC, f"body-{key}".encode(), keys=key)
            )
            if sent.send_result.queue.broker_name == "broker-a":
                halves[role] = (key, sent.send_result.queue_offset)
                if len(halves) == len(HALF_ROLES):
                    return halves
            assert i < 29, "not enough halves went to broker-a"
    finally:
        await producer.close()
    return halves


async def end_transaction(namesrv: str, half_offset: int, state: TransactionState) -> None:
    """END_TRANSACTION to broker-a's routed master (the acting one), as a producer sends it."""
    producer = AsyncTransactionProducer(
        namesrv, TX_GROUP, lambda m, a: state, lambda m: TransactionState.UNKNOW
    )
    try:
        addr = (await producer.core.route(TX_TOPIC, refresh=True)).master_addr("broker-a")
        await producer.core.invoke(
            addr,
            RequestCode.END_TRANSACTION,
            {
                "group": TX_GROUP,
                "tran_state_table_offset": half_offset,
                "commit_or_rollback": state.value,
            },
        )
    finally:
        await producer.close()


def prepare(c) -> tuple[str, str, dict[str, int]]:
    """Topics on both groups, the undecided halves and the waiting delay message in
    broker-a, the slave caught up; then broker-a's master killed and its slave acting.
    Returns (the acting slave's address, the delay message's key, the halves)."""
    with hamq.Admin(c.namesrv) as admin:
        for topic in (DELAY_TOPIC, TX_TOPIC):
            admin.create_topic(topic, 1)
            wait_for(
                lambda t=topic: master_of(admin, t, "broker-a") and master_of(admin, t, "broker-b"),
                WAIT_S,
                f"{topic} routed on both groups",
            )
        halves = asyncio.run(send_halves(c.namesrv))
        with hamq.Producer(c.namesrv) as producer:
            sent = producer.send(
                Message(DELAY_TOPIC, b"late", keys="delayed", delay_level=DELAY_LEVEL),
                MessageQueue(DELAY_TOPIC, "broker-a", 0),
            )
            assert sent.status is SendStatus.SEND_OK
        master, slave = c.broker_addr("a-master"), c.broker_addr("a-slave")
        wait_for(
            lambda: (
                admin.broker_runtime_info(slave)["commitlog_max_offset"]
                == admin.broker_runtime_info(master)["commitlog_max_offset"]
            ),
            WAIT_S,
            "broker-a's slave caught up",
        )
        c.procs["a-master"].kill9()
        wait_for(
            lambda: (
                admin.broker_runtime_info(slave)["acting_master"]["acting"]
                and master_of(admin, TX_TOPIC, "broker-a") is None
                and admin.topic_route(TX_TOPIC).master_addr("broker-a") == slave
            ),
            WAIT_S,
            "broker-a's slave acting and routed as its read-only master",
        )
    return slave, "delayed", halves


def commitlog_end(namesrv: str, addr: str) -> int:
    with hamq.Admin(namesrv) as admin:
        return admin.broker_runtime_info(addr)["commitlog_max_offset"]


def test_acting_master_escapes_delay_and_transaction_messages_into_the_other_master(
    cluster_factory,
):
    c, metrics = start_groups(cluster_factory, remote_escape=True)
    slave, delayed, halves = prepare(c)
    log_end = commitlog_end(c.namesrv, slave)

    (commit, commit_offset), (_, rollback_offset), (checked, _) = (
        halves[role] for role in HALF_ROLES
    )
    asyncio.run(end_transaction(c.namesrv, commit_offset, TransactionState.COMMIT_MESSAGE))
    asyncio.run(end_transaction(c.namesrv, rollback_offset, TransactionState.ROLLBACK_MESSAGE))
    # the committed message is read from broker-b's master, the rolled-back one never
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 1, WAIT_S) == [commit]
    # the delay message, due during the outage, is delivered once, through broker-b
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-b", 1, WAIT_S) == [delayed]
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-b", 2, 3.0) == [delayed]
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 2, 1.0) == [commit]

    # a producer of the group comes: the acting master checks back the last half with it,
    # and the commit it answers goes the same way
    def check(msg: Message) -> TransactionState:
        return TransactionState.COMMIT_MESSAGE if msg.keys == checked else TransactionState.UNKNOW

    with hamq.TransactionProducer(
        c.namesrv, TX_GROUP, lambda m, a: TransactionState.UNKNOW, check, heartbeat_interval_s=0.3
    ):
        assert read_group(c.namesrv, TX_TOPIC, "broker-b", 2, WAIT_S) == [commit, checked]

    samples = scrape_metrics(metrics)
    assert samples["hamq_escaped_remote_total"] == 3
    assert samples["hamq_escaped_local_total"] == 0
    # the acting master never wrote its own commit log
    assert commitlog_end(c.namesrv, slave) == log_end
    # an END_TRANSACTION repeated after the decision changes nothing
    asyncio.run(end_transaction(c.namesrv, commit_offset, TransactionState.COMMIT_MESSAGE))
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 3, 1.0) == [commit, checked]
    assert scrape_metrics(metrics)["hamq_escaped_remote_total"] == 3


def test_without_remote_escape_messages_wait_for_the_master(cluster_factory):
    c, metrics = start_groups(cluster_factory, remote_escape=False)
    slave, delayed, halves = prepare(c)
    log_end = commitlog_end(c.namesrv, slave)
    commit, commit_offset = halves["commit"]

    # nowhere to escape to: the commit is refused (the producer is asked again later)
    try:
        asyncio.run(end_transaction(c.namesrv, commit_offset, TransactionState.COMMIT_MESSAGE))
    except HamqError as err:
        assert "enable_remote_escape" in err.message
    else:
        raise AssertionError("END_TRANSACTION committed with nowhere to escape to")
    # the delay message falls due (10 s after it was sent) and waits on the acting master
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-b", 1, 12.0) == []
    assert commitlog_end(c.namesrv, slave) == log_end
    assert scrape_metrics(metrics)["hamq_escaped_remote_total"] == 0

    # the master returns: it delivers the delay message itself, once, and takes the commit
    c.procs["a-master"].start()
    with hamq.Admin(c.namesrv) as admin:
        wait_for(
            lambda: master_of(admin, TX_TOPIC, "broker-a") == c.broker_addr("a-master"),
            WAIT_S,
            "broker-a's master routed again",
        )
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-a", 1, WAIT_S) == [delayed]
    assert read_group(c.namesrv, DELAY_TOPIC, "broker-a", 2, 2.0) == [delayed]
    asyncio.run(end_transaction(c.namesrv, commit_offset, TransactionState.COMMIT_MESSAGE))
    assert read_group(c.namesrv, TX_TOPIC, "broker-a", 1, WAIT_S) == [commit]
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 1, 1.0) == []


def test_returning_master_takes_the_acting_masters_decisions(cluster_factory):
    """A half committed by the acting master has no op record in the group's log: the
    returning master takes the decision at pre-online, so its check-back never asks about
    that half again (a COMMIT answer would store the message a second time)."""
    c, _ = start_groups(cluster_factory, remote_escape=True, pre_online=True)
    _, _, halves = prepare(c)
    (commit, commit_offset), (rollback, _) = halves["commit"], halves["rollback"]
    asyncio.run(end_transaction(c.namesrv, commit_offset, TransactionState.COMMIT_MESSAGE))
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 1, WAIT_S) == [commit]

    c.procs["a-master"].start()
    master = c.broker_addr("a-master")
    with hamq.Admin(c.namesrv) as admin:
        wait_for(
            lambda: master_of(admin, TX_TOPIC, "broker-a") == master,
            WAIT_S,
            "broker-a's master back online after pre-online",
        )
        assert "transaction_decisions taken" in str(admin.broker_runtime_info(master)["pre_online"])
    checked: list[str] = []

    def check(msg: Message) -> TransactionState:
        checked.append(msg.keys)
        return TransactionState.COMMIT_MESSAGE if msg.keys == commit else TransactionState.UNKNOW

    with hamq.TransactionProducer(
        c.namesrv, TX_GROUP, lambda m, a: TransactionState.UNKNOW, check, heartbeat_interval_s=0.3
    ):
        # the master checks back its undecided halves, but not the one decided while acting
        wait_for(lambda: rollback in checked, WAIT_S, "the master checking back")
        assert commit not in checked
    assert read_group(c.namesrv, TX_TOPIC, "broker-a", 1, 1.0) == []
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 2, 1.0) == [commit]
