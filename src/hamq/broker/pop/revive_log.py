"""The revive log: pop checkpoints (CK) and acks (ACK) as messages of a system topic in the
commit log (RocketMQ's ``rmq_sys_REVIVE_LOG``), plus the revive checkpoint file.

Appending through the normal store puts a CK or ACK into the same ``writev`` (and, under
sync flush, the same group-commit fsync) as everything else of the event-loop turn, so an
answered ack survives ``kill -9``. On start the pop state is loaded from the checkpoint
file (the state as of a revive-log offset) and the records after that offset are replayed.
Every record carries the broker name (seed 004: a member scanning a revive log offsets only
its own group's CK/ACK records).
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

# (queue_id, offsets, reconsume_times) handed out from one queue
CkEntry = tuple[int, list[int], list[int]]
# (topic, queue_id, queue_offset, ck)
AckEntry = tuple[str, int, int, int]


@dataclass(frozen=True)
class ReviveRecord:
    revive_offset: int
    kind: str
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
        return self._append(
            {
                "k": KIND_CK,
                "b": self.broker_name,
                "g": group,
                "t": topic,
                "d": deadline_ms,
                "e": entries,
            }
        )

    def append_ack(self, group: str, entries: list[AckEntry]) -> PutResult:
        return self._append({"k": KIND_ACK, "b": self.broker_name, "g": group, "e": entries})

    def _append(self, record: dict[str, Any]) -> PutResult:
        payload = encode_message(msgpack.packb(record, use_bin_type=True))
        return self.store.put_batch(
            REVIVE_LOG_TOPIC,
            REVIVE_QUEUE_ID,
            payload,
            1,
            zlib.crc32(payload),
            self.store.clock_ms(),
        )

    def replay(self, start: int) -> Iterator[ReviveRecord]:
        """This broker's records from revive offset ``start`` to the end."""
        offset = max(start, self.store.min_offset(REVIVE_LOG_TOPIC, REVIVE_QUEUE_ID))
        while True:
            result = self.store.get_messages(
                REVIVE_LOG_TOPIC, REVIVE_QUEUE_ID, offset, REPLAY_BATCH, MAX_PULL_BYTES
            )
            if result.status is not GetStatus.FOUND:
                return
            for revive_offset, body in decode_records(result.records, offset, _offset_body):
                record = self._decode(revive_offset, body)
                if record is not None:
                    yield record
            offset = result.next_begin_offset

    def _decode(self, revive_offset: int, body: bytes) -> ReviveRecord | None:
        try:
            raw = msgpack.unpackb(body, raw=False)
            if raw["b"] != self.broker_name:
                return None
            return ReviveRecord(
                revive_offset, raw["k"], raw["g"], raw.get("t", ""), raw.get("d", 0), raw["e"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.error("skipping unreadable revive log record at %d: %s", revive_offset, exc)
            return None

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


def _offset_body(
    header: Any, index: int, queue_offset: int, props: bytes, body: bytes
) -> tuple[int, bytes]:
    return queue_offset, body
