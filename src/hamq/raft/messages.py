"""Raft messages: plain dataclasses with a msgpack codec for the TCP transport.

One flat `Message` (as etcd's raftpb.Message) keeps the codec a single function pair;
fields a type does not use keep their defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
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
_FIELD_COUNT = 16
# decode looks codes up here: calling an IntEnum for every field costs microseconds each
_MESSAGE_TYPES = {int(t): t for t in MessageType}
_RESPONSE_CODES = {int(c): c for c in ResponseCode}


@dataclass(frozen=True, slots=True)
class Message:
    """A Raft message; see the `MessageType` comments for which fields each one uses.

    `index` is the first entry index a push request carries (or, in a vote, the
    candidate's ledger_end_index; in a PUSH_RESPONSE, the request's `last_index`);
    `entries` are consecutive from `index` — several for APPEND (DLedger's batch push: one
    message, one answer for a run of entries), exactly one for COMPARE/TRUNCATE; `log_term`
    is the term just before `index` for APPEND/TRUNCATE and the candidate's last term for
    votes; `next_term` is the leader's term at `index + 1` for TRUNCATE so a duplicated
    truncate cannot cut entries written since; `water_mark` in APPEND and COMMIT is the
    index the leader knows the follower holds (it acknowledged it in this term), so a
    follower whose log ends before it knows it lost acknowledged entries and says so;
    `probe` in a PRE_VOTE of a member that started on an empty disk names that start (a
    random number), and its answer echoes it if the voter also started on an empty disk and
    has not voted since (node.py says why).
    """

    type: MessageType
    from_id: int
    to_id: int
    term: int
    index: int = EMPTY_INDEX
    log_term: int = NO_TERM
    entries: tuple[Entry, ...] = ()
    committed_index: int = EMPTY_INDEX
    code: ResponseCode = ResponseCode.SUCCESS
    req_type: MessageType | None = None
    begin_index: int = EMPTY_INDEX
    end_index: int = EMPTY_INDEX
    next_term: int = NO_TERM
    force: bool = False  # a transfer campaign: voters ignore their leader lease
    water_mark: int = EMPTY_INDEX
    probe: int = 0

    @property
    def last_index(self) -> int:
        """The index of the last entry carried (`index` itself when none are)."""
        return self.index + max(len(self.entries) - 1, 0)

    def encode(self, *, with_data: bool = True) -> bytes:
        """`with_data=False` leaves the entries' data out, for a transport that ships it as
        separate pieces and hands it back to `decode`."""
        packed_entries = [
            [e.index, e.term, e.data if with_data else b"", e.is_noop] for e in self.entries
        ]
        return msgpack.packb(
            [
                int(self.type),
                self.from_id,
                self.to_id,
                self.term,
                self.index,
                self.log_term,
                packed_entries,
                self.committed_index,
                int(self.code),
                None if self.req_type is None else int(self.req_type),
                self.begin_index,
                self.end_index,
                self.next_term,
                self.force,
                self.water_mark,
                self.probe,
            ],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes, entry_data: Sequence[bytes] | None = None) -> Message:
        """`entry_data`, if given, is the entries' data in order (see `encode`)."""
        try:
            fields = msgpack.unpackb(data, raw=False)
            if not isinstance(fields, list) or len(fields) != _FIELD_COUNT:
                raise MessageDecodeError(f"expected a {_FIELD_COUNT}-field array")
            (
                mtype,
                from_id,
                to_id,
                term,
                index,
                log_term,
                packed_entries,
                committed,
                code,
                req_type,
                begin,
                end,
                next_term,
                force,
                water_mark,
                probe,
            ) = fields
            if entry_data is None:
                entry_data = [bytes(e[2]) for e in packed_entries]
            elif len(entry_data) != len(packed_entries):
                raise MessageDecodeError(
                    f"{len(entry_data)} data for {len(packed_entries)} entries"
                )
            entries = tuple(
                Entry(int(e[0]), int(e[1]), d, bool(e[3]))
                for e, d in zip(packed_entries, entry_data)
            )
            return cls(
                _MESSAGE_TYPES[mtype],
                int(from_id),
                int(to_id),
                int(term),
                int(index),
                int(log_term),
                entries,
                int(committed),
                _RESPONSE_CODES[code],
                None if req_type is None else _MESSAGE_TYPES[req_type],
                int(begin),
                int(end),
                int(next_term),
                bool(force),
                int(water_mark),
                int(probe),
            )
        except MessageDecodeError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
            raise MessageDecodeError(str(exc)) from exc
