"""Slave acting master in the routes (seed 004) on real processes: a group of three (master,
slaves 1 and 2) beside a second group; the master is killed with kill -9 (by PID). The
name server then routes slave 1 as brokerId 0, read-only; slave 1 acts (runtime info),
slave 2 does not; producers send to the other group only; consumers and the admin's offset
queries are answered by the acting master through the unchanged clients. When the master
is started again (pre-online skipped: tested in test_pre_online*), the route is the real
one again and slave 1 stops acting."""

from __future__ import annotations

import json
import time

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE
from helpers import wait_for

NS_TIMEOUT_MS = 3000
TOPIC = "ActingT"
SENT = 40  # messages into broker-a before its master dies
WAIT_S = 30.0
ACTING = {"enable_slave_acting_master": True, "skip_pre_online": True}


def start_cluster(cluster_factory, sync_period_ms: int):
    c = cluster_factory()
    acting = dict(ACTING, sync_broker_member_group_period_ms=sync_period_ms)
    c.start_namesrv(
        scan_not_active_broker_interval_ms=500,
        broker_not_active_timeout_ms=NS_TIMEOUT_MS,
        support_acting_master=True,
    )
    c.start_broker("master", broker_role="sync_master", total_replicas=3, **acting)
    for i in (1, 2):
        c.start_broker(f"slave{i}", broker_id=i, broker_role="slave", total_replicas=3, **acting)
    c.start_broker("b-master", broker_name="broker-b", **acting)
    return c


def group_route(admin: hamq.Admin, name: str) -> tuple[dict[int, str], int]:
    """(broker id -> address, perm) of group ``name`` in the topic's route, as sent."""
    route = admin.topic_route_raw(TOPIC)
    addrs = next(b["broker_addrs"] for b in route["broker_datas"] if b["broker_name"] == name)
    perm = next(q["perm"] for q in route["queue_datas"] if q["broker_name"] == name)
    return {int(i): a for i, a in addrs.items()}, perm


def acting(admin: hamq.Admin, addr: str) -> bool:
    return admin.broker_runtime_info(addr)["acting_master"]["acting"]


# 200 ms: the members' own member-group sync and the name server's reverse notification
# both drive acting; 10 min: no sync after the first, the notification alone does
@pytest.mark.parametrize("sync_period_ms", [200, 600_000], ids=["sync", "notification-only"])
def test_killed_master_is_replaced_by_the_smallest_slave_until_it_returns(
    cluster_factory, hamq_cli, sync_period_ms
):
    c = start_cluster(cluster_factory, sync_period_ms)
    master, s1, s2, b0 = (c.broker_addr(n) for n in ("master", "slave1", "slave2", "b-master"))
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 2)
        wait_for(
            lambda: group_route(admin, "broker-a") == ({0: master, 1: s1, 2: s2}, PERM_READ_WRITE),
            WAIT_S,
            "broker-a routed with its master and both slaves",
        )
        with hamq.Producer(c.namesrv) as producer:
            sent_a = 0
            while sent_a < SENT:
                result = producer.send(Message(TOPIC, b"m%d" % sent_a))
                assert result.status is SendStatus.SEND_OK
                sent_a += result.queue.broker_name == "broker-a"
        a_queues = [q for q in admin.topic_offsets(TOPIC) if q["broker_name"] == "broker-a"]
        before = {q["queue_id"]: q["max_offset"] for q in a_queues}
        assert sum(before.values()) == SENT
        # both slaves hold all of it (sync master with three replicas)
        wait_for(
            lambda: all(
                admin.broker_runtime_info(s)["commitlog_max_offset"]
                == admin.broker_runtime_info(master)["commitlog_max_offset"]
                for s in (s1, s2)
            ),
            WAIT_S,
            "slaves caught up",
        )
        assert not acting(admin, s1) and not acting(admin, s2)

        c.procs["master"].kill9()
        killed = time.monotonic()
        wait_for(
            lambda: group_route(admin, "broker-a") == ({0: s1, 2: s2}, PERM_READ),
            WAIT_S,
            "slave 1 routed as a read-only brokerId 0",
        )
        routed_s = time.monotonic() - killed
        wait_for(lambda: acting(admin, s1), WAIT_S, "slave 1 acting as master")
        assert not acting(admin, s2)
        # the flag goes up before the acting services start, pop revive last (broker/role.py)
        acting_services = {"acting_delay_delivery", "acting_transaction_check", "acting_pop_revive"}
        wait_for(
            lambda: acting_services <= set(admin.broker_runtime_info(s1)["role"]["services"]),
            WAIT_S,
            "slave 1's acting services started",
        )
        info = admin.broker_runtime_info(s1)
        assert info["broker_role"] == "slave" and info["broker_id"] == 1  # still a slave
        # the unmodified group is untouched
        assert group_route(admin, "broker-b") == ({0: b0}, PERM_READ_WRITE)

        # producers leave the read-only group: every send goes to broker-b
        with hamq.Producer(c.namesrv) as producer:
            for i in range(20):
                result = producer.send(Message(TOPIC, b"after%d" % i))
                assert result.status is SendStatus.SEND_OK
                assert result.queue.broker_name == "broker-b"

        # consumers read what broker-a had, from the acting master
        with hamq.PullConsumer("g-acting", c.namesrv) as consumer:
            bodies = set()
            for mq in consumer.fetch_message_queues(TOPIC):
                if mq.broker_name != "broker-a":
                    continue
                # the master-only queries of seed 004, through the unchanged client
                assert consumer.min_offset(mq) == 0
                assert consumer.max_offset(mq) == before[mq.queue_id]
                assert consumer.search_offset(mq, 0) == 0
                assert consumer.earliest_msg_store_time_ms(mq) > 0
                result = consumer.pull(mq, 0, 100)
                assert result.status is PullStatus.FOUND
                bodies |= {m.body for m in result.messages}
                consumer.commit_offset(mq, before[mq.queue_id])
        assert bodies == {b"m%d" % i for i in range(SENT)}
        # the admin's offset queries of the group are answered by the acting master
        offsets = {
            q["queue_id"]: q["max_offset"]
            for q in admin.topic_offsets(TOPIC)
            if q["broker_name"] == "broker-a"
        }
        assert offsets == before
        cli = hamq_cli("admin", "consumer-progress", "-g", "g-acting", "-n", c.namesrv, "--json")
        assert cli.returncode == 0, cli.stderr
        rows = [r for r in json.loads(cli.stdout)["queues"] if r["broker_name"] == "broker-a"]
        assert {r["queue_id"]: r["consumer_offset"] for r in rows} == before

        # the master returns (pre-online skipped): the real route again, acting ends
        c.procs["master"].start()
        wait_for(
            lambda: group_route(admin, "broker-a") == ({0: master, 1: s1, 2: s2}, PERM_READ_WRITE),
            WAIT_S,
            "the real master routed again",
        )
        wait_for(lambda: not acting(admin, s1), WAIT_S, "slave 1 no longer acting")
        assert not acting(admin, s2)
        info = admin.broker_runtime_info(s1)
        assert not {"acting_delay_delivery", "acting_transaction_check", "acting_pop_revive"} & set(
            info["role"]["services"]
        )
        assert info["acting_master"]["changes"] == 2  # began once, ended once
        print(f"kill -9 to acting master in routes: {routed_s:.2f} s")
