"""Each controller request decided against a real state: ids, registration, election, fencing."""

from __future__ import annotations

from hamq.controller.apply import apply_event
from hamq.controller.codec import decode_snapshot, encode_snapshot
from hamq.controller.decide import (
    decide_alter_sync_state_set,
    decide_apply_broker_id,
    decide_clean_broker_data,
    decide_elect_master,
    decide_register_broker,
)
from hamq.controller.elect import BrokerLiveInfo
from hamq.controller.errors import ControllerCode, ControllerError
from hamq.controller.events import ApplyBrokerId, ElectMaster
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.controller.state import ControllerState

CLUSTER, GROUP = "DefaultCluster", "broker-a"
KEY = (CLUSTER, GROUP)
Code = ControllerCode


def _code(decision: object) -> ControllerCode:
    assert isinstance(decision, ControllerError), decision
    return decision.code


def _alter(master: int, master_epoch: int, ids: set[int], set_epoch: int):
    return AlterSyncStateSetRequest(CLUSTER, GROUP, master, master_epoch, frozenset(ids), set_epoch)


def _timeout_elect(state, alive, live_info=None, unclean=False):
    request = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.MASTER_TIMEOUT)
    return decide_elect_master(state, request, alive, live_info or {}, unclean)


def test_first_broker_id_is_one_and_ids_are_owned_by_their_check_code(commit):
    state = ControllerState()
    assert state.next_broker_id(KEY) == 1
    # a group not known takes any id: members apply theirs again when the controller
    # lost its state (nothing to compare their codes with)
    again_after_loss = ApplyBrokerIdRequest(CLUSTER, GROUP, 2, "b:2", "b:2;z")
    assert decide_apply_broker_id(state, again_after_loss, 0) == ApplyBrokerId(
        CLUSTER, GROUP, 2, "b:2", "b:2;z", 0
    )
    commit(
        state,
        decide_apply_broker_id(state, ApplyBrokerIdRequest(CLUSTER, GROUP, 1, "a:1", "a:1;x"), 5),
    )
    assert state.groups[KEY].members[1].register_time_ms == 5
    assert state.next_broker_id(KEY) == 2
    thief = ApplyBrokerIdRequest(CLUSTER, GROUP, 1, "b:1", "b:1;y")
    assert _code(decide_apply_broker_id(state, thief, 6)) is Code.CONTROLLER_BROKER_ID_INVALID
    again = ApplyBrokerIdRequest(CLUSTER, GROUP, 1, "a:1", "a:1;x")
    commit(state, decide_apply_broker_id(state, again, 7))


def test_register_updates_the_address_of_a_known_member_only(group_of_three, commit):
    state = group_of_three
    code = state.groups[KEY].members[2].register_check_code
    # anyone may send a registration: moving a member's id needs its register check code
    for guess in ("", "127.0.0.1:1;2", code + "x"):
        hijack = RegisterBrokerRequest(CLUSTER, GROUP, 2, "127.0.0.1:1", guess)
        assert _code(decide_register_broker(state, hijack, 9)) is Code.CONTROLLER_BROKER_ID_INVALID
    commit(
        state,
        decide_register_broker(state, RegisterBrokerRequest(CLUSTER, GROUP, 2, "new:2", code), 9),
    )
    assert state.groups[KEY].members[2].address == "new:2"
    # at the recorded address a registration changes nothing, code or not
    assert (
        decide_register_broker(state, RegisterBrokerRequest(CLUSTER, GROUP, 2, "new:2"), 9) is None
    )
    stranger = RegisterBrokerRequest(CLUSTER, GROUP, 7, "x:7")
    assert (
        _code(decide_register_broker(state, stranger, 9))
        is Code.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    )


def test_first_election_takes_the_registering_member(group_of_three):
    group = group_of_three.groups[KEY]
    assert (group.master_id, group.master_epoch) == (1, 1)
    assert (group.sync_state_set, group.sync_state_set_epoch) == ({1, 2, 3}, 2)


def _first_election(state: ControllerState, requester: int, live: dict, alive=None) -> ElectMaster:
    request = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.REGISTER, broker_id=requester)
    decision = decide_elect_master(state, request, alive or live.keys(), live, False)
    assert isinstance(decision, ElectMaster), decision
    return decision


def test_first_election_takes_the_alive_member_with_the_most_data(three_members):
    # members already hold data (moved from master-slave mode, or a group created again
    # after clean-broker-metadata): a lagging member that asks first must not win
    live = {1: BrokerLiveInfo(0, 100), 2: BrokerLiveInfo(0, 500), 3: BrokerLiveInfo(0, 300)}
    assert _first_election(three_members, 1, live) == ElectMaster(CLUSTER, GROUP, 2, 1, False)
    assert _first_election(three_members, 3, live).new_master_id == 2
    # a newer epoch beats a longer log
    live = {1: BrokerLiveInfo(3, 100), 2: BrokerLiveInfo(2, 900)}
    assert _first_election(three_members, 2, live).new_master_id == 1
    # a dead member's data does not hold the election up
    live = {1: BrokerLiveInfo(0, 100), 3: BrokerLiveInfo(0, 900)}
    assert _first_election(three_members, 1, live, alive={1}).new_master_id == 1


def test_a_group_created_again_first_elects_past_every_epoch_its_members_report(
    three_members, commit
):
    """A controller that lost its state creates the group again at epoch 0 while its
    members hold later epochs: the first election counts past the highest one reported
    (a member must never see an epoch go backwards, nor two masters share one), and
    every later election is the next epoch."""
    state = three_members
    live = {1: BrokerLiveInfo(7, 900), 2: BrokerLiveInfo(9, 400), 3: BrokerLiveInfo(-1, -1)}
    first = _first_election(state, 1, live)
    assert (first.new_master_id, first.new_master_epoch) == (2, 10)
    commit(state, first)
    assert (state.groups[KEY].master_id, state.groups[KEY].master_epoch) == (2, 10)
    # a second first election decided alongside it is refused when applied
    assert not apply_event(state, ElectMaster(CLUSTER, GROUP, 1, 10, False))
    # later elections are the next epoch, whatever members report
    later = _timeout_elect(state, {1, 3}, {1: BrokerLiveInfo(50, 0), 3: BrokerLiveInfo(50, 0)})
    assert later == ElectMaster(CLUSTER, GROUP, None, 11, False)


def test_first_election_of_an_empty_group_takes_the_requester_at_once(three_members):
    empty = {i: BrokerLiveInfo(0, 0) for i in (1, 2, 3)}
    assert _first_election(three_members, 3, empty).new_master_id == 3
    # ties go to the requester; alone, it wins without waiting for the others
    tie = {1: BrokerLiveInfo(1, 700), 2: BrokerLiveInfo(1, 700), 3: BrokerLiveInfo(1, 300)}
    assert _first_election(three_members, 2, tie).new_master_id == 2
    assert _first_election(three_members, 2, {2: BrokerLiveInfo(0, 0)}).new_master_id == 2


def test_alive_master_in_the_set_is_kept(group_of_three):
    admin = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.ADMIN)
    decision = decide_elect_master(group_of_three, admin, {1, 2, 3}, {}, False)
    assert _code(decision) is Code.CONTROLLER_MASTER_STILL_EXIST
    registering = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.REGISTER, broker_id=3)
    decision = decide_elect_master(group_of_three, registering, {1, 2, 3}, {}, False)
    assert _code(decision) is Code.CONTROLLER_MASTER_STILL_EXIST


def test_election_prefers_largest_epoch_then_offset(group_of_three, commit):
    state = group_of_three
    live = {2: BrokerLiveInfo(1, 500), 3: BrokerLiveInfo(1, 900)}
    event = commit(state, _timeout_elect(state, {2, 3}, live))
    assert event == ElectMaster(CLUSTER, GROUP, 3, 2, unclean=False)
    group = state.groups[KEY]
    assert (group.master_id, group.master_epoch) == (3, 2)
    assert (group.sync_state_set, group.sync_state_set_epoch) == ({3}, 3)


def test_newer_epoch_beats_longer_log(group_of_three):
    live = {2: BrokerLiveInfo(2, 10), 3: BrokerLiveInfo(1, 10_000)}
    decision = _timeout_elect(group_of_three, {2, 3}, live)
    assert isinstance(decision, ElectMaster) and decision.new_master_id == 2


def test_equal_logs_pick_the_smallest_id_and_silent_members_rank_last(group_of_three):
    tie = _timeout_elect(group_of_three, {2, 3}, {2: BrokerLiveInfo(1, 7), 3: BrokerLiveInfo(1, 7)})
    assert isinstance(tie, ElectMaster) and tie.new_master_id == 2
    silent = _timeout_elect(group_of_three, {2, 3}, {3: BrokerLiveInfo(0, 0)})
    assert isinstance(silent, ElectMaster) and silent.new_master_id == 3


def test_preferred_member_must_be_an_alive_set_member(group_of_three, commit):
    state = group_of_three
    commit(state, decide_alter_sync_state_set(state, _alter(1, 1, {1, 2}, 2), {1, 2, 3}))
    outside = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.ADMIN, broker_id=3)
    assert _code(decide_elect_master(state, outside, {1, 2, 3}, {}, False)) is (
        Code.CONTROLLER_ELECT_MASTER_FAILED
    )
    inside = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.ADMIN, broker_id=2)
    event = commit(state, decide_elect_master(state, inside, {1, 2, 3}, {}, False))
    assert event == ElectMaster(CLUSTER, GROUP, 2, 2, unclean=False)


def test_no_alive_set_member_fences_the_dead_master_and_leaves_no_master(group_of_three, commit):
    state = group_of_three
    commit(state, decide_alter_sync_state_set(state, _alter(1, 1, {1}, 2), {1, 2, 3}))
    event = commit(state, _timeout_elect(state, {2, 3}))
    assert event == ElectMaster(CLUSTER, GROUP, None, 2, unclean=False)
    group = state.groups[KEY]
    assert (group.master_id, group.master_epoch, group.sync_state_set) == (None, 2, {1})
    admin = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.ADMIN)
    assert _code(decide_elect_master(state, admin, {2, 3}, {}, False)) is (
        Code.CONTROLLER_ELECT_MASTER_FAILED
    )
    # The old master comes back: the only clean candidate, in a new epoch.
    assert commit(state, decide_elect_master(state, admin, {1, 2}, {}, False)) == ElectMaster(
        CLUSTER, GROUP, 1, 3, unclean=False
    )


def test_unclean_election_takes_any_alive_member_and_says_so(group_of_three, commit):
    state = group_of_three
    commit(state, decide_alter_sync_state_set(state, _alter(1, 1, {1}, 2), {1, 2, 3}))
    live = {2: BrokerLiveInfo(1, 10), 3: BrokerLiveInfo(1, 20)}
    event = commit(state, _timeout_elect(state, {2, 3}, live, unclean=True))
    # the old master never reported its log's end: how much is lost is not known
    assert event == ElectMaster(CLUSTER, GROUP, 3, 2, True, new_master_max_offset=20)
    assert event.lost_bytes is None
    assert state.groups[KEY].sync_state_set == {3}


def test_alter_is_fenced_by_master_and_both_epochs(group_of_three, commit):
    state = group_of_three
    alive = {1, 2, 3}
    cases = [
        (_alter(2, 1, {1, 2}, 2), Code.CONTROLLER_INVALID_MASTER),
        (_alter(1, 0, {1, 2}, 2), Code.CONTROLLER_FENCED_MASTER_EPOCH),
        (_alter(1, 1, {1, 2}, 1), Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
        (_alter(1, 1, {1, 2, 9}, 2), Code.CONTROLLER_INVALID_REPLICAS),
        (_alter(1, 1, {2, 3}, 2), Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
        (_alter(1, 1, {1, 2, 3}, 2), Code.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
    ]
    for request, code in cases:
        assert _code(decide_alter_sync_state_set(state, request, alive)) is code, request
    assert _code(decide_alter_sync_state_set(state, _alter(1, 1, {1, 2}, 2), {1})) is (
        Code.CONTROLLER_BROKER_NOT_ALIVE
    )
    commit(state, decide_alter_sync_state_set(state, _alter(1, 1, {1, 2}, 2), alive))
    assert (state.groups[KEY].sync_state_set, state.groups[KEY].sync_state_set_epoch) == ({1, 2}, 3)


def test_deposed_master_cannot_shrink_the_set_to_itself(group_of_three, commit):
    state = group_of_three
    commit(state, _timeout_elect(state, {2, 3}, {2: BrokerLiveInfo(1, 9)}))
    # Member 1 still believes it leads at master epoch 1 with set epoch 2.
    stale = _alter(1, 1, {1}, 2)
    assert (
        _code(decide_alter_sync_state_set(state, stale, {1, 2, 3}))
        is Code.CONTROLLER_INVALID_MASTER
    )


def test_apply_refuses_an_event_made_stale_by_a_concurrent_one(group_of_three):
    state = group_of_three
    shrink = decide_alter_sync_state_set(state, _alter(1, 1, {1, 2}, 2), {1, 2, 3})
    elect = _timeout_elect(state, {2, 3}, {3: BrokerLiveInfo(1, 1)})
    assert not isinstance(shrink, ControllerError) and not isinstance(elect, ControllerError)
    assert apply_event(state, elect)
    before = state.groups[KEY]
    assert not apply_event(state, shrink)
    assert not apply_event(state, elect)  # the same epoch twice
    assert state.groups[KEY] == before


def test_clean_forgets_dead_members_never_the_master_alone(group_of_three, commit):
    state = group_of_three
    alive = {1, 2}
    living = CleanBrokerDataRequest(CLUSTER, GROUP, frozenset({2}))
    assert _code(decide_clean_broker_data(state, living, alive)) is (
        Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    )
    master = CleanBrokerDataRequest(CLUSTER, GROUP, frozenset({1}), clean_living_broker=True)
    assert _code(decide_clean_broker_data(state, master, alive)) is (
        Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    )
    commit(
        state,
        decide_clean_broker_data(
            state, CleanBrokerDataRequest(CLUSTER, GROUP, frozenset({3})), alive
        ),
    )
    group = state.groups[KEY]
    assert (set(group.members), group.sync_state_set, group.sync_state_set_epoch) == (
        {1, 2},
        {1, 2},
        3,
    )
    whole = CleanBrokerDataRequest(CLUSTER, GROUP, clean_living_broker=True)
    commit(state, decide_clean_broker_data(state, whole, alive - {1}))  # once the master died
    assert KEY not in state.groups


def test_an_alter_asked_again_after_its_answer_was_lost_is_fenced(group_of_three, commit):
    """The first attempt was applied (its answer lost with a controller leader); the
    repeat carries the set epoch it moved past. It is refused as stale, so the master
    re-reads its replica info, not as a failed alter that leaves it on its old view."""
    state = group_of_three
    shrink = _alter(1, 1, {1, 2}, 2)
    commit(state, decide_alter_sync_state_set(state, shrink, {1, 2, 3}))
    again = decide_alter_sync_state_set(state, shrink, {1, 2, 3})
    assert _code(again) is Code.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH


def test_a_deposed_master_asking_for_the_current_set_is_fenced(group_of_three):
    state = group_of_three
    group = state.groups[KEY]
    current = set(group.sync_state_set)
    other_master = _alter(2, group.master_epoch, current, group.sync_state_set_epoch)
    assert (
        _code(decide_alter_sync_state_set(state, other_master, {1, 2, 3}))
        is Code.CONTROLLER_INVALID_MASTER
    )
    old_epoch = _alter(1, group.master_epoch - 1, current, group.sync_state_set_epoch)
    assert (
        _code(decide_alter_sync_state_set(state, old_epoch, {1, 2, 3}))
        is Code.CONTROLLER_FENCED_MASTER_EPOCH
    )


def test_a_living_master_is_never_cleaned_with_its_whole_group(group_of_three):
    """Forgetting the group would leave its master acknowledging with nobody to fence it,
    and a re-created group would start its epochs again below those its members hold."""
    state = group_of_three
    whole_group = CleanBrokerDataRequest(CLUSTER, GROUP, frozenset(), clean_living_broker=True)
    refused = decide_clean_broker_data(state, whole_group, {1, 2, 3})
    assert _code(refused) is Code.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    assert "master 1" in refused.remark
    # with the master dead, the group goes (its living slaves too, as the admin asked)
    assert not isinstance(decide_clean_broker_data(state, whole_group, {2, 3}), ControllerError)


def test_a_group_cleaned_away_and_created_again_continues_its_epochs(group_of_three, commit):
    """Its members' epoch files (and role states) hold the old epochs: starting again at
    epoch 1 would be refused by them, or written below epochs their files already hold.
    The new group's first election still takes any member, as a new group's does."""
    state = group_of_three
    admin = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.ADMIN, 2)
    commit(state, decide_elect_master(state, admin, {1, 2, 3}, {}, False))  # master epoch 2
    whole = CleanBrokerDataRequest(CLUSTER, GROUP, clean_living_broker=True)
    commit(state, decide_clean_broker_data(state, whole, set()))
    assert KEY not in state.groups and state.retired_epochs == {KEY: 2}
    again = ApplyBrokerIdRequest(CLUSTER, GROUP, 1, "a:1", "a:1;new")
    commit(state, decide_apply_broker_id(state, again, 9))
    assert state.retired_epochs == {}
    assert state.groups[KEY].master_epoch == 2 and not state.groups[KEY].elected
    first = ElectMasterRequest(CLUSTER, GROUP, ElectTrigger.REGISTER, 1)
    event = commit(state, decide_elect_master(state, first, {1}, {}, False))
    assert event == ElectMaster(CLUSTER, GROUP, 1, 3, unclean=False)
    assert decode_snapshot(encode_snapshot(state)) == state
