"""Availability after a partition heals, with real processes: a broker whose connection
to a name server was blackholed reconnects at its first request timeout instead of
waiting out TCP's retransmission backoff (RocketMQ's clientCloseSocketIfTimeout), and a
client whose first name server has no route asks the others (an isolated name server has
dropped the brokers it cannot hear, while the others still route them)."""

from __future__ import annotations

import time

import pytest
from faultproxy import FaultProxy

import hamq
from hamq import Message, SendStatus
from hamq.errors import TopicNotExist
from helpers import topic_routed, wait_for

REGISTER_INTERVAL_MS = 1000
# A request timeout (3 s), one registration period, a reconnect and slack for a busy host.
REREGISTER_DEADLINE_S = 10.0


def registered(namesrv: str) -> bool:
    with hamq.Admin(namesrv) as admin:
        return "broker-a" in admin.master_addrs()


def test_broker_reregisters_soon_after_its_name_server_link_was_blackholed(cluster_factory):
    cluster = cluster_factory()
    cluster.start_namesrv()
    namesrv = cluster.namesrv
    proxy = FaultProxy(namesrv)
    try:
        cluster.namesrv_addrs[:] = [proxy.address]  # the broker reaches it through the proxy
        cluster.start_broker(register_broker_interval_ms=REGISTER_INTERVAL_MS)
        wait_for(lambda: registered(namesrv), 30, "the broker registered")
        # The link goes silent but stays open, as a healed blackhole leaves it; a fresh
        # name server knows nothing until the broker registers again.
        proxy.stall()
        cluster.restart("namesrv")
        healed_at = time.monotonic()
        wait_for(lambda: registered(namesrv), REREGISTER_DEADLINE_S, "the broker re-registered")
        assert time.monotonic() - healed_at < REREGISTER_DEADLINE_S
    finally:
        proxy.stop()


def test_producer_routes_by_the_name_server_that_has_the_route(cluster_factory):
    cluster = cluster_factory()
    cluster.start_namesrv("ns-cut-off")  # first in the list, never hears the broker
    cluster.start_namesrv("ns-routing")
    cut_off, routing = cluster.namesrv_addrs
    cluster.namesrv_addrs[:] = [routing]
    cluster.start_broker()
    with hamq.Admin(routing) as admin:
        admin.create_topic("Routed", 4)
        wait_for(lambda: topic_routed(admin, "Routed"), 30, "the topic routed")
    with hamq.Producer(f"{cut_off};{routing}") as producer:
        for i in range(20):
            result = producer.send(Message("Routed", b"m%d" % i))
            assert result.status is SendStatus.SEND_OK
            producer.async_client.core.routes.clear()  # every send looks the route up
        # A topic no name server routes still fails, and at once.
        started = time.monotonic()
        with pytest.raises(TopicNotExist):
            producer.send(Message("NeverRouted", b"x"))
        assert time.monotonic() - started < 2.0
