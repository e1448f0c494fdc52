"""Histories of a chaos run: one JSON line per client operation, and the message bodies
that let a reader tell a real message from garbage.

Every line carries ``n`` (its line number in the file) and ``t`` (``time.monotonic_ns()``
of the runner: CLOCK_MONOTONIC is system-wide and the clock nemesis never moves it, so
histories of different clients line up even while brokers' wall clocks jump). Lines are
written line-buffered, so a runner killed mid-run leaves every finished line on disk; the
reader drops a torn last line and refuses garbage anywhere else.

A body is ``b"<id>|<seq>|<crc32 of id|seq|payload, 8 hex>|" + payload``, the payload 64..512
bytes derived from the run's seed and the id: a reader recomputes nothing but the crc, and
a byte flipped anywhere in the body makes it invalid.
"""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from pathlib import Path
from typing import Any

PAYLOAD_BYTES_MIN = 64
PAYLOAD_BYTES_MAX = 512
_SEP = b"|"


class HistoryWriter:
    """One client's history file. ``record`` may be called from any thread (a push
    consumer's listener runs on its consume pool)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._n = 0

    def record(self, **fields: Any) -> dict[str, Any]:
        with self._lock:
            line = {"n": self._n, "t": time.monotonic_ns(), **fields}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._n += 1
        return line

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every line of a history file. A last line cut short (the writer was killed while
    writing it) is dropped; a bad line before the last is an error naming it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # no newline after it: torn while written
                break
            raise ValueError(f"{path}:{i + 1}: not a history line ({err})") from None
    return out


def payload_for(seed: int, message_id: str, payload_len: int) -> bytes:
    """The deterministic payload of ``message_id`` in the run of ``seed``."""
    return random.Random(f"{seed}/{message_id}").randbytes(payload_len)


def make_body(message_id: str, seq: int, payload_len: int, seed: int) -> bytes:
    if _SEP.decode() in message_id:
        raise ValueError(f"message id {message_id!r} must not contain {_SEP!r}")
    payload = payload_for(seed, message_id, payload_len)
    raw_id, raw_seq = message_id.encode(), b"%d" % seq
    return b"%s|%s|%08x|" % (raw_id, raw_seq, _crc(raw_id, raw_seq, payload)) + payload


def _crc(raw_id: bytes, raw_seq: bytes, payload: bytes) -> int:
    """Covers the id and seq too: a flipped digit there must not turn a copy of one
    message into a valid-looking copy of another (p0-5 -> p1-5 is one bit)."""
    return zlib.crc32(payload, zlib.crc32(raw_id + _SEP + raw_seq + _SEP))


def parse_body(body: bytes) -> tuple[str, int, bool]:
    """``(id, seq, valid)`` of a body; never raises. Whatever does not parse is
    ``("", -1, False)``; a body that parses but fails its crc (id, seq and payload) keeps
    its id and seq with ``valid`` False (a corrupted copy of a real message)."""
    parts = bytes(body).split(_SEP, 3)
    if len(parts) != 4:
        return "", -1, False
    raw_id, raw_seq, raw_crc, payload = parts
    try:
        message_id = raw_id.decode("ascii")
        seq = int(raw_seq)
        crc = int(raw_crc, 16)
    except ValueError:  # UnicodeDecodeError is one
        return "", -1, False
    return message_id, seq, len(raw_crc) == 8 and _crc(raw_id, raw_seq, payload) == crc
