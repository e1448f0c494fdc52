"""PULL_MESSAGE with long polling (RocketMQ's PullRequestHoldService).

A pull that finds nothing new is held until a send reaches its queue or its suspend time
runs out. Arrivals are collected while a read is handled and served after the commit-log
write, so a woken pull always sees the bytes it is told about.

Controller mode caps reads at the confirm offset, sync flush at the fsynced end
(``MessageStore.reads_end``): an arrival the cap still holds back keeps its pulls held, and
its queue is looked at again each time the cap rises; so is the queue of a pull held while
the cap holds records back (they may have arrived before it).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Container
from dataclasses import dataclass

from hamq.broker.stats import BrokerStats
from hamq.broker.topics import TopicService
from hamq.net.connection import Connection, response_pieces
from hamq.net.metrics import COUNTS
from hamq.protocol.codes import ResponseCode
from hamq.protocol.frame import Frame, optional, require, require_int, require_name
from hamq.protocol.limits import MAX_PULL_BYTES
from hamq.store.message_store import GetStatus, MessageStore

DEFAULT_PULL_BATCH = 32  # RocketMQ pullBatchSize
MAX_PULL_MESSAGES = 65_536
_NOT_FOUND = {GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE}


@dataclass
class HeldPull:
    conn: Connection
    frame: Frame
    timer: asyncio.TimerHandle | None = None


class PullProcessor:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        max_wait_ms: int,
        stats: BrokerStats | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.max_wait_ms = max_wait_ms
        self.stats = stats or BrokerStats()  # the broker's, shared with sends and pops
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self._arrived: set[tuple[str, int]] = set()
        # queues that got records the read cap held back: arrivals again once it rises
        self._capped: set[tuple[str, int]] = set()
        self._watched: Container[str] = ()
        self._on_arrivals: Callable[[set[tuple[str, int]]], None] | None = None
        store.read_cap_listeners.append(self._read_cap_rose)

    def watch_arrivals(
        self, topics: Container[str], on_arrivals: Callable[[set[tuple[str, int]]], None]
    ) -> None:
        """Another long-polling service (pop) holds requests on ``topics`` (a live view):
        after each write it is told which of their queues got messages."""
        self._watched = topics
        self._on_arrivals = on_arrivals

    def pull(self, conn: Connection, frame: Frame) -> list | None:
        ext = frame.ext
        topic = require(ext, "topic")
        queue_id = require(ext, "queue_id", int)
        self.topics.for_read(topic, queue_id)
        COUNTS.pull_requests += 1
        suspend_ms = min(optional(ext, "suspend_timeout_ms", 0), self.max_wait_ms)
        if ext.get("commit_offset") is not None:
            # Checked before anything is stored: a group that is not a name (an int, say)
            # would be persisted as another group's key.
            group = require_name(ext, "group")
            commit_offset = require_int(ext, "commit_offset")
            self.store.offsets.commit(group, topic, queue_id, commit_offset, self.store.clock_ms())
        pieces = self._answer(frame, hold=suspend_ms > 0)
        if pieces is not None:
            return pieces
        held = HeldPull(conn, frame)
        self._held.setdefault((topic, queue_id), []).append(held)
        if self.store.reads_end < self.store.commitlog.max_offset:
            # the cap may hold back records that arrived before this pull: look again
            # when it rises, not only at the next arrival
            self._capped.add((topic, queue_id))
        held.timer = asyncio.get_running_loop().call_later(
            suspend_ms / 1000, self._expire, (topic, queue_id), held
        )
        return None

    def message_arrived(self, topic: str, queue_id: int) -> None:
        key = (topic, queue_id)
        if key in self._held or topic in self._watched:
            self._arrived.add(key)

    def serve_arrivals(self) -> None:
        """After the commit log write of a read: answer the pulls whose queue got data."""
        if not self._arrived:
            return
        arrived, self._arrived = self._arrived, set()
        capped = self.store.reads_end < self.store.commitlog.max_offset
        if capped:
            self._capped |= arrived
        for key in arrived:
            waiting = self._held.pop(key, None)
            if not waiting:
                continue
            if capped:
                readable = self.store.readable_max_offset(*key)
                still = [h for h in waiting if h.frame.ext["queue_offset"] >= readable]
                if still:
                    self._held[key] = still
                    waiting = [h for h in waiting if h.frame.ext["queue_offset"] < readable]
            for held in waiting:
                held.timer.cancel()
                held.conn.reply_when_drained(functools.partial(self._answer, held.frame, False))
        if self._on_arrivals is not None:
            self._on_arrivals(arrived)

    def _read_cap_rose(self) -> None:
        if self._capped:
            self._arrived |= self._capped
            self._capped = set()
            self.serve_arrivals()

    def _expire(self, key: tuple[str, int], held: HeldPull) -> None:
        waiting = self._held.get(key)
        if waiting and held in waiting:
            waiting.remove(held)
            if not waiting:
                del self._held[key]
            held.conn.reply_when_drained(functools.partial(self._answer, held.frame, False))

    def _answer(self, frame: Frame, hold: bool) -> list | None:
        ext = frame.ext
        max_msgs = min(optional(ext, "max_msgs", DEFAULT_PULL_BATCH, low=1), MAX_PULL_MESSAGES)
        max_bytes = min(optional(ext, "max_bytes", MAX_PULL_BYTES, low=1), MAX_PULL_BYTES)
        result = self.store.get_messages(
            ext["topic"], ext["queue_id"], require(ext, "queue_offset", int), max_msgs, max_bytes
        )
        if result.status in _NOT_FOUND and hold:
            return None
        answer = {
            "next_begin_offset": result.next_begin_offset,
            "min_offset": result.min_offset,
            "max_offset": result.max_offset,
        }
        if result.status is GetStatus.FOUND:
            self.stats.consumed(
                ext.get("group"),
                ext["topic"],
                result.next_begin_offset - ext["queue_offset"],
                result.records,
                self.store.clock_ms(),
            )
            return response_pieces(frame, ext=answer, body=result.records)
        if result.status in _NOT_FOUND:
            return response_pieces(frame, ResponseCode.PULL_NOT_FOUND, ext=answer)
        return response_pieces(
            frame,
            ResponseCode.PULL_OFFSET_MOVED,
            ext=answer,
            remark=f"offset {ext['queue_offset']} out of range "
            f"[{result.min_offset}, {result.max_offset}]",
        )

    def close(self) -> None:
        for waiting in self._held.values():
            for held in waiting:
                held.timer.cancel()
        self._held.clear()
