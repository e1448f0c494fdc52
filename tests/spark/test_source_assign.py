"""An ``assign`` naming a queue its topic does not have fails naming the queues the topic
has (the planning kept only the assigned ones and answered "it has none")."""

from __future__ import annotations

import pytest

from hamq.client.sync import Admin
from hamq.spark.options import ReadOptions
from hamq.spark.reader import HamqBatchReader, HamqStreamReader


def test_assign_of_a_missing_queue_names_the_queues_the_topic_has(hamq_cluster):
    ns = hamq_cluster.namesrv
    with Admin(ns) as admin:
        admin.create_topic("Assigned", queue_nums=3)
    options = ReadOptions.parse({"namesrv": ns, "assign": '{"Assigned": ["broker-a:7"]}'})
    expected = (
        "topic Assigned has no readable queue broker-a:7 "
        ".it has broker-a:0, broker-a:1, broker-a:2."
    )
    with pytest.raises(ValueError, match=expected):
        HamqBatchReader(options).partitions()
    with pytest.raises(ValueError, match=expected):
        HamqStreamReader(options).initialOffset()
