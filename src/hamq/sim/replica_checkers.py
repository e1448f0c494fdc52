"""Store-level safety checkers for master–slave replication, fed by the simulator as things
happen; each raises ``InvariantViolation``.

They read the members' real message stores (on their simulated disks):
- a send acknowledged PUT_OK under ``needAckNums = k`` is held by at least k members;
- an attached slave's commit log equals its master's, byte for byte, over their common
  range, and its consume queues hold the same entries there;
- under sync flush, every acknowledged message is readable with the same id from the
  master after any crash and recovery.
"""

from __future__ import annotations

from dataclasses import dataclass

from hamq.protocol.message import decode_records, encode_batch, encode_message, offset_msg_id
from hamq.store.message_store import GetStatus, MessageStore, PutResult


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class AckedMessage:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    physical_offset: int  # retention may remove it once its segment is old enough


def put_one(
    store: MessageStore, topic: str, queue_id: int, body: bytes, born_ms: int
) -> tuple[PutResult, AckedMessage]:
    """A producer's one-message send, stored and written (not fsynced), and the message as
    the checkers expect to read it back if it is acknowledged."""
    payload, crc = encode_batch([encode_message(body)])
    put = store.put_batch(topic, queue_id, payload, 1, crc, born_timestamp_ms=born_ms)
    store.commit()
    message = AckedMessage(
        topic,
        queue_id,
        put.base_queue_offset,
        offset_msg_id(put.physical_offset, 0),
        body,
        put.physical_offset,
    )
    return put, message


def check_held(end: int, need: int, slave_ends: dict[int, int]) -> None:
    """PUT_OK for a record ending at ``end``: the master and need - 1 slaves hold it.
    ``slave_ends`` is how far each slave has acknowledged since it last attached."""
    holders = 1 + sum(1 for slave_end in slave_ends.values() if slave_end >= end)
    if holders < need:
        raise InvariantViolation(
            f"PUT_OK for offset {end} with needAckNums={need} but only {holders} members hold it"
        )


def check_same_bytes(master: MessageStore, slave: MessageStore, member_id: int, start: int) -> int:
    """Compare the two commit logs from ``start`` to the end of their common range; returns
    that end (what is checked so far)."""
    lo = max(start, master.commitlog.min_offset, slave.commitlog.min_offset)
    hi = min(master.commitlog.max_offset, slave.commitlog.max_offset)
    if hi > lo and master.commitlog.read_range(lo, hi) != slave.commitlog.read_range(lo, hi):
        theirs, ours = master.commitlog.read_range(lo, hi), slave.commitlog.read_range(lo, hi)
        at = lo + next(i for i in range(hi - lo) if theirs[i] != ours[i])
        raise InvariantViolation(
            f"slave {member_id} diverged from its master at offset {at} (common range {lo}..{hi})"
        )
    return max(hi, start)


def check_same_queues(master: MessageStore, slave: MessageStore, member_id: int) -> None:
    """Queue entries of records in the common range agree (offsets, sizes, queue offsets)."""
    lo = max(master.commitlog.min_offset, slave.commitlog.min_offset)
    hi = min(master.commitlog.max_offset, slave.commitlog.max_offset)
    for key in sorted(master.queues.keys() | slave.queues.keys()):
        theirs, ours = _entries(master, key, lo, hi), _entries(slave, key, lo, hi)
        if theirs != ours:
            raise InvariantViolation(
                f"slave {member_id} queue {key} differs from its "
                f"master's in {lo}..{hi}: {ours[:3]}... vs {theirs[:3]}..."
            )


def check_readable(store: MessageStore, acked: list[AckedMessage]) -> None:
    """Every acknowledged message retention kept is where its answer said, with its id and
    body."""
    for m in acked:
        if m.physical_offset < store.commitlog.min_offset:
            continue
        got = store.get_messages(m.topic, m.queue_id, m.queue_offset, 1, 1 << 20)
        found = (
            decode_records(bytes(got.records), m.queue_offset, _id_and_body)
            if got.status is GetStatus.FOUND
            else []
        )
        if not found or found[0] != (m.msg_id, m.body):
            raise InvariantViolation(
                f"acknowledged message {m.msg_id} ({m.topic}:{m.queue_id}"
                f"@{m.queue_offset}) lost or changed after recovery"
            )


def _id_and_body(header, index: int, queue_offset: int, props: bytes, body: bytes):
    return offset_msg_id(header.physical_offset, index), bytes(body)


def _entries(store: MessageStore, key: tuple[str, int], lo: int, hi: int) -> list[tuple]:
    cq = store.queues.get(key)
    if cq is None:
        return []
    return [
        (p, s, b, c)
        for p, s, b, c in zip(cq.phys, cq.size, cq.base, cq.count)
        if lo <= p and p + s <= hi
    ]
