"""Swarm testing: each seed draws its own cluster size and fault mix, so some runs are
calm and some are storms, and bugs that need one particular mix still get found."""

from __future__ import annotations

import random
from dataclasses import dataclass

CLUSTER_SIZES = (1, 3, 5)


@dataclass(frozen=True, slots=True)
class FaultMix:
    nodes: int
    drop_probability: float
    duplicate_probability: float
    delay_ms_max: int  # each message takes 1..delay_ms_max; the spread reorders them
    crash_probability: float  # per tick, that one live node crashes
    restart_ms_max: int  # a crashed node restarts after up to this long
    crash_during_persist_probability: float  # per Ready, a crash before its sync
    partition_probability: float  # per tick, that the network splits
    one_way_partitions: bool
    heal_ms_max: int
    proposal_probability: float  # per tick, that a client proposes
    transfer_probability: float  # per tick, that the leader is asked to hand over
    # batch-push bounds: workload entries are ~10 bytes, so 16 bytes means one or two
    max_entries_per_push: int
    max_push_bytes: int


def choose_fault_mix(rng: random.Random, nodes: int | None) -> FaultMix:
    return FaultMix(
        nodes=nodes if nodes is not None else rng.choice(CLUSTER_SIZES),
        drop_probability=rng.choice((0.0, 0.01, 0.05, 0.2)),
        duplicate_probability=rng.choice((0.0, 0.02, 0.1)),
        delay_ms_max=rng.choice((2, 10, 40, 150)),
        crash_probability=rng.choice((0.0, 0.002, 0.005, 0.01)),
        restart_ms_max=rng.choice((100, 1000)),
        crash_during_persist_probability=rng.choice((0.0, 0.0, 0.01, 0.03)),
        partition_probability=rng.choice((0.0, 0.003, 0.01, 0.03)),
        one_way_partitions=rng.random() < 0.5,
        heal_ms_max=rng.choice((200, 1500)),
        proposal_probability=rng.choice((0.05, 0.3, 1.0)),
        transfer_probability=rng.choice((0.0, 0.0, 0.005, 0.02)),
        max_entries_per_push=rng.choice((1, 3, 64)),
        max_push_bytes=rng.choice((16, 1024 * 1024)),
    )
