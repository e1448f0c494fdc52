"""The exactly-once sink's commit protocol against real brokers, driving the writer objects
in-process as Spark would (``write`` on an executor under a task context, ``commit`` /
``abort`` on the driver; a new writer object is a restarted driver). Two broker groups:
``broker-a`` keeps the journals (the cluster's smallest group name) and ``broker-b`` the
sink's data, so one group's failure is tested apart from the other's."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest
from pyspark import TaskContext

import hamq
from hamq.client.sync import Admin
from hamq.errors import HamqError, TransactionRolledBack
from hamq.spark.failpoint import FAILPOINT_ENV
from hamq.spark.journal import JournalError, journal_topic, sink_key
from hamq.spark.options import WriteOptions
from hamq.spark.writer import QUERY_ID_PROPERTY, HalvesWritten, HamqBatchWriter, HamqStreamWriter
from helpers import wait_for

DATA = "SinkData"
CHECKPOINT = "hdfs://namenode:8020/checkpoints/orders"  # not a local path: see item 2
WAIT_S = 60


def start_groups(cluster_factory, slave: bool = False):
    """broker-a (with a slave if asked) and broker-b; the data topic in broker-b only."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    if slave:
        c.start_broker("a", broker_name="broker-a", broker_role="sync_master", total_replicas=2)
        c.start_broker(
            "a-slave", broker_name="broker-a", broker_id=1, broker_role="slave", total_replicas=2
        )
    else:
        c.start_broker("a", broker_name="broker-a")
    c.start_broker("b", broker_name="broker-b", cluster_name="DataCluster")
    with Admin(c.namesrv) as admin:
        wait_for(lambda: len(admin.master_addrs()) == 2, WAIT_S, "both masters registered")
        admin.create_topic(DATA, queue_nums=4, cluster="DataCluster")
    return c


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One cluster for the tests that stop no broker."""
    from harness import Cluster

    clusters: list[Cluster] = []

    def make() -> Cluster:
        clusters.append(Cluster(tmp_path_factory.mktemp("spark-journal")))
        return clusters[-1]

    try:
        yield start_groups(make)
    finally:
        for c in clusters:
            c.stop_all()


@contextmanager
def spark_task(query_id: str | None) -> Iterator[None]:
    """The task context Spark gives a streaming query's write task (its local
    properties carry the query id)."""
    context = TaskContext._getOrCreate()
    context._localProperties = {QUERY_ID_PROPERTY: query_id} if query_id else {}
    try:
        yield
    finally:
        TaskContext._setTaskContext(None)


def options(ns: str, timeout_s: float = 3.0, checkpoint: str = CHECKPOINT) -> WriteOptions:
    return WriteOptions(ns, DATA, "spark-journal-sink", checkpoint, timeout_s)


def write(writer, values: range, query_id: str | None = "query-1") -> HalvesWritten:
    batch = pa.RecordBatch.from_pydict({"value": pa.array([str(v).encode() for v in values])})
    with spark_task(query_id):
        return writer.write(iter([batch]))


def visible(drain_topic, ns: str, among: range = range(1000)) -> list[int]:
    """The sink's rows consumers see (those in ``among``: tests share the topic), sorted
    with repeats."""
    values = (int(body) for rows in drain_topic(ns, DATA).values() for _, body in rows)
    return sorted(v for v in values if v in among)


def restart_master(c, name: str) -> None:
    c.procs[name].start()
    with Admin(c.namesrv) as admin:
        wait_for(lambda: len(admin.master_addrs()) == 2, WAIT_S, f"{name} registered again")


def test_abort_after_the_journal_append_rolls_the_batch_forward(cluster_factory, drain_topic):
    """Item 1: commit journals batch 1, then fails to commit its halves (the data group
    lost its master); Spark calls abort, which must commit (the batch is journaled), not
    roll back; the restarted query's replay then finds it committed. Today's abort rolled
    the journaled halves back and the replay 're-committed' halves that were gone."""
    c = start_groups(cluster_factory)
    ns = c.namesrv
    driver = HamqStreamWriter(options(ns))
    driver.commit([write(driver, range(10))], 0)
    rows = write(driver, range(10, 110))
    c.procs["b"].kill9()
    with Admin(ns) as admin:
        wait_for(lambda: "broker-b" not in admin.master_addrs(), WAIT_S, "broker-b without master")
    with pytest.raises(HamqError):
        driver.commit([rows], 1)
    restart_master(c, "b")
    HamqStreamWriter(options(ns)).abort([rows], 1)  # Spark's abort after the failed commit
    replay = HamqStreamWriter(options(ns))  # the restarted query runs batch 1 again
    replay.commit([write(replay, range(10, 110))], 1)
    assert visible(drain_topic, ns) == list(range(110))


def test_a_reset_checkpoint_is_a_new_sink_and_going_back_is_an_error(shared, drain_topic):
    """Item 2: the query id comes from Spark's tasks, so a checkpoint reset on a non-local
    file system (a new query id at the same path, batches from 0 again) is a new sink; a
    batch id below the journal's last with the same query id is an error, never a replay.
    Today the key was the path alone and the new query's first batches were rolled back."""
    ns = shared.namesrv
    checkpoint = CHECKPOINT + "/reset"
    old = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    for batch_id in range(3):
        old.commit([write(old, range(batch_id, batch_id + 1), "old-query")], batch_id)
    new = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    new.commit([write(new, range(10, 20), "new-query")], 0)
    assert visible(drain_topic, ns, range(100)) == [0, 1, 2, *range(10, 20)]
    restored = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    with pytest.raises(JournalError, match="checkpoint was reset or restored"):
        restored.commit([write(restored, range(30, 40), "old-query")], 1)
    restored.abort([write(restored, range(30, 40), "old-query")], 1)
    assert visible(drain_topic, ns, range(100)) == [0, 1, 2, *range(10, 20)]


def test_the_journal_waits_for_its_groups_master_across_a_driver_restart(
    cluster_factory, drain_topic
):
    """Item 3: batch 0 is journaled and committed in broker-a; its master is killed and
    the driver restarts, replaying batch 0 (Spark had not recorded it). The journal must
    be read from broker-a's master once it is back — not from its slave, nor from another
    group's empty queue (today: min(write_queues) moved to broker-b and batch 0 was
    committed twice)."""
    c = start_groups(cluster_factory, slave=True)
    ns = c.namesrv
    first = HamqStreamWriter(options(ns))
    first.commit([write(first, range(50))], 0)
    topic = journal_topic(sink_key(options(ns), "query-1"))
    c.procs["a"].kill9()
    with Admin(ns) as admin:
        wait_for(lambda: "broker-a" not in admin.master_addrs(), WAIT_S, "broker-a without master")
    restarter = threading.Timer(1.0, restart_master, (c, "a"))
    restarter.start()
    try:
        replay = HamqStreamWriter(options(ns, timeout_s=WAIT_S))
        replay.commit([write(replay, range(50))], 0)
        replay.commit([write(replay, range(50, 100))], 1)
    finally:
        restarter.join()
    assert visible(drain_topic, ns) == list(range(100))
    with Admin(ns) as admin:
        assert {q.broker_name for q in admin.topic_route(topic).read_queues} == {"broker-a"}


def test_two_drivers_on_one_checkpoint_cannot_both_commit_a_batch(
    shared, drain_topic, tmp_path, monkeypatch
):
    """Item 4: two drivers read the journal, both find batch 0 not journaled, and both
    append: the append is a compare-and-set, so exactly one wins and the other raises; its
    abort leaves the winner's rows and rolls back its own."""
    ns = shared.namesrv
    checkpoint = CHECKPOINT + "/two-drivers"
    marker = tmp_path / "both-read-the-journal"
    monkeypatch.setenv(FAILPOINT_ENV, f"before_journal:0:{marker}")
    drivers = [HamqStreamWriter(options(ns, checkpoint=checkpoint)) for _ in range(2)]
    rows = [
        write(d, range(1000 + i * 1000, 1010 + i * 1000), "twin") for i, d in enumerate(drivers)
    ]
    errors: list[HamqError | None] = [None, None]

    def commit(i: int) -> None:
        try:
            drivers[i].commit([rows[i]], 0)
        except HamqError as err:  # the test reads it below
            errors[i] = err

    threads = [threading.Thread(target=commit, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    wait_for(
        lambda: marker.exists() and len(marker.read_text().splitlines()) == 2,
        WAIT_S,
        "both drivers past their journal read",
    )
    marker.unlink()
    for t in threads:
        t.join(WAIT_S)
    losers = [i for i, err in enumerate(errors) if err is not None]
    assert len(losers) == 1, errors
    assert "another driver journaled" in str(errors[losers[0]])
    monkeypatch.delenv(FAILPOINT_ENV)
    drivers[losers[0]].abort([rows[losers[0]]], 0)
    winner = 1 - losers[0]
    assert visible(drain_topic, ns, range(1000, 3000)) == list(
        range(1000 + winner * 1000, 1010 + winner * 1000)
    )


def test_small_keyless_tasks_spread_over_the_queues(shared, drain_topic):
    """Item 7: one Python worker runs many small tasks; they must not all start on the
    queue of the worker's pid."""
    ns = shared.namesrv
    writer = HamqBatchWriter(options(ns))
    tasks = [write(writer, range(5000 + i, 5001 + i), None) for i in range(20)]
    writer.commit(tasks)
    queues = {
        q
        for q, rows in drain_topic(ns, DATA).items()
        if any(5000 <= int(b) < 5020 for _, b in rows)
    }
    assert len(queues) > 1


def test_a_journaled_batch_whose_halves_were_rolled_back_fails_loudly(
    shared, drain_topic, tmp_path, monkeypatch
):
    """Item 5: batch 0 is journaled, its commit's answer is lost, and its halves are then
    rolled back by someone else (here a rollback as the broker's check would give); the
    replay must raise (rows are missing), not report the batch committed."""
    ns = shared.namesrv
    checkpoint = CHECKPOINT + "/rolled-back"
    monkeypatch.setenv(FAILPOINT_ENV, f"after_journal+raise:0:{tmp_path / 'lost'}")
    driver = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    rows = write(driver, range(3000, 3010), "rolled")
    with pytest.raises(HamqError, match="answer after after_journal was lost"):
        driver.commit([rows], 0)
    monkeypatch.delenv(FAILPOINT_ENV)
    HamqBatchWriter(options(ns)).abort([rows])  # the halves are rolled back behind its back
    replay = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    with pytest.raises(TransactionRolledBack, match="rows are missing"):
        replay.commit([write(replay, range(3000, 3010), "rolled")], 0)
    assert visible(drain_topic, ns, range(3000, 3010)) == []


def test_admin_lists_and_deletes_spark_journals(shared, hamq_cli):
    """Item 6: journals outlive their queries, so operators list them (sink, last batch,
    age) and delete the journal of a query that will not run again."""
    ns = shared.namesrv
    checkpoint = CHECKPOINT + "/listed"
    driver = HamqStreamWriter(options(ns, checkpoint=checkpoint))
    for batch_id in range(2):
        driver.commit([write(driver, range(4000 + batch_id, 4001 + batch_id), "listed")], batch_id)
    topic = journal_topic(sink_key(options(ns, checkpoint=checkpoint), "listed"))

    def journals() -> dict[str, dict]:
        done = hamq_cli("admin", "spark-journals", "--json", "--namesrv", ns)
        assert done.returncode == 0, done.stderr
        return {row["topic"]: row for row in json.loads(done.stdout)}

    row = journals()[topic]
    assert (row["group"], row["entries"], row["last_batch"]) == ("broker-a", 2, 1)
    assert 0 <= row["age_s"] < WAIT_S and topic.endswith(row["sink_key_hash"])
    assert topic in hamq_cli("admin", "spark-journals", "--namesrv", ns).stdout
    done = hamq_cli("admin", "spark-journals", "--delete", topic, "--namesrv", ns)
    assert done.returncode == 0, done.stderr
    assert topic not in journals()
    refused = hamq_cli("admin", "spark-journals", "--delete", DATA, "--namesrv", ns)
    assert refused.returncode != 0 and "is not a sink journal" in refused.stderr


def test_a_batch_write_is_all_or_nothing_past_its_commit_point(cluster_factory):
    """Item 1, batch writes: the commit committed its first half (broker-a) and then could
    not reach broker-b's master; Spark's abort finds the commit point committed and
    commits the rest instead of rolling it back, so the job is wholly visible, not half."""
    c = start_groups(cluster_factory)
    ns, topic = c.namesrv, "SinkBoth"
    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=2)  # both groups
    writer = HamqBatchWriter(WriteOptions(ns, topic, "spark-journal-sink", None, 2.0))
    values = pa.array([b"%d" % i for i in range(200)])
    keys = pa.array([b"k%d" % i for i in range(200)])  # keyed rows reach every queue
    batch = pa.RecordBatch.from_pydict({"value": values, "key": keys})
    rows = writer.write(iter([batch]))
    assert set(rows.halves) == {"broker-a", "broker-b"}
    c.procs["b"].kill9()
    with Admin(ns) as admin:
        wait_for(lambda: "broker-b" not in admin.master_addrs(), WAIT_S, "broker-b without master")
    with pytest.raises(HamqError):
        writer.commit([rows])
    restart_master(c, "b")
    writer.abort([rows])
    with hamq.PullConsumer("all-or-nothing", ns) as consumer:
        got = []
        for mq in consumer.fetch_message_queues(topic):
            result = consumer.pull(mq, 0, 500)
            got += [int(m.body) for m in result.messages]
    assert sorted(got) == list(range(200))


def test_a_journal_retention_removed_is_an_error_not_no_batch_yet(cluster_factory, drain_topic):
    """Item 6: batch 0 is committed and journaled, then retention removes the journal
    (64 KiB segments kept a second) while the query is stopped; Spark replays batch 0 on
    restart. The sink must refuse (which batches were committed is unknown) rather than
    read an empty journal as "no batch yet" and commit the replay's rows a second time."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(
        "a",
        broker_name="broker-a",
        mapped_file_size_commitlog=64 * 1024,
        file_reserved_hours=1.0 / 3600,
        clean_resource_interval_ms=200,
    )
    ns = c.namesrv
    with Admin(ns) as admin:
        wait_for(lambda: admin.master_addrs(), WAIT_S, "broker-a registered")
        admin.create_topic(DATA, queue_nums=1)
        admin.create_topic("Filler", queue_nums=1)
    driver = HamqStreamWriter(options(ns))
    driver.commit([write(driver, range(10))], 0)
    journal = journal_topic(sink_key(options(ns), "query-1"))
    with hamq.Producer(ns, "spark-journal-filler") as producer, Admin(ns) as admin:

        def journal_expired() -> bool:
            producer.send_batch([hamq.Message("Filler", bytes(1000)) for _ in range(80)])
            row = admin.topic_offsets(journal)[0]
            return row["min_offset"] == row["max_offset"] > 0

        wait_for(journal_expired, 60, "retention to remove the journal")
    before = visible(drain_topic, ns, range(10))  # batch 0's rows may have expired too
    replay = HamqStreamWriter(options(ns))
    rows = write(replay, range(10))
    with pytest.raises(JournalError, match="retention removed"):
        replay.commit([rows], 0)
    assert visible(drain_topic, ns, range(10)) == before
