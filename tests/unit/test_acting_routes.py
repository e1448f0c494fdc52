"""Acting master in the name server's routes (seed 004, ``namesrv/routes.py``): with
``support_acting_master`` and a group without a master, the smallest-id member that
enabled acting is routed as brokerId 0 (removed from its own id) with every queue of the
group read-only; the prime slave's topic configs define the group's queues while it has no
master (a restarted name server still routes it); a registering master ends it all;
member-group answers stay the truth."""

from __future__ import annotations

import pytest

from hamq.namesrv.routes import RouteInfoManager
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE

TIMEOUT_MS = 10_000
A0, A1, A2, B0 = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"


def topics(*names: str) -> dict:
    return {
        n: {"read_queue_nums": 4, "write_queue_nums": 4, "perm": PERM_READ_WRITE} for n in names
    }


def register(r: RouteInfoManager, name: str, broker_id: int, addr: str, now: int, **kw) -> bool:
    kw.setdefault("enable_acting_master", True)
    return r.register_broker(
        "C", name, broker_id, addr, kw.pop("topic_configs", topics("T")), {}, now, **kw
    )


def group_of(r: RouteInfoManager, topic: str, name: str) -> tuple[dict, int]:
    """(broker id -> address, perm) of group ``name`` in the route of ``topic``."""
    route = r.get_route(topic)
    addrs = next(b["broker_addrs"] for b in route["broker_datas"] if b["broker_name"] == name)
    perm = next(q["perm"] for q in route["queue_datas"] if q["broker_name"] == name)
    return addrs, perm


def three_members(support: bool = True, enable: bool = True) -> RouteInfoManager:
    """broker-a: master A0, slaves A2 (id 2) and A1 (id 1); broker-b: master B0."""
    r = RouteInfoManager(TIMEOUT_MS, support_acting_master=support)
    register(r, "broker-a", 0, A0, 1000, enable_acting_master=enable)
    register(r, "broker-a", 2, A2, 1000, enable_acting_master=enable)
    register(r, "broker-a", 1, A1, 1000, enable_acting_master=enable)
    register(r, "broker-b", 0, B0, 1000, enable_acting_master=enable)
    return r


def master_dies(r: RouteInfoManager) -> None:
    """A0 falls silent; A1, A2 and B0 heartbeat on; A0 expires."""
    for addr in (A1, A2, B0):
        assert r.broker_heartbeat(addr, 1000 + TIMEOUT_MS)
    assert r.scan_not_active_broker(1001 + TIMEOUT_MS) == [A0]


def test_smallest_id_member_is_routed_as_read_only_master():
    r = three_members()
    assert group_of(r, "T", "broker-a") == ({0: A0, 1: A1, 2: A2}, PERM_READ_WRITE)
    master_dies(r)
    # A1 moves from id 1 to id 0, as pickupTopicRouteData does; the group turns read-only
    assert group_of(r, "T", "broker-a") == ({0: A1, 2: A2}, PERM_READ)
    assert group_of(r, "T", "broker-b") == ({0: B0}, PERM_READ_WRITE)  # untouched
    # the members need the truth: no substitution in their answers
    assert r.get_broker_member_group("C", "broker-a")["broker_addrs"] == {1: A1, 2: A2}
    assert r.cluster_info()["broker_addr_table"]["broker-a"]["broker_addrs"] == {1: A1, 2: A2}


def test_substitution_ends_when_the_master_registers():
    r = three_members()
    master_dies(r)
    changed = register(r, "broker-a", 0, A0, 2000 + TIMEOUT_MS)
    assert changed  # membership changed: the members are notified (server.py)
    assert group_of(r, "T", "broker-a") == ({0: A0, 1: A1, 2: A2}, PERM_READ_WRITE)


def test_next_smallest_takes_over_when_the_acting_one_dies_too():
    r = three_members()
    master_dies(r)
    assert r.broker_heartbeat(A2, 1000 + 2 * TIMEOUT_MS)
    assert r.broker_heartbeat(B0, 1000 + 2 * TIMEOUT_MS)
    assert r.scan_not_active_broker(1001 + 2 * TIMEOUT_MS) == [A1]
    assert group_of(r, "T", "broker-a") == ({0: A2}, PERM_READ)


@pytest.mark.parametrize("support, enable", [(False, True), (True, False)])
def test_no_substitution_without_both_switches(support, enable):
    r = three_members(support=support, enable=enable)
    master_dies(r)
    assert group_of(r, "T", "broker-a") == ({1: A1, 2: A2}, PERM_READ_WRITE)


def test_only_the_smallest_id_members_flag_counts():
    """The member routed as master is the one that acts: if it did not enable acting,
    nobody is substituted (a larger-id member would not act either)."""
    r = RouteInfoManager(TIMEOUT_MS, support_acting_master=True)
    register(r, "broker-a", 1, A1, 1000, enable_acting_master=False)
    register(r, "broker-a", 2, A2, 1000, topic_configs={})
    assert r.get_route("T") is None  # no master, and the smallest id defines no queues
    assert r.acting_master_of("broker-a") is None


def test_prime_slave_topic_configs_route_a_masterless_group():
    """A name server that (re)started while the group had no master hears only slaves: the
    smallest-id one's topics define the group's queues, without write permission."""
    r = RouteInfoManager(TIMEOUT_MS, support_acting_master=True)
    register(r, "broker-a", 2, A2, 1000, topic_configs=topics("T", "FromA2"))
    assert group_of(r, "FromA2", "broker-a") == ({0: A2}, PERM_READ)
    register(r, "broker-a", 1, A1, 1000, topic_configs=topics("T"))
    # A1 is now the prime slave: its topics replace A2's
    assert r.get_route("FromA2") is None
    assert group_of(r, "T", "broker-a") == ({0: A1, 2: A2}, PERM_READ)
    register(r, "broker-a", 2, A2, 1500, topic_configs=topics("T", "FromA2"))
    assert r.get_route("FromA2") is None  # not the prime slave any more: ignored
    # the master's registration takes the group back, with its own permissions
    register(r, "broker-a", 0, A0, 2000, topic_configs=topics("T", "FromMaster"))
    assert group_of(r, "FromMaster", "broker-a") == ({0: A0, 1: A1, 2: A2}, PERM_READ_WRITE)
    assert group_of(r, "T", "broker-a")[1] == PERM_READ_WRITE
    register(r, "broker-a", 1, A1, 2500, topic_configs=topics("T", "Late"))
    assert r.get_route("Late") is None  # a slave beside a master defines nothing


def test_prime_slave_topics_need_the_switches():
    r = RouteInfoManager(TIMEOUT_MS, support_acting_master=False)
    register(r, "broker-a", 1, A1, 1000)
    assert r.get_route("T") is None
