"""The revive log: pop checkpoints (CK) and acks (ACK) as messages of a system topic in the
commit log (RocketMQ's ``rmq_sys_REVIVE_LOG``), with where groups started (INIT) and where an
operator reset them (RESET), plus the revive checkpoint file.

Appending through the normal store puts a CK or ACK into the same ``writev`` (and, under
sync flush, the same group-commit fsync) as everything else of the event-loop turn, so an
answered ack survives ``kill -9``. On start the pop state is loaded from the checkpoint
file (the state as of a revive-log offset) and the records after that offset are replayed.
Every record carries the broker name (seed 004: a member scanning a revive log offsets only
its own group's CK/ACK records). An acting master (seed 004) never appends to its own log:
its records are escaped into one chosen master's revive log under its own broker name, and
a CK it escapes names its receipt id itself (``c``), as the id cannot be the offset of a
record in a log the acting master does not write; ACKs name the CK they cancel by that id.
"""

from __future__ import annotations

import json
import logging
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from hamq.errors import InvalidArgument
from hamq.protocol.limits import MAX_PULL_BYTES
from hamq.protocol.message import decode_records, encode_message
from hamq.store.disk import atomic_write
from hamq.store.message_store import GetStatus, MessageStore, PutResult

log = logging.getLogger(__name__)

REVIVE_LOG_TOPIC = "rmq_sys_REVIVE_LOG"
REVIVE_QUEUE_ID = 0
CHECKPOINT_FILE = "pop_revive_checkpoint.json"
REPLAY_BATCH = 4096  # records read per step while replaying
KIND_CK = "ck"
KIND_ACK = "ack"
KIND_INIT = "init"  # where a group starts on queues it had no offset for
# an operator reset the group's offsets: its pop state restarts there, the CKs and ACKs
# before it no longer count (replayed without it, they moved the group past the reset)
KIND_RESET = "reset"

# (queue_id, offsets, reconsume_times) handed out from one queue
CkEntry = tuple[int, list[int], list[int]]
# (topic, queue_id, queue_offset, ck)
AckEntry = tuple[str, int, int, int]
# (queue_id, offset): a group's start on a queue (the offset its init mode chose)
InitEntry = tuple[int, int]


@dataclass(frozen=True)
class ReviveRecord:
    revive_offset: int
    ck: int  # the receipt id of a CK: its revive offset, or the one an acting master chose
    kind: str
    broker_name: str
    group: str
    topic: str  # CK only
    deadline_ms: int  # CK only
    entries: list  # CkEntry for CK, AckEntry for ACK


class ReviveLog:
    def __init__(self, store: MessageStore, broker_name: str) -> None:
        self.store = store
        self.broker_name = broker_name
        self.checkpoint_path = Path(store.config.store_dir) / CHECKPOINT_FILE
        # The periodic write runs in a worker thread and may still be running when the
        # shutdown write starts.
        self._checkpoint_lock = threading.Lock()

    @property
    def end_offset(self) -> int:
        return self.store.max_offset(REVIVE_LOG_TOPIC, REVIVE_QUEUE_ID)

    def append_ck(
        self, group: str, topic: str, deadline_ms: int, entries: list[CkEntry]
    ) -> PutResult:
        return self._append(ck_record(self.broker_name, group, topic, deadline_ms, entries))

    def append_ack(self, group: str, entries: list[AckEntry]) -> PutResult:
        return self._append(ack_record(self.broker_name, group, entries))

    def append_init(self, group: str, topic: str, entries: list[InitEntry]) -> PutResult:
        """A group's start offsets, replicated with the log: a new master that has no
        consumer offset for the group yet (the table reaches slaves only every few
        seconds) starts it there, not at its own end, past what was sent since."""
        return self._append_offsets(KIND_INIT, group, topic, entries)

    def append_reset(self, group: str, topic: str, entries: list[InitEntry]) -> PutResult:
        """A group's offsets reset by an operator (broker/consumer_admin.py), replicated
        with the log: a member rebuilding its pop state (a restart, a new master) restarts
        the group's queues there instead of going on from the acks before the reset."""
        return self._append_offsets(KIND_RESET, group, topic, entries)

    def _append_offsets(
        self, kind: str, group: str, topic: str, entries: list[InitEntry]
    ) -> PutResult:
        return self._append(
            msgpack.packb(
                {"k": kind, "b": self.broker_name, "g": group, "t": topic, "e": entries},
                use_bin_type=True,
            )
        )

    def check_escaped(self, record: bytes) -> ReviveRecord:
        """A record an acting master of another group escapes here (seed 004), parsed. One
        under this broker's own name is refused: it would change this broker's pop state."""
        try:
            raw = parse_record(0, record)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"escaped revive record unreadable: {exc!r:.200}") from None
        if raw.broker_name == self.broker_name:
            raise InvalidArgument(
                f"escaped revive record names this broker ({self.broker_name}): refused"
            )
        if raw.kind in (KIND_INIT, KIND_RESET):  # a master's own: acting members escape none
            raise InvalidArgument("escaped revive record: only CK and ACK records escape")
        return raw

    def append_escaped(self, record: bytes) -> PutResult:
        self.check_escaped(record)
        return self._append(record)

    def _append(self, record: bytes) -> PutResult:
        payload = encode_message(record)
        return self.store.put_batch(
            REVIVE_LOG_TOPIC,
            REVIVE_QUEUE_ID,
            payload,
            1,
            zlib.crc32(payload),
            self.store.clock_ms(),
        )

    def replay(self, start: int, broker_name: str | None = None) -> Iterator[ReviveRecord]:
        """The records of ``broker_name`` (this broker's by default; a chosen master reads
        an acting master's escaped ones by its name) from revive offset ``start`` on."""
        name = self.broker_name if broker_name is None else broker_name
        offset = max(start, self.store.min_offset(REVIVE_LOG_TOPIC, REVIVE_QUEUE_ID))
        while True:
            result = self.store.get_messages(  # the state holds every record it counts
                REVIVE_LOG_TOPIC,
                REVIVE_QUEUE_ID,
                offset,
                REPLAY_BATCH,
                MAX_PULL_BYTES,
                past_durable=True,
            )
            if result.status is not GetStatus.FOUND:
                return
            yield from records_in(result.records, offset, name)
            offset = result.next_begin_offset

    # -- revive checkpoint: the pop state as of a revive-log offset -----------------------
    def load_checkpoint(self) -> dict:
        try:
            return json.loads(self.store.disk.read_bytes(self.checkpoint_path))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            log.error(
                "revive checkpoint %s unreadable (%s); replaying the whole revive log",
                self.checkpoint_path,
                exc,
            )
            return {}

    def write_checkpoint(self, snapshot: bytes) -> None:
        with self._checkpoint_lock:
            atomic_write(self.store.disk, self.checkpoint_path, snapshot)


def ck_record(
    broker_name: str,
    group: str,
    topic: str,
    deadline_ms: int,
    entries: list[CkEntry],
    ck: int | None = None,
) -> bytes:
    """A CK record (a message body); ``ck`` is given by an acting master (module
    docstring)."""
    record = {"k": KIND_CK, "b": broker_name, "g": group, "t": topic, "d": deadline_ms}
    if ck is not None:
        record["c"] = ck
    return msgpack.packb({**record, "e": entries}, use_bin_type=True)


def ack_record(broker_name: str, group: str, entries: list[AckEntry]) -> bytes:
    return msgpack.packb(
        {"k": KIND_ACK, "b": broker_name, "g": group, "e": entries}, use_bin_type=True
    )


def records_in(data: bytes, start: int, broker_name: str) -> list[ReviveRecord]:
    """``broker_name``'s records in raw revive log records read from queue offset ``start``."""
    found = []
    for revive_offset, body in decode_records(data, start, _offset_body):
        record = decode_record(revive_offset, body, broker_name)
        if record is not None:
            found.append(record)
    return found


def decode_record(revive_offset: int, body: bytes, broker_name: str) -> ReviveRecord | None:
    """The record at ``revive_offset`` if it is one of ``broker_name``'s; None for another
    broker's or an unreadable one (logged)."""
    try:
        record = parse_record(revive_offset, body)
    except (ValueError, KeyError, TypeError) as exc:
        log.error("skipping unreadable revive log record at %d: %s", revive_offset, exc)
        return None
    return record if record.broker_name == broker_name else None


def parse_record(revive_offset: int, body: bytes) -> ReviveRecord:
    """Raises ValueError, KeyError or TypeError for what is not a CK, ACK, INIT or RESET
    record."""
    raw = msgpack.unpackb(body, raw=False)
    if not isinstance(raw, dict):
        raise ValueError(f"not a map: {raw!r:.200}")
    record = ReviveRecord(
        revive_offset,
        raw.get("c", revive_offset),
        raw["k"],
        raw["b"],
        raw["g"],
        raw.get("t", ""),
        raw.get("d", 0),
        raw["e"],
    )
    if record.kind not in (KIND_CK, KIND_ACK, KIND_INIT, KIND_RESET) or not all(
        isinstance(v, t)
        for v, t in (
            (record.ck, int),
            (record.broker_name, str),
            (record.group, str),
            (record.topic, str),
            (record.deadline_ms, int),
            (record.entries, list),
        )
    ):
        raise ValueError(f"not a CK, ACK, INIT or RESET record: {raw!r:.200}")
    return record


def _offset_body(
    header: Any, index: int, queue_offset: int, props: bytes, body: bytes
) -> tuple[int, bytes]:
    return queue_offset, body
