"""Transaction decisions an acting master took (seed 004), kept as metadata beside the log.

A master logs a decision as an op record in ``RMQ_SYS_TRANS_OP_HALF_TOPIC``; an acting
master may not append to its commit log (the group's log would fork), so it keeps its
decisions here instead: half-queue offset -> the half message's commit-log offset, in a
versioned table written (fsynced, by rename) before END_TRANSACTION is answered. Check-back
then never asks about them again and a restart of the acting member keeps them; a returning
master takes them at pre-online (``merge``, GET_TRANSACTION_DECISIONS), so its check-back
does not decide them a second time.

The commit-log offset pins the decision to the very half message: a member whose log was
cut and written again (a slave attaching to a master with a shorter log) may hold another
half at the same queue offset, and that one is not decided.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hamq.store.disk import OS_DISK, Disk
from hamq.store.metadata import TableSnapshot, VersionedTable

log = logging.getLogger(__name__)

DECISIONS_FILE = "transaction_decisions.json"
_DECIDED = "decided"


class TransactionDecisions:
    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self._t = VersionedTable(directory / DECISIONS_FILE, now_ms, disk=disk)
        found = self._t.table.get(_DECIDED, {})
        self._t.table[_DECIDED] = kept = _well_formed(found)
        if kept != found:
            # read on every start of the transaction services: damage must not stop them
            log.error(
                "%s: dropped damaged transaction decisions (their halves are checked again): %r",
                self._t.path,
                {k: v for k, v in found.items() if k not in kept}
                if isinstance(found, dict)
                else found,
            )

    def decided(self) -> dict[int, int]:
        """Half-queue offset -> the half message's commit-log offset."""
        return {int(half): physical for half, physical in self._t.table[_DECIDED].items()}

    def record(self, half_offset: int, physical_offset: int, now_ms: int) -> TableSnapshot:
        """Add a decision; returns the snapshot to ``write`` before the answer."""
        self._t.table[_DECIDED][str(half_offset)] = physical_offset
        self._t.touch(now_ms)
        snapshot = self._t.snapshot()
        assert snapshot is not None  # just touched
        return snapshot

    def write(self, snapshot: TableSnapshot) -> None:
        """Make ``snapshot`` durable (from a worker thread; a newer one already written wins)."""
        self._t.write(snapshot)

    def forget(self, keep: dict[int, int], now_ms: int) -> None:
        """Keep only ``keep`` (decisions whose half message is still retained and not
        decided by the op log as well)."""
        if keep != self.decided():
            self._t.table[_DECIDED] = {str(half): physical for half, physical in keep.items()}
            self._t.touch(now_ms)
            self._t.persist()

    def merge(self, decided: dict[int, int], now_ms: int) -> TableSnapshot | None:
        """Take another member's decisions (a decision is a fact: the union is kept);
        returns the snapshot to ``write`` before anyone is told they are kept, None if
        none was new."""
        table = self._t.table[_DECIDED]
        new = {str(half): physical for half, physical in decided.items() if str(half) not in table}
        if not new:
            return None
        table.update(new)
        self._t.touch(now_ms)
        return self._t.snapshot()


def _well_formed(found: Any) -> dict[str, int]:
    """The decisions of a read table that are half offset -> commit-log offset."""
    if not isinstance(found, dict):
        return {}
    return {
        half: physical
        for half, physical in found.items()
        if half.isdecimal() and type(physical) is int
    }
