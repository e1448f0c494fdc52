"""Pre-online (seed 004) on real processes: group A is a master and two slaves with slave
acting master on, group B a master (where A's acting master escapes due delay messages).
A's master is killed with kill -9; a consumer group commits through the acting master
(enough commits to step the offsets' DataVersion) and a delay message falls due and is
delivered through B. A's master then starts again while slave 2 is frozen (SIGSTOP): it
stays isolated (not in the routes, runtime info says so) until the name server drops slave
2, and takes slave 1's newer offsets and delay progress first. So consumers do not go back
and the delay message is not delivered again."""

from __future__ import annotations

import os
import signal

import pytest

import hamq
from chaos.acting_cluster import read_topic
from hamq import Message, MessageQueue
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError, NoPermission
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, unpack_body
from helpers import wait_for

TOPIC, DELAY_TOPIC = "PreOnlineT", "PreOnlineDelayT"
GROUP = "g-pre-online"
SENT = 60  # into each of A's two queues
DELAY_LEVEL = 3  # 10 s: due while A's master is down
VERSION_STEP = 10  # consumer_offset_update_version_step
NOT_ACTIVE_MS = 2000
WAIT_S = 40.0
SETTINGS = {
    "enable_slave_acting_master": True,
    "enable_remote_escape": True,
    "consumer_offset_update_version_step": VERSION_STEP,
    "delay_offset_update_version_step": 1,
    "broker_heartbeat_interval_ms": 300,
    "sync_broker_member_group_period_ms": 300,
    "slave_sync_interval_ms": 500,
    "ha_send_heartbeat_interval_ms": 200,
    "flush_delay_offset_interval_ms": 500,
}


class Group:
    """The cluster and a raw view of its servers (one request on the admin's loop)."""

    def __init__(self, cluster_factory, **settings) -> None:
        self.c = cluster_factory()
        self.c.start_namesrv(
            support_acting_master=True,
            scan_not_active_broker_interval_ms=300,
            broker_not_active_timeout_ms=NOT_ACTIVE_MS,
        )
        self.settings = {**SETTINGS, **settings}
        for broker_id, name in enumerate(("a0", "a1", "a2")):
            self.c.start_broker(
                name,
                broker_id=broker_id,
                broker_role="slave" if broker_id else "async_master",
                total_replicas=3,
                **self.settings,
            )
        self.c.start_broker("b0", broker_name="broker-b", **self.settings)
        self.admin = hamq.Admin(self.c.namesrv)

    def addr(self, name: str) -> str:
        return self.c.broker_addr(name)

    def invoke(self, name: str, code: int, ext: dict | None = None) -> Frame:
        core = self.admin.async_client.core
        return self.admin.submit(core.invoke(self.addr(name), code, ext)).result(15)

    def runtime(self, name: str) -> dict:
        return self.admin.broker_runtime_info(self.addr(name))

    def routed(self, group: str) -> dict[int, str]:
        route = self.admin.topic_route_raw(TOPIC)
        for broker in route["broker_datas"]:
            if broker["broker_name"] == group:
                return {int(i): a for i, a in broker["broker_addrs"].items()}
        return {}

    def offsets(self, name: str) -> tuple[dict, dict]:
        """A member's consumer offsets of GROUP on TOPIC and the table's DataVersion."""
        frame = self.invoke(name, RequestCode.GET_ALL_CONSUMER_OFFSET)
        table = unpack_body(frame.body) or {}
        return table.get(f"{TOPIC}@{GROUP}", {}), frame.ext["data_version"]

    def delay_offset(self, name: str) -> int:
        frame = self.invoke(name, RequestCode.GET_ALL_DELAY_OFFSET)
        return (unpack_body(frame.body) or {})["delay_offsets"].get(str(DELAY_LEVEL), 0)

    def log_end(self, name: str) -> int:
        return self.runtime(name)["commitlog_max_offset"]

    def read(self, topic: str, group: str) -> list[hamq.MessageExt]:
        """Every message of ``topic`` in ``group``, from each queue's minimum."""
        return read_topic(self.c.namesrv, topic).get(group, [])


@pytest.fixture
def group(cluster_factory):
    g = Group(cluster_factory)
    yield g
    a2 = g.c.procs["a2"]
    if a2.alive():
        os.kill(a2.pid, signal.SIGCONT)  # frozen by the test: let it stop
    g.admin.close()


def test_returning_master_takes_newer_offsets_and_delay_progress_before_it_registers(group):
    g = group
    master = g.addr("a0")
    for topic in (TOPIC, DELAY_TOPIC):
        g.admin.create_topic(topic, 2)
    wait_for(lambda: g.routed("broker-a").get(0) == master, WAIT_S, "a0 routed")
    queues = [MessageQueue(TOPIC, "broker-a", q) for q in (0, 1)]
    with hamq.Producer(g.c.namesrv) as producer:
        for mq in queues:
            for i in range(SENT):
                producer.send(Message(TOPIC, b"%d-%d" % (mq.queue_id, i)), mq)
        with hamq.PullConsumer(GROUP, g.c.namesrv) as consumer:
            for mq in queues:  # what the group had consumed before the master died
                consumer.commit_offset(mq, 5)
        wait_for(lambda: g.offsets("a1")[0] == {"0": 5, "1": 5}, WAIT_S, "a1 synced offsets")
        master_version = g.offsets("a0")[1]
        # last before the kill, so it falls due during the outage
        producer.send(
            Message(DELAY_TOPIC, b"delayed", delay_level=DELAY_LEVEL),
            MessageQueue(DELAY_TOPIC, "broker-a", 0),
        )
    end = g.log_end("a0")
    for slave in ("a1", "a2"):
        wait_for(lambda s=slave: g.log_end(s) >= end, WAIT_S, f"{slave} caught up")
    g.c.procs["a0"].kill9()
    wait_for(lambda: g.runtime("a1")["acting_master"]["acting"], WAIT_S, "a1 acting")
    # the group consumes everything through the acting master, committing each message
    with hamq.PullConsumer(GROUP, g.c.namesrv) as consumer:
        for mq in queues:
            offset = consumer.fetch_offset(mq)
            assert offset == 5
            while offset < SENT:
                result = consumer.pull(mq, offset, 8)
                assert result.status is PullStatus.FOUND
                for m in result.messages:
                    consumer.commit_offset(mq, m.queue_offset + 1)
                offset = result.next_begin_offset
    acting_offsets, acting_version = g.offsets("a1")
    assert acting_offsets == {"0": SENT, "1": SENT}
    assert acting_version["counter"] > master_version["counter"]  # stepped while acting
    # the delay message falls due during the outage: delivered once, through broker-b
    wait_for(lambda: g.read(DELAY_TOPIC, "broker-b"), WAIT_S, "delay message escaped to B")
    delivered_to = wait_for(lambda: g.delay_offset("a1"), WAIT_S, "a1's delay progress")

    # the master returns while slave 2 is frozen: pre-online waits for it until the name
    # server drops it, isolated all that time
    os.kill(g.c.procs["a2"].pid, signal.SIGSTOP)
    g.c.procs["a0"].start()
    info = g.runtime("a0")["pre_online"]
    assert info["isolated"], info
    assert g.routed("broker-a").get(0) != master  # not registered: a1 is still routed
    wait_for(lambda: not g.runtime("a0")["pre_online"]["isolated"], WAIT_S, "a0 online")
    info = g.runtime("a0")["pre_online"]
    assert set(info["done"]) == {1} and "consumer_offsets taken" in info["done"][1], info
    wait_for(lambda: g.routed("broker-a").get(0) == master, WAIT_S, "a0 routed again")
    os.kill(g.c.procs["a2"].pid, signal.SIGCONT)

    # consumers do not go back: the master answers the offsets committed while it was away
    offsets, version = g.offsets("a0")
    assert offsets == {"0": SENT, "1": SENT}
    assert version["counter"] >= acting_version["counter"]
    with hamq.PullConsumer(GROUP, g.c.namesrv) as consumer:
        reconsumed = 0
        for mq in queues:
            result = consumer.pull(mq, consumer.fetch_offset(mq), 100)
            reconsumed += len(result.messages)
    assert reconsumed == 0
    # delay progress does not go back: once the master's delay delivery runs, the message
    # delivered through B during the outage is not delivered again into A
    assert g.delay_offset("a0") >= delivered_to
    wait_for(
        lambda: "delay_delivery" in g.runtime("a0")["role"]["services"],
        WAIT_S,
        "a0's delay delivery running",
    )
    assert not g.read(DELAY_TOPIC, "broker-a")
    assert len(g.read(DELAY_TOPIC, "broker-b")) == 1
    # the acting member stopped acting, and follows the master again
    wait_for(lambda: not g.runtime("a1")["acting_master"]["acting"], WAIT_S, "a1 not acting")


def test_forged_announcements_are_refused(group):
    """A stranger cannot depose the acting master or point a slave's HA elsewhere."""
    g = group
    wait_for(lambda: g.runtime("a1")["ha"].get("state") == "TRANSFER", WAIT_S, "a1 follows a0")
    ha_before = g.runtime("a1")["ha"]["master_ha_addr"]
    good = {
        "cluster_name": "TestCluster",
        "broker_name": "broker-a",
        "master_addr": g.addr("a0"),
        "master_ha_addr": ha_before,
        "master_max_offset": 0,
        "hold_ms": 1000,
    }
    forged = [
        {**good, "broker_name": "broker-b"},  # another group's
        {**good, "master_addr": g.addr("a2")},  # a fellow slave claims to be the master
        {**good, "master_addr": "127.0.0.2:1", "master_ha_addr": "127.0.0.2:2"},  # elsewhere
        {**good, "master_ha_addr": "127.0.0.1:1"},  # not the master a1 follows
        {**good, "master_addr": g.addr("b0")},  # while the name server knows a0
    ]
    for ext in forged:
        with pytest.raises(NoPermission):
            g.invoke("a1", RequestCode.EXCHANGE_BROKER_HA_INFO, ext)
    with pytest.raises(HamqError, match="hold_ms"):
        g.invoke("a1", RequestCode.EXCHANGE_BROKER_HA_INFO, {**good, "hold_ms": 10**9})
    with pytest.raises(NoPermission):  # a master follows nobody
        g.invoke("a0", RequestCode.EXCHANGE_BROKER_HA_INFO, good)
    assert g.runtime("a1")["ha"]["master_ha_addr"] == ha_before
    assert g.runtime("a1")["acting_master"]["held_off_ms"] == 0


def test_skip_pre_online_registers_at_once(cluster_factory):
    c = cluster_factory()
    c.start_namesrv(support_acting_master=True)
    c.start_broker("a0", total_replicas=2, skip_pre_online=True, **SETTINGS)
    c.start_broker("a1", broker_id=1, broker_role="slave", total_replicas=2, **SETTINGS)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
        c.procs["a0"].stop()
        c.procs["a0"].start()
        # registered before it said it was ready: no isolation, no pre-online
        route = admin.topic_route_raw(TOPIC)
        addrs = next(b["broker_addrs"] for b in route["broker_datas"])
        assert addrs.get("0", addrs.get(0)) == c.broker_addr("a0")
        assert admin.broker_runtime_info(c.broker_addr("a0"))["pre_online"] is None
