"""Raft messages: plain dataclasses with a msgpack codec for the TCP transport.

One flat `Message` (as etcd's raftpb.Message) keeps the codec a single function pair;
fields a type does not use keep their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import msgpack

from hamq.raft.errors import MessageDecodeError
from hamq.raft.log import EMPTY_INDEX, NO_TERM, Entry


class MessageType(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESPONSE = 2
    VOTE = 3
    VOTE_RESPONSE = 4
    APPEND = 5  # DLedger PushEntryRequest.Type.APPEND
    COMPARE = 6
    TRUNCATE = 7
    COMMIT = 8  # also the leader's heartbeat
    PUSH_RESPONSE = 9  # answer to APPEND / COMPARE / TRUNCATE / COMMIT
    TIMEOUT_NOW = 10  # leadership transfer: "campaign now"


class ResponseCode(IntEnum):
    SUCCESS = 0
    INCONSISTENT_STATE = 1  # gap or mismatch: the leader must COMPARE
    REJECTED = 2  # vote refused
    STALE_TERM = 3  # the request's term is behind ours; `term` carries ours


REQUEST_TYPES = frozenset(
    {MessageType.APPEND, MessageType.COMPARE, MessageType.TRUNCATE, MessageType.COMMIT}
)
VOTE_REQUEST_TYPES = frozenset({MessageType.PRE_VOTE, MessageType.VOTE})
_FIELD_COUNT = 14


@dataclass(frozen=True, slots=True)
class Message:
    """A Raft message; see the `MessageType` comments for which fields each one uses.

    `index` is the entry index a push request carries (or, in a vote, the candidate's
    ledger_end_index); `log_term` is the term just before `index` for APPEND/TRUNCATE
    and the candidate's last term for votes; `next_term` is the leader's term at
    `index + 1` for TRUNCATE so a duplicated truncate cannot cut entries written since.
    """

    type: MessageType
    from_id: int
    to_id: int
    term: int
    index: int = EMPTY_INDEX
    log_term: int = NO_TERM
    entry: Entry | None = None
    committed_index: int = EMPTY_INDEX
    code: ResponseCode = ResponseCode.SUCCESS
    req_type: MessageType | None = None
    begin_index: int = EMPTY_INDEX
    end_index: int = EMPTY_INDEX
    next_term: int = NO_TERM
    force: bool = False  # a transfer campaign: voters ignore their leader lease

    def encode(self) -> bytes:
        entry = self.entry
        packed_entry = None if entry is None else [entry.index, entry.term, entry.data, entry.is_noop]
        return msgpack.packb(
            [
                int(self.type), self.from_id, self.to_id, self.term, self.index,
                self.log_term, packed_entry, self.committed_index, int(self.code),
                None if self.req_type is None else int(self.req_type),
                self.begin_index, self.end_index, self.next_term, self.force,
            ],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes) -> Message:
        try:
            fields = msgpack.unpackb(data, raw=False)
            if not isinstance(fields, list) or len(fields) != _FIELD_COUNT:
                raise MessageDecodeError(f"expected a {_FIELD_COUNT}-field array")
            (mtype, from_id, to_id, term, index, log_term, packed_entry, committed,
             code, req_type, begin, end, next_term, force) = fields
            entry = None if packed_entry is None else Entry(
                int(packed_entry[0]), int(packed_entry[1]), bytes(packed_entry[2]),
                bool(packed_entry[3]),
            )
            return cls(
                MessageType(mtype), int(from_id), int(to_id), int(term), int(index),
                int(log_term), entry, int(committed), ResponseCode(code),
                None if req_type is None else MessageType(req_type),
                int(begin), int(end), int(next_term), bool(force),
            )
        except MessageDecodeError:
            raise
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise MessageDecodeError(str(exc)) from exc
