"""The DLedger transport's framing of Raft messages: the entry data travels as its own
piece (shared by every follower's frame) and comes back intact."""
from __future__ import annotations

import pytest

from hamq.broker.dledger import decode_message, encode_message
from hamq.raft import Entry, Message, MessageDecodeError, MessageType


@pytest.mark.parametrize("entry", [None, Entry(7, 2, b""), Entry(7, 2, b"", is_noop=True),
                                   Entry(8, 3, b"x" * 70_000)])
def test_round_trip(entry):
    msg = Message(MessageType.APPEND, 1, 2, 3, index=8, log_term=2, entry=entry,
                  committed_index=5)
    pieces = encode_message(msg)
    assert decode_message(b"".join(pieces)) == msg
    if entry is not None and entry.data:
        assert pieces[-1] is entry.data  # not copied, not re-packed


def test_truncated_frame_is_a_decode_error():
    with pytest.raises(MessageDecodeError):
        decode_message(b"\x00")
