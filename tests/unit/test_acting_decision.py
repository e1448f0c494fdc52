"""The acting-master decision (``broker/acting_master.py``) as a property: for any group
the members and the name server see alike, at most one member acts, none while brokerId 0
is present, and the one acting is the one the name server routes as brokerId 0 (and the
other way round, unless a returning master holds it off). Broken decisions (the largest id,
one blind to the master, every slave) are parametrised in to show the property catches
them. Then ``ActingMasterWatch`` applies the decision through the role state and honours a
returning master's hold."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.broker.acting_master import ActingMasterWatch, should_act
from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.role import BrokerRole, RoleService, RoleServices, RoleState
from hamq.config import BrokerConfig
from hamq.namesrv.routes import RouteInfoManager
from hamq.net.pool import ConnectionPool

Decide = Callable[..., bool]
MAX_ID = 8


def addr(broker_id: int) -> str:
    return f"10.0.0.{broker_id + 1}:10911"


@st.composite
def groups(draw) -> tuple[set[int], dict[int, bool], dict[int, bool]]:
    """A group's member ids, and per member whether it enabled acting and is held off."""
    ids = draw(st.sets(st.integers(0, MAX_ID), min_size=1, max_size=5))
    enabled = {i: draw(st.booleans()) for i in ids}
    held = {i: draw(st.booleans()) for i in ids}
    return ids, enabled, held


def routed_master(ids: set[int], enabled: dict[int, bool]) -> int | None:
    """The broker id whose member the name server routes as brokerId 0."""
    r = RouteInfoManager(10_000, support_acting_master=True)
    topics = {"T": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}}
    for i in sorted(ids):
        r.register_broker("C", "g", i, addr(i), topics, {}, 0, enable_acting_master=enabled[i])
    route = r.get_route("T")
    if route is None:  # a masterless group whose prime slave did not enable acting
        return None
    routed = route["broker_datas"][0]["broker_addrs"].get(0)
    return None if routed is None else next(i for i in ids if addr(i) == routed)


def check(decide: Decide, group: tuple[set[int], dict[int, bool], dict[int, bool]]) -> None:
    ids, enabled, held = group
    acting = {
        i
        for i in ids
        if decide(
            enabled=enabled[i],
            role=BrokerRole.MASTER if i == 0 else BrokerRole.SLAVE,
            broker_id=i,
            member_ids=ids,
            held_off=held[i],
        )
    }
    assert len(acting) <= 1, f"several members act: {acting}"
    if 0 in ids:
        assert not acting, f"{acting} acts beside the master"
    routed = routed_master(ids, enabled)
    for i in acting:
        assert routed == i, f"{i} acts but the name server routes {routed} as brokerId 0"
    if routed is not None and routed != 0 and not held[routed]:
        assert acting == {routed}, f"{routed} is routed as brokerId 0 but does not act"


def check_property(decide: Decide) -> None:
    @settings(max_examples=300, deadline=None, database=None, report_multiple_bugs=False)
    @given(groups())
    def prop(group) -> None:
        check(decide, group)

    prop()


def largest_id(*, member_ids: Collection[int], broker_id: int, **kw) -> bool:
    slaves = [i for i in member_ids if i != 0]
    return bool(slaves) and 0 not in member_ids and broker_id == max(slaves) and kw["enabled"]


def blind_to_master(*, member_ids: Collection[int], broker_id: int, **kw) -> bool:
    slaves = [i for i in member_ids if i != 0]
    return bool(slaves) and broker_id == min(slaves) and kw["enabled"] and not kw["held_off"]


def every_slave(*, role: BrokerRole, member_ids: Collection[int], **kw) -> bool:
    return role is BrokerRole.SLAVE and 0 not in member_ids and kw["enabled"]


def test_the_decision_keeps_the_property():
    check_property(should_act)


@pytest.mark.parametrize("broken", [largest_id, blind_to_master, every_slave])
def test_the_property_catches_a_broken_decision(broken):
    with pytest.raises(AssertionError):
        check_property(broken)


# -- the watch: the decision applied through the role state -----------------------------


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def watch_of(broker_id: int, **settings) -> tuple[ActingMasterWatch, MemberGroup, Clock]:
    config = BrokerConfig(
        broker_name="g",
        broker_id=broker_id,
        broker_role="slave",
        listen=addr(broker_id),
        enable_slave_acting_master=True,
        **settings,
    )
    role = RoleState(BrokerRole.SLAVE, broker_id, addr(0))
    role.services = RoleServices(acting=[RoleService("acting_x", _nothing, _nothing)])
    members = MemberGroup(config, ConnectionPool())
    clock = Clock()
    return ActingMasterWatch(config, role, members, now_ms=clock), members, clock


def _nothing() -> None:
    """A service with nothing to start or stop: the role state's bookkeeping is tested."""


async def settled(watch: ActingMasterWatch) -> bool:
    """Run the group's callbacks (a member-group change) and wait for the decision."""
    for callback in watch.members.on_change:
        callback()
    for _ in range(100):
        await asyncio.sleep(0)
    return watch.role.is_acting_master


def test_the_watch_follows_the_group_and_a_returning_master():
    async def scenario() -> None:
        watch, members, clock = watch_of(1)
        members.broker_addrs = {1: addr(1), 2: addr(2)}
        assert not await settled(watch)  # not started: no decision yet
        watch.start()
        assert await settled(watch)
        assert watch.info()["acting"] and watch.role.running == {"acting_x"}
        members.broker_addrs = {0: addr(0), 1: addr(1), 2: addr(2)}
        assert not await settled(watch)  # the master is back
        members.broker_addrs = {1: addr(1), 2: addr(2)}
        assert await settled(watch)
        # a returning master's pre-online: off now, and held off while it has not registered
        await watch.master_returning(5_000)
        assert not watch.role.is_acting_master
        assert watch.info()["held_off_ms"] == 5_000
        assert not await settled(watch)
        clock.ms += 5_000  # its pre-online never finished: acting again
        assert await settled(watch)
        await watch.master_returning(5_000)
        members.broker_addrs = {0: addr(0), 1: addr(1), 2: addr(2)}  # it registered
        assert not await settled(watch) and not watch.held_off()
        await watch.stop()
        members.broker_addrs = {1: addr(1)}
        assert not await settled(watch)  # stopped: no decisions

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_watch_does_nothing_when_acting_is_disabled():
    async def scenario() -> None:
        watch, members, _ = watch_of(1)
        watch.enabled = False
        watch.start()
        members.broker_addrs = {1: addr(1)}
        assert not await settled(watch)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_settling_name_servers_masterless_answer_is_not_acted_on():
    """A name server up for less than its liveness timeout may not have heard from a live
    master yet: its group without a master is ignored (the member keeps what it knew), one
    with the master is taken; and a member whose registration lease lapsed does not act."""

    async def scenario() -> None:
        watch, members, _ = watch_of(1)
        watch.start()
        whole = {"broker_addrs": {0: addr(0), 1: addr(1), 2: addr(2)}}
        members._take("ns", whole)
        members._reconcile()
        assert not await settled(watch)
        members._take("ns", {"broker_addrs": {1: addr(1), 2: addr(2)}, "settling": True})
        members._reconcile()
        assert members.broker_addrs == {0: addr(0), 1: addr(1), 2: addr(2)}
        assert not await settled(watch)
        members._take("ns", {"broker_addrs": {1: addr(1), 2: addr(2)}, "settling": False})
        members._reconcile()
        assert await settled(watch)  # settled, and still no master: it acts
        lapsed = True
        watch.lease_lapsed = lambda: lapsed
        assert not await settled(watch)
        lapsed = False
        assert await settled(watch)
        await watch.stop()

    asyncio.run(asyncio.wait_for(scenario(), 10))
