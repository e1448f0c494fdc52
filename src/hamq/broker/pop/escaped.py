"""The acting master's revive log (seed 004). An acting master never appends to its own
commit log (that would fork the group's log), so its CK and ACK records are escaped, in
the order they were made, into the revive log of ONE chosen master of another group, under
this member's broker name: there a CK and the ACK that cancels it meet in one log, and
that master's own pop state ignores both (records of another broker name).

The chosen master is the one the first put went to; it is recorded in the store directory
(``pop_escape_target.json``) so every later put of this member, across restarts and acting
periods, goes to the same one. A put that fails (the target unreachable) leaves the record
at the head of the queue, retried every ``RETRY_INTERVAL_S``: the order is kept and nothing
is dropped while acting lasts.

A CK escaped here cannot be named by its offset in a log this member does not write, so it
names its receipt id itself: ``ESCAPED_CK_BASE`` plus the wall clock in 1/1024 ms, kept
increasing, so it never equals the revive offset of a CK of the group's own log (a stale
receipt handle from before the outage never acks a redelivery) and a restarted acting
member does not reuse one (unless its wall clock went back).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hamq.broker.durable import when_durable
from hamq.broker.escape import STORED_CODES, EscapeBridge, takes_escape
from hamq.broker.pop.revive_log import (
    KIND_CK,
    REVIVE_LOG_TOPIC,
    REVIVE_QUEUE_ID,
    ReviveRecord,
    records_in,
)
from hamq.client.admin import AsyncAdmin
from hamq.errors import (
    HamqError,
    NoPermission,
    RequestCodeNotSupported,
    ServiceNotAvailable,
)
from hamq.net.counts import COUNTS
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.store.disk import Disk, atomic_write

if TYPE_CHECKING:
    from hamq.broker.server import Broker

log = logging.getLogger(__name__)

ESCAPED_CK_BASE = 1 << 62
CK_PER_MS = 1024
TARGET_FILE = "pop_escape_target.json"
RETRY_INTERVAL_S = 0.5
STOP_DRAIN_S = 2.0  # a last try at what is pending when acting ends
# Records waiting for the chosen master past which pops and acks are refused (it is down):
# memory stays bounded, and a refused pop hands nothing out.
MAX_PENDING = 10_000
CONFIRM_S = 1.0  # one member's answer to POP_ESCAPED_CONFIRM (the putter waits 3 s)
READER_GROUP = "rmq_sys_pop_escape_reader"  # names the pulls; commits no offset
PULL_BATCH = 1024  # revive records per pull while reading another master's revive log
MAX_PULLS = 100_000  # bounds one read of a revive log
PULL_ANSWERS = (
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
)

# (record, the chosen master or None) -> the broker name it was stored by
EscapePut = Callable[[bytes, str | None], Awaitable[str]]


class ReviveEscape:
    """Puts one record into a master of another group of the cluster: one in this process
    first (local escape), else over the network when ``enable_remote_escape``, as the
    escape bridge does. Not through the bridge's send: the revive log is a system topic,
    which a send never writes (a client could forge acks there); the master takes the
    record with POP_ESCAPED_REVIVE, which refuses records under its own broker name, so
    whatever arrives there can never change its own pop state. With no master chosen yet,
    the first of the cluster's other masters by name is taken."""

    def __init__(self, bridge: EscapeBridge) -> None:
        self.bridge = bridge
        self._admin = AsyncAdmin(core=bridge.core)

    async def put(self, record: bytes, target: str | None) -> str:
        config = self.bridge.config
        for broker in self.bridge.siblings():
            if takes_escape(broker, config.cluster_name, config.broker_name, target):
                return await _put_local(broker, record)
        if not config.enable_remote_escape:
            raise ServiceNotAvailable(
                f"no master of {target or 'another group'} in this process and "
                "enable_remote_escape is false: pop records kept and tried again"
            )
        masters = await self._admin.master_addrs(config.cluster_name)
        names = [target] if target else sorted(n for n in masters if n != config.broker_name)
        for name in names:
            if name in masters:
                try:
                    await self.bridge.core.invoke(
                        masters[name], RequestCode.POP_ESCAPED_REVIVE, body=record, ok=STORED_CODES
                    )
                except RequestCodeNotSupported:  # a DLedger group: not through its Raft log
                    if target:
                        raise
                    continue
                COUNTS.escaped_remote += 1
                return name
        raise ServiceNotAvailable(f"no master of {target or 'another group'} in the cluster")

    async def confirm(self, record: bytes, broker_name: str) -> None:
        """On the chosen master, before it stores a record that came over the network: a
        member of ``broker_name``'s group, as the name servers know it in this cluster, must
        be putting exactly this record now (POP_ESCAPED_CONFIRM). A request carries no
        credentials: without this, a client could put a CK and an ACK under another group's
        name, which that group's next acting member replays, taking for acked messages
        nobody acked (lost). Raises NoPermission otherwise."""
        entry = (await self._admin.cluster_info())["broker_addr_table"].get(broker_name)
        if entry is None or entry["cluster"] != self.bridge.config.cluster_name:
            raise NoPermission(f"{broker_name} is no group of this cluster: record refused")
        digest = record_digest(record)
        # all members at once, taken at the first yes: a hung member (SIGSTOP) must not
        # make the putter's request time out, as it would retry the same record for ever
        asks = [
            asyncio.ensure_future(self._confirmed_by(addr, digest))
            for addr in entry["broker_addrs"].values()
        ]
        try:
            for answer in asyncio.as_completed(asks):
                if await answer:
                    return
        finally:
            for ask in asks:
                ask.cancel()
        raise NoPermission(f"no member of {broker_name} is putting this record: refused")

    async def _confirmed_by(self, addr: str, digest: str) -> bool:
        try:
            await self.bridge.core.invoke(
                addr, RequestCode.POP_ESCAPED_CONFIRM, {"digest": digest}, timeout_s=CONFIRM_S
            )
        except (HamqError, OSError):
            return False
        return True

    async def records_of(self, broker_name: str) -> list[ReviveRecord]:
        """The records escaped under ``broker_name`` into the cluster's other masters, one
        master's after another's, ordered by their first CK (each acting period's records
        are in one master). A member that begins acting replays them after its own revive
        log: an acting member that died took its pop state's changes there only."""
        config = self.bridge.config
        logs: dict[str, list[ReviveRecord]] = {}
        for broker in self.bridge.siblings():
            if takes_escape(broker, config.cluster_name, config.broker_name, None):
                logs[broker.config.broker_name] = list(broker.pop.revive.replay(0, broker_name))
        if config.enable_remote_escape:
            masters = await self._admin.master_addrs(config.cluster_name)
            for name, addr in masters.items():
                if name != config.broker_name and name not in logs:
                    logs[name] = await self._pull(addr, broker_name)
        ordered = sorted(
            (records for records in logs.values() if records),
            key=lambda records: min((r.ck for r in records if r.kind == KIND_CK), default=0),
        )
        return [record for records in ordered for record in records]

    async def _pull(self, addr: str, broker_name: str) -> list[ReviveRecord]:
        found: list[ReviveRecord] = []
        offset = 0
        for _ in range(MAX_PULLS):
            ext = {
                "topic": REVIVE_LOG_TOPIC,
                "queue_id": REVIVE_QUEUE_ID,
                "queue_offset": offset,
                "max_msgs": PULL_BATCH,
                "suspend_timeout_ms": 0,
                "group": READER_GROUP,
            }
            frame = await self.bridge.core.invoke(
                addr, RequestCode.PULL_MESSAGE, ext, ok=PULL_ANSWERS
            )
            if frame.code == ResponseCode.PULL_OFFSET_MOVED:
                offset = frame.ext["next_begin_offset"]
                continue
            if frame.code != ResponseCode.SUCCESS:
                return found
            found += records_in(frame.body, offset, broker_name)
            offset = frame.ext["next_begin_offset"]
        raise ServiceNotAvailable(f"revive log of {addr} longer than {MAX_PULLS} pulls")


async def _put_local(broker: Broker, record: bytes) -> str:
    """Into a master in this process, done once as durable as that master's
    POP_ESCAPED_REVIVE answer would say (fsynced under sync flush; stored all the same if
    the flush timed out)."""
    put = broker.pop.store_escaped(record)
    broker.processor.after_batch()  # written and shipped now, as after a request
    stored: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    when_durable(broker.flush, put.end_offset, lambda ok: stored.done() or stored.set_result(ok))
    await stored
    COUNTS.escaped_local += 1
    return broker.config.broker_name


def record_digest(record: bytes) -> str:
    return hashlib.sha256(record).hexdigest()


class EscapedReviveLog:
    def __init__(self, put: EscapePut, store_dir: Path, disk: Disk) -> None:
        self.put = put
        self.disk = disk
        self.target_path = store_dir / TARGET_FILE
        self.target = self._load_target()
        self.pending: deque[tuple[bytes, asyncio.Future | None]] = deque()
        self.escaped = 0  # records put since the process started
        self._last_ck = 0
        self._drainer = PeriodicTask(
            "escaped revive log", RETRY_INTERVAL_S, self._drain, (HamqError, OSError)
        )

    def next_ck(self, now_ms: int) -> int:
        self._last_ck = max(self._last_ck + 1, ESCAPED_CK_BASE + now_ms * CK_PER_MS)
        return self._last_ck

    def check_room(self) -> None:
        if len(self.pending) >= MAX_PENDING:
            raise ServiceNotAvailable(
                f"{len(self.pending)} pop records wait for {self.target or 'a master'} to take "
                "them: pops and acks refused until it does"
            )

    def submit(self, record: bytes, *, wait: bool = False) -> asyncio.Future | None:
        """Queue a record; with ``wait``, a future done once it is in the chosen master."""
        future = asyncio.get_running_loop().create_future() if wait else None
        self.pending.append((record, future))
        self._drainer.wake()
        return future

    def settled(self) -> asyncio.Future | None:
        """A future done once every record queued so far is in the chosen master (None if
        none waits): an ack found already done may have been applied by an earlier request
        whose ACK record is still queued, so its answer waits for that record too."""
        if not self.pending:
            return None
        record, future = self.pending[-1]
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.pending[-1] = (record, future)
        return future

    def putting(self, digest: str) -> bool:
        """Whether the record being put now (the head: one is in flight at a time) has this
        digest: the chosen master asks before it stores it (``ReviveEscape.confirm``)."""
        return bool(self.pending) and record_digest(self.pending[0][0]) == digest

    def start(self) -> None:
        self._drainer.start()

    async def stop(self) -> None:
        """Stop escaping. What is still pending is tried once more, briefly; an ACK that
        still did not get there is answered all the same: it is in this member's pop state,
        which the returning master takes (GET_POP_CHECKPOINT) before it serves pops."""
        await self._drainer.stop()
        try:
            await asyncio.wait_for(self._drain(), STOP_DRAIN_S)
        except (HamqError, OSError, TimeoutError) as exc:
            log.warning(
                "%d revive records not escaped when acting ended: %s", len(self.pending), exc
            )
        for _, future in self.pending:
            if future is not None and not future.done():
                future.set_result(None)
        self.pending.clear()

    async def _drain(self) -> None:
        while self.pending:
            record, future = self.pending[0]
            broker_name = await self.put(record, self.target)
            if self.target is None:
                self._record_target(broker_name)
            self.pending.popleft()
            self.escaped += 1
            if future is not None and not future.done():
                future.set_result(None)

    def _load_target(self) -> str | None:
        try:
            target = json.loads(self.disk.read_bytes(self.target_path))["broker_name"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            log.error("%s unreadable (%s): a new target is chosen", self.target_path, exc)
            return None
        return target if isinstance(target, str) else None

    def _record_target(self, broker_name: str) -> None:
        atomic_write(self.disk, self.target_path, json.dumps({"broker_name": broker_name}).encode())
        self.target = broker_name
        log.info("pop CK/ACK records of this acting master escape into %s", broker_name)
