"""Waiting for broker-internal writes to be durable under the configured flush type.

Delay delivery, send-back copies, transaction decisions and pop acks are written by the
broker itself; whatever depends on them (a progress table, a consumer's committed offset,
an answer to a client) may only move once they are as durable as a producer's send would
be: in the page cache under async flush (the promise of ``flush_disk_type = "async"``),
fsynced under sync flush.
"""

from __future__ import annotations

from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import ResponseCode
from hamq.protocol.frame import Frame
from hamq.store.flush import FlushCallback, FlushService


def when_durable(flush: FlushService, end_offset: int, callback: FlushCallback) -> None:
    """``callback(True)`` once the commit log is durable up to ``end_offset`` (at once under
    async flush), ``callback(False)`` if the sync flush timed out."""
    if flush.sync:
        flush.wait_flushed(end_offset, callback)
    else:
        callback(True)


def answer_when_durable(
    flush: FlushService,
    conn: Connection,
    frame: Frame,
    end_offset: int | None,
    ext: dict,
    what: str,
) -> list | None:
    """The success answer of a request whose write ends at ``end_offset`` (None: nothing
    written): at once under async flush, after the fsync under sync flush, or
    FLUSH_DISK_TIMEOUT (``what`` stored, as for a send) past ``sync_flush_timeout_ms``."""
    if end_offset is None or not flush.sync:
        return response_pieces(frame, ext=ext)

    def flushed(ok: bool) -> None:
        conn.reply(
            response_pieces(frame, ext=ext)
            if ok
            else response_pieces(
                frame,
                ResponseCode.FLUSH_DISK_TIMEOUT,
                ext=ext,
                remark=f"flush to disk timed out; {what} stored",
            )
        )

    flush.wait_flushed(end_offset, flushed)
    return None
