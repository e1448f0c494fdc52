"""A member whose disk was lost (or replaced) restarts empty, like a new group's member: it
must not vote again in a term it voted in, nor for a candidate missing entries that were
committed with its acknowledgement (node.py, "A member that started on an empty disk")."""

from __future__ import annotations

import random

from hamq.raft import (
    Entry,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RawNode,
    ResponseCode,
    Role,
)
from hamq.raft.log import UNKNOWN_VOTE
from hamq.raft.storage import persist

TICK_MS = 10
IDS = (1, 2, 3)


class Group:
    """Three members with default configs, messages delivered in order unless a member is
    down or cut off; every Ready fully persisted before its messages leave."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.storages = {i: MemoryStorage() for i in IDS}
        self.nodes: dict[int, RawNode | None] = dict.fromkeys(IDS)
        self.cut: set[int] = set()
        self.now_ms = 0
        self.leaders_by_term: dict[int, set[int]] = {}
        for i in IDS:
            self.start(i)

    def start(self, node_id: int) -> None:
        self.nodes[node_id] = RawNode(
            RaftConfig(node_id, IDS),
            self.storages[node_id],
            random.Random(self.rng.getrandbits(32)),
            self.now_ms,
        )

    def wipe(self, node_id: int) -> None:
        self.storages[node_id] = MemoryStorage()
        self.start(node_id)

    def node(self, node_id: int) -> RawNode:
        node = self.nodes[node_id]
        assert node is not None
        return node

    def run(self, ms: int) -> None:
        for _ in range(ms // TICK_MS):
            self.now_ms += TICK_MS
            for node in self.nodes.values():
                if node is not None:
                    node.tick(self.now_ms)
            self._settle()

    def _settle(self) -> None:
        for _ in range(200):
            messages: list[Message] = []
            for node_id, node in self.nodes.items():
                if node is not None and node.has_ready():
                    ready = node.ready()
                    persist(self.storages[node_id], ready)
                    messages += ready.messages
                    node.advance(ready)
            for node_id, node in self.nodes.items():
                if node is not None and node.role == Role.LEADER:
                    self.leaders_by_term.setdefault(node.term, set()).add(node_id)
            if not messages:
                return
            for msg in messages:
                target = self.nodes[msg.to_id]
                if target is not None and not {msg.from_id, msg.to_id} & self.cut:
                    target.step(msg)

    def leader(self) -> int | None:
        leaders = [i for i, n in self.nodes.items() if n is not None and n.role == Role.LEADER]
        return max(leaders, key=lambda i: self.node(i).term, default=None)

    def committed(self, node_id: int) -> list[bytes]:
        node = self.node(node_id)
        return [node.log.entry(i).data for i in range(node.committed_index + 1)]


def test_a_new_group_elects_a_leader_through_probes() -> None:
    group = Group(seed=1)
    group.run(3000)
    leader = group.leader()
    assert leader is not None
    group.node(leader).propose(b"a")
    group.run(500)
    assert all(b"a" in group.committed(i) for i in IDS)
    assert all(group.node(i).voted_for != UNKNOWN_VOTE for i in IDS)


def test_a_wiped_member_does_not_elect_a_candidate_missing_committed_entries() -> None:
    for seed in range(5):
        group = Group(seed)
        group.run(3000)
        leader = group.leader()
        assert leader is not None
        wiped, stale = [i for i in IDS if i != leader]
        group.cut = {stale}  # "a" commits on the leader and the member about to be wiped
        group.node(leader).propose(b"a")
        group.run(500)
        assert b"a" in group.committed(leader)
        group.nodes[leader] = None  # the leader is down, the other disk is replaced
        group.wipe(wiped)
        group.cut = set()
        group.run(5000)
        # only 'stale' could lead now, and only with the wiped member's vote
        assert group.leader() is None, f"seed {seed}: {group.leader()} elected without 'a'"
        group.start(leader)
        group.run(5000)
        new_leader = group.leader()
        assert new_leader is not None
        assert all(b"a" in group.committed(i) for i in IDS), f"seed {seed}"
        assert all(len(leaders) == 1 for leaders in group.leaders_by_term.values())


def test_a_wiped_member_votes_again_in_no_term() -> None:
    node = RawNode(RaftConfig(2, IDS), MemoryStorage(), random.Random(1))
    # 2 voted for 1 in term 1, then lost its disk: now 3 asks in the same term
    node.step(Message(MessageType.VOTE, 3, 2, term=1))
    (answer,) = node.ready().messages
    assert answer.type == MessageType.VOTE_RESPONSE and answer.code == ResponseCode.REJECTED


def test_a_wiped_member_is_vouched_for_once_caught_up_and_stays_so_after_a_crash() -> None:
    group = Group(seed=7)
    group.run(3000)
    leader = group.leader()
    assert leader is not None
    for body in (b"a", b"b"):
        group.node(leader).propose(body)
    group.run(500)
    wiped = next(i for i in IDS if i != leader)
    group.wipe(wiped)
    group.run(100)  # the first Ready saves the unknown vote
    assert group.storages[wiped].load_hard_state().voted_for in (UNKNOWN_VOTE, leader)
    group.run(1000)
    assert group.committed(wiped) == group.committed(leader)
    assert group.node(wiped).voted_for == leader
    group.start(wiped)  # a crash: what was saved vouches for it
    assert group.node(wiped).voted_for == leader


def test_a_wiped_member_is_not_vouched_for_before_it_holds_all_the_leader_committed() -> None:
    """The leader lowered its watermark for us (we had answered that we lost entries, then
    crashed again): what it committed, not what it says we hold, is what we must hold."""
    node = RawNode(RaftConfig(2, IDS), MemoryStorage(), random.Random(1))
    entries = tuple(Entry(i, 2, b"x%d" % i) for i in range(4))
    node.step(
        Message(
            MessageType.APPEND,
            1,
            2,
            term=2,
            index=0,
            log_term=0,
            entries=entries,
            committed_index=5,
            water_mark=-1,
        )
    )
    assert node.committed_index == 3 and node.voted_for == UNKNOWN_VOTE  # 4 and 5 missing
    more = (Entry(4, 2, b"x4"), Entry(5, 2, b"x5"))
    node.step(
        Message(
            MessageType.APPEND,
            1,
            2,
            term=2,
            index=4,
            log_term=2,
            entries=more,
            committed_index=5,
            water_mark=3,
        )
    )
    assert node.committed_index == 5 and node.voted_for == 1
