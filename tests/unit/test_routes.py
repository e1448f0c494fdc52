"""``RouteInfoManager`` (the name server's registry) driven with explicit times: routes
appear on registration, heartbeats keep members alive, silent members expire exactly after
their timeout, a master coming back on a new address replaces its old entry once that one
has expired, and nobody else takes over a live member's id."""

from __future__ import annotations

import pytest

from hamq.errors import NoPermission
from hamq.namesrv.routes import AUTO_CREATE_TOPIC_KEY_TOPIC, RouteInfoManager

TIMEOUT_MS = 10_000
A0, A1, B0 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"


def topics(*names: str, queues: int = 4) -> dict:
    return {n: {"read_queue_nums": queues, "write_queue_nums": queues, "perm": 6} for n in names}


@pytest.fixture
def routes() -> RouteInfoManager:
    """broker-a (master A0, slave A1) and broker-b (master B0) registered at t=1000."""
    r = RouteInfoManager(TIMEOUT_MS)
    r.register_broker("C", "broker-a", 0, A0, topics("T", "OnlyA"), {"counter": 1}, 1000)
    r.register_broker("C", "broker-a", 1, A1, {}, {"counter": 1}, 1000)
    r.register_broker("C", "broker-b", 0, B0, topics("T", queues=2), {}, 1000)
    return r


def test_register_gives_routes(routes):
    route = routes.get_route("T")
    assert [q["broker_name"] for q in route["queue_datas"]] == ["broker-a", "broker-b"]
    assert [q["write_queue_nums"] for q in route["queue_datas"]] == [4, 2]
    assert {b["broker_name"]: b["broker_addrs"] for b in route["broker_datas"]} == {
        "broker-a": {0: A0, 1: A1},
        "broker-b": {0: B0},
    }
    assert {b["cluster"] for b in route["broker_datas"]} == {"C"}
    assert routes.get_route("Nope") is None
    assert routes.topic_list() == ["OnlyA", "T"]
    assert routes.cluster_info()["cluster_addr_table"] == {"C": ["broker-a", "broker-b"]}


def test_slave_topic_configs_do_not_change_routes(routes):
    routes.register_broker("C", "broker-a", 1, A1, topics("SlaveOnly"), {}, 2000)
    assert routes.get_route("SlaveOnly") is None
    assert routes.get_route("OnlyA") is not None


def test_master_reregistration_replaces_its_topics(routes):
    routes.register_broker("C", "broker-a", 0, A0, topics("T", "New"), {}, 2000)
    assert routes.get_route("OnlyA") is None
    assert routes.get_route("New")["queue_datas"][0]["broker_name"] == "broker-a"


def test_expiry_after_timeout_with_explicit_now(routes):
    """Silent for exactly the timeout is still alive; one millisecond more expires."""
    assert routes.scan_not_active_broker(1000 + TIMEOUT_MS) == []
    assert sorted(routes.scan_not_active_broker(1001 + TIMEOUT_MS)) == sorted([A0, A1, B0])
    assert routes.get_route("T") is None
    assert routes.cluster_info() == {"cluster_addr_table": {}, "broker_addr_table": {}}


def test_heartbeat_keeps_member_alive(routes):
    assert routes.broker_heartbeat(A0, 8000)
    assert routes.broker_heartbeat(A1, 8000)
    assert not routes.broker_heartbeat("10.9.9.9:1", 8000)  # unknown: must register
    assert routes.scan_not_active_broker(12_000) == [B0]
    route = routes.get_route("T")
    assert [q["broker_name"] for q in route["queue_datas"]] == ["broker-a"]
    assert routes.scan_not_active_broker(18_000) == []
    assert sorted(routes.scan_not_active_broker(18_001)) == [A0, A1]
    assert not routes.broker_heartbeat(A0, 18_002)


def test_per_broker_timeout(routes):
    routes.register_broker("C", "broker-b", 0, B0, topics("T"), {}, 1000, timeout_ms=500)
    assert routes.scan_not_active_broker(1501) == [B0]


def test_losing_the_slave_keeps_the_group(routes):
    routes.broker_heartbeat(A0, 9000)
    routes.broker_heartbeat(B0, 9000)
    assert routes.scan_not_active_broker(11_001) == [A1]
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {0: A0}
    assert routes.get_route("T")["broker_datas"][0]["broker_addrs"] == {0: A0}


def test_member_group(routes):
    group = routes.get_broker_member_group("C", "broker-a")
    assert (group["cluster"], group["broker_name"], group["broker_addrs"]) == (
        "C",
        "broker-a",
        {0: A0, 1: A1},
    )
    assert routes.get_broker_member_group("C", "broker-x")["broker_addrs"] == {}


def test_master_reregistering_on_new_address(routes):
    """A member on a new address replaces its old entry once the old one is silent past
    its timeout; the old address's expiry must not remove the new one."""
    new = "10.0.0.9:10911"
    routes.register_broker("C", "broker-a", 0, new, topics("T", "OnlyA"), {}, 1001 + TIMEOUT_MS)
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {0: new, 1: A1}
    assert not routes.broker_heartbeat(A0, 11_002)
    routes.broker_heartbeat(A1, 11_000)
    routes.broker_heartbeat(B0, 11_000)
    assert routes.scan_not_active_broker(14_000) == []
    assert routes.get_route("T")["broker_datas"][0]["broker_addrs"] == {0: new, 1: A1}


def test_registration_taking_a_live_members_id_is_refused(routes):
    """Without authentication a stranger cannot take over a live member's broker id or move
    its group to another cluster: refused, and nothing of the registration is kept."""
    before = routes.cluster_info()
    with pytest.raises(NoPermission, match="broker-a/0 is registered by live member"):
        routes.register_broker("C", "broker-a", 0, "6.6.6.6:1", topics("Evil"), {}, 5000)
    with pytest.raises(NoPermission, match="belongs to cluster C"):
        routes.register_broker("Other", "broker-a", 7, "6.6.6.6:1", {}, {}, 5000)
    assert routes.cluster_info() == before
    assert routes.get_route("Evil") is None and "6.6.6.6:1" not in routes.live


def test_live_member_of_the_group_may_take_the_id_of_a_silent_one(routes):
    """DLedger elects a follower that is already a live member: it registers as id 0 while
    the old leader's entry has not expired yet, and takes it over once the old leader has
    missed a third of its timeout; a master still heartbeating keeps its id (else anyone
    could join as a slave and then claim the master's id)."""
    routes.broker_heartbeat(A1, 2000)
    with pytest.raises(NoPermission, match="broker-a/0 is registered by live member"):
        routes.register_broker("C", "broker-a", 0, A1, topics("T"), {}, 2000)
    routes.broker_heartbeat(A1, 1000 + TIMEOUT_MS // 3 + 1)
    routes.register_broker("C", "broker-a", 0, A1, topics("T"), {}, 1000 + TIMEOUT_MS // 3 + 1)
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {0: A1}
    assert A0 not in routes.live


def test_unregister_last_member_forgets_group(routes):
    routes.unregister_broker("broker-b", 0, B0)
    assert [q["broker_name"] for q in routes.get_route("T")["queue_datas"]] == ["broker-a"]
    assert routes.cluster_info()["cluster_addr_table"] == {"C": ["broker-a"]}
    routes.unregister_broker("broker-a", 0, "1.1.1.1:1")  # stale address: no effect
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {0: A0, 1: A1}


def test_auto_create_key_topic_hidden_from_list(routes):
    routes.register_broker("C", "broker-b", 0, B0, topics(AUTO_CREATE_TOPIC_KEY_TOPIC), {}, 2000)
    assert routes.get_route(AUTO_CREATE_TOPIC_KEY_TOPIC) is not None
    assert AUTO_CREATE_TOPIC_KEY_TOPIC not in routes.topic_list()


def test_delete_topic(routes):
    assert routes.delete_topic("T")
    assert not routes.delete_topic("T")
    assert routes.get_route("T") is None


def test_slave_promoted_at_same_address_keeps_one_entry(routes):
    """A slave that re-registers as master (id 1 -> 0) on its own address replaces both
    entries; nothing stale is left to route to or to keep the group alive."""
    routes.unregister_broker("broker-a", 0, A0)
    routes.register_broker("C", "broker-a", 0, A1, topics("T"), {}, 2000)
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {0: A1}
    routes.broker_heartbeat(B0, 12_000)
    assert routes.scan_not_active_broker(12_001) == [A1]
    assert routes.get_broker_member_group("C", "broker-a")["broker_addrs"] == {}
    assert routes.cluster_info()["cluster_addr_table"] == {"C": ["broker-b"]}
