"""Seeded crashes at every step, under the message store on the simulated disk.

Each seed sends to two live queues and to a topic it deletes and re-creates, flushes
(sync flush: what a flush returns is acknowledged), checkpoints, cuts the log, lets
retention remove segments, fails an fsync with EIO now and then, and crashes the process
in the middle of any of these (``SimDisk.crash_after``: at a write, truncation, fsync,
creation, removal or rename), followed by a restart or a power loss. After every restart:
the store opened (a crash or a power loss alone never makes it refuse), every
acknowledged message reads back at its queue offset, nothing reads back that was never
written there (a deleted topic's or a cut record), and a second restart reads the same.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import pytest

from hamq.config import StoreConfig
from hamq.errors import HamqError
from hamq.protocol.message import encode_batch, encode_message
from hamq.sim.fs import ProcessCrash, SimDisk
from hamq.store.message_store import MessageStore
from helpers import read_queue

SEEDS = 300
QUEUES = (("T", 0), ("T", 1), ("D", 0))
HOUR_MS = 3600 * 1000
Key = tuple[str, int, int]  # topic, queue id, queue offset


@dataclass
class Model:
    """What the seed wrote and what was acknowledged, as the store must show it."""

    written: dict[Key, tuple[bytes, int]] = field(default_factory=dict)  # -> (body, end)
    acked: set[Key] = field(default_factory=set)

    def forget(self, keep) -> None:
        self.written = {k: v for k, v in self.written.items() if keep(k, v)}
        self.acked &= set(self.written)

    def may_lose(self, keep) -> None:
        """About to remove what ``keep`` rejects: a crash may leave it or not."""
        self.acked = {k for k in self.acked if keep(k, self.written[k])}


def read_all(store: MessageStore) -> dict[Key, bytes]:
    return {
        (topic, queue_id, offset): body
        for topic, queue_id in QUEUES
        for offset, body in read_queue(store, topic, queue_id).items()
    }


class Seed:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.disk = SimDisk(clock=lambda: self.now_ms / 1000)
        self.config = StoreConfig(
            store_dir="/store",
            file_reserved_hours=1.0,
            mapped_file_size_commitlog=self.rng.choice([1024, 2048, 4096]),
        )
        self.model = Model()
        self.store = self.open()

    def open(self) -> MessageStore:
        return MessageStore(self.config, lambda: self.now_ms, disk=self.disk)

    # -- actions ---------------------------------------------------------------------------
    def put(self) -> None:
        for _ in range(self.rng.randrange(1, 4)):
            topic, queue_id = self.rng.choice(QUEUES)
            body = f"{topic}{queue_id} {len(self.model.written)} {self.rng.random()}".encode()
            body = body.ljust(self.rng.randrange(len(body), 300), b".")
            payload, crc = encode_batch([encode_message(body)])
            put = self.store.put_batch(topic, queue_id, payload, 1, crc, 0)
            self.model.written[(topic, queue_id, put.base_queue_offset)] = (body, put.end_offset)
        self.store.commit()

    def flush(self) -> None:
        durable = self.store.commitlog.flush()
        self.model.acked |= {k for k, (_, end) in self.model.written.items() if end <= durable}

    def cut(self) -> None:
        queue = self.store.queues.get(("T", 0))
        if queue is None or not len(queue):
            return
        cut = queue.phys[self.rng.randrange(len(queue))]
        kept = lambda k, v: v[1] <= cut  # noqa: E731
        self.model.may_lose(kept)
        self.store.truncate_to(cut)
        self.model.forget(kept)

    def delete_topic(self) -> None:
        kept = lambda k, v: k[0] != "D"  # noqa: E731
        self.model.may_lose(kept)
        self.store.delete_topic("D")
        self.model.forget(kept)

    def retention(self) -> None:
        self.now_ms += 2 * HOUR_MS  # every segment but the active one expires
        first = self.store.commitlog.segments[-1].start
        kept = lambda k, v: v[1] > first  # noqa: E731
        self.model.may_lose(kept)
        self.store.delete_expired()
        self.model.forget(kept)

    def fail_an_fsync(self) -> None:
        files = [seg.path for seg in self.store.commitlog.segments] + [
            cq.path for cq in self.store.queues.values()
        ]
        self.disk.fail_fsync(self.rng.choice(files))

    def step(self) -> None:
        action = self.rng.choices(
            [
                self.put,
                self.flush,
                self.store.flush_consume_queues,
                self.cut,
                self.delete_topic,
                self.retention,
                self.fail_an_fsync,
            ],
            [50, 15, 10, 5, 4, 3, 2],
        )[0]
        if self.rng.random() < 0.1:
            self.disk.crash_after(self.rng.randrange(12))
        try:
            action()
        except ProcessCrash:
            self.restart(power_loss=self.rng.random() < 0.5)
        except (OSError, HamqError):  # a failed fsync: stop, and the machine reboots
            self.restart(power_loss=True)
        else:
            self.disk.steps_to_crash = None

    # -- checks ----------------------------------------------------------------------------
    def restart(self, power_loss: bool) -> None:
        self.disk.failing_fsyncs.clear()  # the disk fails no more (a failure at open is
        # a refusal to start, tested on its own)
        if power_loss:
            self.disk.power_loss(self.rng)
        else:
            self.disk.kill()
        try:
            self.store = self.open()
        except HamqError as err:
            raise AssertionError(f"seed {self.seed}: refused to reopen: {err}") from err
        found = read_all(self.store)
        for key in sorted(self.model.acked):
            assert found.get(key) == self.model.written[key][0], (
                f"seed {self.seed}: acknowledged {key} reads {found.get(key)!r}"
            )
        for key, body in found.items():
            assert key in self.model.written and self.model.written[key][0] == body, (
                f"seed {self.seed}: {key} reads {body!r}, never written there"
            )
        # what survived is durable now (the reopen fsynced it); what did not is gone
        self.model.forget(lambda k, v: k in found)
        self.model.acked = set(self.model.written)

    def run(self) -> None:
        for _ in range(self.rng.randrange(20, 120)):
            self.step()
        self.restart(power_loss=True)
        found = read_all(self.store)
        self.disk.kill()
        assert read_all(self.open()) == found, f"seed {self.seed}: second reopen differs"


@pytest.mark.parametrize("first", range(0, SEEDS, 100))
def test_crashes_at_any_step_lose_nothing_acknowledged(
    first: int, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.CRITICAL)  # seeds log their cuts and failed fsyncs
    for seed in range(first, first + 100):
        Seed(seed).run()
