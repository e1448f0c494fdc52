"""Master–slave replication of commit-log records larger than the HA flow-control window,
on real processes. A record is a whole producer batch, and a slave acknowledges only
complete records; the master used to count every shipped byte of a half-received record
against the window, so a record bigger than the window stopped the slave's stream for good
(every quorum send after it timed out). With the default window (8 MiB) a max-size batch
(8 MiB of messages plus the record header) is such a record."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hamq
from hamq import Message, SendStatus
from hamq.client.message import UNIQ_KEY_CHARS
from hamq.protocol.limits import MAX_BATCH_BYTES
from helpers import wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_master_slave import _caught_up, _commit_log, start_group

KIB = 1024
SEND_TIMEOUT_MS = 10_000  # generous on a loaded machine; the stall never ends at all


def _replicate(cluster_factory, large: list[Message], **master_settings) -> None:
    """A master and one slave, sends needing both: the large send and a small one after it
    are acknowledged, and the slave's commit log ends up identical to the master's."""
    c = start_group(
        cluster_factory,
        slaves=1,
        in_sync_replicas=2,
        sync_flush_timeout_ms=SEND_TIMEOUT_MS,
        **master_settings,
    )
    with hamq.Producer(
        c.namesrv, retry_times_when_send_failed=0, send_timeout_s=2 * SEND_TIMEOUT_MS / 1000
    ) as producer:
        sent = producer.send_batch(large) if len(large) > 1 else producer.send(large[0])
        assert sent.status is SendStatus.SEND_OK
        assert producer.send(Message("Rep", b"after")).status is SendStatus.SEND_OK
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: _caught_up(admin, c), 15, "slave caught up")
    for name in ("master", "slave1"):
        c.procs[name].stop()
    assert _commit_log(c.root / "slave1") == _commit_log(c.root / "master")


def test_a_message_larger_than_a_small_window_reaches_the_slave(cluster_factory):
    _replicate(
        cluster_factory,
        [Message("Rep", os.urandom(1024 * KIB))],
        ha_window_bytes=16 * KIB,
        ha_transfer_batch_bytes=16 * KIB,
    )


def test_a_max_size_batch_reaches_the_slave_under_the_default_window(cluster_factory):
    # Two messages filling MAX_BATCH_BYTES exactly: with its header and topic the record is
    # larger than the default ha_window_bytes (8 MiB, as MAX_BATCH_BYTES).
    per_message = len(Message("Rep", b"").encode("0" * UNIQ_KEY_CHARS))
    body_bytes = MAX_BATCH_BYTES // 2 - per_message
    _replicate(cluster_factory, [Message("Rep", os.urandom(body_bytes)) for _ in range(2)])
