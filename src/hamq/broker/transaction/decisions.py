"""Transaction decisions an acting master took (seed 004), kept as metadata beside the log.

A master logs a decision as an op record in ``RMQ_SYS_TRANS_OP_HALF_TOPIC``; an acting
master may not append to its commit log (the group's log would fork), so it keeps its
decisions here instead: half-queue offset -> [the half message's commit-log offset, the
verdict] (a bare commit-log offset in tables written before verdicts were kept), in a
versioned table written (fsynced, by rename) before END_TRANSACTION is answered. Check-back
then never asks about them again and a restart of the acting member keeps them; a returning
master takes them at pre-online (``merge``, GET_TRANSACTION_DECISIONS), so its check-back
does not decide them a second time.

The commit-log offset pins the decision to the very half message: a member whose log was
cut and written again (a slave attaching to a master with a shorter log) may hold another
half at the same queue offset, and that one is not decided. The verdict travels with the
decision (on restart, to the other members, to a returning master), so END_TRANSACTION of
the opposite decision is refused there too, never answered SUCCESS: the Spark sink relies
on that not to leave a batch partly visible or report rows it lost as committed.
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

# a commit-log offset, or [commit-log offset, verdict (a TransactionState value)]
Decision = int | list


class TransactionDecisions:
    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self._t = VersionedTable(directory / DECISIONS_FILE, now_ms, disk=disk)
        found = self._t.table.get(_DECIDED, {})
        self._t.table[_DECIDED] = kept = well_formed_decisions(found)
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
        return {int(half): _physical(d) for half, d in self._t.table[_DECIDED].items()}

    def verdicts(self) -> dict[int, str]:
        """Half-queue offset -> the verdict, for the decisions that name theirs."""
        return {int(h): d[1] for h, d in self._t.table[_DECIDED].items() if type(d) is list}

    def shared(self, halves: set[int] | None = None) -> dict[str, Decision]:
        """The decisions (of ``halves`` only, if given) as kept: what members hand on."""
        table = self._t.table[_DECIDED]
        return {h: d for h, d in table.items() if halves is None or int(h) in halves}

    def record(
        self, half_offset: int, physical_offset: int, now_ms: int, verdict: str | None = None
    ) -> TableSnapshot:
        """Add a decision (with its verdict, if known); returns the snapshot to ``write``
        before the answer."""
        decision = physical_offset if verdict is None else [physical_offset, verdict]
        self._t.table[_DECIDED][str(half_offset)] = decision
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
            self._t.table[_DECIDED] = self.shared(set(keep))
            self._t.touch(now_ms)
            self._t.persist()

    def merge(self, decided: dict[str, Decision], now_ms: int) -> TableSnapshot | None:
        """Take another member's decisions (a decision is a fact: the union is kept);
        returns the snapshot to ``write`` before anyone is told they are kept, None if
        none was new."""
        table = self._t.table[_DECIDED]
        new = {half: d for half, d in well_formed_decisions(decided).items() if half not in table}
        if not new:
            return None
        table.update(new)
        self._t.touch(now_ms)
        return self._t.snapshot()


def well_formed_decisions(found: Any) -> dict[str, Decision]:
    """The decisions of a read table that are half offset -> a ``Decision``."""
    if not isinstance(found, dict):
        return {}
    return {str(h): d for h, d in found.items() if str(h).isdecimal() and _is_decision(d)}


def _is_decision(d: Any) -> bool:
    if type(d) is int:
        return True
    return type(d) is list and len(d) == 2 and type(d[0]) is int and isinstance(d[1], str)


def _physical(d: Decision) -> int:
    return d if type(d) is int else d[0]
