"""The timer log and wheel without a broker: chains per slot, windows in due order, turns of
the wheel, recovery of a torn or damaged log, segment deletion, and the memory bound."""
from __future__ import annotations

import sys

from hamq.broker.timer_log import RECORD_SIZE, TimerLog, TimerRecord
from hamq.broker.timer_wheel import SLOT_MS, WHEEL_SLOTS, TimerWheel

T0 = 1_700_000_000_000  # a slot start


def make_wheel(directory, segment_records: int = 8, slots: int = 16) -> TimerWheel:
    return TimerWheel(TimerLog(directory, segment_records=segment_records), slots)


def recovered(directory, read_ms: int = 0, segment_records: int = 8,
              slots: int = 16) -> tuple[TimerWheel, list[TimerRecord]]:
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
        (T0 + 5, 1), (T0 + 5, 3), (T0 + 300, 4), (T0 + 900, 0)]
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
    for offset in range(10):  # segment 4..7 holds one far timer
        wheel.add(T0 + (100 * SLOT_MS if offset == 5 else offset), offset, offset)
    wheel.log.fsync()
    wheel.log.delete_due_before(T0 + 50)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == [
        f"{4:020d}", f"{8:020d}"]  # the first goes; the far timer's and the active stay
    assert wheel.log.read(0) is None and wheel.log.read(5).due_ms == T0 + 100 * SLOT_MS
    wheel.log.close()
    wheel, seen = recovered(tmp_path, segment_records=4)
    assert [r.queue_offset for r in seen] == list(range(4, 10)) and wheel.log.end == 10
    assert not wheel.log.cut  # deleted segments are not a cut


def test_memory_is_the_slot_array_whatever_the_number_of_timers(tmp_path):
    wheel = TimerWheel(TimerLog(tmp_path))
    size = sys.getsizeof(wheel._tails)
    assert size < WHEEL_SLOTS * 8 + 1024  # 2.8 MB
    for offset in range(20_000):
        wheel.add(T0 + offset * 7, offset, offset)
    assert sys.getsizeof(wheel._tails) == size
