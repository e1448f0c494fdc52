"""The timer log and wheel without a broker: chains per slot, windows in due order, turns of
the wheel, recovery of a torn or damaged log, segment deletion, the memory bound, and seeded
power losses on the simulated disk."""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

from hamq.broker.schedule.timer_log import RECORD_SIZE, TimerLog, TimerRecord
from hamq.broker.schedule.timer_wheel import SLOT_MS, WHEEL_SLOTS, TimerWheel
from hamq.sim.fs import SimDisk

T0 = 1_700_000_000_000  # a slot start


def make_wheel(directory, segment_records: int = 8, slots: int = 16) -> TimerWheel:
    return TimerWheel(TimerLog(directory, segment_records=segment_records), slots)


def recovered(
    directory, read_ms: int = 0, segment_records: int = 8, slots: int = 16
) -> tuple[TimerWheel, list[TimerRecord]]:
    """Reopen the log, link what is due from ``read_ms`` on, as the schedule service does."""
    wheel = make_wheel(directory, segment_records, slots)
    seen: list[TimerRecord] = []

    def visit(record: TimerRecord) -> None:
        seen.append(record)
        if record.due_ms >= read_ms:
            wheel.link(record)

    wheel.log.recover(visit)
    return wheel, seen


def test_a_slot_window_is_its_timers_in_due_order(tmp_path):
    wheel = make_wheel(tmp_path)
    for offset, due in enumerate([T0 + 900, T0 + 5, T0 + SLOT_MS + 1, T0 + 5, T0 + 300]):
        wheel.add(due, offset, 1000 + offset)
    window, rest = wheel.window(T0, wheel.tail(T0))
    assert [(r.due_ms, r.queue_offset) for r in window] == [
        (T0 + 5, 1),
        (T0 + 5, 3),
        (T0 + 300, 4),
        (T0 + 900, 0),
    ]
    assert rest == -1
    assert [r.queue_offset for r in wheel.window(T0 + SLOT_MS, wheel.tail(T0 + SLOT_MS))[0]] == [2]
    # a big slot comes in windows: the walk goes on where the last window stopped
    first, rest = wheel.window(T0, wheel.tail(T0), limit=3)
    assert len(first) == 3 and rest >= 0
    second, rest = wheel.window(T0, rest, limit=3)
    assert rest == -1
    assert sorted(r.queue_offset for r in first + second) == [0, 1, 3, 4]


def test_a_walk_stops_at_an_earlier_turn_of_the_same_slot(tmp_path):
    wheel = make_wheel(tmp_path, slots=4)
    wheel.add(T0, 0, 0)  # delivered on an earlier turn, its slot not cleared (a crash)
    later = T0 + 4 * SLOT_MS
    assert wheel.fits(later, T0 + SLOT_MS) and not wheel.fits(later, T0)
    wheel.add(later, 1, 1)
    assert [r.queue_offset for r in wheel.window(later, wheel.tail(later))[0]] == [1]
    wheel.clear(later)
    assert wheel.tail(later) == -1


def test_recovery_relinks_what_is_due_and_cuts_a_torn_tail(tmp_path):
    wheel = make_wheel(tmp_path)
    for offset in range(20):  # three segments of 8
        wheel.add(T0 + (offset % 4) * SLOT_MS + offset, offset, offset * 100)
    log_id = wheel.log.log_id
    wheel.log.close()
    last = tmp_path / f"{16:020d}"
    with open(last, "r+b") as f:  # a torn last record
        f.truncate(3 * RECORD_SIZE + 7)

    wheel, seen = recovered(tmp_path, read_ms=T0 + SLOT_MS)
    assert wheel.log.log_id == log_id
    assert [r.queue_offset for r in seen] == list(range(19))
    assert wheel.log.end == 19 and last.stat().st_size == 3 * RECORD_SIZE and wheel.log.cut
    assert wheel.tail(T0) == -1  # due before the cursor: delivered, not linked
    window, _ = wheel.window(T0 + SLOT_MS, wheel.tail(T0 + SLOT_MS))
    assert [r.queue_offset for r in window] == [1, 5, 9, 13, 17]
    assert wheel.add(T0 + SLOT_MS, 99, 0) == 19  # appends go on after the cut


def test_recovery_stops_at_a_damaged_record_and_drops_later_segments(tmp_path):
    wheel = make_wheel(tmp_path)
    for offset in range(20):
        wheel.add(T0 + offset, offset, offset)
    wheel.log.close()
    with open(tmp_path / f"{8:020d}", "r+b") as f:  # record 10: a flipped byte
        f.seek(2 * RECORD_SIZE + 9)
        byte = f.read(1)
        f.seek(2 * RECORD_SIZE + 9)
        f.write(bytes([byte[0] ^ 0xFF]))
    wheel, seen = recovered(tmp_path)
    assert [r.queue_offset for r in seen] == list(range(10))
    assert wheel.log.end == 10
    assert not (tmp_path / f"{16:020d}").exists()
    assert wheel.log.read(10) is None and wheel.log.read(9).queue_offset == 9


def test_segments_are_deleted_once_all_their_timers_are_past_the_cursor(tmp_path):
    wheel = make_wheel(tmp_path, segment_records=4)
    for offset in range(14):  # segment 4..7 holds one far timer
        wheel.add(T0 + (100 * SLOT_MS if offset == 5 else offset), offset, offset)
    wheel.log.fsync()
    wheel.log.delete_due_before(T0 + 50)
    # the first goes; from the far timer's on they stay (the log is one run of positions)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == [
        f"{4:020d}",
        f"{8:020d}",
        f"{12:020d}",
    ]
    assert wheel.log.read(0) is None and wheel.log.read(5).due_ms == T0 + 100 * SLOT_MS
    wheel.log.close()
    wheel, seen = recovered(tmp_path, segment_records=4)
    assert [r.queue_offset for r in seen] == list(range(4, 14)) and wheel.log.end == 14
    assert not wheel.log.cut  # deleted segments are not a cut


def test_memory_is_the_slot_array_whatever_the_number_of_timers(tmp_path):
    wheel = TimerWheel(TimerLog(tmp_path))
    size = sys.getsizeof(wheel._tails)
    assert size < WHEEL_SLOTS * 8 + 1024  # 2.8 MB
    for offset in range(20_000):
        wheel.add(T0 + offset * 7, offset, offset)
    assert sys.getsizeof(wheel._tails) == size


def run_power_loss_seed(seed: int) -> str | None:
    """Appends across segment rolls, fsyncs, deletions and kills on the simulated disk, then
    a power loss: the log must reopen, keep every record fsynced before (unless deleted),
    read back nothing it was not given, and take appends after its end. What went wrong,
    or None."""
    rng = random.Random(seed)
    disk = SimDisk()
    directory = Path("/store/timerlog")
    segment_records = rng.choice([4, 8, 16])
    log = TimerLog(directory, disk=disk, segment_records=segment_records)
    written: dict[int, tuple[int, int, int, int]] = {}  # position -> what was appended
    durable_end = deleted_below = 0
    for _ in range(rng.randrange(5, 60)):
        action = rng.random()
        if action < 0.6:
            for _ in range(rng.randrange(1, 6)):
                record = (rng.randrange(-1, 50), T0 + rng.randrange(10**6), len(written), 7)
                written[log.append(*record)] = record
        elif action < 0.8:
            log.fsync()
            durable_end = log.end
        elif action < 0.9:
            log.delete_due_before(T0 + rng.randrange(10**6))
            deleted_below = min((p for p in range(log.end) if log.read(p)), default=log.end)
        else:
            disk.kill()
            log = TimerLog(directory, disk=disk, segment_records=segment_records)
            log.recover(lambda record: None)
            written = {p: r for p, r in written.items() if p < log.end}
    disk.power_loss(rng)
    seen: dict[int, tuple[int, int, int, int]] = {}
    try:
        log = TimerLog(directory, disk=disk, segment_records=segment_records)
        log.recover(lambda r: seen.__setitem__(r.pos, r[1:]))
    except Exception as err:  # noqa: BLE001 - any refusal is the finding
        return f"seed {seed}: refused to open after a power loss: {err!r}"
    for pos, record in seen.items():
        if written.get(pos) != record:
            return f"seed {seed}: record {pos} reads {record}, {written.get(pos)} was written"
    lost = [p for p in range(deleted_below, durable_end) if p in written and p not in seen]
    if lost:
        return f"seed {seed}: fsynced records {lost[:5]} lost"
    if sorted(seen) != list(range(min(seen, default=log.end), log.end)):
        return f"seed {seed}: recovered records are not one run ending at {log.end}"
    if log.read(log.append(-1, T0, 1, 1)) != (log.end - 1, -1, T0, 1, 1):
        return f"seed {seed}: an append after recovery does not read back"
    return None


def test_the_timer_log_recovers_a_valid_prefix_after_any_power_loss(caplog):
    caplog.set_level(logging.ERROR)  # each seed logs its cuts as warnings
    failures = [r for r in map(run_power_loss_seed, range(300)) if r is not None]
    assert failures == []
