"""What a DLedger group puts in its Raft log, and how Raft messages travel between members.

Pure codec: no asyncio, no I/O, so the simulator and tools can import it alone.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import msgpack

from hamq.raft import Message, MessageDecodeError

# A Raft entry is a run of commands, each `u32 meta length | u32 data length | meta | data`:
# meta is a msgpack list [kind, fields...]; data is a send's batch bytes, kept out of the
# msgpack so that applying hands the store a slice of the entry instead of a copy. Topic
# metadata goes through consensus too, so a newly elected leader always knows every topic.
KIND_SEND = 0
KIND_TOPIC = 1
KIND_DELETE_TOPIC = 2
_COMMAND_HEAD = struct.Struct(">II")

Command = list  # the pieces of one encoded command, joined into its entry when proposed


def encode_command(meta: list, data: bytes = b"") -> Command:
    packed = msgpack.packb(meta, use_bin_type=True)
    return [_COMMAND_HEAD.pack(len(packed), len(data)), packed, data]


def encode_entry(
    topic: str,
    queue_id: int,
    count: int,
    crc: int,
    born_ts: int,
    store_ts: int,
    payload: bytes,
    expected_queue_offset: int = -1,
) -> Command:
    """The command storing one send batch (the leader's store timestamp included, so every
    member writes identical records). A conditional send (``broker/conditional.py``) adds
    its expected queue offset, checked by every member when it applies the command."""
    meta = [KIND_SEND, topic, queue_id, count, crc, born_ts, store_ts]
    if expected_queue_offset >= 0:
        meta.append(expected_queue_offset)
    return encode_command(meta, payload)


def decode_commands(data: bytes) -> Iterator[tuple[list, memoryview]]:
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        meta_len, data_len = _COMMAND_HEAD.unpack_from(view, pos)
        pos += _COMMAND_HEAD.size
        meta = msgpack.unpackb(view[pos : pos + meta_len], raw=False)
        pos += meta_len
        yield meta, view[pos : pos + data_len]
        pos += data_len


def first_command_kind(data: bytes) -> int:
    """The kind of an entry's first command, without decoding it: its meta is a msgpack
    list of at most 15 items (a one-byte fixarray head) whose first item, the kind, is a
    positive fixint."""
    return data[_COMMAND_HEAD.size + 1]


_U32 = struct.Struct(">I")  # the head's length, then the data count


def encode_message(msg: Message) -> list:
    """A Raft message as frame pieces: the message without its entries' data, the data
    count and lengths, then the data themselves — the same bytes objects for every
    follower, written by reference, not re-packed."""
    if not any(entry.data for entry in msg.entries):
        head = msg.encode()
        return [_U32.pack(len(head)), head]
    head = msg.encode(with_data=False)
    lengths = struct.pack(
        f">I{len(msg.entries)}I", len(msg.entries), *(len(entry.data) for entry in msg.entries)
    )
    return [_U32.pack(len(head)), head, lengths, *(e.data for e in msg.entries)]


def decode_message(body: bytes) -> Message:
    try:
        (head_len,) = _U32.unpack_from(body)
        pos = _U32.size + head_len
        head = body[_U32.size : pos]
        if pos >= len(body):
            return Message.decode(head)
        (count,) = _U32.unpack_from(body, pos)
        lengths = struct.unpack_from(f">{count}I", body, pos + _U32.size)
    except struct.error as exc:
        raise MessageDecodeError(f"raft frame: {exc}") from None
    pos += _U32.size + _U32.size * count
    if pos + sum(lengths) != len(body):
        raise MessageDecodeError("raft frame data does not match its lengths")
    data = []
    for length in lengths:
        data.append(bytes(body[pos : pos + length]))
        pos += length
    return Message.decode(head, data)
