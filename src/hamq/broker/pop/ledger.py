"""CK/ACK records applied in their order to the pop state they describe: a CK checks its
offsets out under its receipt id, an ACK naming that id cancels them (an ACK naming another
id — an older delivery — cancels nothing). A member rebuilds its own state this way at
start, and the same function cancels an acting master's escaped records against each other
wherever they are replayed (seed 004: all of them go to one chosen master for that reason)."""

from __future__ import annotations

from collections.abc import Callable

from hamq.broker.pop.revive_log import KIND_CK, ReviveRecord
from hamq.broker.pop.state import PopQueueState

StateKey = tuple[str, str, int]  # group, topic, queue id
# Where a queue's state starts when a CK first reaches it: (group, topic, queue id, offsets)
StartOffset = Callable[[str, str, int, list[int]], int]


def apply_record(
    states: dict[StateKey, PopQueueState], record: ReviveRecord, start_offset: StartOffset
) -> None:
    if record.kind == KIND_CK:
        for queue_id, offsets, times in record.entries:
            key = (record.group, record.topic, queue_id)
            state = states.get(key)
            if state is None:
                state = states[key] = PopQueueState(
                    start_offset(record.group, record.topic, queue_id, offsets)
                )
            state.check_out(offsets, times, record.deadline_ms, record.ck)
        return
    for topic, queue_id, offset, ck in record.entries:
        state = states.get((record.group, topic, queue_id))
        if state is not None:
            state.ack(offset, ck)
