"""RocketMQ 5's EscapeBridge (seed 004, "secondary-message escape"): an acting master is a
slave serving master-only work, and it must never append to its own commit log (that
would fork the group's log from the one its master ships). The messages its services
produce — due delay and timer messages, committed transaction messages, pop CK/ACK
records — are put into ANOTHER group's master instead:

- local escape first: a master of another group living in this process (a broker
  container hands the broker its ``siblings``), through that broker's own send path
  (its store, its flush and HA acks as a send would wait for, its held pulls woken);
- else remote escape when ``enable_remote_escape``: the topic's route from the name
  servers (the client's route code), a writable queue of another group, and a
  SEND_MESSAGE / SEND_BATCH_MESSAGE to its master with the messages as they are;
- else a ``ServiceNotAvailable``: the caller keeps the messages and tries again later.

A put is acknowledged once the target answered as it answers a producer: the message is
stored there (a flush or slave timeout still means stored, as for a producer). Callers
move their progress only after that, so escape is at least once: a put whose answer is
lost is put again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hamq.client.admin import AsyncAdmin
from hamq.client.core import ClientCore, TopicRoute
from hamq.client.message import MessageQueue
from hamq.clock import monotonic_s, wall_ms
from hamq.config import BrokerConfig
from hamq.errors import (
    ConnectionLost,
    HamqError,
    RequestTimeout,
    ServiceNotAvailable,
    TopicNotExist,
)
from hamq.net.counts import COUNTS
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.store.metadata import PERM_WRITE

if TYPE_CHECKING:
    from hamq.broker.server import Broker

log = logging.getLogger(__name__)

# Answers that mean "stored on the target" (a producer gets a SendResult for each, not an
# error): putting again after one would store the messages twice.
STORED_CODES = (
    ResponseCode.SUCCESS,
    ResponseCode.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE,
)
# Groups tried by one remote put before it fails (each one that does not answer is
# avoided for a while by the client core, so the next put starts elsewhere).
MAX_REMOTE_GROUPS = 3
# An escape run is logged when it goes local or remote or into a master it did not name
# yet, else summed up at most this often (puts spread over several groups name them all).
LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class EscapeResult:
    broker_name: str  # the group the messages went to
    local: bool  # into a master in this process (else over the network)
    queue_id: int
    queue_offset: int  # of the first message


def takes_escape(broker: Broker, cluster: str, own_name: str, target: str | None) -> bool:
    """Whether a member in this process may take another member's escaped writes: a master
    of another group of the same cluster (``target`` if given). Not a DLedger group's
    leader: a send there is a Raft proposal, and a put straight into its store would be in
    no member's Raft log (gone once the store is rebuilt from it); such a group is reached
    over the network, where it takes only what goes through Raft."""
    config = broker.config
    return (
        config.cluster_name == cluster
        and config.broker_name != own_name
        and (target is None or config.broker_name == target)
        and broker.role.is_master
        and broker.dledger is None
    )


def local_targets(
    siblings: Iterable[Broker], cluster: str, own_name: str, topic: str, target: str | None
) -> list[Broker]:
    """Masters in this process that may take ``topic`` (``takes_escape``), with the topic
    writable there."""
    found = []
    for broker in siblings:
        if takes_escape(broker, cluster, own_name, target):
            topic_config = broker.store.topics.get(topic)
            if topic_config is not None and topic_config.perm & PERM_WRITE:
                found.append(broker)
    return found


def remote_queues(route: TopicRoute, own_name: str, target: str | None) -> list[MessageQueue]:
    """Writable queues of ``route`` outside this group (only ``target``'s if given): the
    route's write queues are those of groups with a master and write permission, so an
    acting master (published read-only) is never among them."""
    return [
        q
        for q in route.write_queues
        if q.broker_name != own_name and (target is None or q.broker_name == target)
    ]


class EscapeBridge:
    def __init__(
        self, config: BrokerConfig, siblings: Callable[[], Iterable[Broker]] | None = None
    ) -> None:
        self.config = config
        self.siblings = siblings or tuple
        self.core = ClientCore(config.namesrv)  # connects only once a remote put needs it
        self._admin = AsyncAdmin(core=self.core)
        self._turn = itertools.count()  # spreads puts over the targets' queues
        self._logged_local: bool | None = None  # local or remote in the last log line
        self._named: set[str] = set()  # the groups the log lines of this run named
        self._logged_at = 0.0
        self._unlogged: dict[str, int] = {}  # group -> messages escaped since the last line

    async def put(
        self,
        topic: str,
        payload: bytes,
        *,
        count: int = 1,
        target: str | None = None,
        born_ts: int = 0,
    ) -> EscapeResult:
        """Put ``count`` encoded messages of ``topic`` (one batch payload) into another
        group's master, ``target``'s only if given; raises a HamqError if none took them."""
        crc = zlib.crc32(payload)
        born_ts = born_ts or wall_ms()
        own = self.config.broker_name
        local = local_targets(self.siblings(), self.config.cluster_name, own, topic, target)
        if local:
            result = await self._put_local(local, topic, payload, count, crc, born_ts)
        elif self.config.enable_remote_escape:
            result = await self._put_remote(topic, payload, count, crc, born_ts, target)
        else:
            raise ServiceNotAvailable(
                f"cannot escape {count} message(s) of topic {topic!r}: no master of another "
                f"group{f' ({target})' if target else ''} in this process and "
                "enable_remote_escape is false; they are kept and tried again"
            )
        if result.local:
            COUNTS.escaped_local += count
        else:
            COUNTS.escaped_remote += count
        self._log(result, count)
        return result

    async def _put_local(
        self, brokers: list[Broker], topic: str, payload: bytes, count: int, crc: int, born: int
    ) -> EscapeResult:
        turn = next(self._turn)
        broker = brokers[turn % len(brokers)]
        queue_id = turn % broker.store.topics.topics[topic].write_queue_nums
        result, need_ack_nums = broker.send.store_batch(topic, queue_id, payload, count, crc, born)
        broker.processor.after_batch()  # write and ship it now, as after a request
        answered: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        broker.send.when_stored(
            result,
            need_ack_nums,
            lambda code, remark: answered.done() or answered.set_result((code, remark)),
        )
        code, remark = await answered
        if code not in STORED_CODES:
            raise HamqError.for_code(code, remark)
        return EscapeResult(broker.config.broker_name, True, queue_id, result.base_queue_offset)

    async def _put_remote(
        self, topic: str, payload: bytes, count: int, crc: int, born: int, target: str | None
    ) -> EscapeResult:
        candidates = await self._remote_candidates(topic, target)
        if not candidates:
            raise ServiceNotAvailable(
                f"cannot escape topic {topic!r}: no writable queue of "
                f"{target or 'another group'} in its route"
            )
        turn = next(self._turn)
        reachable = [c for c in candidates if self.core.reachable(c[1])] or candidates
        groups = list(dict.fromkeys(q.broker_name for q, _ in reachable))
        code = RequestCode.SEND_BATCH_MESSAGE if count > 1 else RequestCode.SEND_MESSAGE
        last: HamqError | None = None
        for i in range(min(len(groups), MAX_REMOTE_GROUPS)):
            name = groups[(turn + i) % len(groups)]
            queues = [c for c in reachable if c[0].broker_name == name]
            queue, addr = queues[turn % len(queues)]
            ext = {
                "topic": topic,
                "queue_id": queue.queue_id,
                "count": count,
                "crc": crc,
                "born_ts": born,
            }
            try:
                frame = await self.core.invoke(addr, code, ext, payload, ok=STORED_CODES)
            except (ConnectionLost, RequestTimeout) as err:
                self.core.mark_unreachable(addr)
                last = err
                continue
            except HamqError as err:
                if err.refresh_route:
                    self.core.routes.pop(topic, None)
                raise
            return EscapeResult(name, False, queue.queue_id, frame.ext["queue_offset"])
        assert last is not None
        raise last

    async def _remote_candidates(
        self, topic: str, target: str | None
    ) -> list[tuple[MessageQueue, str]]:
        """(queue, master address) of the groups a remote put may go to. A topic with no
        route (a system topic, such as pop's revive log) is put into queue 0 of the
        ``target`` group's master, from the cluster's broker table."""
        try:
            route = await self.core.route(topic)
        except TopicNotExist:
            if target is None:
                raise
            addr = (await self._admin.master_addrs(self.config.cluster_name)).get(target)
            return [(MessageQueue(topic, target, 0), addr)] if addr else []
        own = self.config.broker_name
        found = []
        for q in remote_queues(route, own, target):
            addr = route.master_addr(q.broker_name)
            if addr is not None:
                found.append((q, addr))
        return found

    def _log(self, result: EscapeResult, count: int) -> None:
        """A line when a run starts, goes local or remote, or reaches a master it did not
        name yet; else one every LOG_INTERVAL_S (never one per put)."""
        group = result.broker_name
        self._unlogged[group] = self._unlogged.get(group, 0) + count
        if result.local != self._logged_local:
            self._logged_local, self._named = result.local, set()
        elif group in self._named and monotonic_s() - self._logged_at < LOG_INTERVAL_S:
            return
        self._named.add(group)
        log.info(
            "escaped %d message(s) %s into %s (escaped so far: %d local, %d remote)",
            sum(self._unlogged.values()),
            "locally" if result.local else "remotely",
            ", ".join(f"{g}'s master" for g in self._unlogged),
            COUNTS.escaped_local,
            COUNTS.escaped_remote,
        )
        self._logged_at, self._unlogged = monotonic_s(), {}

    async def close(self) -> None:
        await self.core.close()
