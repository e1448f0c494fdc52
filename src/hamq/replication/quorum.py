"""RIP-34 quorum write: how many replicas must hold a message before the master answers.

Pure functions of the numbers the seed names, so every branch is testable as data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuorumConfig:
    total_replicas: int = 1  # totalReplicas
    in_sync_replicas: int = 1  # inSyncReplicas
    min_in_sync_replicas: int = 1  # minInSyncReplicas
    enable_auto_in_sync_replicas: bool = False  # enableAutoInSyncReplicas
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024  # haMaxGapNotInSync (bytes)


def is_in_sync(master_offset: int, slave_ack_offset: int, max_gap: int) -> bool:
    """A slave is in sync while it lags the master by less than ``haMaxGapNotInSync``."""
    return master_offset - slave_ack_offset < max_gap


def in_sync_replicas_now(alive_replicas_in_group: int, in_sync_slaves: int) -> int:
    """``min(aliveReplicaNumInGroup, inSyncSlaveNums + 1)``: the master counts itself."""
    return min(alive_replicas_in_group, in_sync_slaves + 1)


def calc_need_ack_nums(config: QuorumConfig, in_sync_replicas: int) -> int:
    """The seed's ``calcNeedAckNums``: the configured count, lowered to what is in sync and
    raised back to the floor when automatic degradation is on."""
    need = config.in_sync_replicas
    if config.enable_auto_in_sync_replicas:
        need = min(need, in_sync_replicas)
        need = max(need, config.min_in_sync_replicas)
    return need


@dataclass(frozen=True)
class AckDecision:
    need_ack_nums: int
    in_sync_replicas: int

    @property
    def enough(self) -> bool:
        """False means IN_SYNC_REPLICAS_NOT_ENOUGH: refuse the send before storing it."""
        return self.need_ack_nums <= self.in_sync_replicas

    @property
    def wait_for_slaves(self) -> bool:
        return self.need_ack_nums > 1


def decide(config: QuorumConfig, alive_replicas_in_group: int, in_sync_slaves: int) -> AckDecision:
    in_sync = in_sync_replicas_now(alive_replicas_in_group, in_sync_slaves)
    return AckDecision(calc_need_ack_nums(config, in_sync), in_sync)
