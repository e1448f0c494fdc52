"""RawNode's contract with its driver, beyond what the data-driven scripts show."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hamq.raft import (
    ConfigError,
    EntryId,
    FailureReason,
    FileStorage,
    LogStorage,
    MemoryStorage,
    Message,
    MessageType,
    NotLeaderError,
    RaftConfig,
    RawNode,
    Ready,
    Role,
    UnknownPeerError,
)
from hamq.raft.config import ELECTION_TIMEOUT_MS
from hamq.raft.storage import persist


def drain(node: RawNode, storage: LogStorage) -> list[Ready]:
    readies = []
    while node.has_ready():
        ready = node.ready()
        persist(storage, ready)
        node.advance(ready)
        readies.append(ready)
    return readies


def single(storage: LogStorage | None = None, now_ms: int = 0) -> tuple[RawNode, LogStorage]:
    storage = storage if storage is not None else MemoryStorage()
    node = RawNode(RaftConfig(node_id=1, member_ids=(1,)), storage, random.Random(1), now_ms)
    return node, storage


def elected_single() -> tuple[RawNode, LogStorage]:
    node, storage = single()
    node.campaign()
    assert node.role == Role.LEADER
    drain(node, storage)
    return node, storage


def test_single_member_commits_its_proposals_in_order() -> None:
    node, storage = elected_single()
    ids = [node.propose(b"a"), node.propose(b"b")]
    readies = drain(node, storage)
    committed = [e.data for r in readies for e in r.committed_entries]
    assert committed == [b"a", b"b"]
    assert [e for r in readies for e in r.completed_proposals] == ids
    assert node.applied_index == node.committed_index == 2


def test_election_timer_fires_on_tick() -> None:
    node, _storage = single()
    node.tick(2 * ELECTION_TIMEOUT_MS)  # past any randomized timeout
    assert node.role == Role.LEADER and node.term == 1


def test_proposal_to_a_follower_is_refused() -> None:
    node, _ = single()
    with pytest.raises(NotLeaderError):
        node.propose(b"x")


def test_proposal_must_be_bytes() -> None:
    node, _ = elected_single()
    with pytest.raises(TypeError):
        node.propose("text")  # type: ignore[arg-type]


def leader_of_three(**config: int) -> RawNode:
    node = RawNode(
        RaftConfig(node_id=1, member_ids=(1, 2, 3), empty_disk_guard=False, **config),
        MemoryStorage(),
        random.Random(1),
    )
    node.campaign()
    node.step(Message(MessageType.PRE_VOTE_RESPONSE, 2, 1, 1))
    node.step(Message(MessageType.VOTE_RESPONSE, 2, 1, 1))
    assert node.role == Role.LEADER
    return node


def test_uncommitted_proposal_times_out() -> None:
    # shorter than the election timeout, so check quorum does not depose it first
    node = leader_of_three(proposal_timeout_ms=ELECTION_TIMEOUT_MS // 2)
    entry_id = node.propose(b"lost")
    node.advance(node.ready())
    node.tick(ELECTION_TIMEOUT_MS // 2)
    failed = node.ready().failed_proposals
    assert [(f.entry_id, f.reason) for f in failed] == [(entry_id, FailureReason.TIMEOUT)]


def test_leader_that_hears_no_majority_steps_down() -> None:
    node = leader_of_three()
    node.advance(node.ready())
    node.tick(ELECTION_TIMEOUT_MS - 1)
    node.step(Message(MessageType.PUSH_RESPONSE, 3, 1, 1, req_type=MessageType.COMMIT))
    node.tick(ELECTION_TIMEOUT_MS + 1)  # 2 is silent, but 3 answered recently
    assert node.role == Role.LEADER
    node.tick(2 * ELECTION_TIMEOUT_MS)  # now 3 has been silent for a timeout as well
    assert node.role == Role.FOLLOWER and node.leader_id == 0


def test_stepping_down_fails_pending_proposals() -> None:
    node = leader_of_three()
    entry_id = node.propose(b"x")
    node.advance(node.ready())
    node.step(Message(MessageType.COMMIT, 3, 1, term=5))  # a newer leader
    assert node.role == Role.FOLLOWER and node.leader_id == 3
    ready = node.ready()
    assert [f.reason for f in ready.failed_proposals] == [FailureReason.LEADERSHIP_LOST]
    assert ready.failed_proposals[0].entry_id == entry_id
    assert ready.hard_state is not None and ready.hard_state.term == 5


def test_vote_is_persisted_in_the_same_ready_as_its_answer() -> None:
    config = RaftConfig(node_id=2, member_ids=(1, 2, 3), empty_disk_guard=False)
    node = RawNode(config, MemoryStorage(), random.Random(1))
    node.step(Message(MessageType.VOTE, 1, 2, term=1))
    ready = node.ready()
    assert ready.hard_state is not None and ready.hard_state.voted_for == 1
    assert [m.type for m in ready.messages] == [MessageType.VOTE_RESPONSE]


def test_restart_recovers_term_vote_log_and_commit(tmp_path: Path) -> None:
    node, storage = single(FileStorage(tmp_path))
    node.campaign()
    node.propose(b"kept")
    drain(node, storage)
    assert isinstance(storage, FileStorage)
    storage.close()
    restarted, _ = single(FileStorage(tmp_path))
    assert restarted.term == 1 and restarted.voted_for == 1
    assert restarted.committed_index == 1
    replay = restarted.ready()
    assert [e.data for e in replay.committed_entries] == [b"", b"kept"]


def test_unknown_sender_is_a_typed_error() -> None:
    node, _ = single()
    with pytest.raises(UnknownPeerError):
        node.step(Message(MessageType.COMMIT, 7, 1, 1))


def test_transfer_needs_a_leader_and_a_member() -> None:
    node, _ = single()
    with pytest.raises(NotLeaderError):
        node.transfer_leadership(1)
    leader, _ = elected_single()
    with pytest.raises(UnknownPeerError):
        leader.transfer_leadership(4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"node_id": 4, "member_ids": (1, 2, 3)},
        {"node_id": 1, "member_ids": (1, 1)},
        {"node_id": 0, "member_ids": (0, 1)},
        {"node_id": 1, "member_ids": (1,), "heartbeat_interval_ms": ELECTION_TIMEOUT_MS},
        {"node_id": 1, "member_ids": (1,), "max_pending_pushes": 0},
    ],
)
def test_bad_config_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        RaftConfig(**kwargs)


def test_entry_ids_identify_proposals() -> None:
    node, _storage = elected_single()
    assert node.propose(b"x") == EntryId(term=1, index=1)
