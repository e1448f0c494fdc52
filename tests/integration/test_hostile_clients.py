"""Real brokers facing hostile HEART_BEAT and LOCK_BATCH_MQ requests (issue 12 items 9 and
11): a heartbeat with a malformed group is refused before any of it is applied, and queue
locks need a client that heartbeats as a consumer of the group, an existing topic and a
request of bounded size, so nothing is kept for names a client made up."""

from __future__ import annotations

import hamq
from hamq.broker.locks import RebalanceLockManager
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body, unpack_body
from hamq.protocol.limits import MAX_LOCK_BATCH_QUEUES
from helpers import free_port, scrape_metrics, send_and_pull

TOPIC = "Ordered"


def ask(conn, code: int, opaque: int, ext: dict, body: bytes = b""):
    """The answer to a request, past the one-way notifications a broker or name server
    sends a connection that registered (NOTIFY_CONSUMER_IDS_CHANGED and the like)."""
    conn.send(encode_frame_bytes(code, opaque, ext=ext, body=body))
    while (answer := conn.read_frame()) is not None and answer.is_oneway:
        pass
    assert answer is not None and answer.opaque == opaque, answer
    return answer


def _started(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker(metrics_listen=metrics)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 4)
    return c, metrics


def _consumers(conn, group: str) -> list:
    return unpack_body(ask(conn, RequestCode.GET_CONSUMER_LIST_BY_GROUP, 90, {"group": group}).body)


def test_heartbeat_with_a_malformed_group_applies_nothing(cluster_factory, raw_conn):
    c, metrics = _started(cluster_factory)
    conn = raw_conn(c.broker_addr())
    good = {"group": "g-good", "message_model": "clustering", "subscriptions": {TOPIC: "*"}}
    for opaque, (body, field) in enumerate(
        [
            ({"client_id": "c1", "consumer_groups": [good, {"group": 5}]}, "consumer group"),
            ({"client_id": "c1", "consumer_groups": [good, {"group": "../x"}]}, "consumer group"),
            ({"client_id": "c1", "consumer_groups": [good, "g"]}, "consumer_groups"),
            (
                {"client_id": "c1", "consumer_groups": [good, {**good, "message_model": 1}]},
                "message_model",
            ),
            (
                {"client_id": "c1", "consumer_groups": [{**good, "subscriptions": [TOPIC]}]},
                "subscriptions",
            ),
            ({"client_id": "c1", "consumer_groups": [{"group": "g" * 200}]}, "retry topic"),
            ({"client_id": "c1", "producer_groups": ["pg", {"x": 1}]}, "producer group"),
            ({"client_id": "c1", "consumer_groups": [good] * 2000}, "consumer_groups"),
            ({"client_id": ["c1"], "consumer_groups": [good]}, "client_id"),
        ],
        1,
    ):
        answer = ask(conn, RequestCode.HEART_BEAT, opaque, {}, pack_body(body))
        assert answer.code == ResponseCode.INVALID_ARGUMENT, (body, answer)
        assert field in answer.remark, answer.remark
    assert _consumers(conn, "g-good") == []
    topics = unpack_body(ask(conn, RequestCode.GET_ALL_TOPIC_CONFIG, 91, {}).body)
    assert not any(t.startswith("%RETRY%") for t in topics), sorted(topics)
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    answer = ask(
        conn,
        RequestCode.HEART_BEAT,
        92,
        {},
        pack_body({"client_id": "c1", "consumer_groups": [good]}),
    )
    assert answer.code == ResponseCode.SUCCESS, answer
    assert _consumers(conn, "g-good") == ["c1"]


def _lock(conn, opaque: int, queues: list, client_id: str = "c1", group: str = "g-ord"):
    return ask(
        conn,
        RequestCode.LOCK_BATCH_MQ,
        opaque,
        {"group": group, "client_id": client_id},
        pack_body(queues),
    )


def _heartbeat(conn, client_id: str) -> None:
    assert (
        ask(
            conn,
            RequestCode.HEART_BEAT,
            80,
            {},
            pack_body(
                {
                    "client_id": client_id,
                    "consumer_groups": [{"group": "g-ord", "subscriptions": {TOPIC: "*"}}],
                }
            ),
        ).code
        == ResponseCode.SUCCESS
    )


def test_locks_need_a_registered_client_an_existing_topic_and_a_bounded_request(
    cluster_factory, raw_conn
):
    c, metrics = _started(cluster_factory)
    conn = raw_conn(c.broker_addr())
    answer = _lock(conn, 1, [[TOPIC, 0]])
    assert answer.code == ResponseCode.INVALID_ARGUMENT and "HEART_BEAT" in answer.remark, answer
    _heartbeat(conn, "c1")
    answer = _lock(conn, 3, [[f"Made-up-{i}", 0] for i in range(MAX_LOCK_BATCH_QUEUES + 1)])
    assert (
        answer.code == ResponseCode.INVALID_ARGUMENT and str(MAX_LOCK_BATCH_QUEUES) in answer.remark
    ), answer
    answer = _lock(conn, 4, [[TOPIC, 0], [TOPIC, 3], [TOPIC, 4], ["Made-up", 0]])
    assert answer.code == ResponseCode.SUCCESS, answer
    assert unpack_body(answer.body) == [[TOPIC, 0], [TOPIC, 3]]  # only queues that exist
    # Another registered client of the group finds the locked queues taken.
    other = raw_conn(c.broker_addr())
    _heartbeat(other, "c2")
    assert unpack_body(_lock(other, 6, [[TOPIC, 0], [TOPIC, 1]], "c2").body) == [[TOPIC, 1]]
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    send_and_pull(c.namesrv, TOPIC)


def test_expired_locks_are_removed():
    locks = RebalanceLockManager(max_live_time_ms=1000)
    locks.try_lock_batch("g", [("T", 0), ("T", 1)], "c1", now_ms=0)
    locks.try_lock_batch("h", [("T", 0)], "c2", now_ms=600)
    assert len(locks) == 3
    locks.remove_expired(now_ms=1500)
    assert len(locks) == 1 and locks.owner("h", ("T", 0), 1500) == "c2"
    locks.remove_expired(now_ms=2000)
    assert len(locks) == 0
