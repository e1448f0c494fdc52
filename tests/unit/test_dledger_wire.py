"""The DLedger transport's framing of Raft messages: the entries' data travel as their own
pieces (shared by every follower's frame) and come back intact."""

from __future__ import annotations

import pytest

from hamq.broker.dledger.wire import decode_message, encode_message
from hamq.raft import Entry, Message, MessageDecodeError, MessageType


@pytest.mark.parametrize(
    "entries",
    [
        (),
        (Entry(8, 2, b""),),
        (Entry(8, 2, b"", is_noop=True),),
        (Entry(8, 3, b"x" * 70_000),),
        (Entry(8, 3, b"a"), Entry(9, 3, b""), Entry(10, 3, b"c" * 9)),
    ],
)
def test_round_trip(entries):
    msg = Message(
        MessageType.APPEND, 1, 2, 3, index=8, log_term=2, entries=entries, committed_index=5
    )
    pieces = encode_message(msg)
    assert decode_message(b"".join(pieces)) == msg
    if any(e.data for e in entries):  # the data pieces are the entries' own objects
        assert all(p is e.data for p, e in zip(pieces[-len(entries) :], entries))


@pytest.mark.parametrize(
    "body",
    [
        b"\x00",
        b"".join(
            encode_message(
                Message(MessageType.APPEND, 1, 2, 3, index=8, entries=(Entry(8, 3, b"abc"),))
            )
        )[:-1],
    ],
)
def test_truncated_frame_is_a_decode_error(body):
    with pytest.raises(MessageDecodeError):
        decode_message(body)
