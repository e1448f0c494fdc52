"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK_BATCH_MQ and
UNLOCK_BATCH_MQ: the requests through which clients tell the broker who they are.

A clustering consumer's heartbeat creates its group's retry topic on a master (RocketMQ's
``createTopicInSendMessageBackMethod`` in ClientManageProcessor.heartBeat): every broker
group the consumer reads from can then take a retry copy the client re-sends itself when
the group it consumed from cannot take it back (``client/retry.py``).

Locks are served by any member, a slave acting as master too (seed 004: ordered consumers
lock through it while the master is away). In strict mode (``lock_quorum``) a lock or
unlock is answered once the other members have answered it too.

Locks live in memory, so in strict mode a member grants nothing for one lease after it
starts: it may have granted a queue before it restarted, to a client that still holds it
on one other member; if this member granted it again, it and a member that never held it
(down meanwhile) would be a second majority, and two clients would hold the queue. The
client keeps its queue through the other members meanwhile; only a group without a
majority of members up for a lease (a whole group restarted) waits that lease to lock."""

from __future__ import annotations

import logging
from collections.abc import Coroutine

from hamq.broker.clients import ClientManager, parse_heartbeat
from hamq.broker.lock_quorum import ONLY_THIS_BROKER, LockQuorum
from hamq.broker.locks import QueueKey, RebalanceLockManager
from hamq.broker.send_back import RETRY_QUEUE_NUMS
from hamq.broker.topics import TopicService
from hamq.clock import monotonic_ms
from hamq.errors import HamqError, InvalidArgument
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.counts import COUNTS
from hamq.net.tasks import spawn
from hamq.protocol.frame import Frame, pack_body, require, require_name, unpack_body
from hamq.protocol.limits import MAX_LOCK_BATCH_QUEUES
from hamq.protocol.properties import RETRY_GROUP_TOPIC_PREFIX
from hamq.store.message_store import MessageStore
from hamq.store.metadata import PERM_READ_WRITE

log = logging.getLogger(__name__)


class ClientProcessor:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        clients: ClientManager,
        locks: RebalanceLockManager,
        quorum: LockQuorum | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.clients = clients
        self.locks = locks
        self.quorum = quorum  # strict mode (lock_in_strict_mode) only
        # strict mode: no grants before then (module docstring)
        self.grants_from_ms = monotonic_ms() + locks.max_live_time_ms

    def heart_beat(self, conn: Connection, frame: Frame) -> list | None:
        heartbeat = parse_heartbeat(unpack_body(frame.body))
        self.clients.heart_beat(conn, heartbeat, monotonic_ms())
        if self.topics.role.is_master:  # slaves copy topics; DLedger replicates them first
            for entry in heartbeat.consumer_groups:
                if entry.message_model == "clustering":
                    self._ensure_retry_topic(RETRY_GROUP_TOPIC_PREFIX + entry.group)
        return None if frame.is_oneway else response_pieces(frame)

    def _ensure_retry_topic(self, topic: str) -> None:
        if self.store.topics.get(topic) is None:
            self.topics.create(topic, RETRY_QUEUE_NUMS, RETRY_QUEUE_NUMS, PERM_READ_WRITE)

    def unregister_client(self, conn: Connection, frame: Frame) -> list | None:
        self.clients.unregister(require(frame.ext, "client_id"))
        return None if frame.is_oneway else response_pieces(frame)

    def get_consumer_list_by_group(self, conn: Connection, frame: Frame) -> list:
        ids = self.clients.consumer_ids(require(frame.ext, "group"))
        return response_pieces(frame, body=pack_body(ids))

    def lock_batch_mq(self, conn: Connection, frame: Frame) -> list | None:
        group, client_id, queues = self._lock_args(frame)
        quorum = self._quorum_for(frame)
        if not self.clients.is_registered(client_id):
            # A lock belongs to a client the broker knows (and forgets when it goes away).
            raise InvalidArgument(
                f"client {client_id!r} has not sent a HEART_BEAT to this "
                "broker; it cannot lock queues"
            )
        # Queues of topics this broker does not have are not locked (not held in the
        # answer), as if another client held them: nothing is kept for a name.
        existing = [q for q in queues if self._exists(*q)]
        now = monotonic_ms()
        if self._forgetful(now):
            existing = []
        if quorum is None:
            return _held_pieces(frame, self.locks.try_lock_batch(group, existing, client_id, now))
        renewed = {q for q in existing if self.locks.owner(group, q, now) == client_id}
        held = self.locks.try_lock_batch(group, existing, client_id, now)

        async def by_quorum() -> list:
            return _held_pieces(frame, await quorum.lock(group, client_id, queues, held, renewed))

        answer_later(conn, frame, by_quorum())
        return None

    def _forgetful(self, now_ms: int) -> bool:
        """Strict mode in a group of several, within a lease of this member's start: what
        it granted before may still be held elsewhere (module docstring)."""
        return self.quorum is not None and self.quorum.quorum > 1 and now_ms < self.grants_from_ms

    def _exists(self, topic: str, queue_id: int) -> bool:
        config = self.store.topics.get(topic)
        return config is not None and 0 <= queue_id < config.read_queue_nums

    def unlock_batch_mq(self, conn: Connection, frame: Frame) -> list | None:
        group, client_id, queues = self._lock_args(frame)
        quorum = self._quorum_for(frame)
        self.locks.unlock_batch(group, queues, client_id)
        if quorum is None:
            return None if frame.is_oneway else response_pieces(frame)

        async def everywhere() -> list:
            await quorum.unlock(group, client_id, frame.body)
            return response_pieces(frame)

        answer_later(conn, frame, everywhere())
        return None

    def _quorum_for(self, frame: Frame) -> LockQuorum | None:
        """Strict mode, unless the request came forwarded by another member (it is never
        forwarded again) or a client asked for this member's lock alone (``lock_quorum``)."""
        if ONLY_THIS_BROKER in frame.ext and require(frame.ext, ONLY_THIS_BROKER, bool):
            return None
        return self.quorum

    @staticmethod
    def _lock_args(frame: Frame) -> tuple[str, str, list[tuple[str, int]]]:
        group, client_id = require_name(frame.ext, "group"), require(frame.ext, "client_id")
        body = unpack_body(frame.body)
        if not isinstance(body, list) or not all(
            isinstance(q, list) and len(q) == 2 and isinstance(q[0], str) and isinstance(q[1], int)
            for q in body
        ):
            raise InvalidArgument("lock body must be a list of [topic, queue_id]")
        if len(body) > MAX_LOCK_BATCH_QUEUES:
            raise InvalidArgument(
                f"lock body names {len(body)} queues, more than the limit of "
                f"{MAX_LOCK_BATCH_QUEUES}"
            )
        return group, client_id, [(t, q) for t, q in body]


def answer_later(conn: Connection, frame: Frame, answer: Coroutine[object, object, list]) -> None:
    """Answer once ``answer`` is done (the other members answered, a scan ended); a
    one-way request not at all."""

    async def run() -> None:
        try:
            pieces = await answer
        except HamqError as err:
            pieces = error_pieces(frame, err)
        except Exception as exc:  # a bug must not leave the client waiting for nothing
            COUNTS.internal_errors += 1
            log.exception("answer to %r failed", frame)
            pieces = error_pieces(frame, HamqError(f"internal error: {exc!r}"))
        if not frame.is_oneway:
            conn.reply(pieces)

    spawn(run())


def _held_pieces(frame: Frame, held: list[QueueKey]) -> list:
    return response_pieces(frame, body=pack_body([list(k) for k in held]))
