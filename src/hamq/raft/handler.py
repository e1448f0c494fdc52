"""EntryHandler: how a follower applies the leader's APPEND/COMPARE/TRUNCATE/COMMIT.

Every request names the entry before the first one it carries (`log_term` of
`index - 1`), so a reordered or duplicated request can never splice entries onto the wrong
prefix. An APPEND carries a run of entries and is answered once, for its last index.

An APPEND past a gap is one of two things. If our log still reaches the leader's
watermark for us (`water_mark`, what we acknowledged in this term), the gap is reordering:
the APPEND is held until the gap fills, unanswered (answering sent the leader back to
COMPARE on every reordering, and the group never caught up: bug 1 in
tests/sim/regression_seeds.txt), and a truly lost APPEND is resent after the leader's push
timeout. If our log ends before the watermark, we lost entries we acknowledged (a power
loss under async flush, a disk rebuilt empty): no resend from the watermark can continue
our log, so we answer INCONSISTENT_STATE with our real end at once, to APPENDs and to the
heartbeat alike, and the leader COMPAREs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hamq.raft.log import EMPTY_INDEX
from hamq.raft.messages import Message, MessageType, ResponseCode
from hamq.raft.raft_log import LEDGER_BEGIN_INDEX, RaftLog

# APPENDs that arrived ahead of a gap, held until the gap fills (DLedger's
# writeRequestMap); past this many the follower answers INCONSISTENT_STATE instead.
MAX_BUFFERED_APPENDS = 256


@dataclass(slots=True)
class HandlerResult:
    committed_index: int  # the follower's committed index after the request
    responses: list[Message] = field(default_factory=list)


class EntryHandler:
    def __init__(self, log: RaftLog) -> None:
        self._log = log
        self._buffered: dict[int, Message] = {}

    def reset(self) -> None:
        """Forget buffered APPENDs: they belong to a leader we no longer follow."""
        self._buffered.clear()

    def handle(self, msg: Message, committed_index: int) -> HandlerResult:
        result = HandlerResult(committed_index)
        end = self._log.ledger_end_index
        lost_acknowledged = end < msg.water_mark
        if msg.type == MessageType.COMMIT:
            # capped at our end: what we still hold of what the leader declares committed
            result.committed_index = self._advance_commit(committed_index, msg.committed_index, end)
            # answered so the leader knows a majority still hears it (check quorum)
            code = ResponseCode.INCONSISTENT_STATE if lost_acknowledged else ResponseCode.SUCCESS
            result.responses.append(self._response(msg, code))
            return result
        if msg.type == MessageType.APPEND and lost_acknowledged:
            result.responses.append(self._response(msg, ResponseCode.INCONSISTENT_STATE))
            return result
        if msg.type == MessageType.APPEND and msg.index - 1 > end:
            if len(self._buffered) < MAX_BUFFERED_APPENDS:
                self._buffered[msg.index] = msg  # reordered: the gap may fill soon
                return result
        self._handle_one(msg, result)
        while (pending := self._take_buffered()) is not None:
            self._handle_one(pending, result)
        return result

    def _take_buffered(self) -> Message | None:
        """A buffered APPEND that now continues our log. Those our log already covers are
        dropped unanswered: the answer to what covered them acknowledged them too."""
        end = self._log.ledger_end_index
        for index in [i for i in self._buffered if i <= end + 1]:
            msg = self._buffered.pop(index)
            if msg.last_index > end:
                return msg
        return None

    def _handle_one(self, msg: Message, result: HandlerResult) -> None:
        if msg.type == MessageType.APPEND:
            code = self._append(msg)
        elif msg.type == MessageType.COMPARE:
            code = self._compare(msg)
        else:
            assert msg.type == MessageType.TRUNCATE
            code = self._truncate(msg)
        if code == ResponseCode.SUCCESS and msg.type != MessageType.COMPARE:
            # a verified request proves our log matches the leader's through msg.index
            result.committed_index = self._advance_commit(
                result.committed_index, msg.committed_index, msg.last_index
            )
        result.responses.append(self._response(msg, code))

    def _append(self, msg: Message) -> ResponseCode:
        assert msg.entries and msg.entries[0].index == msg.index
        if not self._log.matches(msg.index - 1, msg.log_term):
            return ResponseCode.INCONSISTENT_STATE  # a gap, or a different previous entry
        for entry in msg.entries:
            if not self._log.matches(entry.index, entry.term):
                self._log.write(entry)  # new, or replaces a conflicting uncommitted suffix
        return ResponseCode.SUCCESS

    def _compare(self, msg: Message) -> ResponseCode:
        assert len(msg.entries) == 1
        if self._log.matches(msg.index, msg.entries[0].term):
            return ResponseCode.SUCCESS
        return ResponseCode.INCONSISTENT_STATE

    def _truncate(self, msg: Message) -> ResponseCode:
        assert len(msg.entries) == 1 and msg.entries[0].index == msg.index
        log = self._log
        if not log.matches(msg.index - 1, msg.log_term):
            return ResponseCode.INCONSISTENT_STATE
        if not log.matches(msg.index, msg.entries[0].term):
            log.write(msg.entries[0])
        elif log.term(msg.index + 1) not in (msg.term, msg.next_term):
            # an entry after the cut written in the leader's term, or equal to the
            # leader's own, means this is a stale duplicate: cutting would lose acked data
            log.truncate_after(msg.index)
        return ResponseCode.SUCCESS

    def _response(self, msg: Message, code: ResponseCode) -> Message:
        end = self._log.ledger_end_index
        return Message(
            MessageType.PUSH_RESPONSE,
            msg.to_id,
            msg.from_id,
            msg.term,
            index=msg.last_index,
            code=code,
            req_type=msg.type,
            begin_index=LEDGER_BEGIN_INDEX if end != EMPTY_INDEX else EMPTY_INDEX,
            end_index=end,
        )

    @staticmethod
    def _advance_commit(committed_index: int, leader_committed: int, verified_index: int) -> int:
        return max(committed_index, min(leader_committed, verified_index))
