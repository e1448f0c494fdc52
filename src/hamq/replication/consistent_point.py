"""Where a member's log stops agreeing with its master's, from their epoch entries alone.

Every member keeps its master epochs (the seed's election metadata: ``epoch`` and
``maxOffset`` register with the controller) as (epoch, start offset) entries — RocketMQ 5's
``EpochFileCache``, Kafka's leader-epoch checkpoint. One epoch has exactly one master, and
that master only appends while its epoch lasts; a member records an epoch only once its
log matched that master's up to the epoch's start. So two members holding the same epoch
hold the same records from 0 up to where either one's copy of that epoch ends, and nothing
is known to agree after that. Before copying from a new master, a slave (or a deposed
master coming back) truncates to this consistent point (RocketMQ's
``AutoSwitchHAConnection`` / ``EpochFileCache.findConsistentPoint``, Kafka's
``OffsetsForLeaderEpoch``), so a member never copies over a log that disagrees.

The match is on the epoch number alone, as in Kafka. RocketMQ also compares the two start
offsets; retention here raises the first entry's start to the new first offset (see
``hamq.store.epoch_file``), so equal epochs may start at different offsets and still hold
the same records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Master epoch ``epoch`` wrote its first record at log offset ``start_offset``."""

    epoch: int
    start_offset: int


def epoch_ends(entries: Sequence[EpochEntry], log_end: int) -> dict[int, int]:
    """Each epoch's end offset in this log: the next entry's start, or the log end for the
    last one; never past the log end, since a power loss can take records that an fsynced
    epoch file still names."""
    starts = [entry.start_offset for entry in entries[1:]] + [log_end]
    return {entry.epoch: min(end, log_end) for entry, end in zip(entries, starts)}


def find_consistent_point(
    master: Sequence[EpochEntry],
    master_log_end: int,
    slave: Sequence[EpochEntry],
    slave_log_end: int,
) -> int:
    """The offset up to which the slave's log agrees with the master's.

    Take the slave's largest epoch the master also has (walking down past epochs the master
    never had: a deposed master's unreplicated tail); the logs agree up to the smaller of
    the two ends of that epoch. 0 when they share no epoch: the slave copies everything.
    """
    master_ends = epoch_ends(master, master_log_end)
    slave_ends = epoch_ends(slave, slave_log_end)
    for entry in reversed(slave):
        if entry.epoch in master_ends:
            return min(slave_ends[entry.epoch], master_ends[entry.epoch])
    return 0
