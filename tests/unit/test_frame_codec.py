"""Frame codec (``hamq.protocol.frame``): whatever way the bytes arrive, the decoder
returns exactly the frames that were encoded, and a peer breaking the framing rules gets
``BadFrame`` before the server buffers anything it declared."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.errors import BadFrame
from hamq.protocol.frame import PREFIX_BYTES, FrameDecoder, encode_frame_bytes
from hamq.protocol.limits import MAX_FRAME_BYTES

ext_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans(), st.binary(max_size=20)
)
frames = st.tuples(
    st.integers(0, 2**31 - 1),  # code
    st.integers(0, 2**32 - 1),  # opaque
    st.integers(0, 3),  # flags
    st.dictionaries(st.text(min_size=1, max_size=10), ext_values, max_size=5),
    st.text(max_size=50),  # remark
    st.binary(max_size=2000),  # body
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


@settings(max_examples=100, deadline=None)
@given(st.lists(frames, min_size=1, max_size=5), st.lists(st.integers(0, 10**6), max_size=12))
def test_round_trip_in_random_chunks(specs, cuts):
    """Frames fed in arbitrary pieces come out whole, in order, with every field equal."""
    stream = b"".join(encode_frame_bytes(*spec) for spec in specs)
    decoder = FrameDecoder()
    got = []
    for chunk in split(stream, cuts):
        got += decoder.feed(chunk)
    assert [(f.code, f.opaque, f.flags, f.ext, f.remark, f.body) for f in got] == [
        tuple(s) for s in specs
    ]
    assert decoder.last_opaque == specs[-1][1]


def test_truncated_input_yields_no_frame_until_complete():
    """A frame missing even its last byte is held back; the last byte completes it."""
    data = encode_frame_bytes(10, 7, 0, {"topic": "T"}, "", b"body" * 100)
    decoder = FrameDecoder()
    for i in range(len(data) - 1):
        assert decoder.feed(data[i : i + 1]) == []
    [frame] = decoder.feed(data[-1:])
    assert (frame.code, frame.opaque, frame.ext, frame.body) == (
        10,
        7,
        {"topic": "T"},
        b"body" * 100,
    )


@pytest.mark.parametrize(
    "header",
    [
        b"\xc1\xc1\xc1",  # not msgpack at all
        msgpack.packb({"code": 1}),  # a map, not the 5-array
        msgpack.packb([1, 2, 3]),  # wrong arity
        msgpack.packb(["ten", 1, 0, None, None]),  # code not an int
        msgpack.packb([10, 1, 0, [1, 2], None]),  # ext not a map
        msgpack.packb([10, 1, 0, None, 42]),  # remark not a string
    ],
)
def test_corrupted_header_raises_bad_frame(header):
    """A header that is not ``[code, opaque, flags, ext, remark]`` is a framing error."""
    body = b"xyz"
    data = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    with pytest.raises(BadFrame):
        FrameDecoder().feed(data)


@pytest.mark.parametrize(
    "total, header_len",
    [
        (100, 0),  # empty header
        (10, 200),  # header longer than the frame
        (10**6, 10**6 - 2),  # header over MAX_HEADER_BYTES
    ],
)
def test_inconsistent_lengths_raise_bad_frame(total, header_len):
    with pytest.raises(BadFrame):
        FrameDecoder().feed(struct.pack(">II", total, header_len))


def test_oversized_declaration_rejected_before_buffering():
    """A 2 GiB declaration fails on its 8-byte prefix alone: nothing waits for the rest."""
    with pytest.raises(BadFrame, match="limit"):
        FrameDecoder().feed(struct.pack(">II", 2 * 1024**3, 20))
    with pytest.raises(BadFrame):
        FrameDecoder().feed(struct.pack(">II", MAX_FRAME_BYTES + 1, 20))


def test_encoder_refuses_oversized_frame():
    with pytest.raises(BadFrame):
        encode_frame_bytes(10, 1, body=b"\0" * MAX_FRAME_BYTES)


def test_prefix_split_across_feeds():
    """Even the 8-byte length prefix may arrive in pieces."""
    data = encode_frame_bytes(11, 3)
    decoder = FrameDecoder()
    assert decoder.feed(data[: PREFIX_BYTES - 3]) == []
    assert [f.opaque for f in decoder.feed(data[PREFIX_BYTES - 3 :])] == [3]


def test_buffer_grows_with_what_arrives_not_with_what_is_declared():
    """A frame declaring the maximum size with one byte sent costs a small buffer; as its
    bytes arrive the buffer grows to at most twice what arrived, and the frame still comes
    out whole."""
    body = bytes(range(256)) * (MAX_FRAME_BYTES // 512)
    data = encode_frame_bytes(10, 9, body=body)
    decoder = FrameDecoder()
    assert decoder.feed(data[: PREFIX_BYTES + 1]) == []
    assert len(decoder.get_buffer(65536)) <= 64 * 1024
    sent, frames = PREFIX_BYTES + 1, []
    while sent < len(data):
        target = decoder.get_buffer()
        assert len(target) <= max(2 * sent, 64 * 1024), "offered more than twice what arrived"
        n = min(len(target), len(data) - sent)
        target[:n] = data[sent : sent + n]
        sent += n
        frames += decoder.buffer_updated(n)
    assert [(f.opaque, f.body) for f in frames] == [(9, body)]
