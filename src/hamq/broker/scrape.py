"""What a broker adds to each Prometheus scrape beyond its plain gauges: its traffic and
latency (``broker/stats.py``), consumer lag per queue, replication lag per slave, the
SyncStateSet, a DLedger member's Raft indexes, disk use and fsync times.

Everything here is computed when scraped, in the scrape's thread, from what the broker
keeps anyway; the event loop pays nothing between scrapes. Dicts the loop changes are
copied (``list(...)``) before they are walked.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hamq.clock import monotonic_ms
from hamq.net.metrics import Families, source

if TYPE_CHECKING:
    from hamq.broker.server import BrokerServer

# Series of consumer lag a scrape returns at most per broker (group × topic × queue grows
# with what clients do); past it the rest is counted in hamq_consumer_lag_series_dropped.
MAX_LAG_SERIES = 2_000


# How long a scrape reuses the store's size: summing it stats every file under the store
# (a consume-queue file per topic and queue: 0.19 s for 3000 topics of 4 queues), and
# Prometheus scrapes every 15 s or more often.
STORE_BYTES_TTL_MS = 30_000


def add_broker_sources(broker: BrokerServer, labels: dict[str, str] | None = None) -> None:
    source("broker_stats", broker.stats.export, labels)
    store_bytes = StoreBytes(broker.store.root)
    source("broker_state", functools.partial(_state, broker, store_bytes), labels)


class StoreBytes:
    """Bytes of the files under a store directory, summed at most every
    ``STORE_BYTES_TTL_MS`` (the figure is for disk-use panels, which move slowly)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._read_at_ms: int | None = None
        self._bytes = 0

    def read(self, now_ms: int) -> int:
        if self._read_at_ms is None or now_ms - self._read_at_ms >= STORE_BYTES_TTL_MS:
            self._bytes = _bytes_under(self.root)
            self._read_at_ms = now_ms
        return self._bytes


def _state(
    broker: BrokerServer, store_bytes: StoreBytes, families: Families, labels: dict[str, str]
) -> None:
    store = broker.store
    serving = broker.dledger.is_leader if broker.dledger is not None else broker.role.is_master
    if serving:  # a slave's offsets are its master's, copied late
        consumer_lag(store, families, labels)
    if broker.ha_master is not None and broker.role.is_master:
        _replication(broker, families, labels)
    if broker.dledger is not None:
        status = broker.dledger.core.node
        for name, documentation, value in (
            ("hamq_dledger_term", "The DLedger member's Raft term", status.term),
            ("hamq_dledger_commit_index", "Raft entries committed", status.committed_index),
            ("hamq_dledger_last_index", "Raft entries held", status.log.ledger_end_index),
        ):
            families.gauge(name, documentation, labels, value)
    _disk(store_bytes, families, labels)
    families.histogram(
        "hamq_flush_seconds",
        "Commit-log fsyncs (in a worker thread, off the event loop)",
        labels,
        broker.flush.fsync_us,
        1_000_000,
    )


def consumer_lag(store, families: Families, labels: dict[str, str]) -> None:
    """Per group, topic and queue: the queue's max offset less the group's committed
    offset, for at most ``MAX_LAG_SERIES`` queues."""
    shown = dropped = 0
    for key, queues in list(store.offsets.table().items()):
        topic, _, group = key.partition("@")
        for queue_id, committed in list(queues.items()):
            if shown >= MAX_LAG_SERIES:
                dropped += 1
                continue
            shown += 1
            families.gauge(
                "hamq_consumer_lag",
                "Messages of a queue its consumer group has not committed",
                {**labels, "group": group, "topic": topic, "queue_id": queue_id},
                max(0, store.max_offset(topic, int(queue_id)) - committed),
            )
    families.gauge(
        "hamq_consumer_lag_series_dropped",
        f"Queues of consumer groups past the first {MAX_LAG_SERIES} lag series",
        labels,
        dropped,
    )


def _replication(broker: BrokerServer, families: Families, labels: dict[str, str]) -> None:
    ha = broker.ha_master
    assert ha is not None
    master_offset = broker.store.commitlog.max_offset
    now = monotonic_ms()
    for slave in list(ha.core.slaves.values()):
        at = {**labels, "slave_id": str(slave.broker_id)}
        behind = max(0, master_offset - slave.ack_offset)
        families.gauge(
            "hamq_replication_lag_bytes",
            "Commit-log bytes the master holds that the slave has not acked",
            at,
            behind,
        )
        families.gauge(
            "hamq_replication_lag_seconds",
            "Time since the slave last held everything the master had (0: it does now)",
            at,
            0 if behind == 0 else max(0, now - slave.caught_up_ms) / 1000,
        )
    sss = ha.core.sync_state_set
    if sss is not None:
        families.gauge(
            "hamq_sync_state_set_size",
            "Members of the group's SyncStateSet (the master included)",
            labels,
            len(sss.applied),
        )


def _disk(store_bytes: StoreBytes, families: Families, labels: dict[str, str]) -> None:
    try:
        usage = os.statvfs(store_bytes.root)
        used = store_bytes.read(monotonic_ms())
    except OSError:  # the store directory is going away (a stopping member)
        return
    families.gauge(
        "hamq_store_bytes",
        f"Bytes of files under the store (summed every {STORE_BYTES_TTL_MS // 1000} s)",
        labels,
        used,
    )
    families.gauge(
        "hamq_disk_free_ratio",
        "Free share of the file system holding the store",
        labels,
        usage.f_bavail / usage.f_blocks if usage.f_blocks else 0.0,
    )


def _bytes_under(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:  # retention removed it meanwhile
                pass
    return total
