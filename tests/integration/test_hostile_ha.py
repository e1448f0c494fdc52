"""Real brokers facing a forged slave on the HA port and a master address a slave cannot
use (issue 12 item 4): a huge ack after a handshake at offset 0 ships no more than the
flow-control window, unknown codes are REQUEST_CODE_NOT_SUPPORTED, and a slave's HA task
that fails logs and tries again instead of stopping replication for good."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import hamq
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Flag, encode_frame_bytes, pack_body
from helpers import send_and_pull, wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_hostile_clients import ask as ask_past_notifications
from test_hostile_input import MIB, _fill, _ha_listen, ask, rss_mib

LOG_MIB = 48
WINDOW_MIB = 8  # ha_window_bytes
# What the master may hold for a slave that reads nothing: its window, plus slack for the
# read buffers and allocator; copying the whole log took LOG_MIB more.
ACK_RSS_BOUND_MIB = WINDOW_MIB + 16


def test_huge_ack_after_a_handshake_at_zero_ships_only_the_window(cluster):
    """A fake slave attaches at offset 0, acks 2**63 - 1 and reads nothing: the master
    queues at most its window for it (the ack counts only as far as it was shipped), and
    keeps serving."""
    _fill(cluster, "Big", LOG_MIB)
    host, port = _ha_listen(cluster).rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    pid = cluster.procs["broker"].pid
    try:
        before = rss_mib(pid)
        # The ack rides in the same write as the handshake, so the master reads it before
        # it ships anything (and before a full socket stops it reading). ``max_offset`` is
        # the attach offset of the handshake before 8b21663, so the test runs against both.
        ack = encode_frame_bytes(RequestCode.HA_ACK, 2, Flag.ONEWAY, {"ack_offset": 2**63 - 1})
        sock.sendall(
            encode_frame_bytes(
                RequestCode.HA_HANDSHAKE,
                1,
                ext={"broker_id": 1, "attach": 0, "proof": None, "max_offset": 0},
            )
            + ack
        )
        with hamq.Admin(cluster.namesrv) as admin:
            wait_for(
                lambda: admin.broker_runtime_info(cluster.broker_addr())["ha"]["slaves"],
                10,
                "fake slave attached",
            )
            time.sleep(1.0)  # what the master ships after the ack, it ships at once
            grown = rss_mib(pid) - before
            slaves = admin.broker_runtime_info(cluster.broker_addr())["ha"]["slaves"]
        assert grown < ACK_RSS_BOUND_MIB, f"RSS grew {grown:.0f} MiB for one fake slave"
        assert len(slaves) == 1 and slaves[0]["ack_offset"] <= WINDOW_MIB * MIB, slaves
    finally:
        sock.close()
    send_and_pull(cluster.namesrv, "Big")


def test_unknown_codes_on_the_ha_port_are_not_supported(cluster, raw_conn):
    conn = raw_conn(_ha_listen(cluster))
    for opaque, code in enumerate([RequestCode.SEND_MESSAGE, RequestCode.HEART_BEAT, 9999], 1):
        answer = ask(conn, code, opaque, {})
        assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, answer)
        assert str(int(code)) in answer.remark, answer.remark
    assert not conn.closed_by_server()


def test_slave_ha_task_survives_a_master_address_it_cannot_use(cluster_factory, raw_conn):
    """While its master is down, a forged registration gives the slave a master HA address
    that makes connecting raise something other than a connection error (a host label
    longer than DNS allows). The slave logs it and tries again, so once the real master is
    back it replicates again; before, its HA task died and it never did."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker("master")
    c.start_broker("slave1", broker_id=1, broker_role="slave")
    with hamq.Admin(c.namesrv) as admin:

        def slave_states() -> list[str]:
            info = admin.broker_runtime_info(c.broker_addr("master"))["ha"]
            return [s["state"] for s in info["slaves"]]

        wait_for(lambda: slave_states() == ["TRANSFER"], 15, "slave attached")
        c.procs["master"].stop()
        forged = {
            "cluster_name": "TestCluster",
            "broker_name": "broker-a",
            "broker_id": 0,
            "broker_addr": "127.0.0.1:1",
            "ha_addr": "a" * 70 + ".example:1",
        }
        conn = raw_conn(c.namesrv_addrs[0])
        wait_for(
            lambda: (
                ask_past_notifications(
                    conn, RequestCode.REGISTER_BROKER, 1, forged, pack_body({"topic_configs": {}})
                ).code
                == ResponseCode.SUCCESS
            ),
            15,
            "forged registration accepted once the master is gone",
        )
        log = c.root / "slave1.log"
        wait_for(lambda: "a" * 70 in log.read_text(), 15, "slave tried the forged address")
        c.procs["master"].start()  # registers once the forged member has expired
        wait_for(lambda: slave_states() == ["TRANSFER"], 30, "slave attached again")
        admin.create_topic("AfterForgery", 1)
    send_and_pull(c.namesrv, "AfterForgery")
