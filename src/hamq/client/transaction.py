"""Transaction messages, producer side (RocketMQ's TransactionMQProducer).

``send_message_in_transaction`` sends a half message (invisible to consumers), runs the
local transaction and tells the broker its outcome (END_TRANSACTION). When the outcome is
UNKNOW, or the producer died before telling, the broker later asks a live producer of the
group (CHECK_TRANSACTION_STATE on the connection its HEART_BEAT came on), and
``check_local_transaction`` answers.

The group heartbeats to every master of the cluster from ``start`` (RocketMQ's producer
heartbeats to all brokers it knows from start): a producer restarted after a crash must be
reachable for the checks of the half messages its previous run left, before it sends
anything itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hamq.client.admin import AsyncAdmin
from hamq.client.core import ROUTE_REFRESH_INTERVAL_S
from hamq.client.message import PROPERTY_KEYS, PROPERTY_TAGS, Message, SendResult
from hamq.client.producer import AsyncProducer
from hamq.client.sync import _SyncFacade
from hamq.clock import monotonic_s
from hamq.errors import HamqError, InvalidArgument, ServiceNotAvailable
from hamq.net.connection import Connection
from hamq.net.tasks import PeriodicTask, cancel_all
from hamq.policy.definition import DEFAULT_VHOST
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body
from hamq.protocol.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    decode_single_message,
)
from hamq.protocol.transaction import TransactionState

log = logging.getLogger(__name__)

# RocketMQ's heartbeatBrokerInterval is 30 s; a producer is only asked about its half
# messages once a broker has its heartbeat, so it registers sooner.
HEARTBEAT_INTERVAL_S = 2.0

ExecuteLocalTransaction = Callable[[Message, Any], TransactionState]
CheckLocalTransaction = Callable[[Message], TransactionState]


@dataclass(frozen=True)
class TransactionSendResult:
    send_result: SendResult  # of the half message
    local_transaction_state: TransactionState


class AsyncTransactionProducer:
    def __init__(
        self,
        namesrv: str | Iterable[str],
        group: str,
        execute_local_transaction: ExecuteLocalTransaction,
        check_local_transaction: CheckLocalTransaction,
        send_timeout_s: float = 3.0,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        self.execute_local_transaction = execute_local_transaction
        self.check_local_transaction = check_local_transaction
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.producer = AsyncProducer(namesrv, group, send_timeout_s, vhost=vhost)
        self.group = self.producer.group  # its wire name
        self.core = self.producer.core
        self.core.pool.handler = self  # brokers ask CHECK_TRANSACTION_STATE on our connections
        self._admin = AsyncAdmin(core=self.core)
        self._masters: set[str] = set()  # brokers that may hold our half messages
        self._masters_fetched_at = -ROUTE_REFRESH_INTERVAL_S
        self._heartbeats = PeriodicTask(
            f"heartbeat of producer group {group}", heartbeat_interval_s, self._heartbeat_round
        )
        self._checks: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Heartbeat the group to every master now, then periodically, so the brokers can
        check the half messages of an earlier run of this group at once."""
        if not self._heartbeats.running:
            await self._heartbeat_round()
            self._heartbeats.start()

    async def close(self) -> None:
        await self._heartbeats.stop()
        await cancel_all(self._checks)
        await self.producer.close()

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        if message.delay_level or message.deliver_time_ms:
            raise InvalidArgument("a transaction message cannot also be a delay or timer message")
        half = dataclasses.replace(
            message,
            properties={
                **message.properties,
                PROPERTY_TRANSACTION_PREPARED: "true",
                PROPERTY_PRODUCER_GROUP: self.group,
            },
        )
        result = await self.producer.send(half)
        master = await self._master_of(self.core.wire(message.topic), result.queue.broker_name)
        if master not in self._masters:  # a master that joined since the last refresh
            self._masters.add(master)
            await self._heartbeat([master])
        self._heartbeats.start()  # if not running yet
        state = await self._run_callback(self.execute_local_transaction, message, arg)
        if state is not TransactionState.UNKNOW:
            try:
                await self.core.invoke(
                    master, RequestCode.END_TRANSACTION, self._end_ext(result.queue_offset, state)
                )
            except HamqError as err:  # the broker will ask us again
                log.warning("END_TRANSACTION to %s failed: %s", master, err.message)
        return TransactionSendResult(result, state)

    # -- requests from brokers (RequestHandler) --------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code != RequestCode.CHECK_TRANSACTION_STATE:
            return self.producer.handle(conn, frame)  # CONNECTION_(UN)BLOCKED
        task = asyncio.ensure_future(self._answer_check(conn, frame))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)
        return None

    def after_batch(self) -> None:
        pass

    async def _answer_check(self, conn: Connection, frame: Frame) -> None:
        properties, body = decode_single_message(frame.body)
        properties.pop(PROPERTY_TRANSACTION_PREPARED, None)
        properties.pop(PROPERTY_PRODUCER_GROUP, None)
        message = Message(
            frame.ext["topic"],
            body,
            keys=properties.pop(PROPERTY_KEYS, None),
            tags=properties.pop(PROPERTY_TAGS, None),
            properties=properties,
        )
        state = await self._run_callback(self.check_local_transaction, message)
        if state is not TransactionState.UNKNOW:
            conn.oneway(
                RequestCode.END_TRANSACTION,
                self._end_ext(frame.ext["tran_state_table_offset"], state),
            )

    # -- internals ---------------------------------------------------------------------------
    def _end_ext(self, half_offset: int, state: TransactionState) -> dict:
        return {
            "group": self.group,
            "tran_state_table_offset": half_offset,
            "commit_or_rollback": state.value,
        }

    @staticmethod
    async def _run_callback(callback: Callable, *args: Any) -> TransactionState:
        """A failing local transaction or check is UNKNOW (RocketMQ: the broker asks again)."""
        try:
            state = callback(*args)
            if inspect.isawaitable(state):
                state = await state
        except Exception:
            log.exception("transaction callback %s failed; state UNKNOW", callback)
            return TransactionState.UNKNOW
        if not isinstance(state, TransactionState):
            log.error(
                "transaction callback %s returned %r, not a TransactionState; state UNKNOW",
                callback,
                state,
            )
            return TransactionState.UNKNOW
        return state

    async def _master_of(self, topic: str, broker_name: str) -> str:
        master = (await self.core.route(topic)).master_addr(broker_name)
        if master is None:
            raise ServiceNotAvailable(f"broker group {broker_name} has no master")
        return master

    async def _heartbeat(self, addrs: list[str]) -> None:
        await self.core.heart_beat(
            addrs, pack_body({"client_id": self.client_id, "producer_groups": [self.group]})
        )

    async def _heartbeat_round(self) -> None:
        """Refresh the cluster's masters from the name server (as often as routes), then
        heartbeat to all of them; a name server that does not answer keeps the list. A
        group without a master counts its smallest-id member, which checks back on the
        group's half messages when it acts as master (seed 004)."""
        if monotonic_s() - self._masters_fetched_at >= ROUTE_REFRESH_INTERVAL_S:
            try:
                self._masters.update((await self._admin.read_addrs()).values())
                self._masters_fetched_at = monotonic_s()
            except HamqError as err:
                log.warning(
                    "listing masters for producer group %s failed: %s", self.group, err.message
                )
        await self._heartbeat(list(self._masters))


class TransactionProducer(_SyncFacade):
    """The blocking twin of ``AsyncTransactionProducer``, started on construction; its
    callbacks run on the facade's event-loop thread."""

    _async_cls = AsyncTransactionProducer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._run(self._async.start())
