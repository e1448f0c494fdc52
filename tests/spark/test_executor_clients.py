"""Executors pull through one hamq client per Python worker process, not one per partition:
counted as the connections the kernel saw opened to the broker (and the name server) while
Spark reads a 16-queue topic again and again, and checked for threads and fork without
Spark."""

from __future__ import annotations

import os
import threading

import pytest

from hamq import Message
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from hamq.spark import worker_client
from hamq.spark.worker_client import worker_consumer
from tcp_sockets import client_ports

TOPIC = "SparkClients"
QUEUES = 16
PER_QUEUE = 20
READS = 3
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def loaded(hamq_cluster):
    ns = hamq_cluster.namesrv
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queue_nums=QUEUES)
    with Producer(ns, "spark-clients") as producer:
        for queue_id in range(QUEUES):
            producer.send_batch(
                [Message(TOPIC, b"x") for _ in range(PER_QUEUE)],
                MessageQueue(TOPIC, "broker-a", queue_id),
            )
    return ns


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_spark_reads_open_no_connection_per_partition(spark, hamq_cluster, loaded):
    df = spark.read.format("hamq").option("namesrv", loaded).option("topic", TOPIC).load()
    assert df.rdd.getNumPartitions() == QUEUES
    assert df.count() == QUEUES * PER_QUEUE  # the workers and their clients are up
    broker, namesrv = port_of(hamq_cluster.broker_addr()), port_of(loaded)
    before = client_ports(broker), client_ports(namesrv)
    for _ in range(READS):
        assert df.count() == QUEUES * PER_QUEUE
    to_broker = client_ports(broker) - before[0]
    to_namesrv = client_ports(namesrv) - before[1]
    # What is left is the driver's planning (one admin client per read); a client per
    # partition opened READS * QUEUES to each.
    assert len(to_broker) <= READS, f"{len(to_broker)} connections to the broker"
    assert len(to_namesrv) <= READS, f"{len(to_namesrv)} connections to the name server"


def test_threads_share_one_client_and_a_forked_child_gets_its_own(hamq_cluster, loaded):
    worker_client.close_all()  # a client of an earlier test in this process
    broker = port_of(hamq_cluster.broker_addr())
    before = client_ports(broker)
    clients, errors = [], []

    def pull(queue_id: int) -> None:
        try:
            client, consumer = worker_consumer(loaded, TIMEOUT_S, "spark-clients")
            mq = MessageQueue(TOPIC, "broker-a", queue_id)
            assert client.submit(consumer.pull_raw(mq, 0, PER_QUEUE)).result().records
            clients.append(client)
        except Exception as e:  # noqa: BLE001 (reported below, with the thread's queue)
            errors.append((queue_id, e))

    threads = [threading.Thread(target=pull, args=(q,)) for q in range(QUEUES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert not errors and len(clients) == QUEUES
    assert len({id(c) for c in clients}) == 1
    assert len(client_ports(broker) - before) == 1

    child = os.fork()
    if child == 0:  # the child must not use the parent's client (its loop thread is gone)
        try:
            client, consumer = worker_consumer(loaded, TIMEOUT_S, "spark-clients")
            mq = MessageQueue(TOPIC, "broker-a", 0)
            found = client.submit(consumer.pull_raw(mq, 0, 1)).result().status
            os._exit(0 if client is not clients[0] and found is PullStatus.FOUND else 1)
        finally:
            os._exit(2)
    assert os.waitpid(child, 0)[1] == 0
    client, consumer = worker_consumer(loaded, TIMEOUT_S, "spark-clients")
    assert client is clients[0]  # the parent's is unharmed and still works
    answer = client.submit(consumer.pull_raw(MessageQueue(TOPIC, "broker-a", 1), 0, 1)).result()
    assert answer.status is PullStatus.FOUND
    assert len(client_ports(broker) - before) == 2  # the parent's and the child's

    worker_client.close_all()
    assert client.loop.is_closed()
    fresh, _ = worker_consumer(loaded, TIMEOUT_S, "spark-clients")
    assert fresh is not client
    worker_client.close_all()
