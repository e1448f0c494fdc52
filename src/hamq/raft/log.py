"""Log records shared by the core, its storage and its messages.

Indices start at 0 as in DLedger: an empty log has `ledger_end_index == EMPTY_INDEX`.
"""

from __future__ import annotations

from dataclasses import dataclass

EMPTY_INDEX = -1  # ledger_end_index of an empty log (DLedger's initial value)
NO_TERM = 0  # the term "before" any entry; real terms start at 1
NO_NODE = 0  # voted_for / leader_id when there is none; member ids are >= 1
# voted_for of a member that started on an empty disk (a disk lost or replaced looks just
# like a new one): it may have voted in any term before, so it votes in none until the
# group vouches for it (node.py, "A member that started on an empty disk")
UNKNOWN_VOTE = -1


@dataclass(frozen=True, slots=True)
class Entry:
    """One log record. `data == b""` with `is_noop` marks the leader's election no-op."""

    index: int
    term: int
    data: bytes
    is_noop: bool = False


@dataclass(frozen=True, slots=True)
class EntryId:
    """Identifies a proposal: the term it was proposed in and the index it got."""

    term: int
    index: int


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before a vote or an append is answered."""

    term: int = NO_TERM
    voted_for: int = NO_NODE


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """DLedger's checkpoint file: where the log ends and how much of it is committed."""

    ledger_end_index: int = EMPTY_INDEX
    committed_index: int = EMPTY_INDEX
