"""Real servers facing input no well-behaved client sends: broken framing is answered with
an error frame and that connection closed, without harming anyone else; bad requests inside
good frames get a precise error on a connection that stays usable; a bad config file stops
the broker at once with a message naming the key."""

from __future__ import annotations

import re
import struct
import time

import msgpack
import pytest

import hamq
from hamq import Message, MessageQueue
from hamq.errors import MessageIllegal, QueueNotExist
from hamq.protocol.codes import Flag, RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body
from hamq.protocol.limits import MAX_MESSAGE_BYTES
from hamq.protocol.message import encode_batch, encode_message
from helpers import send_and_pull

GARBAGE = {
    "http request": b"GET / HTTP/1.1\r\nHost: hamq\r\n\r\n",
    "header not msgpack": struct.pack(">II", 12, 5) + b"\xc1" * 5 + b"abc",
    "header wrong shape": struct.pack(">II", 4 + 3, 3) + msgpack.packb([1, 2]),
    "empty header": struct.pack(">II", 10, 0) + b"\0" * 10,
    "declares 2 GiB": struct.pack(">II", 2 * 1024**3, 16),
}
# A request each server answers with SUCCESS, to prove a connection or server still works.
PROBE = {
    "broker": RequestCode.GET_BROKER_RUNTIME_INFO,
    "namesrv": RequestCode.GET_BROKER_CLUSTER_INFO,
}


def address(cluster, server: str) -> str:
    return cluster.broker_addr() if server == "broker" else cluster.namesrv_addrs[0]


@pytest.mark.parametrize("server", ["broker", "namesrv"])
def test_broken_framing_gets_error_and_close_server_keeps_serving(cluster, raw_conn, server):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Bad", 2)
    addr = address(cluster, server)
    bystander = raw_conn(addr)  # a connection open across all the abuse
    for name, data in GARBAGE.items():
        conn = raw_conn(addr)
        conn.send(data)
        answer = conn.read_frame()
        assert answer is not None, f"{name}: closed without an error frame"
        assert answer.code == ResponseCode.BAD_FRAME, (name, answer)
        assert answer.flags & Flag.RESPONSE and answer.remark, name
        assert conn.closed_by_server(), f"{name}: connection left open"
    huge = raw_conn(addr)
    huge.send(GARBAGE["declares 2 GiB"])
    assert "limit" in huge.read_frame().remark
    bystander.send(encode_frame_bytes(PROBE[server], 5))
    answer = bystander.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.SUCCESS, 5)
    send_and_pull(cluster.namesrv, "Bad")


@pytest.mark.parametrize("server", ["broker", "namesrv"])
def test_unknown_request_code_keeps_connection_open(cluster, raw_conn, server):
    conn = raw_conn(address(cluster, server))
    conn.send(encode_frame_bytes(4242, 77, ext={"x": 1}))
    answer = conn.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 77)
    assert "4242" in answer.remark
    conn.send(encode_frame_bytes(PROBE[server], 78))
    answer = conn.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.SUCCESS, 78)


def test_send_to_bad_queue_id_is_queue_not_exist(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("TwoQueues", 2)
    with hamq.Producer(cluster.namesrv) as producer:
        with pytest.raises(QueueNotExist, match="queue 7 does not exist"):
            producer.send(Message("TwoQueues", b"x"), MessageQueue("TwoQueues", "broker-a", 7))
        ok = producer.send(Message("TwoQueues", b"x"), MessageQueue("TwoQueues", "broker-a", 1))
    assert ok.status is hamq.SendStatus.SEND_OK and ok.queue.queue_id == 1


def test_message_over_4_mib_is_message_illegal(cluster, raw_conn):
    """The client refuses to encode it; a raw frame carrying one is refused by the broker,
    which keeps the connection and stores nothing."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Big", 1)
    with hamq.Producer(cluster.namesrv) as producer:
        with pytest.raises(MessageIllegal):
            producer.send(Message("Big", b"\0" * (MAX_MESSAGE_BYTES + 1)))
        assert producer.send(Message("Big", b"\0" * MAX_MESSAGE_BYTES)).queue_offset == 0
    body = b"\1" * (MAX_MESSAGE_BYTES + 1)
    payload, crc = encode_batch([struct.pack(">IH", 2 + len(body), 0) + body])
    conn = raw_conn(cluster.broker_addr())
    conn.send(
        encode_frame_bytes(
            RequestCode.SEND_MESSAGE,
            9,
            ext={"topic": "Big", "queue_id": 0, "count": 1, "crc": crc},
            body=payload,
        )
    )
    answer = conn.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.MESSAGE_ILLEGAL, 9)
    assert "limit" in answer.remark
    conn.send(
        encode_frame_bytes(RequestCode.GET_MAX_OFFSET, 10, ext={"topic": "Big", "queue_id": 0})
    )
    answer = conn.read_frame()
    assert (answer.code, answer.ext["offset"]) == (ResponseCode.SUCCESS, 1)


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            'flush_disk_typ = "sync"',
            r"unknown key 'flush_disk_typ' \(did you mean 'flush_disk_type'\?\)",
        ),
        ('broker_id = "zero"', r"broker_id = 'zero': must be an integer"),
        ('namesrv = ["127.0.0.1:99999"]', r"namesrv = '127.0.0.1:99999': must be HOST:PORT"),
    ],
    ids=["unknown-key", "wrong-type", "bad-address"],
)
def test_broker_refuses_bad_config_file(tmp_path, hamq_cli, line, expected):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'broker_name = "b"\nlisten = "127.0.0.1:1"\nstore_dir = "{tmp_path / "store"}"\n{line}\n'
    )
    result = hamq_cli("broker", "-c", str(cfg), timeout=30)
    assert result.returncode != 0
    assert re.search(expected, result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "ext, body, expected",
    [
        ({}, pack_body({"topic_configs": {"Ghost": {"perm": 6}}}), "topic config of 'Ghost'"),
        ({}, pack_body([1, 2]), "must be a map"),
        ({"heartbeat_timeout_ms": "soon"}, b"", "heartbeat_timeout_ms"),
        ({"heartbeat_timeout_ms": -1}, b"", "heartbeat_timeout_ms"),
    ],
    ids=["topic-config-incomplete", "body-not-a-map", "timeout-not-int", "timeout-negative"],
)
def test_malformed_registration_changes_nothing(cluster, raw_conn, ext, body, expected):
    """A registration the name server cannot use, even for a real broker's identity, is
    refused as INVALID_ARGUMENT before anything is applied: the broker's routes stay, and
    the name server survives its next expiry scans."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Keep", 2)
    identity = {
        "cluster_name": "TestCluster",
        "broker_name": "broker-a",
        "broker_id": 0,
        "broker_addr": cluster.broker_addr(),
    }
    conn = raw_conn(cluster.namesrv_addrs[0])
    conn.send(
        encode_frame_bytes(RequestCode.REGISTER_BROKER, 3, ext={**identity, **ext}, body=body)
    )
    answer = conn.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.INVALID_ARGUMENT, 3)
    assert expected in answer.remark
    time.sleep(1.2)  # two expiry scans of the cluster fixture (every 500 ms)
    assert cluster.procs["namesrv"].alive()
    with hamq.Admin(cluster.namesrv) as admin:
        assert len(admin.topic_route("Keep").write_queues) == 2


@pytest.mark.parametrize(
    "code, ext, field",
    [
        (
            RequestCode.PULL_MESSAGE,
            {"topic": "Typed", "queue_id": 0, "queue_offset": 0, "max_msgs": "x"},
            "max_msgs",
        ),
        (
            RequestCode.PULL_MESSAGE,
            {"topic": "Typed", "queue_id": 0, "queue_offset": 0, "suspend_timeout_ms": "x"},
            "suspend_timeout_ms",
        ),
        (
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "Other", "read_queue_nums": "abc"},
            "read_queue_nums",
        ),
        (RequestCode.SEND_MESSAGE, {"born_ts": "x"}, "born_ts"),
    ],
    ids=["pull-max_msgs", "pull-suspend", "create-read_queue_nums", "send-born_ts"],
)
def test_ill_typed_optional_field_is_invalid_argument(cluster, raw_conn, code, ext, field):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Typed", 1)
    body = b""
    if code == RequestCode.SEND_MESSAGE:
        body, crc = encode_batch([encode_message(b"a")])
        ext = {"topic": "Typed", "queue_id": 0, "count": 1, "crc": crc, **ext}
    conn = raw_conn(cluster.broker_addr())
    conn.send(encode_frame_bytes(code, 21, ext=ext, body=body))
    answer = conn.read_frame()
    assert (answer.code, answer.opaque) == (ResponseCode.INVALID_ARGUMENT, 21), answer
    assert field in answer.remark
