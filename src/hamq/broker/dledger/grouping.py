"""Which proposals share one Raft entry.

Sends (and topic changes) proposed in one event-loop turn become one entry, up to
MAX_GROUPED_ENTRY_BYTES, so pipelined single-message sends do not each cost an entry, an
APPEND and a write on every member. Each command keeps its own callback, answered with its
own result once the entry is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hamq.broker.dledger.wire import Command
from hamq.errors import HamqError
from hamq.store.message_store import PutResult

MAX_GROUPED_ENTRY_BYTES = 512 * 1024

ProposalCallback = Callable[[PutResult | None, HamqError | None], None]


@dataclass(slots=True)
class ProposalGroup:
    """Commands waiting to be proposed as one entry, and the callbacks answering them."""

    pieces: list = field(default_factory=list)
    callbacks: list[ProposalCallback] = field(default_factory=list)
    size: int = 0

    def fits(self, command: Command) -> bool:
        """Whether `command` may join this group (an empty group takes any size)."""
        return not self.size or self.size + sum(map(len, command)) <= MAX_GROUPED_ENTRY_BYTES

    def add(self, command: Command, callback: ProposalCallback) -> None:
        self.pieces += command
        self.callbacks.append(callback)
        self.size += sum(map(len, command))

    def data(self) -> bytes:
        return b"".join(self.pieces)
