"""Events and snapshots survive their bytes exactly; bad bytes are refused with a clear error."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.controller.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from hamq.controller.errors import ControllerCodecError
from hamq.controller.events import (
    AlterSyncStateSet,
    ApplyBrokerId,
    CleanBrokerData,
    ElectMaster,
    RegisterBroker,
)
from hamq.controller.state import ControllerState

ids = st.frozensets(st.integers(0, 2**40))
names = st.text(max_size=20)
epochs = st.integers(0, 2**31)
events = st.one_of(
    st.builds(ApplyBrokerId, names, names, epochs, names, names, epochs),
    st.builds(RegisterBroker, names, names, epochs, names, epochs),
    st.builds(ElectMaster, names, names, st.none() | epochs, epochs, st.booleans()),
    st.builds(AlterSyncStateSet, names, names, epochs, epochs, ids, epochs),
    st.builds(CleanBrokerData, names, names, ids),
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_event_round_trip(event):
    assert decode_event(encode_event(event)) == event


def test_snapshot_round_trip_is_exact_and_canonical(group_of_three):
    data = encode_snapshot(group_of_three)
    restored = decode_snapshot(data)
    assert restored == group_of_three
    assert encode_snapshot(restored) == data
    assert decode_snapshot(encode_snapshot(ControllerState())) == ControllerState()


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([]), "empty event"),
        (msgpack.packb([99, "a"]), "unknown event tag 99"),
        (msgpack.packb([3, "c", "g", 1, 2]), r"needs 7 fields \(5 in older entries\), got 4"),
        (msgpack.packb([3, "c", "g", True, 2, False]), "expected an integer, got bool"),
        (msgpack.packb([3, "c", "g", 1, 2, 0]), "expected a boolean"),
        (msgpack.packb([5, "c", "g", [1, 1]]), "duplicate broker ids"),
        (msgpack.packb([5, "c", "g", {"a": 1}]), "expected an array"),
        (msgpack.packb({"tag": 1}), "expected an array"),
        (msgpack.packb([1, "c", "g", 1, "a", "k", 2]) + b"\x00", "not valid msgpack"),
    ],
)
def test_malformed_events_are_refused(raw, reason):
    with pytest.raises(ControllerCodecError, match=reason):
        decode_event(raw)


def test_malformed_snapshots_are_refused(group_of_three):
    good = msgpack.unpackb(encode_snapshot(group_of_three))
    # version 2 snapshots: their groups are written as version 3 writes them
    twice = [2, good[1] + good[1], []]
    bad_member = [2, [[*good[1][0][:2], [[1, "a", "k"]], *good[1][0][3:]]], []]
    one = [[1, "a", "k", 0]]
    for value, reason in [
        ([2, []], "version 2"),
        ([1, [], []], "version 2"),
        (twice, "appears twice"),
        (bad_member, "a member needs 4 fields"),
        ([2, [["c", "g"]], []], "a group needs 8 fields"),
        ([2, [["c", "g", [], None, 0, [], 0, 0]], []], "has no members"),
        ([2, [["c", "g", one, 1, 1, [2], 1, 0]], []], "unknown members"),
        ([2, [["c", "g", [*one, [2, "b", "k", 0]], 1, 1, [2], 1, 0]], []], "not in its set"),
        ([2, [["c", "g", one, None, -1, [], 0, 0]], []], "negative epoch"),
        ([2, [["c", "g", one, None, 1, [], 0, 2]], []], "first epoch 2 out of range"),
        ([2, [], [["c", "g"]]], "a retired group needs 3 fields"),
        ([2, [], [["c", "g", 0]]], "has epoch 0"),
        ([2, [["c", "g", one, None, 1, [], 0, 0]], [["c", "g", 3]]], "listed twice"),
    ]:
        with pytest.raises(ControllerCodecError, match=reason):
            decode_snapshot(msgpack.packb(value))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_codec_error(raw):
    for decode in (decode_event, decode_snapshot):
        try:
            decode(raw)
        except ControllerCodecError:
            pass
