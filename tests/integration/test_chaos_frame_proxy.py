"""The chaos suite's FrameProxy in front of a real broker that advertises it.

The broker listens on one port and registers the proxy's address (``advertise``), so the
name server routes every client through the proxy; whole frames are then lost, held or
doubled there, and what the broker stores is read back after the faults are cleared.
"""

from __future__ import annotations

import time

import pytest

import hamq
from hamq.chaos.frame_proxy import FrameProxy
from hamq.client.controller import ControllerClient
from hamq.errors import RequestTimeout
from helpers import free_port, wait_for

TOPIC = "proxied"


@pytest.fixture
def proxied(cluster_factory):
    """(cluster, proxy): a name server, and a broker reached only through the proxy."""
    cluster = cluster_factory()
    cluster.start_namesrv()
    listen = f"127.0.0.1:{free_port()}"
    proxy = FrameProxy("127.0.0.1:0", listen)
    try:
        cluster.start_broker(listen=listen, advertise=proxy.address, flush_disk_type="sync")
        with hamq.Admin(cluster.namesrv) as admin:
            admin.create_topic(TOPIC, 1)
        yield cluster, proxy
    finally:
        proxy.close()


def stored_bodies(cluster, drain_topic) -> list[bytes]:
    return sorted(body for _, body in drain_topic(cluster.namesrv, TOPIC)[0])


def test_a_producer_routed_through_the_proxy_sends_and_every_frame_crosses_it(proxied, drain_topic):
    cluster, proxy = proxied
    with hamq.Admin(cluster.namesrv) as admin:
        route = admin.topic_route(TOPIC)
    assert route.master_addr("broker-a") == proxy.address  # the advertised address is routed
    bodies = [b"m%d" % i for i in range(20)]
    with hamq.Producer(cluster.namesrv) as producer:
        for body in bodies:
            assert producer.send(hamq.Message(TOPIC, body)).status is hamq.SendStatus.SEND_OK
    assert proxy.counts("up").forwarded >= 20 and proxy.counts("down").forwarded >= 20
    assert stored_bodies(cluster, drain_topic) == sorted(bodies)


def test_a_duplicated_send_request_is_stored_twice_and_acknowledged_once(proxied, drain_topic):
    cluster, proxy = proxied
    bodies = [b"d%d" % i for i in range(5)]
    with hamq.Producer(cluster.namesrv) as producer:
        producer.send(hamq.Message(TOPIC, b"warm"))  # route and connection before the fault
        proxy.set_faults(duplicate=1.0, direction="up")
        offsets = [producer.send(hamq.Message(TOPIC, body)).queue_offset for body in bodies]
        proxy.clear()
    # The broker does not recognise a retransmitted request (same opaque, same UNIQ_KEY):
    # each copy is written; the client takes the first answer and ignores the second.
    assert proxy.counts("up").duplicated >= 5
    assert offsets == [1, 3, 5, 7, 9]  # each send's copy took the offset after it
    assert stored_bodies(cluster, drain_topic) == sorted([b"warm", *bodies, *bodies])


def test_lost_frames_fail_sends_and_no_acknowledged_send_is_missing(proxied, drain_topic):
    cluster, proxy = proxied
    acked, failed = [], []
    with hamq.Producer(
        cluster.namesrv, send_timeout_s=0.5, retry_times_when_send_failed=0
    ) as producer:
        producer.send(hamq.Message(TOPIC, b"warm"))
        acked.append(b"warm")
        proxy.set_faults(loss=0.3, seed=18)
        for i in range(40):
            body = b"l%d" % i
            try:
                producer.send(hamq.Message(TOPIC, body))
            except RequestTimeout:
                failed.append(body)  # indeterminate: the request or its answer was lost
            else:
                acked.append(body)
        proxy.clear()
    up, down = proxy.counts("up"), proxy.counts("down")
    assert failed and up.dropped and down.dropped
    stored = stored_bodies(cluster, drain_topic)
    assert set(acked) <= set(stored)  # never acknowledged without being stored
    assert len(stored) == len(set(stored))  # loss alone duplicates nothing
    # A send whose request was dropped is not stored; one whose answer was dropped is.
    assert len(stored) - len(acked) <= down.dropped
    assert len(acked) + len(failed) == 41


def test_delayed_answers_arrive_late_and_in_order(proxied):
    cluster, proxy = proxied
    with hamq.Producer(cluster.namesrv) as producer:
        producer.send(hamq.Message(TOPIC, b"warm"))
        proxy.set_faults(delay_ms=300, direction="down")
        start = time.monotonic()
        results = [producer.send(hamq.Message(TOPIC, b"x%d" % i)) for i in range(3)]
        elapsed = time.monotonic() - start
    assert elapsed >= 0.9
    assert [r.queue_offset for r in results] == [1, 2, 3]
    assert proxy.counts("down").delayed >= 3


@pytest.mark.parametrize(
    ("faults", "message"),
    [
        ({"loss": 1.5}, "loss must be a fraction"),
        ({"duplicate": -0.1}, "duplicate must be a fraction"),
        ({"delay_ms": -1}, "delay_ms must be in"),
        ({"direction": "sideways"}, "direction must be"),
    ],
)
def test_bad_faults_are_refused_and_change_nothing(faults, message):
    with FrameProxy("127.0.0.1:0", "127.0.0.1:1") as proxy:
        proxy.set_faults(loss=0.25)
        with pytest.raises(ValueError, match=message):
            proxy.set_faults(**faults)
        assert proxy.faults("up").loss == 0.25


def test_a_master_and_slave_advertising_proxies_replicate_through_them(cluster_factory):
    cluster = cluster_factory()
    cluster.start_namesrv()
    proxies: dict[str, FrameProxy] = {}
    try:
        for name, broker_id, role in (("master", 0, "sync_master"), ("slave", 1, "slave")):
            listen, ha_listen = (f"127.0.0.1:{free_port()}" for _ in range(2))
            proxies[name] = FrameProxy("127.0.0.1:0", listen)
            proxies[f"{name}-ha"] = FrameProxy("127.0.0.1:0", ha_listen)
            cluster.start_broker(
                name,
                broker_id=broker_id,
                broker_role=role,
                total_replicas=2,
                in_sync_replicas=2,
                listen=listen,
                ha_listen=ha_listen,
                advertise=proxies[name].address,
                ha_advertise=proxies[f"{name}-ha"].address,
            )
        with hamq.Admin(cluster.namesrv) as admin:
            wait_for(
                lambda: (
                    [
                        s["state"]
                        for s in admin.broker_runtime_info(proxies["master"].address)["ha"][
                            "slaves"
                        ]
                    ]
                    == ["TRANSFER"]
                ),
                20,
                "the slave attached through the master's HA proxy",
            )
            admin.create_topic(TOPIC, 1)
            route = admin.topic_route(TOPIC)
        assert route.master_addr("broker-a") == proxies["master"].address
        ha_frames = proxies["master-ha"].counts("up").forwarded
        with hamq.Producer(cluster.namesrv) as producer:
            for i in range(10):  # SEND_OK only once the slave acknowledged it
                result = producer.send(hamq.Message(TOPIC, b"r%d" % i))
                assert result.status is hamq.SendStatus.SEND_OK
        assert proxies["master-ha"].counts("up").forwarded > ha_frames  # the slave's acks
        assert proxies["master-ha"].counts("down").forwarded > 0  # the master's transfers
        assert proxies["master"].counts("up").forwarded >= 10
    finally:
        for proxy in proxies.values():
            proxy.close()


def test_controller_mode_members_register_and_elect_at_their_advertised_addresses(
    cluster_factory,
):
    cluster = cluster_factory()
    cluster.start_namesrv(enable_controller_in_namesrv=True)
    proxies: dict[str, FrameProxy] = {}
    try:
        for name in ("m1", "m2"):
            listen, ha_listen = (f"127.0.0.1:{free_port()}" for _ in range(2))
            proxies[name] = FrameProxy("127.0.0.1:0", listen)
            proxies[f"{name}-ha"] = FrameProxy("127.0.0.1:0", ha_listen)
            cluster.start_broker(
                name,
                enable_controller_mode=True,
                controller_addr=cluster.namesrv_addrs,
                all_ack_in_sync_state_set=True,
                check_sync_state_set_period_ms=300,
                listen=listen,
                ha_listen=ha_listen,
                advertise=proxies[name].address,
                ha_advertise=proxies[f"{name}-ha"].address,
            )
        advertised = {proxies[name].address: name for name in ("m1", "m2")}
        with hamq.Admin(cluster.namesrv) as admin:

            def replica_info():
                async def ask():
                    client = ControllerClient(cluster.namesrv_addrs)
                    try:
                        return await client.get_replica_info("TestCluster", "broker-a")
                    finally:
                        await client.close()

                info = admin.submit(ask()).result(30)
                return info if len(info.sync_state_set) == 2 else None

            info = wait_for(replica_info, 30, "a master and both members in the SyncStateSet")
            assert info.master_addr in advertised
            assert set(dict(info.members).values()) == set(advertised)
            master = advertised[info.master_addr]
            wait_for(
                lambda: admin.master_addrs().get("broker-a") == info.master_addr,
                30,
                "the name server routing the master's advertised address",
            )
            admin.create_topic(TOPIC, 1)
        ha_frames = proxies[f"{master}-ha"].counts("up").forwarded
        with hamq.Producer(cluster.namesrv) as producer:
            for i in range(5):  # all_ack_in_sync_state_set: the slave acknowledged each
                result = producer.send(hamq.Message(TOPIC, b"c%d" % i))
                assert result.status is hamq.SendStatus.SEND_OK
        assert proxies[f"{master}-ha"].counts("up").forwarded > ha_frames
    finally:
        for proxy in proxies.values():
            proxy.close()
