"""Transaction messages (RocketMQ's TransactionalMessageService): half messages and the op
log.

A half message (property ``TRAN_MSG``) is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` with
``REAL_TOPIC`` / ``REAL_QID``, where no consumer reads. END_TRANSACTION commits it (the
message is re-stored in its real queue) or rolls it back; either decision is appended to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` as the half message's queue offset (RocketMQ's op message),
in the same commit-log write as the commit. A decision counts once its op record is in
the log: until the write of its event-loop turn succeeds it is *staged*, and a failed
write (disk full undoes the turn's appends) leaves the half undecided, so it is checked
again. On start the op log is read back, so a restart keeps every decision;
``TransactionalMessageCheckService`` asks producers about the half messages still
undecided.

An acting master (seed 004: a slave standing in for its dead master) decides too, but
never appends to its own commit log: a committed message is escaped into another group's
master (``broker/escape.py``), and the decision, which has no op record, is kept in
``TransactionDecisions`` (``decisions.py``), fsynced before END_TRANSACTION is answered. The
escape comes first: a crash between the two commits again on the next decision (at least
once), never loses a commit. Decisions are read back on every start, with the op log.

An op record also names its verdict (property ``TRAN_VERDICT``, hamq's: RocketMQ's op
records only say "decided"), so END_TRANSACTION repeated after the decision is answered
from the log, across restarts and on a slave that becomes master: the same decision again
succeeds, the opposite one is refused with TRANSACTION_ROLLED_BACK (a COMMIT of a half
rolled back, by a ROLLBACK or by the check giving up) or TRANSACTION_COMMITTED (a ROLLBACK
of a half committed), which the Spark sink relies on never to report rows it lost as
committed. A one-way END_TRANSACTION (an ordinary producer's) is answered as before:
never. An acting master's decision keeps its verdict too (``decisions.py``: on restart,
on the other members, on the returning master). A decision whose record carries no
verdict (one written before verdicts were kept, or whose half is no longer retained) is
answered SUCCESS whatever was asked, as before.

A half message with ``TRAN_BATCH = n`` carries a whole encoded batch as its body (hamq's
extension for the Spark sink): committing it stores the ``n`` messages as one record, so a
transactional write costs one half and one commit per batch, not per message.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterator

from hamq.broker.durable import answer_when_durable
from hamq.broker.escape import EscapeBridge
from hamq.broker.role import RoleState
from hamq.broker.stored_message import StoredMessage, read_message, read_messages
from hamq.broker.transaction.decisions import Decision, TransactionDecisions, well_formed_decisions
from hamq.errors import (
    BrokerSystemError,
    HamqError,
    InvalidArgument,
    NoPermission,
    QueryNotFound,
    TransactionCommitted,
    TransactionRolledBack,
)
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.tasks import spawn
from hamq.protocol.frame import Frame, pack_body, require, require_int, require_name, unpack_body
from hamq.protocol.message import encode_message, encode_properties, validate_batch
from hamq.protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_PREPARED,
)
from hamq.protocol.transaction import TransactionState
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore, PutResult
from hamq.store.metadata import TableSnapshot

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # RocketMQ TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # RocketMQ TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC
HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
# Op messages read per store lookup when rebuilding the decisions on start.
SCAN_BATCH = 1024
# The op record's property naming its decision (a TransactionState value).
PROPERTY_VERDICT = "TRAN_VERDICT"


class TransactionalMessageService:
    def __init__(
        self,
        store: MessageStore,
        flush: FlushService,
        role: RoleState,
        escape: EscapeBridge,
        *,
        on_put: Callable[[str, int], None],
        share: Callable[[dict[str, Decision]], Awaitable[None]],
    ) -> None:
        self.store = store
        self.escape = escape  # an acting master's commits go to another group's master
        self.share = share  # ...and its decisions to its group's members (decision_share.py)
        self.decisions = TransactionDecisions(store.root, store.clock_ms(), disk=store.disk)
        # acting: decisions being taken (escape, then the decision written), by half offset
        self._deciding: dict[int, asyncio.Future[None]] = {}
        self.flush = flush
        self.max_message_bytes = store.config.max_message_size
        self.on_put = on_put  # wakes pulls held on a real queue
        self.role = role
        # Decided half offsets: all below ``decided_below``, and those in ``_decided``.
        self.decided_below = 0
        self._decided: set[int] = set()
        # Verdicts of the decided halves from ``_verdicts_from`` on (the oldest half still
        # retained when last looked): rolled back, or unknown (no verdict in the record);
        # the others were committed. Rollbacks are added when decided, before settling.
        self._rolled_back: set[int] = set()
        self._verdict_unknown: set[int] = set()
        self._verdicts_from = 0
        # Undecided halves whose CHECK_IMMUNITY_TIME_IN_SECONDS defers their check: half
        # offset -> store time (ms) it may be checked from. Noted when the half is put (or
        # first read by the check after a start), so check rounds pass over them without
        # reading them again: the Spark sink keeps thousands pending for an hour.
        self.check_due_ms: dict[int, int] = {}
        # Decisions whose op record may not be written yet: (half offset, op queue offset,
        # op record end in the commit log).
        self._staged: list[tuple[int, int, int]] = []

    def start(self) -> None:
        """Read the op log back: every decision taken before the restart, or (a member
        that was a slave) by the master it replicated."""
        self.decided_below, self._decided = 0, set()
        self._rolled_back, self._verdict_unknown = set(), set()
        self._verdicts_from = self.store.min_offset(HALF_TOPIC, HALF_QUEUE_ID)
        self.check_due_ms = {}
        offset = self.store.min_offset(OP_HALF_TOPIC, OP_QUEUE_ID)
        while batch := read_messages(self.store, OP_HALF_TOPIC, OP_QUEUE_ID, offset, SCAN_BATCH):
            for op in batch:
                self._logged_decision(int(op.body), op.properties.get(PROPERTY_VERDICT))
            offset = batch[-1].queue_offset + 1
        self._read_acting_decisions()
        log.info(
            "transactions: %d half messages, all decided below %d",
            self.store.max_offset(HALF_TOPIC, HALF_QUEUE_ID),
            self.decided_below,
        )

    # -- half messages -------------------------------------------------------------------
    def put_half(
        self,
        topic: str,
        queue_id: int,
        properties: dict[str, str],
        body: bytes,
        born_timestamp_ms: int,
    ) -> PutResult:
        if not properties.get(PROPERTY_PRODUCER_GROUP):
            raise InvalidArgument(
                f"a transaction message needs property {PROPERTY_PRODUCER_GROUP}"
                " (its producer group, asked when the outcome is unknown)"
            )
        if PROPERTY_TRANSACTION_BATCH in properties:
            validate_batch(body, _batch_count(properties), zlib.crc32(body), self.max_message_bytes)
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        half = self._put(HALF_TOPIC, HALF_QUEUE_ID, properties, body, born_timestamp_ms)
        immunity_ms = check_immunity_ms(properties)
        if immunity_ms:
            self.check_due_ms[half.base_queue_offset] = half.store_timestamp_ms + immunity_ms
        return half

    def is_decided(self, half_offset: int) -> bool:
        """Decided, or decided earlier in this event-loop turn (so a repeated
        END_TRANSACTION in one read does not commit twice)."""
        self._settle()
        return (
            half_offset < self.decided_below
            or half_offset in self._decided
            or any(half == half_offset for half, _, _ in self._staged)
        )

    def verdict(self, half_offset: int) -> TransactionState | None:
        """The decision taken on a decided half message; None if its record does not say
        (see the module docstring)."""
        if half_offset < self._verdicts_from or half_offset in self._verdict_unknown:
            return None
        if half_offset in self._rolled_back:
            return TransactionState.ROLLBACK_MESSAGE
        return TransactionState.COMMIT_MESSAGE

    def undecided(self, start: int = 0) -> Iterator[int]:
        """Offsets of undecided half messages from ``start`` that are still retained,
        oldest first."""
        self._settle()
        staged = {half for half, _, _ in self._staged} | self._deciding.keys()
        retained = self.store.min_offset(HALF_TOPIC, HALF_QUEUE_ID)
        if retained > self._verdicts_from:  # retention removed halves: forget their verdicts
            self._verdicts_from = retained
            self._rolled_back = {h for h in self._rolled_back if h >= retained}
            self._verdict_unknown = {h for h in self._verdict_unknown if h >= retained}
            self.check_due_ms = {h: t for h, t in self.check_due_ms.items() if h >= retained}
        start = max(start, self.decided_below, retained)
        end = self.store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        return (o for o in range(start, end) if o not in self._decided and o not in staged)

    def half_message(self, half_offset: int) -> StoredMessage:
        msg = read_message(self.store, HALF_TOPIC, HALF_QUEUE_ID, half_offset)
        if msg is None:
            raise QueryNotFound(f"no half message at offset {half_offset}")
        return msg

    # -- END_TRANSACTION -----------------------------------------------------------------
    def end_transaction(self, conn: Connection, frame: Frame) -> list | None:
        if not self.role.is_master and not self.role.is_acting_master:
            raise NoPermission("this broker is a slave: end transactions on the group's master")
        ext = frame.ext
        half_offset = require_int(ext, "tran_state_table_offset")
        try:
            state = TransactionState(require(ext, "commit_or_rollback"))
        except ValueError:
            raise InvalidArgument(
                f"commit_or_rollback must be one of {[s.value for s in TransactionState]}"
            ) from None
        group = require_name(ext, "group")
        half_end = self.store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        if half_offset >= half_end:
            # Not a half message (an offset -1 or past the end was answered SUCCESS, as if
            # a transaction had been decided).
            raise InvalidArgument(
                f"request field 'tran_state_table_offset' {half_offset} is "
                f"not a half message: half offsets are below {half_end}"
            )
        op = None
        if state is TransactionState.UNKNOW:
            pass
        elif self.is_decided(half_offset):
            if frame.is_oneway:
                return None
            _refuse_the_opposite(half_offset, state, self.verdict(half_offset))
        else:
            msg = self.half_message(half_offset)
            if msg.properties.get(PROPERTY_PRODUCER_GROUP) != group:
                raise InvalidArgument(
                    f"half message {half_offset} belongs to producer group "
                    f"{msg.properties.get(PROPERTY_PRODUCER_GROUP)!r}, not "
                    f"{group!r}"
                )
            if not self.role.is_master:
                return _answer_when_done(conn, frame, self.decide_acting(msg, state))
            op = self.decide(msg, state)
        if frame.is_oneway:
            return None
        # Under sync flush the producer learns of the commit once it is on disk, as for
        # a send (RocketMQ's endTransaction puts the final message like a send).
        return answer_when_durable(self.flush, conn, frame, op and op.end_offset, {}, "decision")

    def decide(self, msg: StoredMessage, state: TransactionState) -> PutResult:
        """Commit (re-store in the real queue) or roll back, and log the decision; returns
        the op record, the last append of the decision."""
        if state is TransactionState.COMMIT_MESSAGE:
            real = self._committed_message(msg)
            if real is not None:
                topic, queue_id, payload, count = real
                self._put_payload(topic, queue_id, payload, count, msg.born_timestamp_ms)
                self.on_put(topic, queue_id)
        self._settle()  # before the op queue can grow again: see _settle
        op = self._put(
            OP_HALF_TOPIC,
            OP_QUEUE_ID,
            {PROPERTY_VERDICT: state.value},
            str(msg.queue_offset).encode(),
            msg.born_timestamp_ms,
        )
        self._staged.append((msg.queue_offset, op.base_queue_offset, op.end_offset))
        if state is TransactionState.ROLLBACK_MESSAGE:
            self._rolled_back.add(msg.queue_offset)
        return op

    def roll_back(self, msg: StoredMessage) -> bool:
        """Check-back gave up on ``msg``: roll it back; True if that wrote to the log."""
        if self.role.is_master:
            self.decide(msg, TransactionState.ROLLBACK_MESSAGE)
            return True
        self.decide_acting(msg, TransactionState.ROLLBACK_MESSAGE).add_done_callback(_log_failure)
        return False

    def decide_acting(self, msg: StoredMessage, state: TransactionState) -> asyncio.Future[None]:
        """Acting master: commit (escape the real message) or roll back, then write the
        decision; one decision per half message at a time (a repeated END_TRANSACTION
        waits for the one under way)."""
        half = msg.queue_offset
        pending = self._deciding.get(half)
        if pending is None:
            pending = asyncio.ensure_future(self._decide_acting(msg, state))
            self._deciding[half] = pending
            pending.add_done_callback(lambda _: self._deciding.pop(half, None))
        return pending

    async def _decide_acting(self, msg: StoredMessage, state: TransactionState) -> None:
        if state is TransactionState.COMMIT_MESSAGE:
            real = self._committed_message(msg)
            if real is not None:
                topic, _, payload, count = real
                await self.escape.put(topic, payload, count=count, born_ts=msg.born_timestamp_ms)
        snapshot = self.decisions.record(
            msg.queue_offset, msg.physical_offset, self.store.clock_ms(), state.value
        )
        try:
            await asyncio.to_thread(self.decisions.write, snapshot)
        except OSError as err:
            raise BrokerSystemError(f"writing the transaction decision failed: {err}") from err
        # before the answer: killed after it, this member would take the decision with it
        await self.share(self.decisions.shared({msg.queue_offset}))
        self._logged_decision(msg.queue_offset, state.value)

    def get_decisions(self, conn: Connection, frame: Frame) -> list:
        """GET_TRANSACTION_DECISIONS: the decisions kept as metadata (half offset ->
        commit-log offset), for a returning master's pre-online."""
        return response_pieces(frame, body=pack_body(self.decisions.shared()))

    def put_decisions(self, conn: Connection, frame: Frame) -> list | None:
        """PUT_TRANSACTION_DECISIONS: decisions the group's acting master took, kept here
        (durable, written off the event loop before the answer) for this member's own
        check-back if it acts or is master later."""
        snapshot = self.decisions.merge(_decided(frame.body), self.store.clock_ms())
        if snapshot is None:
            return response_pieces(frame)
        spawn(self._answer_written(conn, frame, snapshot))
        return None

    async def _answer_written(
        self, conn: Connection, frame: Frame, snapshot: TableSnapshot
    ) -> None:
        try:
            await asyncio.to_thread(self.decisions.write, snapshot)
        except OSError as err:
            conn.reply(error_pieces(frame, BrokerSystemError(f"writing decisions failed: {err}")))
            return
        conn.reply(response_pieces(frame))

    def merge_decisions(self, body: bytes) -> bool:
        """Pre-online: take a member's decisions (read back with the op log when the
        transaction services start), durable at once; True if any was new."""
        snapshot = self.decisions.merge(_decided(body), self.store.clock_ms())
        if snapshot is None:
            return False
        self.decisions.write(snapshot)
        return True

    def stop_deciding(self) -> None:
        """Acting ends: decisions under way are dropped (not written, so asked again)."""
        for pending in list(self._deciding.values()):
            pending.cancel()

    def _read_acting_decisions(self) -> None:
        """Take the decisions kept as metadata (this member acting, before) whose half
        message is still the one decided; forget the others."""
        keep = {}
        verdicts = self.decisions.verdicts()
        for half, physical in self.decisions.decided().items():
            if half < self.decided_below or half in self._decided:
                continue  # the op log has it
            msg = read_message(self.store, HALF_TOPIC, HALF_QUEUE_ID, half)
            if msg is not None and msg.physical_offset == physical:
                keep[half] = physical
                self._logged_decision(half, verdicts.get(half))
        self.decisions.forget(keep, self.store.clock_ms())

    def _committed_message(self, msg: StoredMessage) -> tuple[str, int, bytes, int] | None:
        """(topic, queue id, payload, count) a commit of ``msg`` stores; None if its
        topic is gone (dropped, as RocketMQ does). An acting master escapes it whatever
        its own topic table says (a slave's lags its master's): the target decides."""
        properties = dict(msg.properties)
        topic = properties.pop(PROPERTY_REAL_TOPIC)
        queue_id = int(properties.pop(PROPERTY_REAL_QUEUE_ID))
        properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
        config = self.store.topics.get(topic)
        if config is not None:
            queue_id %= config.write_queue_nums
        elif self.role.is_master:
            log.warning("committed transaction message for missing topic %r dropped", topic)
            return None
        if PROPERTY_TRANSACTION_BATCH in properties:
            return topic, queue_id, msg.body, _batch_count(properties)
        payload = encode_message(msg.body, encode_properties(properties))
        return topic, queue_id, payload, 1

    def _settle(self) -> None:
        """Staged decisions whose op record was written become decided; those whose op
        record was undone by a failed write are forgotten (the half is undecided again).
        A failed write drops the op queue's entries from its first append on, so an op
        record is undone exactly when the queue now ends at or below it — as long as no
        new op record was appended since, which ``decide`` ensures by settling first."""
        if not self._staged:
            return
        op_end = self.store.max_offset(OP_HALF_TOPIC, OP_QUEUE_ID)
        written = self.store.commitlog.written_offset
        still = []
        for half, op_offset, end in self._staged:
            if op_offset >= op_end:
                log.warning(
                    "decision on half message %d lost with a failed write; it will be "
                    "checked again",
                    half,
                )
                self._rolled_back.discard(half)
            elif end <= written:
                self._mark_decided(half)
            else:
                still.append((half, op_offset, end))
        self._staged = still

    def _logged_decision(self, half_offset: int, verdict: str | None) -> None:
        """A decision taken or read back (``verdict``: a TransactionState value, None when
        its record does not say)."""
        if verdict == TransactionState.ROLLBACK_MESSAGE.value:
            self._rolled_back.add(half_offset)
        elif verdict != TransactionState.COMMIT_MESSAGE.value:
            self._verdict_unknown.add(half_offset)
        self._mark_decided(half_offset)

    def _mark_decided(self, half_offset: int) -> None:
        self.check_due_ms.pop(half_offset, None)
        self._decided.add(half_offset)
        while self.decided_below in self._decided:
            self._decided.discard(self.decided_below)
            self.decided_below += 1

    def _put(
        self,
        topic: str,
        queue_id: int,
        properties: dict[str, str],
        body: bytes,
        born_timestamp_ms: int,
    ) -> PutResult:
        return self._put_payload(
            topic,
            queue_id,
            encode_message(body, encode_properties(properties)),
            1,
            born_timestamp_ms,
        )

    def _put_payload(
        self, topic: str, queue_id: int, payload: bytes, count: int, born_timestamp_ms: int
    ) -> PutResult:
        return self.store.put_batch(
            topic, queue_id, payload, count, zlib.crc32(payload), born_timestamp_ms
        )


def _refuse_the_opposite(
    half_offset: int, asked: TransactionState, verdict: TransactionState | None
) -> None:
    """END_TRANSACTION of a decided half: the same decision again (or an unknown one) is
    answered SUCCESS, the opposite refused, so no caller takes a rollback for a commit."""
    if verdict is None or verdict is asked:
        return
    if verdict is TransactionState.ROLLBACK_MESSAGE:
        raise TransactionRolledBack(
            f"half message {half_offset} was rolled back already (by a ROLLBACK, or by the "
            "check-back giving up): its messages were not stored"
        )
    raise TransactionCommitted(
        f"half message {half_offset} was committed already: its messages are stored"
    )


def _answer_when_done(conn: Connection, frame: Frame, decision: asyncio.Future[None]) -> None:
    """Answer END_TRANSACTION once an acting master's decision is taken (or failed)."""
    if frame.is_oneway:
        decision.add_done_callback(_log_failure)
        return

    def done(future: asyncio.Future[None]) -> None:
        err = None if future.cancelled() else future.exception()
        if future.cancelled():
            err = BrokerSystemError("the decision was dropped: this broker stopped acting")
        if err is None:
            conn.reply(response_pieces(frame))
        else:
            conn.reply(
                error_pieces(
                    frame, err if isinstance(err, HamqError) else BrokerSystemError(str(err))
                )
            )

    decision.add_done_callback(done)


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("transaction decision not taken (asked again later): %s", future.exception())


def check_immunity_ms(properties: dict[str, str]) -> int:
    """How long a half message is kept from check-back (CHECK_IMMUNITY_TIME_IN_SECONDS),
    0 if it does not say."""
    try:
        return max(0, int(properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, 0)) * 1000)
    except ValueError:
        return 0  # a producer's typo must not keep the half message forever


def _batch_count(properties: dict[str, str]) -> int:
    try:
        return int(properties[PROPERTY_TRANSACTION_BATCH])
    except ValueError:
        raise InvalidArgument(
            f"{PROPERTY_TRANSACTION_BATCH} must be a message count, not "
            f"{properties[PROPERTY_TRANSACTION_BATCH]!r}"
        ) from None


def _decided(body: bytes) -> dict[str, Decision]:
    """A PUT/GET_TRANSACTION_DECISIONS body: half offset -> commit-log offset, or
    [commit-log offset, verdict]."""
    table = unpack_body(body) or {}
    kept = well_formed_decisions(table)
    if not isinstance(table, dict) or len(kept) != len(table):
        raise InvalidArgument(
            "transaction decisions must map half offsets to commit-log offsets "
            "or [commit-log offset, verdict]"
        )
    return kept
