"""The restarted master's election (trigger "restart"): a master back before its heartbeat
timed out never continues its epoch, since with async flush it may have lost a tail its
SyncStateSet acknowledged; the set member with the most data wins, always in a new epoch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hamq.controller.decide import decide_elect_master
from hamq.controller.elect import BrokerLiveInfo
from hamq.controller.errors import ControllerCode, ControllerError
from hamq.controller.events import ElectMaster
from hamq.controller.requests import ElectMasterRequest, ElectTrigger
from hamq.controller.state import ControllerState
from hamq.errors import InvalidArgument
from hamq.protocol import controller as wire

CLUSTER, GROUP = "DefaultCluster", "broker-a"
KEY = (CLUSTER, GROUP)
RESTARTED_AT_MS = 5000  # when this leader saw master 1 register again after its restart
ALIVE = frozenset({1, 2, 3})


def _restart(broker_id: int = 1, master_epoch: int | None = 1) -> ElectMasterRequest:
    return ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.MASTER_RESTART, broker_id, master_epoch)


def _fresh(epoch: int, max_offset: int) -> BrokerLiveInfo:
    """A report that arrived after the restarted master registered (each member's
    registration time is this leader's too; only the requester's counts)."""
    return BrokerLiveInfo(epoch, max_offset, RESTARTED_AT_MS + 100, RESTARTED_AT_MS)


@pytest.fixture
def restarted(group_of_three) -> ControllerState:
    """Master 1 of epoch 1 (set {1, 2, 3}), back after a restart."""
    return group_of_three


def _elected(decision: object) -> ElectMaster:
    assert isinstance(decision, ElectMaster), decision
    return decision


def _code(decision: object) -> ControllerCode:
    assert isinstance(decision, ControllerError), decision
    return decision.code


def test_the_set_member_with_the_most_data_wins_in_a_new_epoch(restarted, commit):
    # 1 lost its unflushed tail (900 -> 600); 3 holds everything 1 acknowledged
    live = {1: _fresh(1, 600), 2: _fresh(1, 800), 3: _fresh(1, 900)}
    event = _elected(decide_elect_master(restarted, _restart(), ALIVE, live, False))
    assert (event.new_master_id, event.new_master_epoch, event.unclean) == (3, 2, False)
    commit(restarted, event)
    group = restarted.groups[KEY]
    assert (group.master_id, group.master_epoch) == (3, 2)


def test_a_newer_epoch_beats_a_longer_log(restarted):
    live = {1: _fresh(1, 10_000), 2: _fresh(2, 10), 3: _fresh(1, 900)}
    assert (
        _elected(decide_elect_master(restarted, _restart(), ALIVE, live, False)).new_master_id == 2
    )


def test_the_restarted_master_winning_still_begins_a_new_epoch(restarted, commit):
    # it lost nothing (kill -9, page cache kept): it stays master, never in its old epoch
    live = {1: _fresh(1, 900), 2: _fresh(1, 700), 3: _fresh(1, 800)}
    event = _elected(decide_elect_master(restarted, _restart(), ALIVE, live, False))
    assert (event.new_master_id, event.new_master_epoch) == (1, 2)
    commit(restarted, event)
    assert restarted.groups[KEY].master_epoch == 2


def test_the_only_alive_set_member_wins_again_in_a_new_epoch(restarted):
    event = decide_elect_master(restarted, _restart(), {1}, {1: _fresh(1, 600)}, False)
    assert (_elected(event).new_master_id, _elected(event).new_master_epoch) == (1, 2)


def test_refused_to_a_member_that_is_not_the_master(restarted):
    live = {i: _fresh(1, 900) for i in ALIVE}
    for who in (2, None):
        decision = decide_elect_master(restarted, _restart(who), ALIVE, live, False)
        assert _code(decision) is ControllerCode.CONTROLLER_INVALID_MASTER
    assert restarted.groups[KEY].master_epoch == 1


def test_a_retry_after_the_answer_was_lost_is_fenced(restarted, commit):
    live = {1: _fresh(1, 900), 2: _fresh(1, 700), 3: _fresh(1, 800)}
    commit(restarted, decide_elect_master(restarted, _restart(), ALIVE, live, False))
    # 1 won epoch 2; the same request again must not end that epoch too
    again = decide_elect_master(restarted, _restart(), ALIVE, live, False)
    assert _code(again) is ControllerCode.CONTROLLER_FENCED_MASTER_EPOCH
    assert restarted.groups[KEY].master_epoch == 2


def test_reports_older_than_the_restart_are_not_trusted(restarted):
    # 3's last report predates the restart: it may understate what 3 holds, and 1 (which
    # lost a tail) would win over the records it lost
    live = {
        1: _fresh(1, 600),
        2: _fresh(1, 500),
        3: replace(_fresh(1, 550), last_seen_ms=RESTARTED_AT_MS - 1),
    }
    decision = decide_elect_master(restarted, _restart(), ALIVE, live, False)
    assert _code(decision) is ControllerCode.CONTROLLER_ELECT_MASTER_FAILED
    assert "[3]" in decision.remark
    # the restarted master's own report must be the new one too
    live = {
        1: replace(_fresh(1, 900), last_seen_ms=RESTARTED_AT_MS - 1),
        2: _fresh(1, 800),
        3: _fresh(1, 800),
    }
    assert _code(decide_elect_master(restarted, _restart(), ALIVE, live, False)) is (
        ControllerCode.CONTROLLER_ELECT_MASTER_FAILED
    )
    # a dead set member is not waited for
    live = {1: _fresh(1, 600), 2: _fresh(1, 800)}
    assert (
        _elected(decide_elect_master(restarted, _restart(), {1, 2}, live, False)).new_master_id == 2
    )


def test_a_leader_that_did_not_see_the_registration_waits_for_a_new_one(restarted):
    # Every report is recent, but this leader never handled master 1's registration (it was
    # elected since): a time from another peer's clock proves nothing, so it refuses, and
    # the member, refused a few times, registers again (broker/replicas_manager.py)
    live = {i: replace(_fresh(1, 900), registered_ms=None) for i in ALIVE}
    decision = decide_elect_master(restarted, _restart(), ALIVE, live, False)
    assert _code(decision) is ControllerCode.CONTROLLER_ELECT_MASTER_FAILED
    assert "register again" in decision.remark
    assert restarted.groups[KEY].master_epoch == 1
    # the replicated registration time is informational: it decides nothing
    for member in restarted.groups[KEY].members.values():
        assert member.register_time_ms < RESTARTED_AT_MS
    live[1] = replace(live[1], registered_ms=RESTARTED_AT_MS)
    assert (
        _elected(decide_elect_master(restarted, _restart(), ALIVE, live, False)).new_master_epoch
        == 2
    )


def test_the_wire_carries_the_restart_and_its_epoch():
    request = _restart(1, 7)
    ext = wire.elect_master_ext(request)
    assert ext["trigger"] == "restart"
    assert wire.elect_master_request(ext) == request
    del ext["master_epoch"]
    with pytest.raises(InvalidArgument, match="master_epoch"):
        wire.elect_master_request(ext)
    timeout = {**ext, "trigger": "master_timeout"}
    with pytest.raises(InvalidArgument, match="trigger"):
        wire.elect_master_request(timeout)
