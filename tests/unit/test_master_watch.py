"""MasterWatch (``client/master_watch.py``): which broker groups a consumer with
``cancel_on_ha_failover`` sees change master, route by route."""

from __future__ import annotations

from hamq.client.core import TopicRoute
from hamq.client.master_watch import MasterWatch


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
