"""The driver's side of the sink: END_TRANSACTION for the halves its tasks wrote, and the
order of decisions that makes a batch write all or nothing and a streaming write
exactly once.

A decision is final: END_TRANSACTION of a half already decided the same way succeeds, and
the other way raises (``TransactionRolledBack`` / ``TransactionCommitted``), so a half is
never silently left out. Undecided halves are retried until every one is decided or the
sink's timeout passes (a group without a master, a lost answer); the sink then raises with
the batch still in its journal, and whoever runs next (Spark's ``abort``, the restarted
query's replay) finishes it the same way.

Streaming (``commit_micro_batch`` / ``abort_micro_batch``): the journal entry ``(B,
halves)`` is the commit point. Once it is appended — even by an append whose answer was
lost — ``B`` only rolls forward: ``abort`` commits a journaled batch rather than rolling
it back. An abort that does not find ``B`` journaled first fences the journal (appends its
last entry again at the offset a lost append of ``B`` would take), so that append can no
longer land after the rollback.

Batch writes (``commit_batch`` / ``abort_batch``): the first half (by group and offset) is
the commit point: ``commit`` decides it alone before the others, and ``abort`` rolls it
back first — when it finds it committed, it commits the rest instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hamq.client.admin import AsyncAdmin
from hamq.client.core import ClientCore
from hamq.clock import monotonic_s
from hamq.errors import (
    BrokerNotFound,
    ConnectionLost,
    NoPermission,
    NotLeader,
    RequestTimeout,
    ServiceNotAvailable,
    TransactionCommitted,
    TransactionRolledBack,
)
from hamq.protocol.codes import RequestCode
from hamq.protocol.transaction import TransactionState
from hamq.spark.failpoint import Failpoint
from hamq.spark.journal import NO_BATCH, Halves, JournalEntry, JournalError, SinkJournal

END_TRANSACTIONS_IN_FLIGHT = 512
RETRY_PAUSE_S = 0.2
FENCE_ATTEMPTS = 3

COMMIT = TransactionState.COMMIT_MESSAGE
ROLLBACK = TransactionState.ROLLBACK_MESSAGE

# An END_TRANSACTION that may be answered if sent again: no master (yet), a lost answer.
_RETRIABLE = (
    BrokerNotFound,
    ConnectionLost,
    NoPermission,
    NotLeader,
    RequestTimeout,
    ServiceNotAvailable,
    TimeoutError,
)


@dataclass(frozen=True)
class Decider:
    """Ends halves of one producer group, retrying for up to ``wait_s`` per call."""

    core: ClientCore
    group: str
    wait_s: float

    async def end(self, halves: Halves, state: TransactionState) -> None:
        """END_TRANSACTION ``state`` for every half, until each is decided. A half decided
        the other way raises at once (its rows are missing, or visible when they must not
        be); halves still undecided at the deadline raise ``ServiceNotAvailable``."""
        pending = {(b, o) for b, offsets in halves.items() for o in offsets}
        deadline = monotonic_s() + self.wait_s
        while pending:
            masters = await AsyncAdmin(core=self.core).master_addrs()
            ready = sorted(h for h in pending if h[0] in masters)
            for i in range(0, len(ready), END_TRANSACTIONS_IN_FLIGHT):
                chunk = ready[i : i + END_TRANSACTIONS_IN_FLIGHT]
                results = await asyncio.gather(
                    *(self._end_one(masters[b], o, state) for b, o in chunk),
                    return_exceptions=True,
                )
                for half, result in zip(chunk, results):
                    if result is None:
                        pending.discard(half)
                    elif not isinstance(result, _RETRIABLE):
                        raise _decided_otherwise(half, result)
            if not pending:
                return
            if monotonic_s() > deadline:
                groups = sorted({b for b, _ in pending})
                raise ServiceNotAvailable(
                    f"{len(pending)} half batches in broker groups {groups} are not "
                    f"{'committed' if state is COMMIT else 'rolled back'} after "
                    f"{self.wait_s:.0f} s (no master answered); they stay invisible until "
                    "the query's restart or Spark's abort decides them"
                )
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _end_one(self, addr: str, offset: int, state: TransactionState) -> None:
        await self.core.invoke(
            addr,
            RequestCode.END_TRANSACTION,
            {
                "group": self.group,
                "tran_state_table_offset": offset,
                "commit_or_rollback": state.value,
            },
        )


def _decided_otherwise(half: tuple[str, int], err: BaseException) -> BaseException:
    broker, offset = half
    if isinstance(err, TransactionRolledBack):
        return TransactionRolledBack(
            f"half batch {offset} of broker group {broker} was already rolled back, so its "
            "rows are missing from the sink's output; the commit is refused rather than "
            f"reported as done ({err.message})"
        )
    if isinstance(err, TransactionCommitted):
        return TransactionCommitted(
            f"half batch {offset} of broker group {broker} is already committed; it cannot "
            f"be rolled back ({err.message})"
        )
    return err


def without(halves: Halves, taken: Halves) -> Halves:
    """``halves`` less those in ``taken``: a replay's (or an abort's) own halves that the
    journal does not name."""
    rest = {
        b: [o for o in offsets if o not in set(taken.get(b, ()))] for b, offsets in halves.items()
    }
    return {b: offsets for b, offsets in rest.items() if offsets}


# -- batch writes ------------------------------------------------------------------------
def commit_point(halves: Halves) -> tuple[Halves, Halves]:
    """The first half (smallest group name, then offset) and all the others."""
    if not halves:
        return {}, {}
    broker = min(b for b, offsets in halves.items() if offsets)
    first = min(halves[broker])
    return {broker: [first]}, without(halves, {broker: [first]})


async def commit_batch(decider: Decider, halves: Halves) -> None:
    first, rest = commit_point(halves)
    await decider.end(first, COMMIT)
    await decider.end(rest, COMMIT)


async def abort_batch(decider: Decider, halves: Halves) -> None:
    first, rest = commit_point(halves)
    try:
        await decider.end(first, ROLLBACK)
    except TransactionCommitted:
        await decider.end(rest, COMMIT)  # the commit passed its commit point: finish it
        return
    await decider.end(rest, ROLLBACK)


# -- streaming writes --------------------------------------------------------------------
async def commit_micro_batch(
    journal: SinkJournal, decider: Decider, batch_id: int, halves: Halves, failpoint: Failpoint
) -> None:
    tail = await journal.tail()
    last = tail.last
    if last is not None and last.batch_id > batch_id:
        raise JournalError(
            f"the sink journal {journal.topic} has micro-batch {last.batch_id} committed, "
            f"but Spark asks to commit {batch_id}: the query's checkpoint was reset or "
            "restored at the same path while its query id stayed the same. Nothing of "
            f"batch {batch_id} was made visible. Restart the query from a new checkpoint, "
            "or delete the journal (hamq admin spark-journals --delete) to accept repeats"
        )
    if last is not None and last.batch_id == batch_id:
        await roll_forward(decider, last, halves)  # a replay of a journaled batch
        return
    failpoint.reached("before_journal", batch_id)
    if not await journal.append(JournalEntry(batch_id, halves), tail.end):
        raise JournalError(
            f"another driver journaled entry {tail.end} of the sink journal {journal.topic} "
            f"first: two queries run on one checkpoint. This driver's micro-batch {batch_id} "
            "is not committed"
        )
    failpoint.reached("after_journal", batch_id)
    await decider.end(halves, COMMIT)
    failpoint.reached("after_commit", batch_id)


async def abort_micro_batch(
    journal: SinkJournal, decider: Decider, batch_id: int, halves: Halves
) -> None:
    for _ in range(FENCE_ATTEMPTS):
        tail = await journal.tail()
        last = tail.last
        if last is not None and last.batch_id == batch_id:
            await roll_forward(decider, last, halves)
            return
        if last is not None and last.batch_id > batch_id:
            await decider.end(without(halves, last.halves), ROLLBACK)
            return
        if not halves:
            return
        fence = last or JournalEntry(NO_BATCH, {})
        if await journal.append(fence, tail.end):
            await decider.end(halves, ROLLBACK)
            return
    raise JournalError(
        f"the sink journal {journal.topic} kept moving while micro-batch {batch_id} was "
        "aborted: another driver runs on the same checkpoint. Its halves are left undecided"
    )


async def roll_forward(decider: Decider, journaled: JournalEntry, own: Halves) -> None:
    """Commit the journaled halves and roll back the caller's others (a replay's)."""
    await decider.end(journaled.halves, COMMIT)
    await decider.end(without(own, journaled.halves), ROLLBACK)
