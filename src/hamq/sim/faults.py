"""Swarm testing: each seed draws its own cluster size and fault mix, so some runs are
calm and some are storms, and bugs that need one particular mix still get found."""

from __future__ import annotations

import random
from dataclasses import dataclass

CLUSTER_SIZES = (1, 3, 5)
FLUSH_DISK_TYPES = ("async", "sync")


@dataclass(frozen=True, slots=True)
class FaultMix:
    nodes: int
    drop_probability: float
    duplicate_probability: float
    delay_ms_max: int  # each message takes 1..delay_ms_max; the spread reorders them
    kill_probability: float  # per tick, that one live member's process dies (page cache kept)
    power_loss_probability: float  # per tick, that one member's machine loses power ("sync")
    clean_stop_probability: float  # per tick, that one live member is stopped cleanly
    # per tick, that one member's disk is replaced by an empty one (its votes lost too);
    # one at a time: only once the last one the group vouched for again
    disk_wipe_probability: float
    # per tick, that one member's disk fills up (until up to heal_ms_max later): writes of
    # the store and of the Raft log fail with ENOSPC
    disk_full_probability: float
    # whether the store refuses sends short of a full disk (RocketMQ's guard, normally on);
    # off, its own writes hit ENOSPC, undoing appends of the turn (bugs found only so)
    store_disk_guard: bool
    restart_ms_max: int  # a stopped member restarts after up to this long
    crash_during_persist_probability: float  # per Ready, a kill or power loss before it is written
    partition_probability: float  # per tick, that the network splits
    one_way_partitions: bool
    heal_ms_max: int
    proposal_probability: float  # per tick, that a client sends (1..3 messages at once)
    topic_probability: float  # per tick, that an admin creates or updates a topic
    transfer_probability: float  # per tick, that the leader is asked to hand over
    # batch-push bounds: one send command is ~150 bytes, so 16 bytes means one entry a push
    max_entries_per_push: int
    max_push_bytes: int
    # the stores: both flush types, small files so segments roll, and when things get fsynced
    flush_disk_type: str
    commitlog_segment_bytes: int
    raft_segment_bytes: int
    store_flush_ms: int  # the commit log's flush (with "sync": the group-commit period)
    raft_flush_ms: int  # the Raft log's fsync and checkpoint
    store_checkpoint_ms: int  # consume queues + store checkpoint (the applied claim)
    # per-member wall clocks (store timestamps): a fixed skew, and jumps either way
    clock_skew_ms_max: int
    clock_jump_probability: float
    clock_jump_ms_max: int


def choose_fault_mix(rng: random.Random, nodes: int | None, later_rng: random.Random) -> FaultMix:
    """`later_rng` draws the probabilities of faults added later (disk wipes, full disks)
    apart from `rng`, so a seed without them keeps the schedule it had."""
    flush_disk_type = rng.choice(FLUSH_DISK_TYPES)
    return FaultMix(
        nodes=nodes if nodes is not None else rng.choice(CLUSTER_SIZES),
        drop_probability=rng.choice((0.0, 0.01, 0.05, 0.2)),
        duplicate_probability=rng.choice((0.0, 0.02, 0.1)),
        delay_ms_max=rng.choice((2, 10, 40, 150)),
        kill_probability=rng.choice((0.0, 0.003, 0.01)),
        # "async" acknowledges what is in the page cache only (RocketMQ's ASYNC_FLUSH
        # contract): a power loss may then lose acknowledged data by design
        power_loss_probability=rng.choice((0.0, 0.0, 0.003, 0.01))
        if flush_disk_type == "sync"
        else 0.0,
        clean_stop_probability=rng.choice((0.0, 0.002, 0.005)),
        disk_wipe_probability=later_rng.choice((0.0, 0.0, 0.003, 0.01)),
        disk_full_probability=later_rng.choice((0.0, 0.0, 0.003, 0.01)),
        store_disk_guard=later_rng.choice((True, True, False)),
        restart_ms_max=rng.choice((100, 1000)),
        crash_during_persist_probability=rng.choice((0.0, 0.0, 0.01, 0.03)),
        partition_probability=rng.choice((0.0, 0.003, 0.01, 0.03)),
        one_way_partitions=rng.random() < 0.5,
        heal_ms_max=rng.choice((200, 1500)),
        proposal_probability=rng.choice((0.05, 0.3, 1.0)),
        topic_probability=rng.choice((0.0, 0.01)),
        transfer_probability=rng.choice((0.0, 0.0, 0.005, 0.02)),
        max_entries_per_push=rng.choice((1, 3, 64)),
        max_push_bytes=rng.choice((16, 1024 * 1024)),
        flush_disk_type=flush_disk_type,
        commitlog_segment_bytes=rng.choice((2048, 64 * 1024)),
        raft_segment_bytes=rng.choice((1024, 64 * 1024)),
        # with "sync" the group commit runs every 10 ms, or lags behind a slow disk
        store_flush_ms=rng.choice((10, 100, 500) if flush_disk_type == "sync" else (20, 100, 500)),
        raft_flush_ms=rng.choice((20, 100, 500)),
        store_checkpoint_ms=rng.choice((50, 200, 1000)),
        clock_skew_ms_max=rng.choice((0, 5_000, 3_600_000)),
        clock_jump_probability=rng.choice((0.0, 0.001, 0.01)),
        clock_jump_ms_max=rng.choice((1_000, 3_600_000)),
    )
