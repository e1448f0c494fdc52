"""The batch of work the core hands its driver, to be done in order, then `advance`d."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from hamq.raft.log import Checkpoint, Entry, EntryId, HardState
from hamq.raft.messages import Message


class FailureReason(IntEnum):
    TIMEOUT = 1  # not committed in time; it may still commit later
    LEADERSHIP_LOST = 2  # this member stopped leading; a new leader may still commit it


@dataclass(frozen=True, slots=True)
class FailedProposal:
    entry_id: EntryId
    reason: FailureReason


@dataclass(slots=True)
class Ready:
    """Do, in this order: save `hard_state`, append `entries` (they replace the stored
    suffix from `entries[0].index`), save `checkpoint`, sync; only then send `messages`,
    apply `committed_entries` and report the proposal outcomes; then `advance(ready)`.
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    messages: list[Message] = field(default_factory=list)
    committed_entries: list[Entry] = field(default_factory=list)
    completed_proposals: list[EntryId] = field(default_factory=list)
    failed_proposals: list[FailedProposal] = field(default_factory=list)
