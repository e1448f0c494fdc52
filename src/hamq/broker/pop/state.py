"""What pop consumption remembers per (group, topic, queue), sans-IO.

Every queue offset in ``[consume_offset, pop_offset)`` is either *in flight* (popped, not
acked; invisible until its deadline) or *acked* above the acked prefix. ``consume_offset``
is the end of the contiguous acked prefix: it is what the group's consumer offset shows.

The revive log (``revive_log.py``) records each change as a checkpoint (CK: offsets handed
out with a deadline) or an ACK, and replaying those records through ``check_out`` and
``ack`` rebuilds exactly this state: both are deterministic given the records' order.

The state stays small whatever is acked: acked offsets above the prefix are kept as ranges
(a message never acked — a poison message until it goes to the DLQ — leaves every later
ack in one range, not a set of millions), and the deadline heap is rebuilt once acked
entries outnumber the live ones. ``version`` counts changes, so a checkpoint re-encodes
only the queues that changed.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable
from enum import IntEnum

# (deadline_ms, reconsume_times, ck): ck is the revive-log offset of the checkpoint that
# handed the message out, so a receipt handle from an older delivery cannot ack a newer one.
InFlight = tuple[int, int, int]


class AckResult(IntEnum):
    ACKED = 0
    ALREADY_ACKED = 1
    STALE = 2  # in flight under another receipt handle (redelivered since), or never popped


# The receipt id of offsets a checkpoint skipped over: a replayed CK names offsets above the
# state's pop offset when the CKs that handed out those in between never reached this member
# (a slave that lagged behind the one that acted before it; a revive log cut by retention).
# Someone may hold them unacked: they are due at once (at least once), never skipped for ever.
UNKNOWN_CK = -1

# Stale deadline-heap entries tolerated beyond the live ones before the heap is rebuilt.
DEADLINE_SLACK = 1024


class AckedRanges:
    """Offsets as sorted, disjoint ``[start, end)`` ranges. Acks arrive mostly in order, so
    they extend one range; memory follows the gaps between acked offsets, not their count."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.ends[i]

    def __len__(self) -> int:
        """The number of ranges (not of offsets)."""
        return len(self.starts)

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))

    def add(self, offset: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, offset) - 1  # the range starting at or before ``offset``
        if i >= 0 and offset < ends[i]:
            return
        joins_left = i >= 0 and ends[i] == offset
        joins_right = i + 1 < len(starts) and starts[i + 1] == offset + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = offset + 1
        elif joins_right:
            starts[i + 1] = offset
        else:
            starts.insert(i + 1, offset)
            ends.insert(i + 1, offset + 1)

    def take_prefix(self, offset: int) -> int:
        """Remove the range starting at ``offset``, if any; returns where the contiguous
        run from ``offset`` ends."""
        if self.starts and self.starts[0] == offset:
            del self.starts[0]
            return self.ends.pop(0)
        return offset

    def keep(self, low: int, high: int) -> None:
        """Forget offsets outside ``[low, high)``."""
        kept = [
            (max(s, low), min(e, high))
            for s, e in zip(self.starts, self.ends)
            if e > low and s < high
        ]
        self.starts = [s for s, _ in kept]
        self.ends = [e for _, e in kept]


class PopQueueState:
    __slots__ = ("_deadlines", "acked", "consume_offset", "inflight", "pop_offset", "version")

    def __init__(self, consume_offset: int) -> None:
        self.consume_offset = consume_offset
        self.pop_offset = consume_offset
        self.inflight: dict[int, InFlight] = {}
        self.acked = AckedRanges()
        self.version = 0  # bumped by every change of what ``to_wire`` encodes
        # Min-heap of (deadline_ms, offset, ck); entries that no longer match ``inflight``
        # (acked, or handed out again) are dropped lazily, or all at once past
        # ``DEADLINE_SLACK`` of them.
        self._deadlines: list[InFlight] = []

    def check_out(
        self, offsets: Iterable[int], reconsume_times: Iterable[int], deadline_ms: int, ck: int
    ) -> None:
        """Apply a checkpoint: these offsets are invisible until ``deadline_ms``."""
        inflight, push, heap = self.inflight, heapq.heappush, self._deadlines
        top = self.pop_offset
        for offset, times in zip(offsets, reconsume_times):
            if offset >= top:
                for skipped in range(top, offset):  # handed out by a CK this state missed
                    inflight[skipped] = (0, 0, UNKNOWN_CK)
                    push(heap, (0, skipped, UNKNOWN_CK))
                top = offset + 1
            elif offset < self.consume_offset or offset in self.acked:
                continue  # acked meanwhile (possible when a replay starts mid-history)
            inflight[offset] = (deadline_ms, times, ck)
            push(heap, (deadline_ms, offset, ck))
        self.pop_offset = top
        self.version += 1

    def take_expired(self, now_ms: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (offset, reconsume_times + 1) whose invisible time is over. The
        caller checks them out again (or calls ``restore_deadlines`` if it cannot)."""
        heap, inflight = self._deadlines, self.inflight
        due: list[tuple[int, int]] = []
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            deadline, offset, ck = heapq.heappop(heap)
            entry = inflight.get(offset)
            if entry is not None and entry[0] == deadline and entry[2] == ck:
                due.append((offset, entry[1] + 1))
        due.sort()
        return due

    def revive_now(self, now_ms: int) -> int:
        """Everything in flight is due at ``now_ms`` (a new master took the group over: the
        consumers that held these have lost their master, RabbitMQ requeues them at once);
        returns how many. Their receipt handles stay valid until they are handed out again."""
        if not self.inflight:
            return 0
        self.inflight = {o: (min(d, now_ms), r, ck) for o, (d, r, ck) in self.inflight.items()}
        self.version += 1
        self.restore_deadlines()
        return len(self.inflight)

    def next_deadline_ms(self) -> int | None:
        """The earliest invisible time that runs out (possibly of an entry acked since, so
        a caller may wake for nothing once), or None if nothing is in flight."""
        return self._deadlines[0][0] if self._deadlines else None

    def restore_deadlines(self) -> None:
        self._deadlines = [(d, o, ck) for o, (d, _, ck) in self.inflight.items()]
        heapq.heapify(self._deadlines)

    def lookup(self, offset: int, ck: int) -> InFlight | None:
        """The in-flight entry of ``offset`` if ``ck`` is its current receipt handle."""
        entry = self.inflight.get(offset)
        return entry if entry is not None and entry[2] == ck else None

    def ack(self, offset: int, ck: int) -> AckResult:
        entry = self.inflight.get(offset)
        if entry is None:
            done = offset < self.consume_offset or offset in self.acked
            return AckResult.ALREADY_ACKED if done else AckResult.STALE
        if entry[2] != ck:
            return AckResult.STALE
        del self.inflight[offset]
        if offset == self.consume_offset:
            self.consume_offset = self.acked.take_prefix(offset + 1)
        else:
            self.acked.add(offset)
        self.version += 1
        if len(self._deadlines) > 2 * len(self.inflight) + DEADLINE_SLACK:
            self.restore_deadlines()
        return AckResult.ACKED

    def forget_below(self, min_offset: int) -> None:
        """Retention deleted everything below ``min_offset``: nothing there can be
        delivered any more."""
        if self.consume_offset >= min_offset:
            return
        self.inflight = {o: e for o, e in self.inflight.items() if o >= min_offset}
        self.acked.keep(min_offset, self.pop_offset)
        self.pop_offset = max(self.pop_offset, min_offset)
        self.consume_offset = self.acked.take_prefix(min_offset)
        self.version += 1
        self.restore_deadlines()

    def truncate_to(self, max_offset: int) -> None:
        """The queue ends below ``pop_offset`` (a torn tail was cut after a power loss):
        forget what was handed out past its end, so new messages there count as new."""
        if self.pop_offset <= max_offset:
            return
        self.inflight = {o: e for o, e in self.inflight.items() if o < max_offset}
        self.acked.keep(0, max_offset)
        self.pop_offset = max_offset
        self.consume_offset = min(self.consume_offset, max_offset)
        self.version += 1
        self.restore_deadlines()

    # -- snapshot (the revive checkpoint) ---------------------------------------------
    def to_wire(self) -> list:
        return [
            self.consume_offset,
            self.pop_offset,
            [[o, d, r, ck] for o, (d, r, ck) in self.inflight.items()],
            [[s, e] for s, e in self.acked.ranges()],
        ]

    def check(self) -> None:
        """Raises ValueError unless every offset, deadline and count is an integer (a state
        read from another member, GET_POP_CHECKPOINT)."""
        values = [self.consume_offset, self.pop_offset, *self.acked.starts, *self.acked.ends]
        for offset, entry in self.inflight.items():
            values += [offset, *entry]
        if not all(type(v) is int for v in values):
            raise ValueError("pop queue state holds a value that is not an integer")

    @staticmethod
    def from_wire(data: list) -> PopQueueState:
        consume_offset, pop_offset, inflight, acked = data
        state = PopQueueState(consume_offset)
        state.pop_offset = pop_offset
        state.inflight = {o: (d, r, ck) for o, d, r, ck in inflight}
        for entry in acked:  # [start, end] ranges; single offsets in older checkpoints
            if isinstance(entry, int):
                state.acked.add(entry)
            else:
                state.acked.starts.append(entry[0])
                state.acked.ends.append(entry[1])
        state.restore_deadlines()
        return state
