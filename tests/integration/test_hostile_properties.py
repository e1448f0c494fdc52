"""Real brokers facing messages whose properties the broker would choke on later (issue 12
items 5, 6 and 11): half, delay and timer messages with ill-typed properties are refused at
send with MESSAGE_ILLEGAL naming the property, so the transaction check and delivery keep
working; a plain message whose properties are not a map is refused; and ``hamq consume
--json`` prints a stored message whose properties it cannot read with an error field
instead of silently skipping it and everything after it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgpack
import pytest

import hamq
from hamq.config import StoreConfig
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body, unpack_body
from hamq.protocol.message import encode_batch, encode_message
from hamq.store.message_store import MessageStore
from helpers import free_port, scrape_metrics

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_hostile_input import ask
from test_transaction import FAST_CHECKS, TOPIC, LocalTransactions, send, visible

HALF = {"TRAN_MSG": "true", "PGROUP": "pg-tx"}


def raw_props(properties) -> bytes:
    return msgpack.packb(properties, use_bin_type=True)


def send_raw(conn, opaque: int, props: bytes, body: bytes = b"body"):
    payload, crc = encode_batch([encode_message(body, props)])
    return ask(
        conn,
        RequestCode.SEND_MESSAGE,
        opaque,
        {"topic": TOPIC, "queue_id": 0, "count": 1, "crc": crc},
        payload,
    )


@pytest.mark.parametrize(
    "props, field",
    [
        ({**HALF, "PGROUP": 7}, "PGROUP"),
        ({**HALF, "PGROUP": "../x"}, "PGROUP"),
        ({**HALF, "TRAN_BATCH": [1, 2]}, "TRAN_BATCH"),
        ({**HALF, "CHECK_IMMUNITY_TIME_IN_SECONDS": "1e3"}, "CHECK_IMMUNITY_TIME_IN_SECONDS"),
        ({**HALF, "REAL_TOPIC": ".."}, "REAL_TOPIC"),
        ({**HALF, "REAL_QID": "-1"}, "REAL_QID"),
        ({**HALF, "UNIQ_KEY": "k" * 1000}, "UNIQ_KEY"),
        ({"DELAY": 3}, "DELAY"),
        ({"DELAY": "\u00b2"}, "DELAY"),  # superscript two: str.isdigit, not int()
        ({"DELAY": "\u0663"}, "DELAY"),  # Arabic-Indic three
        ({"TIMER_DELIVER_MS": ["1"]}, "TIMER_DELIVER_MS"),
        ({"TRAN_MSG": "true", "PGROUP": "pg-tx", 5: "x"}, "map key"),
    ],
    ids=[
        "pgroup-int",
        "pgroup-path",
        "tran_batch-list",
        "immunity-float",
        "real_topic-dotdot",
        "real_qid-negative",
        "uniq_key-huge",
        "delay-int",
        "delay-superscript",
        "delay-arabic",
        "timer-list",
        "key-int",
    ],
)
def test_held_back_messages_with_bad_properties_are_refused(
    cluster_factory, raw_conn, props, field
):
    """Refused with MESSAGE_ILLEGAL naming the property, nothing stored, no internal
    error; afterwards a legitimate half whose outcome is unknown is still checked back and
    committed (the check task is alive)."""
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker(metrics_listen=metrics, **FAST_CHECKS)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    conn = raw_conn(c.broker_addr())
    answer = send_raw(conn, 3, raw_props(props))
    assert answer.code == ResponseCode.MESSAGE_ILLEGAL, answer
    assert field in answer.remark, answer.remark
    for system_topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"):
        for queue_id in (0, 2, 18):
            stored = ask(
                conn, RequestCode.GET_MAX_OFFSET, 4, {"topic": system_topic, "queue_id": queue_id}
            )
            assert stored.ext.get("offset", 0) == 0, (system_topic, queue_id, stored)
    assert scrape_metrics(metrics)["hamq_internal_errors_total"] == 0
    local = LocalTransactions(
        {"unknown": hamq.TransactionState.UNKNOW}, {"unknown": hamq.TransactionState.COMMIT_MESSAGE}
    )
    with local.producer(c.namesrv) as producer:
        send(producer, "unknown")
        assert visible(c.namesrv, wait_s=8.0, until_count=1) == ["unknown"]
    assert local.checks == ["unknown"]


@pytest.mark.parametrize(
    "props", [raw_props(["a", "b"]), raw_props("text"), b"\xc0"], ids=["list", "string", "nil"]
)
def test_plain_message_properties_that_are_not_a_map_are_refused(cluster_factory, raw_conn, props):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker()
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    conn = raw_conn(c.broker_addr())
    answer = send_raw(conn, 5, props)
    assert answer.code == ResponseCode.MESSAGE_ILLEGAL, answer
    assert "properties" in answer.remark and "not a map" in answer.remark, answer.remark
    assert ask(conn, RequestCode.GET_MAX_OFFSET, 6, {"topic": TOPIC, "queue_id": 0}).ext == {
        "offset": 0
    }


def test_consume_json_reports_unreadable_properties_and_goes_on(cluster, raw_conn, hamq_cli):
    """A stored map the send check lets through (it looks only at the map header) but that
    is not string to string, or is cut short, is printed with an ``error`` field between
    its neighbours; none is skipped."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    conn = raw_conn(cluster.broker_addr())
    for opaque, props in enumerate(
        [
            raw_props({"KEYS": "first"}),
            raw_props({"a": b"\xff"}),
            b"\x81",
            raw_props({"KEYS": "last"}),
        ]
    ):
        assert send_raw(conn, opaque, props, f"m{opaque}".encode()).code == ResponseCode.SUCCESS
    done = hamq_cli(
        "consume",
        TOPIC,
        "-g",
        "g-json",
        "--from-beginning",
        "--max",
        "4",
        "--timeout",
        "20",
        "--json",
        "-n",
        cluster.namesrv,
    )
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [m["body"] for m in printed] == ["m0", "m1", "m2", "m3"], printed
    assert [m["keys"] for m in (printed[0], printed[3])] == ["first", "last"]
    for bad in printed[1:3]:
        assert "properties cannot be read" in bad["error"] and "keys" not in bad, bad


# -- 11. fields that aliased, or answered SUCCESS for, what does not exist ---------------
def test_pull_commit_offset_needs_a_group_name(cluster, raw_conn):
    """A pull's commit offset is stored under its group: a group that is not a name (an
    int that would be persisted as the group "1", a list) or an offset out of range is
    INVALID_ARGUMENT naming the field, and no offset is stored."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    conn = raw_conn(cluster.broker_addr())
    pull = {"topic": TOPIC, "queue_id": 0, "queue_offset": 0, "max_msgs": 1}
    for opaque, (extra, field) in enumerate(
        [
            ({"group": 1, "commit_offset": 5}, "group"),
            ({"group": ["g"], "commit_offset": 5}, "group"),
            ({"commit_offset": 5}, "group"),
            ({"group": "g", "commit_offset": 2**64 - 1}, "commit_offset"),
            ({"group": "g", "commit_offset": "5"}, "commit_offset"),
        ]
    ):
        answer = ask(conn, RequestCode.PULL_MESSAGE, opaque, {**pull, **extra})
        assert answer.code == ResponseCode.INVALID_ARGUMENT, (extra, answer)
        assert field in answer.remark, answer.remark
    offsets = ask(conn, RequestCode.GET_ALL_CONSUMER_OFFSET, 9, {})
    assert offsets.body in (b"", pack_body({})), unpack_body(offsets.body)


@pytest.mark.parametrize("offset", [-1, 1, 2**40], ids=["minus-one", "past-end", "huge"])
def test_end_transaction_of_what_is_not_a_half_is_refused(cluster_factory, raw_conn, offset):
    """END_TRANSACTION answered SUCCESS for offset -1 (below every decided half) and for
    offsets past the half queue (with UNKNOW): now INVALID_ARGUMENT naming the field; a
    real half is still committed by it."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(**FAST_CHECKS)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    conn = raw_conn(c.broker_addr())
    half = send_raw(conn, 1, raw_props(HALF))
    assert half.code == ResponseCode.SUCCESS, half
    for opaque, state in enumerate(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"], 2):
        answer = ask(
            conn,
            RequestCode.END_TRANSACTION,
            opaque,
            {"group": "pg-tx", "tran_state_table_offset": offset, "commit_or_rollback": state},
        )
        assert answer.code == ResponseCode.INVALID_ARGUMENT, (state, answer)
        assert "tran_state_table_offset" in answer.remark, answer.remark
    answer = ask(
        conn,
        RequestCode.END_TRANSACTION,
        9,
        {"group": "pg-tx", "tran_state_table_offset": 0, "commit_or_rollback": "COMMIT_MESSAGE"},
    )
    assert answer.code == ResponseCode.SUCCESS, answer
    assert ask(conn, RequestCode.GET_MAX_OFFSET, 10, {"topic": TOPIC, "queue_id": 0}).ext == {
        "offset": 1
    }


# -- 10. held pops are capped -------------------------------------------------------------
def _pops(conn, first_opaque: int, n: int) -> None:
    conn.send(
        b"".join(
            encode_frame_bytes(
                RequestCode.POP_MESSAGE,
                first_opaque + i,
                ext={
                    "group": "g-held",
                    "topic": TOPIC,
                    "queue_id": -1,
                    "invisible_time_ms": 60_000,
                    "max_msgs": 1,
                    "poll_time_ms": 20_000,
                },
            )
            for i in range(n)
        )
    )


def _answered_at_once(conn, n: int) -> list:
    frames = [conn.read_frame() for _ in range(n)]
    assert all(f is not None and f.code == ResponseCode.PULL_NOT_FOUND for f in frames), frames
    return sorted(f.opaque for f in frames)


def test_held_pops_are_capped_per_connection_and_per_queue(cluster_factory, raw_conn):
    """Past ``max_held_pops_per_connection`` (and ``max_held_pops_per_queue`` across
    connections) a pop with nothing to find is answered empty at once instead of held;
    the held ones still get what a send brings."""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(max_held_pops_per_connection=20, max_held_pops_per_queue=30)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    first, second = raw_conn(c.broker_addr()), raw_conn(c.broker_addr())
    _pops(first, 1, 25)
    assert _answered_at_once(first, 5) == list(range(21, 26))  # over the connection's 20
    _pops(second, 101, 15)
    assert _answered_at_once(second, 5) == list(range(111, 116))  # over the queue's 30
    payload, crc = encode_batch([encode_message(b"wake")])
    assert (
        ask(
            raw_conn(c.broker_addr()),
            RequestCode.SEND_MESSAGE,
            1,
            {"topic": TOPIC, "queue_id": 0, "count": 1, "crc": crc},
            payload,
        ).code
        == ResponseCode.SUCCESS
    )
    woken = first.read_frame()
    assert woken.code == ResponseCode.SUCCESS and woken.opaque == 1, woken


def test_transaction_check_survives_unreadable_halves_stored_before(cluster_factory):
    """Halves stored before sends checked properties (written into the stopped broker's
    store here): a group that is a list, properties cut short. The check task skips them
    (logged, counted) and still checks back and commits a legitimate half after them."""
    c = cluster_factory()
    c.start_namesrv()
    metrics = f"127.0.0.1:{free_port()}"
    c.start_broker(metrics_listen=metrics, **FAST_CHECKS)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    c.procs["broker"].stop()
    store = MessageStore(StoreConfig(store_dir=str(c.root / "broker"), disk_min_free_bytes=1))
    try:
        for props in (
            raw_props({**HALF, "PGROUP": ["pg-tx"], "REAL_TOPIC": TOPIC, "REAL_QID": "0"}),
            b"\x81",
        ):
            payload, crc = encode_batch([encode_message(b"old", props)])
            store.put_batch("RMQ_SYS_TRANS_HALF_TOPIC", 0, payload, 1, crc, 0)
        store.commit()
    finally:
        store.close()
    c.procs["broker"].start()
    local = LocalTransactions(
        {"unknown": hamq.TransactionState.UNKNOW}, {"unknown": hamq.TransactionState.COMMIT_MESSAGE}
    )
    with local.producer(c.namesrv) as producer:
        send(producer, "unknown")
        assert visible(c.namesrv, wait_s=10.0, until_count=1) == ["unknown"]
    assert local.checks == ["unknown"]
    counted = scrape_metrics(metrics)
    assert counted["hamq_records_skipped_total"] == 2
    assert counted["hamq_internal_errors_total"] == 0
