"""Configuration of one Raft member; every limit is a named default with its reason."""

from __future__ import annotations

from dataclasses import dataclass

from hamq.errors import ConfigError

# A follower waits this long without hearing from a leader, plus a random extra of up to
# the same again, before campaigning; the spread makes split votes rare.
ELECTION_TIMEOUT_MS = 300
# The leader's idle COMMIT heartbeat; several fit in one election timeout.
HEARTBEAT_INTERVAL_MS = 60
# An APPEND/COMPARE/TRUNCATE left unanswered this long is sent again (lost message).
PUSH_TIMEOUT_MS = 120
# A proposal not committed within this long is reported failed (its outcome unknown).
PROPOSAL_TIMEOUT_MS = 3000
# Unanswered APPENDs in flight per follower (DLedger's maxPendingSize); bounds memory.
MAX_PENDING_PUSHES = 64
# One APPEND carries consecutive entries up to these bounds (DLedger's batch push): a
# follower writes and answers a run of entries at once instead of one message per entry.
# An entry larger than the byte bound still travels, alone.
MAX_ENTRIES_PER_PUSH = 64
MAX_PUSH_BYTES = 1024 * 1024
# Committed entries handed out per Ready, so one Ready stays a bounded batch.
MAX_COMMITTED_PER_READY = 1024


@dataclass(frozen=True, slots=True)
class RaftConfig:
    node_id: int
    member_ids: tuple[int, ...]  # the whole group, this member included
    election_timeout_ms: int = ELECTION_TIMEOUT_MS
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    push_timeout_ms: int = PUSH_TIMEOUT_MS
    proposal_timeout_ms: int = PROPOSAL_TIMEOUT_MS
    max_pending_pushes: int = MAX_PENDING_PUSHES
    max_entries_per_push: int = MAX_ENTRIES_PER_PUSH
    max_push_bytes: int = MAX_PUSH_BYTES
    max_committed_per_ready: int = MAX_COMMITTED_PER_READY
    pre_vote: bool = True
    # a member that starts on an empty disk neither votes nor campaigns until the group
    # vouches for it (node.py says why); only tests of the bare protocol, which start every
    # member empty and elect in one step, turn it off
    empty_disk_guard: bool = True

    def __post_init__(self) -> None:
        if len(set(self.member_ids)) != len(self.member_ids):
            raise ConfigError(f"duplicate member ids in {self.member_ids}")
        if any(m < 1 for m in self.member_ids):
            raise ConfigError("member ids must be >= 1 (0 means 'nobody')")
        if self.node_id not in self.member_ids:
            raise ConfigError(f"node {self.node_id} is not in {self.member_ids}")
        limits = (
            self.election_timeout_ms,
            self.heartbeat_interval_ms,
            self.push_timeout_ms,
            self.proposal_timeout_ms,
            self.max_pending_pushes,
            self.max_entries_per_push,
            self.max_push_bytes,
            self.max_committed_per_ready,
        )
        if min(limits) <= 0:
            raise ConfigError("timeouts and limits must be positive")
        if self.heartbeat_interval_ms >= self.election_timeout_ms:
            raise ConfigError("heartbeats must come faster than the election timeout")
        if self.push_timeout_ms >= self.election_timeout_ms:
            raise ConfigError("a resent push must arrive before followers time out")

    @property
    def peer_ids(self) -> tuple[int, ...]:
        return tuple(m for m in self.member_ids if m != self.node_id)
