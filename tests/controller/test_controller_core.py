"""ControllerCore with three in-memory peers on virtual time: the Raft election, requests
answered once applied on every peer, refusals, the master-timeout scan's wait, and
snapshots a restarted peer resumes from."""

from __future__ import annotations

import random

import pytest

from hamq.controller.codec import decode_snapshot_at
from hamq.controller.core import Applied, ControllerCore, CoreSettings, Outcome
from hamq.controller.errors import ControllerCode, ControllerError, ControllerRecoveryError
from hamq.controller.events import ElectMaster
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    ElectMasterRequest,
    ElectTrigger,
    RegisterBrokerRequest,
)
from hamq.raft import MemoryStorage, RaftConfig

CLUSTER, GROUP = "DefaultCluster", "broker-a"
KEY = (CLUSTER, GROUP)
PEERS = (1, 2, 3)
TICK_MS = 10
HEARTBEAT_TIMEOUT_MS = 1000
SETTINGS = CoreSettings(
    heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    snapshot_interval_entries=4,
    enable_elect_unclean_master=False,
)


class Cluster:
    """Three peers and a network that delivers at once, except to or from a cut peer."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.storages = {i: MemoryStorage() for i in PEERS}
        self.snapshots: dict[int, bytes] = {}
        self.changes: dict[int, list] = {i: [] for i in PEERS}
        self.cut: set[int] = set()
        self.cores = {i: self.start(i) for i in PEERS}

    def start(self, peer: int, snapshot: bytes | None = None) -> ControllerCore:
        config = RaftConfig(peer, PEERS, election_timeout_ms=300, push_timeout_ms=120)
        return ControllerCore(
            config, self.storages[peer], random.Random(peer), SETTINGS, self.now_ms, snapshot
        )

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            for peer, core in self.cores.items():
                out = core.run_cycle(self.now_ms)
                if out is None:
                    continue
                moved = True
                if out.snapshot is not None:
                    self.snapshots[peer] = out.snapshot.data
                self.changes[peer] += out.changes
                for msg in out.messages:
                    if not {msg.from_id, msg.to_id} & self.cut:
                        self.cores[msg.to_id].step(msg)
            if not moved:
                return
        raise AssertionError("the peers never went quiet")

    def run(self, ms: int) -> None:
        for _ in range(ms // TICK_MS):
            self.now_ms += TICK_MS
            for core in self.cores.values():
                core.tick(self.now_ms)
            self.pump()

    def leader(self, among: set[int] | None = None) -> int:
        """Run until exactly one of ``among`` serves as leader; its id."""
        among = among or set(PEERS)
        for _ in range(500):
            serving = [i for i in among if self.cores[i].serving]
            if len(serving) == 1:
                return serving[0]
            self.run(TICK_MS)
        raise AssertionError("no leader elected")

    def submit(self, peer: int, request) -> list[Outcome]:
        outcomes: list[Outcome] = []
        self.cores[peer].submit(request, self.now_ms, outcomes.append)
        return outcomes

    def commit(self, request) -> Applied:
        outcomes = self.submit(self.leader(), request)
        self.pump()
        assert len(outcomes) == 1 and isinstance(outcomes[0], Applied), outcomes
        return outcomes[0]

    def beat(self, broker_id: int, epoch: int = 0, max_offset: int = 0) -> None:
        heartbeat = BrokerHeartbeat(*KEY, broker_id, _addr(broker_id), epoch, max_offset)
        for core in self.cores.values():
            core.heartbeat(heartbeat, self.now_ms)


def _addr(broker_id: int) -> str:
    return f"127.0.0.1:{10900 + broker_id}"


def _join(cluster: Cluster, broker_id: int) -> None:
    cluster.commit(ApplyBrokerIdRequest(*KEY, broker_id, _addr(broker_id), f"code-{broker_id}"))
    cluster.commit(RegisterBrokerRequest(*KEY, broker_id, _addr(broker_id), f"code-{broker_id}"))
    cluster.beat(broker_id)


def _group_of_two(cluster: Cluster) -> None:
    """Members 1 and 2, 1 elected master, the set grown to both."""
    _join(cluster, 1)
    _join(cluster, 2)
    cluster.commit(ElectMasterRequest(*KEY, ElectTrigger.REGISTER, 1))
    cluster.commit(AlterSyncStateSetRequest(*KEY, 1, 1, frozenset({1, 2}), 1))


def _states(cluster: Cluster) -> list:
    return [core.state for core in cluster.cores.values()]


def test_three_peers_elect_one_leader_and_followers_know_it():
    cluster = Cluster()
    leader = cluster.leader()
    cluster.run(100)
    assert [core.leader_id for core in cluster.cores.values()] == [leader] * 3
    assert sum(core.is_leader for core in cluster.cores.values()) == 1


def test_a_request_is_answered_once_applied_on_every_peer():
    cluster = Cluster()
    leader = cluster.leader()
    request = ApplyBrokerIdRequest(*KEY, 1, _addr(1), "code-1")
    outcomes = cluster.submit(leader, request)
    assert outcomes == []  # proposed, not applied yet
    cluster.pump()
    assert len(outcomes) == 1 and isinstance(outcomes[0], Applied)
    assert outcomes[0].group is not None and 1 in outcomes[0].group.members
    cluster.run(100)  # followers learn the commit index with the next heartbeat
    first, *others = _states(cluster)
    assert all(state == first for state in others)
    assert first.groups[KEY].members[1].address == _addr(1)


def test_a_follower_refuses_with_not_leader_at_once():
    cluster = Cluster()
    leader = cluster.leader()
    follower = next(i for i in PEERS if i != leader)
    (outcome,) = cluster.submit(follower, ApplyBrokerIdRequest(*KEY, 1, _addr(1), "c"))
    assert isinstance(outcome, ControllerError)
    assert outcome.code == ControllerCode.CONTROLLER_NOT_LEADER
    assert cluster.cores[follower].leader_id == leader


def test_leadership_lost_mid_proposal_fails_the_callback_and_changes_nothing():
    cluster = Cluster()
    old = cluster.leader()
    cluster.cut = {old}
    outcomes = cluster.submit(old, ApplyBrokerIdRequest(*KEY, 1, _addr(1), "code-1"))
    new = cluster.leader(set(PEERS) - {old})
    cluster.run(400)  # the old leader hears no quorum and steps down
    assert len(outcomes) == 1 and isinstance(outcomes[0], ControllerError)
    assert outcomes[0].code == ControllerCode.CONTROLLER_NOT_LEADER
    cluster.cut = set()
    cluster.run(500)  # healed: the old leader's unreplicated entry is replaced
    assert cluster.leader() == new
    assert all(KEY not in state.groups for state in _states(cluster))


def test_stale_alters_are_refused_when_decided_and_when_applied():
    cluster = Cluster()
    _group_of_two(cluster)
    leader = cluster.leader()
    before = cluster.cores[leader].group(KEY)
    assert before is not None and before.sync_state_set_epoch == 2
    stale_master = AlterSyncStateSetRequest(*KEY, 1, 0, frozenset({1}), 2)
    (refused,) = cluster.submit(leader, stale_master)
    assert isinstance(refused, ControllerError)
    assert refused.code == ControllerCode.CONTROLLER_FENCED_MASTER_EPOCH
    # two alters decided against the same epochs: the log orders them, the second is stale
    shrink = AlterSyncStateSetRequest(*KEY, 1, 1, frozenset({1}), 2)
    first = cluster.submit(leader, shrink)
    second = cluster.submit(leader, shrink)
    cluster.run(100)
    assert isinstance(first[0], Applied)
    assert isinstance(second[0], ControllerError)
    assert second[0].code == ControllerCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    for state in _states(cluster):
        assert state.groups[KEY].sync_state_set == frozenset({1})
        assert state.groups[KEY].sync_state_set_epoch == 3


def test_scan_waits_one_heartbeat_timeout_after_winning_leadership():
    cluster = Cluster()
    _group_of_two(cluster)
    old = cluster.leader()
    cluster.cut = {old}  # the controller leader dies; broker 1 (the master) goes silent too
    new = cluster.leader(set(PEERS) - {old})
    won_at = cluster.now_ms
    core = cluster.cores[new]
    while cluster.now_ms - won_at < HEARTBEAT_TIMEOUT_MS - 5 * TICK_MS:
        cluster.beat(2, epoch=1, max_offset=100)
        assert core.scan(cluster.now_ms) == []  # master 1 unheard of long enough, but wait
        cluster.run(5 * TICK_MS)
    assert 1 not in core.liveness.alive(KEY, cluster.now_ms)  # it was dead for a while
    cluster.beat(2, epoch=1, max_offset=100)
    cluster.run(10 * TICK_MS)
    (election,) = core.scan(cluster.now_ms)
    assert election.trigger is ElectTrigger.MASTER_TIMEOUT
    assert core.scan(cluster.now_ms) == []  # one election in flight per group
    cluster.pump()
    group = core.group(KEY)
    assert group is not None and (group.master_id, group.master_epoch) == (2, 2)
    (change,) = [c for c in cluster.changes[new] if isinstance(c.event, ElectMaster)][-1:]
    assert change.key == KEY and change.event.new_master_id == 2 and not change.event.unclean


def test_a_master_that_keeps_reporting_is_not_replaced():
    cluster = Cluster()
    _group_of_two(cluster)
    leader = cluster.leader()
    for _ in range(3 * HEARTBEAT_TIMEOUT_MS // 100):
        cluster.beat(1, epoch=1)
        cluster.beat(2, epoch=1)
        assert cluster.cores[leader].scan(cluster.now_ms) == []
        cluster.run(100)
    assert cluster.cores[leader].group(KEY).master_id == 1


def test_snapshot_and_restart_give_the_same_state():
    cluster = Cluster()
    _group_of_two(cluster)
    _join(cluster, 3)  # 5 events: snapshots were taken along the way
    cluster.run(100)  # followers learn the last commit with the next heartbeat
    leader = cluster.leader()
    restarted = next(i for i in PEERS if i != leader)
    snapshot = cluster.snapshots[restarted]
    index, snapshot_state = decode_snapshot_at(snapshot)
    assert index > 0 and KEY in snapshot_state.groups
    expected = cluster.cores[restarted].state
    core = cluster.start(restarted, snapshot)
    assert core.node.applied_index == index and core.state == snapshot_state
    cluster.cores[restarted] = core
    cluster.run(200)
    assert core.state == expected == cluster.cores[leader].state
    assert core.node.applied_index == cluster.cores[leader].node.applied_index


def test_a_snapshot_past_the_log_is_refused():
    cluster = Cluster()
    _group_of_two(cluster)
    peer = next(iter(cluster.snapshots))
    cluster.storages[peer] = MemoryStorage()  # the Raft directory was lost, not the snapshot
    with pytest.raises(ControllerRecoveryError, match="snapshot is at Raft index"):
        cluster.start(peer, cluster.snapshots[peer])


def test_reports_of_unknown_members_are_not_kept():
    cluster = Cluster()
    _join(cluster, 1)
    core = cluster.cores[cluster.leader()]
    stranger = BrokerHeartbeat("other", "group", 1, _addr(1), 0, 0)
    assert not core.heartbeat(stranger, cluster.now_ms)
    assert not core.heartbeat(BrokerHeartbeat(*KEY, 9, _addr(9), 0, 0), cluster.now_ms)
    assert core.heartbeat(BrokerHeartbeat(*KEY, 1, _addr(1), 0, 0), cluster.now_ms)
    assert core.liveness.alive(KEY, cluster.now_ms) == {1}
    assert core.liveness.members(("other", "group")) == {}


def test_a_new_leader_does_not_depose_a_master_it_has_not_heard_from_yet():
    """apache/rocketmq #7689's shape: the master's reports reached only the old Raft
    leader (the other peers restarted, or their link to it was down). Until the new
    leader has led a whole heartbeat timeout, its table proves nothing about the master:
    an admin or registration election must not treat it as dead, as the scan does not."""
    cluster = Cluster()
    _group_of_two(cluster)
    old = cluster.leader()
    others = set(PEERS) - {old}
    for peer in others:
        cluster.cores[peer].liveness.forget(KEY, frozenset({1, 2}))  # restarted: no reports
    cluster.cut = {old}
    new = cluster.leader(others)
    cluster.cut = set()  # the old leader is back, a follower; master 1 reports to it alone
    beat_1 = BrokerHeartbeat(*KEY, 1, _addr(1), 1, 100)
    cluster.cores[old].heartbeat(beat_1, cluster.now_ms)
    cluster.beat(2, epoch=1, max_offset=100)
    for trigger, preferred in ((ElectTrigger.ADMIN, None), (ElectTrigger.REGISTER, 2)):
        (refused,) = cluster.submit(new, ElectMasterRequest(*KEY, trigger, preferred))
        assert isinstance(refused, ControllerError), refused
        assert refused.code == ControllerCode.CONTROLLER_MASTER_STILL_EXIST
    # a whole heartbeat timeout led without a word from master 1: now it may be replaced
    for _ in range(HEARTBEAT_TIMEOUT_MS // 100 + 1):
        cluster.beat(2, epoch=1, max_offset=100)
        cluster.run(100)
    assert cluster.cores[new].is_leader
    outcomes = cluster.submit(new, ElectMasterRequest(*KEY, ElectTrigger.ADMIN))
    cluster.pump()
    assert len(outcomes) == 1 and isinstance(outcomes[0], Applied), outcomes
    group = cluster.cores[new].group(KEY)
    assert group is not None and (group.master_id, group.master_epoch) == (2, 2)


def test_a_peer_restarted_with_a_wiped_data_dir_cannot_elect_a_leader_missing_commits():
    """Raft safety under a lost disk: a change committed by the leader and one follower
    (the third peer cut off) survives that follower's wiped restart. The wiped peer must
    not vote for the peer that lacks the change while the old leader is down; the group
    waits instead, and the change is there once the old leader is back."""
    cluster = Cluster()
    old = cluster.leader()
    holder, lagging = (i for i in PEERS if i != old)
    cluster.cut = {lagging}
    cluster.commit(ApplyBrokerIdRequest(*KEY, 1, _addr(1), "code-1"))
    cluster.run(100)  # the follower learns the commit with the next heartbeat
    assert KEY in cluster.cores[holder].state.groups
    cluster.storages[holder] = MemoryStorage()  # its disk is replaced; it restarts empty
    cluster.cores[holder] = cluster.start(holder)
    cluster.cut = {old}  # the old leader goes down; the other two hear each other
    cluster.run(10 * 300)
    assert not any(cluster.cores[i].is_leader for i in (holder, lagging))
    cluster.cut = set()
    leader = cluster.leader()
    cluster.run(300)
    assert leader == old or KEY in cluster.cores[leader].state.groups
    for core in cluster.cores.values():
        assert core.group(KEY) is not None and 1 in core.group(KEY).members


@pytest.mark.parametrize("offset_ms", range(0, 100, 20))
def test_a_leader_cut_off_from_the_majority_stops_serving_before_another_serves(offset_ms):
    """A minority leader must not answer reads (replica info, next broker id) from a state
    the majority has moved past: check quorum steps it down no later than the others can
    elect (their lease), so at no tick do two peers serve. Writes it took are never
    answered as applied."""
    cluster = Cluster()
    old = cluster.leader()
    cluster.run(offset_ms)
    cluster.cut = {old}
    outcomes = cluster.submit(old, ApplyBrokerIdRequest(*KEY, 1, _addr(1), "code-1"))
    for _ in range(300):
        cluster.run(TICK_MS)
        serving = [i for i, core in cluster.cores.items() if core.serving]
        assert len(serving) <= 1, f"peers {serving} serve at once at {cluster.now_ms} ms"
    assert serving and serving[0] != old
    assert len(outcomes) == 1 and isinstance(outcomes[0], ControllerError)


def _register_count(cluster: Cluster, peer: int) -> tuple[Outcome, int]:
    """Register member 1 at ``peer`` (the leader): its answer and the Raft log's growth."""
    core = cluster.cores[peer]
    before = core.node.log.ledger_end_index
    (outcome,) = cluster.submit(peer, RegisterBrokerRequest(*KEY, 1, _addr(1)))
    cluster.pump()
    return outcome, core.node.log.ledger_end_index - before


def test_registering_again_at_the_same_address_adds_no_raft_entry():
    cluster = Cluster()
    _group_of_two(cluster)
    leader = cluster.leader()
    for _ in range(5):  # a member registering at every start, or each poll, or a stranger
        outcome, grown = _register_count(cluster, leader)
        assert isinstance(outcome, Applied) and outcome.event is None and grown == 0
        assert outcome.group == cluster.cores[leader].group(KEY)  # answered from the state
    (stranger,) = cluster.submit(leader, RegisterBrokerRequest(*KEY, 9, _addr(9)))
    assert isinstance(stranger, ControllerError)
    assert 9 not in cluster.cores[leader].liveness.live_info(KEY)  # nothing kept for it
    # an address change needs the member's register check code, and is replicated
    (hijack,) = cluster.submit(leader, RegisterBrokerRequest(*KEY, 1, "127.0.0.1:1", "guess"))
    assert isinstance(hijack, ControllerError)
    assert hijack.code is ControllerCode.CONTROLLER_BROKER_ID_INVALID
    moved = RegisterBrokerRequest(*KEY, 1, "127.0.0.1:20901", "code-1")
    outcome = cluster.commit(moved)
    assert outcome.event is not None
    cluster.run(100)
    assert all(
        state.groups[KEY].members[1].address == "127.0.0.1:20901" for state in _states(cluster)
    )


def test_a_restart_election_waits_for_a_registration_seen_by_the_current_leader():
    """The restarted master registered with the old controller leader; the new leader
    holds recent reports but never saw that registration (a time from the old leader's
    clock, replicated, proves nothing on its own): it refuses until the member registers
    with it, then trusts only reports that arrived after that."""
    cluster = Cluster()
    _group_of_two(cluster)
    old = cluster.leader()
    cluster.submit(old, RegisterBrokerRequest(*KEY, 1, _addr(1)))  # 1 is back after a restart
    cluster.cut = {old}
    new = cluster.leader(set(PEERS) - {old})
    restart = ElectMasterRequest(*KEY, ElectTrigger.MASTER_RESTART, 1, master_epoch=1)
    cluster.beat(1, epoch=1, max_offset=600)  # 1 lost its unflushed tail
    cluster.beat(2, epoch=1, max_offset=900)
    (refused,) = cluster.submit(new, restart)
    assert isinstance(refused, ControllerError)
    assert refused.code == ControllerCode.CONTROLLER_ELECT_MASTER_FAILED
    assert "register again" in refused.remark
    cluster.run(TICK_MS)
    outcome, grown = _register_count(cluster, new)
    assert isinstance(outcome, Applied) and grown == 0
    (waiting,) = cluster.submit(new, restart)  # the reports predate the registration
    assert isinstance(waiting, ControllerError) and "[1, 2]" in waiting.remark
    cluster.run(TICK_MS)
    cluster.beat(1, epoch=1, max_offset=600)
    cluster.beat(2, epoch=1, max_offset=900)
    assert cluster.submit(new, restart) == []  # proposed
    cluster.pump()
    group = cluster.cores[new].group(KEY)
    assert group is not None and (group.master_id, group.master_epoch) == (2, 2)


def test_a_leader_again_forgets_the_registrations_it_saw_in_an_earlier_term():
    """Between its terms another leader may have handled a later restart of the member."""
    cluster = Cluster()
    _group_of_two(cluster)
    first = cluster.leader()
    _register_count(cluster, first)
    assert cluster.cores[first].liveness.live_info(KEY)[1].registered_ms is not None
    leader = first
    for _ in range(20):  # depose each leader until ``first`` leads again
        cluster.cut = {leader}
        leader = cluster.leader(set(PEERS) - {leader})
        cluster.run(400)  # the cut one steps down
        cluster.cut = set()
        if leader == first:
            break
    assert leader == first
    info = cluster.cores[first].liveness.live_info(KEY).get(1)
    assert info is None or info.registered_ms is None
