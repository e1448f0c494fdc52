"""`hamq admin consumer-progress`: lag per queue of a consumer group, from real brokers."""

from __future__ import annotations

import json

import hamq
from hamq import Message


def test_consumer_progress_reports_lag_per_queue(cluster, hamq_cli):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Lagging", 2)
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(30):
            producer.send(Message("Lagging", b"m%d" % i))
    with hamq.PullConsumer("progress", cluster.namesrv) as consumer:
        queues = consumer.fetch_message_queues("Lagging")
        consumer.commit_offset(queues[0], 5)  # 5 consumed on queue 0, nothing on queue 1
        consumer.commit_offset(queues[1], 0)
        ends = {mq.queue_id: consumer.max_offset(mq) for mq in queues}
    done = hamq_cli(
        "admin", "consumer-progress", "--group", "progress", "--json", "--namesrv", cluster.namesrv
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {r["queue_id"]: r for r in report["queues"] if r["topic"] == "Lagging"}
    assert rows[0]["lag"] == ends[0] - 5 and rows[0]["consumer_offset"] == 5
    assert rows[1]["lag"] == ends[1] and rows[1]["broker_offset"] == ends[1]
    assert report["total_lag"] == sum(ends.values()) - 5
    text = hamq_cli(
        "admin", "consumer-progress", "--group", "progress", "--namesrv", cluster.namesrv
    )
    assert "total lag" in text.stdout


def test_consumer_progress_of_an_unknown_group_is_empty(cluster, hamq_cli):
    done = hamq_cli(
        "admin", "consumer-progress", "--group", "nobody", "--json", "--namesrv", cluster.namesrv
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "group": "nobody",
        "members": [],
        "total_lag": 0,
        "queues": [],
    }
