"""Attacks on the message browser's broker side (issue 17, broker/message_lookup.py and
broker/consumer_admin.py): many key scans of a large topic at once must not hold up a
sync-flush producer, and hostile frames to the new request codes get a clear error while
the broker keeps serving."""

from __future__ import annotations

import threading
import time

import pytest

import hamq
from hamq import Message
from hamq.errors import HamqError, SystemBusy
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes
from harness import Cluster

BIG = "ScanBig"
LIVE = "ScanLive"
BATCHES, BATCH = 200, 1000  # a topic of 200k small messages: a scan of it takes ~0.5 s
SCANS = 12  # at once; the default executor has min(32, cores + 4) workers
SEND_LIMIT_S = 1.5  # a loaded 2-core machine (0.1 s idle); scans side by side: 3-6 s


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("lookup_attacks"))
    try:
        cluster.start_namesrv()
        cluster.start_broker(flush_disk_type="sync")
        with hamq.Admin(cluster.namesrv) as admin:
            admin.create_topic(BIG, 1)
            admin.create_topic(LIVE, 1)
        with hamq.Producer(cluster.namesrv) as producer:
            for i in range(BATCHES):
                producer.send_batch(
                    [Message(BIG, b"x" * 16, keys=f"k{i}-{j}") for j in range(BATCH)]
                )
        yield cluster
    finally:
        cluster.stop_all()


def test_many_key_scans_do_not_hold_up_sync_flush_sends(big):
    outcomes: list[str] = []
    with hamq.Admin(big.namesrv) as admin, hamq.Producer(big.namesrv) as producer:
        producer.send(Message(LIVE, b"warm"))

        def scan() -> None:
            try:
                found, _ = admin.query_messages_by_key(BIG, "absent", max_scan=1_000_000)
                outcomes.append("found" if found else "none")
            except SystemBusy:
                outcomes.append("busy")

        threads = [threading.Thread(target=scan) for _ in range(SCANS)]
        for t in threads:
            t.start()
        slowest = 0.0
        while any(t.is_alive() for t in threads) and len(outcomes) < SCANS:
            began = time.monotonic()
            producer.send(Message(LIVE, b"during"))
            slowest = max(slowest, time.monotonic() - began)
        for t in threads:
            t.join(60)
    assert sorted(set(outcomes)) in (["none"], ["busy", "none"]), outcomes
    assert len(outcomes) == SCANS
    assert slowest < SEND_LIMIT_S, f"a send took {slowest:.1f} s while {SCANS} key scans ran"


HOSTILE = [
    (RequestCode.QUERY_MESSAGE, {}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG, "key": 7}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG, "key": ""}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG, "key": "k", "max_scan": -1}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG, "key": "k", "max_scan": "9"}),
    (RequestCode.QUERY_MESSAGE, {"topic": BIG, "key": "k", "max_scan": 0}),
    (RequestCode.QUERY_MESSAGE, {"topic": ["x"], "key": "k"}),
    (RequestCode.VIEW_MESSAGE_BY_ID, {"physical_offset": None}),
    (RequestCode.VIEW_MESSAGE_BY_ID, {"physical_offset": True}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "g", "topic": BIG}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "g", "topic": 3, "timestamp_ms": 0}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "", "topic": BIG, "timestamp_ms": 0}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "g", "topic": BIG, "timestamp_ms": -5}),
    (RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"group": "g", "topic": BIG, "timestamp_ms": "0"}),
]


def test_hostile_frames_to_the_lookup_codes_get_clear_errors(big, raw_conn):
    conn = raw_conn(big.broker_addr())
    for i, (code, ext) in enumerate(HOSTILE, start=1):
        conn.send(encode_frame_bytes(code, i, ext=ext))
        answer = conn.read_frame()
        assert answer is not None and answer.opaque == i, (code, ext)
        assert answer.code == ResponseCode.INVALID_ARGUMENT, (code, ext, answer.remark)
        assert answer.remark, (code, ext)
    conn.send(encode_frame_bytes(RequestCode.QUERY_MESSAGE, 99, ext={"topic": "Nope", "key": "k"}))
    assert conn.read_frame().code == ResponseCode.TOPIC_NOT_EXIST
    with hamq.Admin(big.namesrv) as admin:  # still serving
        found, truncated = admin.query_messages_by_key(BIG, "k199-999", max_scan=5)
        assert [m.body for m in found] == [b"x" * 16] and truncated
        assert admin.reset_offset("g-hostile", BIG, 2**62)[0]["new_offset"] == BATCHES * BATCH


def test_reset_before_the_first_message_goes_to_the_queue_start(big):
    with hamq.Admin(big.namesrv) as admin:
        rows = admin.reset_offset("g-early", BIG, 0)
    assert [(r["queue_id"], r["new_offset"]) for r in rows] == [(0, 0)]
    with pytest.raises(HamqError), hamq.Admin(big.namesrv) as admin:
        admin.reset_offset("g-early", "NoSuchTopic", 0)
