"""Consumers across a master failover (seed 003, "Master Failures and Consumer
Cancellation"), real processes: one controller-mode group of three members, its master
killed with kill -9 once for the whole module.

- Pop messages delivered but not acked come again from the new master at once (not after
  their 60 s invisible time), marked redelivered, with reconsume times 1; acked ones never.
- A simple consumer with ``cancel_on_ha_failover`` gets ``ConsumerCancelled`` and consumes
  again once it subscribes again; a push consumer with it gets ``on_cancel`` and resumes at
  ``start()``; a push consumer without it reads on and gets the messages sent after."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
from controller_group import GROUP, TOPIC, ControllerGroup, module_group

import hamq
from hamq import ConsumeConcurrentlyStatus, Message
from hamq.errors import ConsumerCancelled, HamqError
from helpers import wait_for

pytestmark = pytest.mark.slow

POPPED = 20
ACKED = 8  # of the popped, the rest are left in flight
INVISIBLE_S = 60.0
REDELIVERY_LIMIT_S = 15.0  # from the kill: a loaded machine; the invisible time is 60 s
AFTER = [b"after-%d" % i for i in range(10)]


@dataclass
class Failover:
    group: ControllerGroup
    killed_at: float
    unacked: set[bytes]
    acked: set[bytes]
    fence: bytes
    pop: hamq.SimpleConsumer  # popped the messages, no flag
    cancelling: hamq.SimpleConsumer  # with cancel_on_ha_failover
    push_cancelling: hamq.PushConsumer
    push_plain: hamq.PushConsumer
    cancels: list[str] = field(default_factory=list)
    plain_got: list[bytes] = field(default_factory=list)


def send(namesrv: str, bodies: list[bytes]) -> None:
    """Each body acknowledged once (retried while the group has no master)."""
    with hamq.Producer(namesrv, send_timeout_s=2.0) as producer:
        for body in bodies:
            wait_for(lambda b=body: _sent(producer, b), 30, f"{body!r} acknowledged")


def _sent(producer: hamq.Producer, body: bytes) -> bool:
    try:
        producer.send(Message(TOPIC, body))
    except HamqError:
        time.sleep(0.1)
        return False
    return True


def receive_for(consumer: hamq.SimpleConsumer, until: float, want: int) -> list:
    """What ``consumer`` receives until ``want`` messages or the deadline; errors while
    the routes still name the killed master are retried."""
    got: list = []
    while len(got) < want and time.monotonic() < until:
        try:
            got += consumer.receive(32, INVISIBLE_S)
        except ConsumerCancelled:
            raise
        except HamqError:
            time.sleep(0.1)
    return got


def push_consumer(namesrv: str, group: str, **kwargs) -> hamq.PushConsumer:
    consumer = hamq.PushConsumer(
        group,
        namesrv,
        consume_from_where="first",
        rebalance_interval_s=1.0,
        pull_suspend_ms=1000,
        **kwargs,
    )
    consumer.subscribe(TOPIC)
    return consumer


@pytest.fixture(scope="module")
def failover(tmp_path_factory):
    with module_group(tmp_path_factory, "pop_failover") as group:
        namesrv = group.c.namesrv
        consumers: list = []
        try:
            bodies = [b"p%d" % i for i in range(POPPED)]
            send(namesrv, bodies)
            pop = hamq.SimpleConsumer("g-pop", namesrv, {TOPIC: "*"}, await_duration_s=1.0)
            consumers.append(pop)
            got = receive_for(pop, time.monotonic() + 30, POPPED)
            assert sorted(m.body for m in got) == sorted(bodies)
            assert not any(m.redelivered for m in got)
            for m in got[:ACKED]:
                pop.ack(m)
            cancelling = hamq.SimpleConsumer(
                "g-cancel", namesrv, {TOPIC: "*"}, await_duration_s=1.0, cancel_on_ha_failover=True
            )
            consumers.append(cancelling)
            for m in receive_for(cancelling, time.monotonic() + 30, POPPED):
                cancelling.ack(m)
            cancels: list[str] = []
            push_cancelling = push_consumer(
                namesrv, "g-push-cancel", cancel_on_ha_failover=True, on_cancel=cancels.append
            )
            plain_got: list[bytes] = []
            lock = threading.Lock()

            def listener(messages):
                with lock:
                    plain_got.extend(bytes(m.body) for m in messages)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            push_plain = push_consumer(namesrv, "g-push")
            for consumer, on_messages in (
                (push_cancelling, lambda ms: ConsumeConcurrentlyStatus.CONSUME_SUCCESS),
                (push_plain, listener),
            ):
                consumers.append(consumer)
                consumer.register_message_listener(on_messages)
                consumer.start()
            wait_for(lambda: len(plain_got) >= POPPED, 30, "the plain push consumer reading")
            # A send confirmed by every SyncStateSet member after the acks: the ACK (and CK)
            # records before it in the commit log are on every member the new master is
            # elected from.
            fence = b"fence"
            send(namesrv, [fence])
            old = group.master()
            group.c.procs[old].kill9()
            killed_at = time.monotonic()
            group.master(other_than=old)
            yield Failover(
                group,
                killed_at,
                {m.body for m in got[ACKED:]},
                {m.body for m in got[:ACKED]},
                fence,
                pop,
                cancelling,
                push_cancelling,
                push_plain,
                cancels,
                plain_got,
            )
        finally:
            for consumer in consumers:
                try:
                    consumer.close()
                except HamqError:
                    pass


def test_unacked_pop_messages_come_again_at_once_marked_redelivered(failover):
    f = failover
    got = receive_for(f.pop, f.killed_at + REDELIVERY_LIMIT_S, len(f.unacked) + 1)
    took = time.monotonic() - f.killed_at
    redelivered = {m.body for m in got if m.redelivered}
    assert redelivered == f.unacked, f"after {took:.1f} s"
    assert all(m.reconsume_times == 1 for m in got if m.redelivered)
    assert [m.body for m in got if not m.redelivered] == [f.fence]  # new: not marked
    assert not {m.body for m in got} & f.acked
    for m in got:
        f.pop.ack(m)
    assert f.pop.receive(32, INVISIBLE_S) == []  # nothing else comes (acked stay acked)


def test_a_simple_consumer_with_cancel_on_ha_failover_is_cancelled_until_it_subscribes(
    failover,
):
    f = failover
    with pytest.raises(ConsumerCancelled) as cancelled:
        receive_for(f.cancelling, time.monotonic() + 30, 1)
    assert cancelled.value.broker_name == GROUP
    with pytest.raises(ConsumerCancelled):  # it stays cancelled
        f.cancelling.receive(32, INVISIBLE_S)
    f.cancelling.subscribe(TOPIC)
    send(f.group.c.namesrv, [b"after-cancel"])
    got = receive_for(f.cancelling, time.monotonic() + 30, 2)
    assert {m.body for m in got} == {f.fence, b"after-cancel"}


def test_a_push_consumer_with_cancel_on_ha_failover_is_told_and_resumes_at_start(failover):
    f = failover
    wait_for(lambda: f.cancels, 30, "on_cancel")
    assert GROUP in f.cancels[0]
    queues = f.push_cancelling.async_client.process_queues
    wait_for(lambda: not queues, 15, "the cancelled consumer's queues released")
    f.push_cancelling.start()
    wait_for(lambda: queues, 15, "the consumer taking queues again")
    assert len(f.cancels) == 1


def test_a_push_consumer_without_the_flag_reads_on(failover):
    f = failover
    send(f.group.c.namesrv, AFTER)
    wait_for(lambda: set(AFTER) <= set(f.plain_got), 30, "the messages sent after the failover")
