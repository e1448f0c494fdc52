"""Who may take brokerId 0 from a live member (RocketMQ 5's RouteInfoManager.registerBroker):
registrations carry ``data_version.state_version`` (the master epoch in controller mode,
the Raft term in DLedger mode, 0 in master-slave mode). A live member of the group with a
newer version takes the id at once, though the old holder still heartbeats; an older one
is refused, whoever sends it; a stranger is refused whatever version it claims; equal
versions keep the silence rule."""

from __future__ import annotations

import pytest

from hamq.errors import NoPermission
from hamq.namesrv.routes import SILENT_FRACTION, RouteInfoManager

TIMEOUT_MS = 10_000
OLD, NEW, STRANGER = "10.0.0.1:10911", "10.0.0.2:10911", "6.6.6.6:1"
T = {"T": {"read_queue_nums": 4, "write_queue_nums": 4, "perm": 6}}


def epoch(n: int) -> dict[str, int]:
    return {"state_version": n, "counter": 3, "timestamp_ms": 1}


@pytest.fixture
def routes() -> RouteInfoManager:
    """Group g: OLD master in epoch 1, NEW its slave (broker id 2), both heartbeating."""
    r = RouteInfoManager(TIMEOUT_MS)
    r.register_broker("C", "g", 0, OLD, T, epoch(1), 1000)
    r.register_broker("C", "g", 2, NEW, {}, epoch(1), 1000)
    return r


def members(r: RouteInfoManager) -> dict[int, str]:
    return r.get_broker_member_group("C", "g")["broker_addrs"]


def test_newer_master_takes_broker_id_0_while_the_holder_is_live(routes):
    assert routes.broker_heartbeat(OLD, 1100)  # the deposed master still heartbeats
    assert routes.register_broker("C", "g", 0, NEW, T, epoch(2), 1100)  # membership changed
    assert members(routes) == {0: NEW}
    assert routes.get_route("T")["broker_datas"][0]["broker_addrs"] == {0: NEW}
    assert OLD not in routes.live  # its heartbeats now ask it to register in full
    assert not routes.broker_heartbeat(OLD, 1200)


def test_older_master_is_refused_and_changes_nothing(routes):
    routes.register_broker("C", "g", 0, NEW, T, epoch(2), 1100)
    before = (members(routes), dict(routes.live))
    with pytest.raises(NoPermission, match=r"older state version 1 \(a deposed master"):
        routes.register_broker("C", "g", 0, OLD, T, epoch(1), 1200)
    # even once the holder is silent (it may be frozen, not dead): an older epoch never
    # takes the id from a live holder
    with pytest.raises(NoPermission, match="older state version 1"):
        routes.register_broker("C", "g", 0, OLD, T, epoch(1), 1100 + TIMEOUT_MS - 1)
    assert (members(routes), dict(routes.live)) == before
    # the deposed master registers under its own id and stays in the group as a slave
    routes.register_broker("C", "g", 1, OLD, {}, epoch(2), 1300)
    assert members(routes) == {0: NEW, 1: OLD}


def test_stranger_is_refused_even_with_a_huge_version(routes):
    with pytest.raises(NoPermission, match="g/0 is registered by live member"):
        routes.register_broker("C", "g", 0, STRANGER, {"Evil": T["T"]}, epoch(2**62), 1100)
    assert members(routes) == {0: OLD, 2: NEW}
    assert routes.get_route("Evil") is None and STRANGER not in routes.live


def test_a_member_whose_liveness_expired_is_a_stranger(routes):
    """Only a live member of the group may take the master's id with a newer version."""
    routes.broker_heartbeat(OLD, 1000 + TIMEOUT_MS)
    with pytest.raises(NoPermission, match="registered by live member"):
        routes.register_broker("C", "g", 0, NEW, T, epoch(2), 1001 + TIMEOUT_MS)


def test_a_newer_version_does_not_take_a_slave_id(routes):
    """Versions decide the master's id only: slave ids keep the silence rule."""
    routes.register_broker("C", "g", 3, "10.0.0.3:1", {}, epoch(1), 1000)
    with pytest.raises(NoPermission, match="g/2 is registered by live member"):
        routes.register_broker("C", "g", 2, "10.0.0.3:1", {}, epoch(5), 1100)


def test_equal_versions_keep_the_silence_rule(routes):
    """DLedger's new leader registering in the term the holder has (and master-slave mode,
    which sends 0): the id moves only once the holder missed a third of its timeout."""
    silent_at = 1000 + TIMEOUT_MS // SILENT_FRACTION + 1
    with pytest.raises(NoPermission, match="g/0 is registered by live member"):
        routes.register_broker("C", "g", 0, NEW, T, epoch(1), silent_at - 1)
    routes.broker_heartbeat(NEW, silent_at)
    routes.register_broker("C", "g", 0, NEW, T, epoch(1), silent_at)
    assert members(routes) == {0: NEW}


def test_registrations_without_a_state_version_count_as_zero():
    r = RouteInfoManager(TIMEOUT_MS)
    r.register_broker("C", "g", 0, OLD, T, {}, 1000)
    r.register_broker("C", "g", 1, NEW, {}, {}, 1000)
    r.register_broker("C", "g", 0, NEW, T, epoch(1), 1100)  # a newer one than none
    assert members(r) == {0: NEW}
    with pytest.raises(NoPermission, match="older state version 0"):
        r.register_broker("C", "g", 0, OLD, T, {}, 1200)
