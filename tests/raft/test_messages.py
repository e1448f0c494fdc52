from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hamq.raft import Entry, Message, MessageDecodeError, MessageType, ResponseCode

ints = st.integers(min_value=-1, max_value=2**40)
entry_strategy = st.builds(
    Entry, index=ints, term=ints, data=st.binary(max_size=64), is_noop=st.booleans()
)
message_strategy = st.builds(
    Message,
    type=st.sampled_from(MessageType),
    from_id=ints,
    to_id=ints,
    term=ints,
    index=ints,
    log_term=ints,
    entries=st.lists(entry_strategy, max_size=3).map(tuple),
    committed_index=ints,
    code=st.sampled_from(ResponseCode),
    req_type=st.none() | st.sampled_from(MessageType),
    begin_index=ints,
    end_index=ints,
    next_term=ints,
    force=st.booleans(),
    water_mark=ints,
    probe=ints,
)


@given(message_strategy)
def test_encode_decode_round_trip(msg: Message) -> None:
    assert Message.decode(msg.encode()) == msg


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\xa3abc"])
def test_garbage_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(MessageDecodeError):
        Message.decode(data)


def test_unknown_message_type_is_a_typed_error() -> None:
    good = Message(MessageType.COMMIT, 1, 2, 3).encode()
    bad = bytearray(good)
    bad[1] = 0x7F  # the type field: no such MessageType
    with pytest.raises(MessageDecodeError):
        Message.decode(bytes(bad))
