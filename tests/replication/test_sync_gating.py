"""Synchronised mirrors (seed 003), sans-IO: the need offset rule, the SyncStateSet gated
on it (join only at or below it, leave when it drops below the log start), tail joins,
sync-queue restarts from the need offset in batches of records, and cancel."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hamq.replication.master import MasterReplication, Probe, Restart
from hamq.replication.need_offset import QueueProgress, first_needed, need_offset
from hamq.replication.quorum import QuorumConfig
from hamq.replication.sync_state_set import SyncStateSet

MASTER, SLAVE = 0, 1
RECORD = 100  # bytes per record of the fake log


@dataclass
class FixedLog:
    """A ``RecordLog`` of equal records in [min_offset, max_offset)."""

    min_offset: int
    max_offset: int

    def probe(self, offset: int) -> Probe | None:
        inside = self.min_offset <= offset < self.max_offset
        if not inside or (offset - self.min_offset) % RECORD:
            return None
        return Probe(offset, offset + RECORD, offset)

    def record_starts(self, lo: int, hi: int) -> Sequence[int]:
        first = max(lo, self.min_offset)
        first += -(first - self.min_offset) % RECORD
        return range(first, min(hi, self.max_offset), RECORD)

    def last_record_start(self) -> int | None:
        return self.max_offset - RECORD if self.max_offset > self.min_offset else None

    def records_end(self, start: int, end: int, records: int) -> int:
        starts = self.record_starts(start + 1, end)
        return starts[records - 1] if len(starts) >= records else end


def core() -> tuple[MasterReplication, SyncStateSet]:
    sss = SyncStateSet(MASTER, 1000)
    m = MasterReplication(QuorumConfig(), 1 << 30, 1 << 20, sync_state_set=sss, all_ack=True)
    return m, sss


# -- the need offset -----------------------------------------------------------------------
def test_a_queue_no_group_has_an_offset_in_is_needed_whole():
    assert first_needed(QueueProgress(5, 20, ())) == 5


def test_a_queue_is_needed_from_its_slowest_groups_offset_never_below_its_start():
    assert first_needed(QueueProgress(5, 20, (12, 9, 17))) == 9
    assert first_needed(QueueProgress(5, 20, (2,))) == 5  # retention passed the offset


def test_a_queue_every_group_consumed_is_not_needed():
    assert first_needed(QueueProgress(5, 20, (20, 25))) is None
    assert first_needed(QueueProgress(0, 0, ())) is None  # empty


def test_the_need_offset_is_the_least_needed_record_else_the_log_end_never_below_its_start():
    assert need_offset([700, 300, 900], log_min=0, log_end=1000) == 300
    assert need_offset([], log_min=0, log_end=1000) == 1000
    assert need_offset([300], log_min=400, log_end=1000) == 400


# -- gating the SyncStateSet -------------------------------------------------------------------
def caught_up(sss: SyncStateSet, log_start: int, end: int) -> None:
    sss.on_connect(SLAVE, end, now_ms=0, log_start=log_start)
    sss.on_ack(SLAVE, end)


def test_without_a_need_offset_nothing_is_gated():
    sss = SyncStateSet(MASTER, 1000)
    caught_up(sss, log_start=500, end=1000)
    assert sss.maybe_expand(SLAVE, 1000)


def test_a_caught_up_slave_whose_log_starts_above_the_need_offset_stays_out():
    sss = SyncStateSet(MASTER, 1000)
    sss.set_need_offset(300)
    caught_up(sss, log_start=500, end=1000)
    assert not sss.maybe_expand(SLAVE, 1000)
    assert sss.change(now_ms=10, master_max_offset=1000) is None
    assert SLAVE not in sss.effective


def test_it_joins_once_consumers_pass_its_log_start():
    sss = SyncStateSet(MASTER, 1000)
    sss.set_need_offset(300)
    caught_up(sss, log_start=500, end=1000)
    sss.set_need_offset(500)
    assert sss.change(now_ms=10, master_max_offset=1000) == {MASTER, SLAVE}


def member_of_the_set(need: int, log_start: int) -> SyncStateSet:
    """A set whose caught-up slave, its log starting at ``log_start``, joined under
    need offset ``need``."""
    sss = SyncStateSet(MASTER, 1000)
    sss.set_need_offset(need)
    caught_up(sss, log_start=log_start, end=1000)
    assert sss.maybe_expand(SLAVE, 1000)
    sss.apply(frozenset({MASTER, SLAVE}), 1)
    return sss


def test_a_member_leaves_when_the_need_offset_drops_below_its_log_start():
    sss = member_of_the_set(need=600, log_start=500)
    sss.set_need_offset(400)  # a new consumer group: the whole queue is needed again
    assert sss.change(now_ms=10, master_max_offset=1000) == {MASTER}


def test_a_slave_reporting_retention_past_the_need_offset_leaves():
    sss = member_of_the_set(need=600, log_start=0)
    sss.on_ack(SLAVE, 1000, log_start=700)
    assert sss.change(now_ms=10, master_max_offset=1000) == {MASTER}


# -- joins, sync and cancel in the master core -------------------------------------------------
def test_an_empty_slave_asking_for_the_tail_starts_at_the_masters_end():
    m, sss = core()
    log = FixedLog(0, 1000)
    attached = m.attach("s", SLAVE, 0, None, log, now_ms=0, tail=True)
    assert attached is not None and attached.start == 1000
    assert m.slaves["s"].log_start == 1000 and sss.slaves[SLAVE].log_start == 1000


def test_an_empty_slave_joining_with_history_starts_at_the_masters_first_byte():
    m, _ = core()
    attached = m.attach("s", SLAVE, 0, None, FixedLog(200, 1000), now_ms=0)
    assert attached is not None and attached.start == 200 and m.slaves["s"].log_start == 200


def test_a_slave_with_records_continues_whatever_it_asks():
    m, _ = core()
    log = FixedLog(0, 1000)
    proof = log.probe(700)
    attached = m.attach("s", SLAVE, 800, proof, log, now_ms=0, log_start=500, tail=True)
    assert attached is not None and attached.start == 800 and m.slaves["s"].log_start == 500


def test_sync_restarts_an_unsynchronised_slave_at_the_need_offset_in_batches():
    m, _ = core()
    log = FixedLog(0, 10_000)
    m.restart(SLAVE, Restart(3000, batch_records=4))
    proof = log.probe(9900)
    attached = m.attach("s", SLAVE, 10_000, proof, log, now_ms=0, log_start=9000)
    assert attached is not None and attached.start == 3000
    s = m.slaves["s"]
    assert (s.log_start, s.sync_start, s.batch_records) == (3000, 3000, 4)
    spans = []
    while (span := m.next_transfer("s", 10_000, 0, log.records_end)) is not None:
        spans.append(span)
    assert spans[0] == (3000, 3400) and all(end - start <= 4 * RECORD for start, end in spans)
    assert spans[-1][1] == 10_000 and not m.restarts  # a restart is used once
    assert s.sync_batches == len(spans) - 1  # the last ended at the log's end


def test_a_sync_never_raises_a_log_start_it_only_lowers_it():
    m, _ = core()
    log = FixedLog(0, 10_000)
    m.restart(SLAVE, Restart(3000, batch_records=4))
    attached = m.attach("s", SLAVE, 10_000, log.probe(9900), log, now_ms=0, log_start=1000)
    assert attached is not None and attached.start == 10_000
    assert m.slaves["s"].sync_start is None and m.slaves["s"].batch_records == 0


def test_cancel_sends_the_slave_back_to_the_tail():
    m, sss = core()
    log = FixedLog(0, 10_000)
    m.restart(SLAVE, Restart(None))
    attached = m.attach("s", SLAVE, 5000, log.probe(4900), log, now_ms=0, log_start=3000)
    assert attached is not None and attached.start == 10_000
    assert m.slaves["s"].sync_start is None and sss.slaves[SLAVE].log_start == 10_000


def test_without_a_batch_size_transfers_are_bounded_by_bytes_only():
    m, _ = core()
    log = FixedLog(0, 10_000)
    m.attach("s", SLAVE, 0, None, log, now_ms=0)
    assert m.next_transfer("s", 10_000, 0, log.records_end) == (0, 10_000)


def test_a_member_the_controller_may_still_elect_is_not_restarted_until_it_leaves_the_set():
    """A consumer offset reset drops the need offset below a member's log start; a
    sync-queue before the controller applied the shrink must not empty that member's log:
    while it is in the set the controller may elect it, and it would lose everything."""
    m, sss = core()
    log = FixedLog(0, 10_000)
    m.attach("s", SLAVE, 10_000, log.probe(9900), log, now_ms=0, log_start=5000)
    sss.set_need_offset(6000)
    m.on_ack("s", 10_000, now_ms=0, received_offset=10_000)
    assert sss.maybe_expand(SLAVE, 10_000)
    sss.apply(frozenset({MASTER, SLAVE}), 1)
    sss.set_need_offset(2000)  # the reset: the member is no longer synchronised
    m.restart(SLAVE, Restart(2000, batch_records=4))
    attached = m.attach("s2", SLAVE, 10_000, log.probe(9900), log, now_ms=1, log_start=5000)
    assert attached is not None and attached.start == 10_000  # continues, nothing cut
    assert m.slaves["s2"].sync_start is None and SLAVE in m.restarts  # kept for later
    assert sss.change(now_ms=2, master_max_offset=10_000) == {MASTER}
    attached = m.attach("s3", SLAVE, 10_000, log.probe(9900), log, now_ms=3, log_start=5000)
    assert attached is not None and attached.start == 10_000  # proposed out, not applied
    sss.apply(frozenset({MASTER}), 2)  # the shrink applied: now it may restart
    attached = m.attach("s4", SLAVE, 10_000, log.probe(9900), log, now_ms=4, log_start=5000)
    assert attached is not None and attached.start == 2000
    assert m.slaves["s4"].sync_start == 2000 and not m.restarts


def ship_all(m: MasterReplication, key: str, log: FixedLog) -> None:
    while m.next_transfer(key, log.max_offset, 0, log.records_end) is not None:
        pass


def test_a_slave_restarted_mid_sync_is_still_syncing_and_cancel_reaches_it():
    """kill -9 of a syncing slave: it comes back with its log starting at the need offset
    and refills by an ordinary attach (the sync's restart was used up). It is still
    syncing, so cancel-sync-queue can stop it; once in the set it is not."""
    m, sss = core()
    log = FixedLog(0, 10_000)
    sss.set_need_offset(3000)
    m.restart(SLAVE, Restart(3000, batch_records=4))
    assert m.syncing() == {SLAVE}  # pending: its session closed, not attached yet
    m.attach("s", SLAVE, 10_000, log.probe(9900), log, now_ms=0, log_start=9000)
    assert m.syncing() == {SLAVE}
    ship_all(m, "s", log)
    m.on_ack("s", 4000, now_ms=0, received_offset=4000)
    m.disconnect("s")  # killed mid-sync, restarted: its log is [3000, 4000)
    attached = m.attach("s2", SLAVE, 4000, log.probe(3900), log, now_ms=1, log_start=3000)
    assert attached is not None and attached.start == 4000
    assert m.slaves["s2"].sync_start is None  # an ordinary attach: no sync session
    assert m.syncing() == {SLAVE}
    ship_all(m, "s2", log)
    m.on_ack("s2", 10_000, now_ms=2, received_offset=10_000)
    assert sss.maybe_expand(SLAVE, 10_000)
    assert m.syncing() == set()  # synchronised
    m.attach("t", 2, 0, None, log, now_ms=3, tail=True)
    assert m.syncing() == set()  # a tail mirror is not syncing until asked to
