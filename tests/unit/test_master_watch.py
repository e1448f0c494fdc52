"""MasterWatch (``client/master_watch.py``): which broker groups a consumer with
``cancel_on_ha_failover`` sees change master, route by route."""

from __future__ import annotations

from dataclasses import replace

from hamq.client.core import TopicRoute
from hamq.client.master_watch import MasterWatch
from hamq.namesrv.routes import RouteInfoManager


def route(topic: str, fetched_at: float, **groups: dict[int, str]) -> TopicRoute:
    return TopicRoute(topic, (), (), dict(groups), fetched_at)


def test_first_sight_and_the_same_master_are_no_change():
    watch = MasterWatch()
    assert watch.observe(route("T", 1, a={0: "m1", 1: "m2"})) == []
    assert watch.observe(route("T", 2, a={0: "m1", 1: "m2", 2: "m3"})) == []


def test_another_master_address_is_a_change_once():
    watch = MasterWatch()
    watch.observe(route("T", 1, a={0: "m1", 1: "m2"}, b={0: "n1"}))
    assert watch.observe(route("T", 2, a={0: "m2"}, b={0: "n1"})) == ["a"]
    assert watch.observe(route("T", 3, a={0: "m2"}, b={0: "n1"})) == []


def test_a_group_between_masters_is_no_change_until_another_takes_over():
    watch = MasterWatch()
    watch.observe(route("T", 1, a={0: "m1", 1: "m2"}))
    assert watch.observe(route("T", 2, a={1: "m2"})) == []  # the master lost, none elected yet
    assert watch.observe(route("T", 3, a={0: "m1", 1: "m2"})) == []  # it came back
    assert watch.observe(route("T", 4, a={1: "m2"})) == []
    assert watch.observe(route("T", 5, a={0: "m2"})) == ["a"]  # the slave took over


def test_one_failover_seen_through_two_topics_is_one_change():
    watch = MasterWatch()
    watch.observe(route("T", 1, a={0: "m1"}))
    stale_u = route("U", 2, a={0: "m1"})
    watch.observe(stale_u)
    assert watch.observe(route("T", 3, a={0: "m2"})) == ["a"]
    assert watch.observe(stale_u) == []  # U's cached route, fetched before: no change back
    assert watch.observe(route("U", 4, a={0: "m2"})) == []  # the same failover
    assert watch.observe(route("U", 5, a={0: "m3"})) == ["a"]  # another one


def test_an_acting_master_and_the_master_back_at_its_address_are_no_failover():
    """Seed 004's acting master: the name server routes the prime slave as brokerId 0 of a
    masterless group (read-only) while the master is away. It keeps the invisible times of
    what is popped (no requeue), so a consumer with cancel_on_ha_failover is not cancelled
    when it appears, nor when the master registers again at its address."""
    names = RouteInfoManager(60_000, support_acting_master=True)
    topics = {"T": {"read_queue_nums": 2, "write_queue_nums": 2, "perm": 6}}

    def register(broker_id: int, addr: str, now_ms: int) -> None:
        version = {"timestamp": now_ms, "counter": 0, "state_version": 0}
        names.register_broker(
            "C", "a", broker_id, addr, topics, version, now_ms, enable_acting_master=True
        )

    def fetched(at: float) -> TopicRoute:
        return replace(TopicRoute.from_wire("T", names.get_route("T")), fetched_at=at)

    register(0, "m1", 1)
    register(1, "m2", 1)
    watch = MasterWatch()
    assert watch.observe(fetched(1)) == []
    names.unregister_broker("a", 0, "m1")
    acting = fetched(2)
    assert acting.master_addr("a") == "m2" and not acting.write_queues  # the substitution
    assert watch.observe(acting) == []
    register(0, "m1", 3)
    assert watch.observe(fetched(3)) == []
    names.unregister_broker("a", 0, "m1")
    register(0, "m2", 4)  # a real failover: the slave now master, read-write
    assert watch.observe(fetched(4)) == ["a"]
