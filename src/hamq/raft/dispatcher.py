"""EntryDispatcher: the leader's replication state machine for one follower (DLedger).

COMPARE walks back from the leader's ledger_end_index to the last index the follower
holds with the same term; TRUNCATE cuts the follower's log there; APPEND then streams
entries from `write_index`, several per message, with `pending_map` remembering when
each APPEND was sent, by the last index it carries (the index its answer names).

Every APPEND and heartbeat carries the follower's watermark, so a follower that lost
entries it had acknowledged answers INCONSISTENT_STATE at once (see handler.py); the
leader then lowers that watermark (node.py says why that is safe) and COMPAREs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from hamq.raft.config import RaftConfig
from hamq.raft.log import EMPTY_INDEX, NO_TERM, Entry
from hamq.raft.messages import Message, MessageType, ResponseCode
from hamq.raft.raft_log import LEDGER_BEGIN_INDEX, RaftLog

NEVER_MS = -(10**18)  # "long ago": forces a send on the next poll


class PushType(IntEnum):
    COMPARE = 1
    TRUNCATE = 2
    APPEND = 3


@dataclass(slots=True)
class EntryDispatcher:
    peer_id: int
    leader_id: int
    term: int
    config: RaftConfig
    push_type: PushType = PushType.COMPARE
    write_index: int = EMPTY_INDEX
    # last index of an APPEND -> sent at (ms)
    pending_map: dict[int, int] = field(default_factory=dict)
    compare_index: int = EMPTY_INDEX
    truncate_index: int = EMPTY_INDEX
    # a COMPARE/TRUNCATE in flight waits for its answer or for push_timeout_ms
    awaiting: bool = False
    last_send_ms: int = NEVER_MS

    def poll(
        self, log: RaftLog, water_mark: int, committed_index: int, now_ms: int
    ) -> list[Message]:
        """Messages this follower should get now."""
        if self.awaiting and now_ms - self.last_send_ms < self.config.push_timeout_ms:
            return []
        if self.push_type == PushType.COMPARE:
            return [self._compare(log, now_ms)]
        if self.push_type == PushType.TRUNCATE:
            return [self._truncate(log, committed_index, now_ms)]
        return self._append(log, water_mark, committed_index, now_ms)

    def _compare(self, log: RaftLog, now_ms: int) -> Message:
        end = log.ledger_end_index
        assert end >= LEDGER_BEGIN_INDEX, "a leader holds at least its no-op entry"
        if not LEDGER_BEGIN_INDEX <= self.compare_index <= end:
            self.compare_index = end
        return self._request(MessageType.COMPARE, log, self.compare_index, now_ms)

    def _truncate(self, log: RaftLog, committed_index: int, now_ms: int) -> Message:
        index = self.truncate_index
        return self._request(
            MessageType.TRUNCATE,
            log,
            index,
            now_ms,
            log_term=log.term(index - 1),
            committed_index=committed_index,
            next_term=log.term(index + 1),
        )

    def _request(
        self,
        mtype: MessageType,
        log: RaftLog,
        index: int,
        now_ms: int,
        *,
        log_term: int = NO_TERM,
        committed_index: int = EMPTY_INDEX,
        next_term: int = NO_TERM,
    ) -> Message:
        self.awaiting = True
        self.last_send_ms = now_ms
        return Message(
            mtype,
            self.leader_id,
            self.peer_id,
            self.term,
            index=index,
            log_term=log_term,
            entries=(log.entry(index),),
            committed_index=committed_index,
            next_term=next_term,
        )

    def _append(
        self, log: RaftLog, water_mark: int, committed_index: int, now_ms: int
    ) -> list[Message]:
        # pending entries at or below the watermark were answered out of order: drop them
        for index in [i for i in self.pending_map if i <= water_mark]:
            del self.pending_map[index]
        # sends are recorded in time order, so the first pending one is the oldest
        oldest_ms = next(iter(self.pending_map.values()), now_ms)
        if now_ms - oldest_ms >= self.config.push_timeout_ms:
            # something was lost: resend everything after what the follower confirmed
            self.pending_map.clear()
            self.write_index = water_mark + 1
        # late acks of entries sent before such a resend may have moved the watermark on
        self.write_index = max(self.write_index, water_mark + 1)
        out = []
        while (
            self.write_index <= log.ledger_end_index
            and len(self.pending_map) < self.config.max_pending_pushes
        ):
            index = self.write_index
            entries = self._next_run(log, index)
            last = entries[-1].index
            out.append(
                Message(
                    MessageType.APPEND,
                    self.leader_id,
                    self.peer_id,
                    self.term,
                    index=index,
                    log_term=log.term(index - 1),
                    entries=entries,
                    committed_index=committed_index,
                    water_mark=water_mark,
                )
            )
            self.pending_map[last] = now_ms
            self.write_index = last + 1
        # The committed index rides on every APPEND; a COMMIT goes only to an idle
        # follower (DLedger's doCommit), as the heartbeat: a separate COMMIT (and its
        # answer) per commit would double the messages of one-at-a-time sends.
        if not out and now_ms - self.last_send_ms >= self.config.heartbeat_interval_ms:
            # only what this follower is known to hold may be declared committed to it
            out.append(
                Message(
                    MessageType.COMMIT,
                    self.leader_id,
                    self.peer_id,
                    self.term,
                    committed_index=min(committed_index, water_mark),
                    water_mark=water_mark,
                )
            )
        if out:
            self.last_send_ms = now_ms
        return out

    def _next_run(self, log: RaftLog, index: int) -> tuple[Entry, ...]:
        """Consecutive entries from `index` for one APPEND, within the count and byte
        bounds (the first one always goes, however large)."""
        stop = min(log.ledger_end_index + 1, index + self.config.max_entries_per_push)
        run = [log.entry(index)]
        size = len(run[0].data)
        for i in range(index + 1, stop):
            entry = log.entry(i)
            size += len(entry.data)
            if size > self.config.max_push_bytes:
                break
            run.append(entry)
        return tuple(run)

    def handle_response(self, msg: Message, log: RaftLog) -> int | None:
        """Apply a PUSH_RESPONSE; returns an index the follower is now known to match."""
        assert msg.type == MessageType.PUSH_RESPONSE and msg.term == self.term
        if msg.req_type == MessageType.APPEND:
            return self._on_append_response(msg)
        if msg.req_type == MessageType.COMPARE:
            if self.push_type == PushType.COMPARE and msg.index == self.compare_index:
                return self._on_compare_response(msg, log)
        elif msg.req_type == MessageType.TRUNCATE:
            if self.push_type == PushType.TRUNCATE and msg.index == self.truncate_index:
                return self._on_truncate_response(msg)
        return None

    def on_lost_entries(self) -> None:
        """The follower's log ends before its watermark: find where the logs agree again
        (a COMPARE round already under way finds it by itself)."""
        if self.push_type == PushType.APPEND:
            self._change_to_compare()

    def _on_append_response(self, msg: Message) -> int | None:
        if msg.code == ResponseCode.SUCCESS:
            self.pending_map.pop(msg.index, None)
            return msg.index  # the follower's log matches ours through msg.index
        # answers to appends sent before the last COMPARE round are stale: ignore them
        if self.push_type == PushType.APPEND and msg.index in self.pending_map:
            self._change_to_compare()
        return None

    def _on_compare_response(self, msg: Message, log: RaftLog) -> int | None:
        self.awaiting = False
        begin, end = msg.begin_index, msg.end_index
        truncate_index = EMPTY_INDEX
        if msg.code == ResponseCode.SUCCESS:
            if self.compare_index == end:
                matched = self.compare_index
                self._change_to_append(matched + 1)
                return matched
            truncate_index = self.compare_index  # it holds extra entries past the match
        elif end < LEDGER_BEGIN_INDEX or begin > log.ledger_end_index:
            truncate_index = LEDGER_BEGIN_INDEX  # the two logs do not overlap
        elif self.compare_index < begin:
            truncate_index = LEDGER_BEGIN_INDEX
        elif self.compare_index > end:
            self.compare_index = end  # it is shorter: no need to walk through the gap
        elif self.compare_index == LEDGER_BEGIN_INDEX:
            truncate_index = LEDGER_BEGIN_INDEX  # even the first entry differs
        else:
            self.compare_index -= 1
        if truncate_index != EMPTY_INDEX:
            self.push_type = PushType.TRUNCATE
            self.truncate_index = truncate_index
        return None

    def _on_truncate_response(self, msg: Message) -> int | None:
        self.awaiting = False
        if msg.code != ResponseCode.SUCCESS:
            self._change_to_compare()  # its log moved under us (e.g. it restarted)
            return None
        matched = self.truncate_index
        self._change_to_append(matched + 1)
        return matched

    def _change_to_append(self, write_index: int) -> None:
        self.push_type = PushType.APPEND
        self.write_index = write_index
        self.pending_map.clear()
        self.awaiting = False

    def _change_to_compare(self) -> None:
        self.push_type = PushType.COMPARE
        self.compare_index = EMPTY_INDEX
        self.truncate_index = EMPTY_INDEX
        self.pending_map.clear()
        self.awaiting = False
