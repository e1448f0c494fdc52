"""RawNode: a sans-IO Raft member driven by its user (etcd's RawNode with DLedger's
replication). Time arrives through `tick(now_ms)`, randomness through the `rng` given at
construction, and all I/O leaves through `ready()`/`advance()`.

A member that started on an empty disk may be a new group's, or one whose disk was lost
or replaced, with the votes and the acknowledged entries it held: voting again, it could
elect a second leader in a term it had voted in, or a candidate missing entries committed
with its acknowledgement (both lose acknowledged data). It cannot tell which, so it votes
for nobody (`voted_for = UNKNOWN_VOTE`, saved with its first Ready, so a crash before the
group vouched for it keeps it) and does not campaign, until either
- it has caught up with a leader: it holds every entry the leader had committed when it
  sent an APPEND (the leader's commit index only grows, so every entry committed with an
  acknowledgement it gave before the loss is among them), the last of the leader's own
  term (so every entry committed in earlier terms is too); or
- every other member answered one of its probes (pre-votes carrying a random number
  naming this start) that its log is empty, with its term. Nothing was ever committed
  then (an entry committed sits on a majority: on another member, unless its disk was
  lost too); and every term this member may have voted in is at most one of those terms
  (its candidate saved that term), so it takes the highest as its own, its vote in it
  spent, and votes only in later terms. A new group starts this way; it needs every
  member up once.
A group that lost the disks of a majority at once lost data anyway; one lost at a time
(each caught up before the next) is safe however often.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Protocol

from hamq.raft.config import RaftConfig
from hamq.raft.dispatcher import EntryDispatcher
from hamq.raft.errors import NotLeaderError, TransferInProgressError, UnknownPeerError
from hamq.raft.handler import EntryHandler
from hamq.raft.log import (
    EMPTY_INDEX,
    NO_NODE,
    NO_TERM,
    UNKNOWN_VOTE,
    Checkpoint,
    Entry,
    EntryId,
    HardState,
)
from hamq.raft.messages import REQUEST_TYPES, Message, MessageType, ResponseCode
from hamq.raft.quorum import QuorumAckChecker
from hamq.raft.raft_log import RaftLog
from hamq.raft.ready import FailedProposal, FailureReason, Ready
from hamq.raft.storage import LogStorage


class Rng(Protocol):
    """The part of `random.Random` the core uses; the caller seeds it."""

    def randrange(self, start: int, stop: int) -> int: ...


class Role(IntEnum):
    FOLLOWER = 1
    PRE_CANDIDATE = 2
    CANDIDATE = 3
    LEADER = 4


class RawNode:
    def __init__(
        self,
        config: RaftConfig,
        storage: LogStorage,
        rng: Rng,
        now_ms: int = 0,
        applied_index: int = EMPTY_INDEX,
    ) -> None:
        """Start from what `storage` holds durably; `applied_index` is how far the caller's
        state machine already is (EMPTY_INDEX if it is rebuilt from the log)."""
        self.config = config
        self._rng = rng
        self._now_ms = now_ms
        self.log = RaftLog(
            [storage.term(i) for i in range(storage.last_index() + 1)], storage.entry
        )
        hard_state = storage.load_hard_state()
        self.term = hard_state.term
        self.voted_for = hard_state.voted_for
        self._saved_hard_state = hard_state
        # empty, or not vouched for since it was (a crash while waiting keeps it so)
        self._empty_start = (
            config.empty_disk_guard
            and len(config.member_ids) > 1
            and (
                hard_state.voted_for == UNKNOWN_VOTE
                or (hard_state == HardState() and self.log.ledger_end_index == EMPTY_INDEX)
            )
        )
        self._probe = 0  # names this start in our probes while the group does not vouch
        if self._empty_start:
            self.voted_for = UNKNOWN_VOTE
            self._probe = rng.randrange(1, 1 << 62)
        self._empty_handed_peers: set[int] = set()  # answered our probes (see above)
        self._empty_handed_term = NO_TERM  # the highest term they answered in
        checkpoint = storage.load_checkpoint()
        self.committed_index = min(checkpoint.committed_index, self.log.ledger_end_index)
        self._saved_checkpoint = checkpoint
        assert applied_index <= self.committed_index, "applied past what is committed"
        self.applied_index = applied_index
        self.role = Role.FOLLOWER
        self.leader_id = NO_NODE
        self._handler = EntryHandler(self.log)
        self._quorum = QuorumAckChecker(config.member_ids)
        self._dispatchers: dict[int, EntryDispatcher] = {}
        self._votes: dict[int, bool] = {}
        self._last_leader_contact_ms: int | None = None
        # leader only: when each member last answered in this term (check quorum)
        self._peer_contact_ms: dict[int, int] = {}
        self._election_deadline_ms = 0
        self._transfer_target = NO_NODE
        self._transfer_deadline_ms = 0
        self._timeout_now_sent_ms: int | None = None
        self._messages: list[Message] = []
        self._completed: list[EntryId] = []
        self._failed: list[FailedProposal] = []
        self._ready_out: Ready | None = None
        self._reset_election_timer()

    # ---- inputs ---------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        assert now_ms >= self._now_ms, "time went backwards"
        self._now_ms = now_ms
        if self.role == Role.LEADER:
            self._tick_leader()
        elif now_ms >= self._election_deadline_ms:
            self.campaign()

    def campaign(self) -> None:
        """Start an election now (through pre-vote when enabled), e.g. for a test."""
        if self.role == Role.LEADER:
            return
        if self.config.pre_vote or self.voted_for == UNKNOWN_VOTE:
            self._start_pre_vote()  # an unvouched member's pre-votes are its probes
        else:
            self._start_vote(force=False)

    def propose(self, data: bytes) -> EntryId:
        if self.role != Role.LEADER:
            raise NotLeaderError(self.leader_id or None)
        if self._transfer_target != NO_NODE:
            raise TransferInProgressError(f"moving leadership to {self._transfer_target}")
        if not isinstance(data, bytes):
            raise TypeError(f"proposal data must be bytes, not {type(data).__name__}")
        entry = self._append_entry(data, is_noop=False)
        self._quorum.add_pending(self.term, entry.index, self._now_ms)
        # shipped at the next ready(), so proposals made meanwhile share APPENDs
        return EntryId(entry.term, entry.index)

    def transfer_leadership(self, to_id: int) -> None:
        """Catch `to_id` up, then tell it to campaign; proposals pause meanwhile."""
        if self.role != Role.LEADER:
            raise NotLeaderError(self.leader_id or None)
        if to_id not in self.config.member_ids:
            raise UnknownPeerError(f"{to_id} is not a member")
        if to_id == self.config.node_id:
            return
        self._transfer_target = to_id
        self._timeout_now_sent_ms = None
        # one election timeout to catch up; after that the leader resumes serving
        self._transfer_deadline_ms = self._now_ms + self.config.election_timeout_ms
        self._maybe_send_timeout_now()

    def step(self, msg: Message) -> None:
        if msg.from_id not in self.config.member_ids or msg.from_id == self.config.node_id:
            raise UnknownPeerError(f"message from {msg.from_id}")
        if msg.to_id != self.config.node_id:
            raise UnknownPeerError(f"message for {msg.to_id} reached {self.config.node_id}")
        if self.voted_for == UNKNOWN_VOTE and msg.type == MessageType.PRE_VOTE_RESPONSE:
            self._note_probe_answer(msg)
        if not self._step_term(msg):
            return
        handler = {
            MessageType.PRE_VOTE: self._on_vote_request,
            MessageType.VOTE: self._on_vote_request,
            MessageType.PRE_VOTE_RESPONSE: self._on_vote_response,
            MessageType.VOTE_RESPONSE: self._on_vote_response,
            MessageType.PUSH_RESPONSE: self._on_push_response,
            MessageType.TIMEOUT_NOW: self._on_timeout_now,
        }.get(msg.type, self._on_push_request)
        handler(msg)
        if self.role == Role.LEADER:
            self._broadcast()

    # ---- inspection (tests, admin tools) -------------------------------------------------

    @property
    def dispatchers(self) -> Mapping[int, EntryDispatcher]:
        """Per-follower replication state; empty unless leading."""
        return MappingProxyType(self._dispatchers)

    def water_mark(self, member_id: int) -> int:
        """How far `member_id` is known to hold this leader's log."""
        assert self.role == Role.LEADER
        return self._quorum.water_mark(self.term, member_id)

    # ---- outputs --------------------------------------------------------------------

    def has_ready(self) -> bool:
        return (
            bool(self._messages or self._completed or self._failed)
            or self.term != self._saved_hard_state.term
            or self.voted_for != self._saved_hard_state.voted_for
            or self.log.persisted_end_index != self.log.ledger_end_index
            or self.committed_index != self._saved_checkpoint.committed_index
            or self.applied_index < self.committed_index
        )

    def ready(self) -> Ready:
        assert self._ready_out is None, "advance() the previous Ready first"
        if self.role == Role.LEADER:
            self._broadcast()  # ship what was proposed since the last one
        hard_state = self._hard_state()
        # the checkpoint is rewritten when the commit point moves, not on every append:
        # recovery reads the log's real end from the log itself
        commit_moved = self.committed_index != self._saved_checkpoint.committed_index
        first = self.applied_index + 1
        last = min(self.committed_index, self.applied_index + self.config.max_committed_per_ready)
        ready = Ready(
            hard_state=hard_state if hard_state != self._saved_hard_state else None,
            entries=self.log.take_unstable(),
            checkpoint=self._checkpoint() if commit_moved else None,
            messages=self._messages,
            committed_entries=self.log.entries(first, last + 1),
            completed_proposals=self._completed,
            failed_proposals=self._failed,
        )
        self._messages, self._completed, self._failed = [], [], []
        self._ready_out = ready
        return ready

    def advance(self, ready: Ready) -> None:
        assert ready is self._ready_out, "advance() takes the Ready last returned"
        self._ready_out = None
        if ready.hard_state is not None:
            self._saved_hard_state = ready.hard_state
        if ready.checkpoint is not None:
            self._saved_checkpoint = ready.checkpoint
        self.log.mark_persisted(ready.entries)
        if ready.committed_entries:
            self.applied_index = ready.committed_entries[-1].index
        # applied and on disk: storage serves it from now on, if it is ever needed again
        self.log.release_through(min(self.applied_index, self.log.persisted_end_index))
        if self.role == Role.LEADER:
            # the leader counts towards its quorum only what is on its own disk (what this
            # commits reaches followers with the next APPEND or heartbeat)
            self._on_water_mark(self.config.node_id, self.log.persisted_end_index)

    # ---- terms and elections --------------------------------------------------------

    def _step_term(self, msg: Message) -> bool:
        """Apply Raft's term rules; False if the message is to be ignored."""
        if msg.term > self.term:
            if msg.type in (MessageType.PRE_VOTE, MessageType.VOTE):
                if not msg.force and self._in_lease():
                    return False  # we hear a live leader: do not let this one disrupt it
                if msg.type == MessageType.PRE_VOTE:
                    return True  # a pre-vote never changes our term
            elif msg.type == MessageType.PRE_VOTE_RESPONSE and msg.code == ResponseCode.SUCCESS:
                return True  # a granted pre-vote carries the term we would campaign in
            leader = msg.from_id if msg.type in REQUEST_TYPES else NO_NODE
            self._become_follower(msg.term, leader)
            return True
        if msg.term < self.term:
            if msg.type in REQUEST_TYPES:
                # tell a deposed leader about the newer term so it steps down
                self._send(
                    Message(
                        MessageType.PUSH_RESPONSE,
                        self.config.node_id,
                        msg.from_id,
                        self.term,
                        index=msg.last_index,
                        code=ResponseCode.STALE_TERM,
                        req_type=msg.type,
                    )
                )
            elif msg.type == MessageType.PRE_VOTE:
                self._send(
                    Message(
                        MessageType.PRE_VOTE_RESPONSE,
                        self.config.node_id,
                        msg.from_id,
                        self.term,
                        code=ResponseCode.REJECTED,
                        probe=self._probe_echo(msg),
                    )
                )
            return False
        return True

    def _in_lease(self) -> bool:
        if self.role == Role.LEADER:
            return True  # it steps down by itself once a majority stops answering
        contact = self._last_leader_contact_ms
        return (
            self.leader_id != NO_NODE
            and contact is not None
            and self._now_ms - contact < self.config.election_timeout_ms
        )

    def _start_pre_vote(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader_id = NO_NODE
        self._votes = {self.config.node_id: True}
        self._reset_election_timer()
        if self._has_quorum_of_grants():
            self._start_vote(force=False)
            return
        self._request_votes(MessageType.PRE_VOTE, self.term + 1, force=False)

    def _start_vote(self, force: bool) -> None:
        if self.voted_for == UNKNOWN_VOTE:
            # we may have voted in this term or a later one before our disk was lost
            self._become_follower(self.term, NO_NODE)
            return
        self.term += 1
        self.voted_for = self.config.node_id
        self.role = Role.CANDIDATE
        self.leader_id = NO_NODE
        self._votes = {self.config.node_id: True}
        self._reset_election_timer()
        if self._has_quorum_of_grants():
            self._become_leader()
            return
        self._request_votes(MessageType.VOTE, self.term, force)

    def _request_votes(self, mtype: MessageType, term: int, force: bool) -> None:
        probe = self._probe if self.voted_for == UNKNOWN_VOTE else 0
        for peer in self.config.peer_ids:
            self._send(
                Message(
                    mtype,
                    self.config.node_id,
                    peer,
                    term,
                    index=self.log.ledger_end_index,
                    log_term=self.log.ledger_end_term,
                    force=force,
                    probe=probe,
                )
            )

    def _on_vote_request(self, msg: Message) -> None:
        up_to_date = self.log.is_up_to_date(msg.index, msg.log_term)
        if msg.type == MessageType.PRE_VOTE:
            # an unvouched member answers no, in its own term: to another member at term
            # 0 that says it is at term 0 too
            granted = up_to_date and msg.term > self.term and self.voted_for != UNKNOWN_VOTE
            response_type = MessageType.PRE_VOTE_RESPONSE
        else:
            can_vote = self.voted_for == msg.from_id or (
                self.voted_for == NO_NODE and self.leader_id == NO_NODE
            )
            granted = up_to_date and can_vote
            response_type = MessageType.VOTE_RESPONSE
            if granted:
                self.voted_for = msg.from_id
                self._reset_election_timer()
        code = ResponseCode.SUCCESS if granted else ResponseCode.REJECTED
        # a granted pre-vote answers in the candidate's future term, as etcd does
        term = msg.term if granted else self.term
        self._send(
            Message(
                response_type,
                self.config.node_id,
                msg.from_id,
                term,
                code=code,
                probe=self._probe_echo(msg),
            )
        )

    def _on_vote_response(self, msg: Message) -> None:
        if msg.type == MessageType.PRE_VOTE_RESPONSE:
            if self.role != Role.PRE_CANDIDATE or msg.term not in (self.term, self.term + 1):
                return
        elif self.role != Role.CANDIDATE:
            return
        self._votes[msg.from_id] = msg.code == ResponseCode.SUCCESS
        if self._has_quorum_of_grants():
            if self.role == Role.PRE_CANDIDATE:
                self._start_vote(force=False)
            else:
                self._become_leader()
        elif sum(not v for v in self._votes.values()) >= self._majority():
            self._become_follower(self.term, NO_NODE)

    def _on_timeout_now(self, msg: Message) -> None:
        if msg.from_id == self.leader_id and self.role == Role.FOLLOWER:
            self._start_vote(force=True)  # skip pre-vote: the leader asked for this

    def _probe_echo(self, msg: Message) -> int:
        """Echo a probe if our log is empty (see above); the answer carries our term, or
        (a granted pre-vote) a higher one."""
        if msg.type != MessageType.PRE_VOTE or self.log.ledger_end_index != EMPTY_INDEX:
            return 0
        return msg.probe

    def _note_probe_answer(self, msg: Message) -> None:
        """Count the members that answered a probe of this start with an empty log; once
        all did, nothing was ever committed (see above)."""
        if msg.probe == self._probe != 0:
            self._empty_handed_peers.add(msg.from_id)
            self._empty_handed_term = max(self._empty_handed_term, msg.term)
            if len(self._empty_handed_peers) == len(self.config.peer_ids):
                if self._empty_handed_term > self.term:
                    self._become_follower(self._empty_handed_term, NO_NODE)
                self.voted_for = self.config.node_id  # spent: we vote in later terms only

    def _note_caught_up(self, msg: Message) -> None:
        """Vouched for by the leader we follow (see above); we then count as having voted
        for it. A heartbeat's commit index is capped at what we acknowledged, so only an
        APPEND's is the leader's own."""
        committed = self.committed_index
        if (
            msg.type == MessageType.APPEND
            and committed >= msg.committed_index
            and self.log.term(committed) == self.term
        ):
            self.voted_for = self.leader_id

    def _majority(self) -> int:
        return len(self.config.member_ids) // 2 + 1

    def _has_quorum_of_grants(self) -> bool:
        return sum(self._votes.values()) >= self._majority()

    def _become_follower(self, term: int, leader_id: int) -> None:
        assert term >= self.term
        if term > self.term or leader_id != self.leader_id:
            self._handler.reset()
        if term > self.term:
            self.term = term
            if self.voted_for != UNKNOWN_VOTE:
                self.voted_for = NO_NODE
        if self.role == Role.LEADER:
            self._fail_pending(self._quorum.drop_all(), FailureReason.LEADERSHIP_LOST)
            self._dispatchers.clear()
            self._transfer_target = NO_NODE
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self._reset_election_timer()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.config.node_id
        self._fail_pending(self._quorum.start_term(self.term), FailureReason.LEADERSHIP_LOST)
        # a no-op of our own term lets us commit (only current-term entries are counted)
        self._append_entry(b"", is_noop=True)
        self._on_water_mark(self.config.node_id, self.log.persisted_end_index)
        self._dispatchers = {
            peer: EntryDispatcher(peer, self.config.node_id, self.term, self.config)
            for peer in self.config.peer_ids
        }
        self._peer_contact_ms = dict.fromkeys(self.config.peer_ids, self._now_ms)
        self._broadcast()

    def _reset_election_timer(self) -> None:
        timeout = self.config.election_timeout_ms
        self._election_deadline_ms = self._now_ms + timeout + self._rng.randrange(0, timeout)

    # ---- replication ----------------------------------------------------------------

    def _on_push_request(self, msg: Message) -> None:
        assert msg.type in REQUEST_TYPES and msg.term == self.term
        assert self.role != Role.LEADER, f"two leaders in term {self.term}"
        if self.role != Role.FOLLOWER or self.leader_id != msg.from_id:
            self._become_follower(self.term, msg.from_id)
        self._last_leader_contact_ms = self._now_ms
        self._reset_election_timer()
        result = self._handler.handle(msg, self.committed_index)
        self.committed_index = result.committed_index
        assert self.committed_index <= self.log.ledger_end_index, "committed past the log"
        self._messages.extend(result.responses)
        if self.voted_for == UNKNOWN_VOTE:
            self._note_caught_up(msg)

    def _on_push_response(self, msg: Message) -> None:
        if self.role != Role.LEADER or msg.term != self.term:
            return
        self._peer_contact_ms[msg.from_id] = self._now_ms
        if msg.code == ResponseCode.INCONSISTENT_STATE and msg.end_index < self._quorum.water_mark(
            self.term, msg.from_id
        ):
            self._on_lost_entries(msg.from_id, msg.end_index)
        matched = self._dispatchers[msg.from_id].handle_response(msg, self.log)
        if matched is not None:
            self._on_water_mark(msg.from_id, matched)

    def _on_lost_entries(self, member_id: int, end_index: int) -> None:
        """`member_id` answered that its log ends at `end_index`, before entries it had
        acknowledged in this term (a power loss under async flush, a disk rebuilt empty).
        Only an INCONSISTENT_STATE says so: a SUCCESS with an old end is an answer
        overtaken by a later ack, and changes nothing.

        Lowering its watermark is safe:
        - nothing is un-committed: a lower mark lowers only the quorum index, and
          `committed_index` is never set back to it (`_on_water_mark` only moves it
          forwards), so answered proposals stay answered, and a follower is only ever
          told an index is committed up to what it is known to hold;
        - nothing is committed on a false count: a lower mark takes a vote away and never
          adds one, the other members' marks are untouched, and this follower counts
          again only through acks (one sent before the loss and delivered late can raise
          the mark again, but the next APPEND or heartbeat carries the mark and is
          answered the same way);
        - committed entries are not lost by it: each was on a majority when it
          committed, and that majority still includes the leader, which never truncates
          its own log and counts itself only for what it persisted; it sends them again
          to this follower from the lowered mark. The window in which an entry has one
          copy fewer than was counted is the price of acknowledging before fsync (or of
          replacing a disk); answering at once closes it in a few round trips instead
          of leaving it open until traffic or a restart happens to close it."""
        self._quorum.lower_water_mark(self.term, member_id, end_index)
        self._dispatchers[member_id].on_lost_entries()

    def _on_water_mark(self, member_id: int, index: int) -> None:
        if not self._quorum.update_water_mark(self.term, member_id, index):
            return
        quorum_index = self._quorum.quorum_index(self.term)
        # Raft's Figure 8: an older term's entry is committed only under a newer one
        if quorum_index > self.committed_index and self.log.term(quorum_index) == self.term:
            self.committed_index = quorum_index
            self._completed.extend(self._quorum.complete_up_to(self.term, quorum_index))
        if member_id == self._transfer_target:
            self._maybe_send_timeout_now()

    def _tick_leader(self) -> None:
        if not self._hears_quorum():
            # check quorum: a leader cut off from a majority steps down, so members that
            # still hear it (and so ignore pre-votes) stop holding off a new election
            self._become_follower(self.term, NO_NODE)
            return
        expired = self._quorum.expire(self.term, self._now_ms, self.config.proposal_timeout_ms)
        self._fail_pending(expired, FailureReason.TIMEOUT)
        if self._transfer_target != NO_NODE:
            if self._now_ms >= self._transfer_deadline_ms:
                self._transfer_target = NO_NODE  # it did not catch up in time: keep leading
            else:
                self._maybe_send_timeout_now()
        self._broadcast()

    def _hears_quorum(self) -> bool:
        contacts = sorted(self._peer_contact_ms.values(), reverse=True)
        # the leader itself is one voice of the majority; it needs majority - 1 others
        others_needed = self._majority() - 1
        if others_needed == 0:
            return True
        return self._now_ms - contacts[others_needed - 1] < self.config.election_timeout_ms

    def _broadcast(self) -> None:
        for peer, dispatcher in self._dispatchers.items():
            water_mark = self._quorum.water_mark(self.term, peer)
            self._messages.extend(
                dispatcher.poll(self.log, water_mark, self.committed_index, self._now_ms)
            )

    def _maybe_send_timeout_now(self) -> None:
        target = self._transfer_target
        if target == NO_NODE:
            return
        sent = self._timeout_now_sent_ms
        if sent is not None and self._now_ms - sent < self.config.push_timeout_ms:
            return  # the last one may still arrive
        if self._quorum.water_mark(self.term, target) == self.log.ledger_end_index:
            self._timeout_now_sent_ms = self._now_ms
            self._send(Message(MessageType.TIMEOUT_NOW, self.config.node_id, target, self.term))

    def _append_entry(self, data: bytes, is_noop: bool) -> Entry:
        entry = Entry(self.log.ledger_end_index + 1, self.term, data, is_noop)
        self.log.append(entry)
        return entry

    def _fail_pending(self, entry_ids: list[EntryId], reason: FailureReason) -> None:
        self._failed.extend(FailedProposal(e, reason) for e in entry_ids)

    # ---- helpers --------------------------------------------------------------------

    def _send(self, msg: Message) -> None:
        self._messages.append(msg)

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.voted_for)

    def _checkpoint(self) -> Checkpoint:
        return Checkpoint(self.log.ledger_end_index, self.committed_index)
