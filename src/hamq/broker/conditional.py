"""Conditional appends (hamq's, for the Spark sink's journal, a compare-and-set on a queue's
end as Delta's transaction ids and Iceberg's snapshot check): a send carrying
``expected_queue_offset`` is stored only if the queue's next offset equals it at the moment
its put is ordered, else it is answered QUEUE_OFFSET_MISMATCH with the queue's ``end_offset``
and nothing is stored.

Where the put is ordered, the check is atomic with it: on a master (async or sync, in
controller mode too) the event loop's ``put_batch``, one thread, so two racing sends cannot
both find the same end; in a DLedger group when the entry is applied, where every member
applies the same entries in the same order and so decides alike (the leader's view before
its proposal commits would not be). A mismatch answered in an event-loop turn whose write
then fails (disk full undoes the turn's appends) may name an end that the undo took back:
the caller reads the queue again, as after a timeout.
"""

from __future__ import annotations

from hamq.errors import QueueOffsetMismatch
from hamq.net.connection import response_pieces
from hamq.protocol.frame import Frame
from hamq.store.message_store import MessageStore

UNCONDITIONAL = -1  # a send without expected_queue_offset


def queue_offset_mismatch(
    store: MessageStore, topic: str, queue_id: int, expected: int
) -> QueueOffsetMismatch | None:
    """None if queue ``queue_id`` of ``topic`` ends at ``expected`` (or the send is
    unconditional), else the error to answer."""
    if expected == UNCONDITIONAL:
        return None
    end = store.max_offset(topic, queue_id)
    if end == expected:
        return None
    return QueueOffsetMismatch(
        f"queue {queue_id} of topic {topic!r} ends at offset {end}, not at the expected "
        f"{expected}: nothing was stored",
        end,
    )


def mismatch_pieces(request: Frame, err: QueueOffsetMismatch) -> list:
    """The answer to a conditional send that found the queue elsewhere: its end travels in
    ``ext`` (``HamqError.for_code`` reads it back)."""
    return response_pieces(
        request, err.code, ext={"end_offset": err.end_offset}, remark=err.message
    )
