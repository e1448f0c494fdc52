"""What every client shares: name-server addresses, a connection pool, cached topic routes,
``invoke`` (one request, errors raised as ``hamq.errors`` classes) and its vhost.

A client lives in one vhost (seed 003; default ``/``). Topic and consumer-group names go on
the wire as ``policy.definition.wire_name(vhost, name)`` (RocketMQ 5's namespace:
``vhost%name``), so the same name in two vhosts never collides; a group's retry topic is
then ``%RETRY%vhost%group``, as RocketMQ names it. Clients wrap the names they are given at
their public methods and keep wire names inside (routes, queues, requests); the names they
give back (a send's queue, a consumed message's topic) are unwrapped again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from hamq.client.message import MessageQueue, user_name
from hamq.clock import monotonic_s
from hamq.errors import BrokerNotFound, ConnectionLost, HamqError, RequestTimeout, TopicNotExist
from hamq.net.pool import ConnectionPool
from hamq.policy.definition import (
    DEFAULT_VHOST,
    check_vhost,
    wire_name,
)
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, unpack_body
from hamq.store.metadata import PERM_READ, PERM_WRITE

log = logging.getLogger(__name__)

MASTER_ID = 0
ROUTE_REFRESH_INTERVAL_S = 30.0  # RocketMQ pollNameServerInterval
DEFAULT_TIMEOUT_S = 3.0
# A member that failed to answer is tried last for this long (RocketMQ's latency fault
# tolerance, notAvailableDuration), so failover does not pay a timeout per request.
FAULT_AVOID_S = 5.0


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    write_queues: tuple[MessageQueue, ...]
    read_queues: tuple[MessageQueue, ...]
    brokers: dict[str, dict[int, str]]  # broker name -> broker id -> address
    fetched_at: float

    @staticmethod
    def from_wire(topic: str, data: dict) -> TopicRoute:
        brokers = {
            b["broker_name"]: {int(i): a for i, a in b["broker_addrs"].items()}
            for b in data["broker_datas"]
        }
        write, read = [], []
        for qd in data["queue_datas"]:
            name = qd["broker_name"]
            if qd["perm"] & PERM_WRITE and MASTER_ID in brokers.get(name, {}):
                write += [MessageQueue(topic, name, i) for i in range(qd["write_queue_nums"])]
            if qd["perm"] & PERM_READ and brokers.get(name):
                read += [MessageQueue(topic, name, i) for i in range(qd["read_queue_nums"])]
        return TopicRoute(topic, tuple(write), tuple(read), brokers, monotonic_s())

    def master_addr(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def read_addr(self, broker_name: str) -> str | None:
        """The master, or the lowest-id slave when the master is gone (slave read)."""
        members = self.brokers.get(broker_name, {})
        return members[min(members)] if members else None

    def read_order(self, broker_name: str) -> list[str]:
        """Members to read from, master first, then slaves by id."""
        return [addr for _, addr in sorted(self.brokers.get(broker_name, {}).items())]


def namesrv_list(namesrv: str | Iterable[str]) -> list[str]:
    addrs = [a.strip() for a in (namesrv.split(";") if isinstance(namesrv, str) else namesrv)]
    addrs = [a for a in addrs if a]
    if not addrs:
        raise ValueError("at least one name server address (HOST:PORT) is required")
    return addrs


class ClientCore:
    def __init__(
        self,
        namesrv: str | Iterable[str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        route_refresh_interval_s: float = ROUTE_REFRESH_INTERVAL_S,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        self.namesrv = namesrv_list(namesrv)
        self.vhost = check_vhost(vhost)
        self.timeout_s = timeout_s
        self.route_refresh_interval_s = route_refresh_interval_s
        self.pool = ConnectionPool(connect_timeout_s=timeout_s)
        self.routes: dict[str, TopicRoute] = {}
        self._namesrv_index = 0
        self._unreachable: dict[str, float] = {}  # address -> avoid until (monotonic)

    # -- names in the vhost ----------------------------------------------------------------
    def wire(self, name: str) -> str:
        """A topic or group name as it goes on the wire (the name itself in ``/``)."""
        return wire_name(self.vhost, name)

    def user(self, wire: str) -> str:
        """A wire name as this client's user knows it."""
        return wire if self.vhost == DEFAULT_VHOST else user_name(wire)

    def wire_queue(self, mq: MessageQueue) -> MessageQueue:
        """A queue the user names (with the topic's name in the vhost), as on the wire."""
        return mq if self.vhost == DEFAULT_VHOST else replace(mq, topic=self.wire(mq.topic))

    def user_queue(self, mq: MessageQueue) -> MessageQueue:
        """A queue from the wire, named as the user knows its topic (no new object in
        ``/``, so a send's result costs nothing more there)."""
        return mq if self.vhost == DEFAULT_VHOST else replace(mq, topic=self.user(mq.topic))

    def mark_unreachable(self, addr: str) -> None:
        self._unreachable[addr] = monotonic_s() + FAULT_AVOID_S

    def reachable(self, addr: str) -> bool:
        until = self._unreachable.get(addr)
        if until is not None and until < monotonic_s():
            del self._unreachable[addr]
            return True
        return until is None

    @property
    def avoiding_any(self) -> bool:
        return bool(self._unreachable)

    async def invoke(
        self,
        addr: str,
        code: int,
        ext: dict | None = None,
        body: bytes = b"",
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
        timeout_s: float | None = None,
    ) -> Frame:
        conn = await self.pool.get(addr)
        frame = await conn.request(code, ext, body, timeout_s or self.timeout_s)
        if frame.code not in ok:
            raise HamqError.for_code(frame.code, frame.remark)
        return frame

    async def invoke_namesrv(
        self, code: int, ext: dict | None = None, not_here: type[HamqError] | None = None
    ) -> Frame:
        """Ask the name servers in turn until one answers (they are independent). One that
        is down or hung (no answer in time) is skipped, and later lookups start after it.
        An answer of ``not_here`` asks the next one too (a name server holds what the
        brokers that reach it registered: one cut off from them has dropped theirs); it is
        raised only when no name server answers otherwise."""
        last: HamqError = ConnectionLost("no name server reachable")
        answer: HamqError | None = None
        start = self._namesrv_index
        for i in range(len(self.namesrv)):
            addr = self.namesrv[(start + i) % len(self.namesrv)]
            try:
                return await self.invoke(addr, code, ext)
            except (ConnectionLost, RequestTimeout) as err:
                last = ConnectionLost(f"name server {addr} unreachable: {err.message}")
            except TimeoutError:
                last = ConnectionLost(f"name server {addr} did not answer")
            except HamqError as err:
                if not_here is None or not isinstance(err, not_here):
                    raise
                answer = err
                continue
            self._namesrv_index = (start + i + 1) % len(self.namesrv)
        raise answer or last

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the name servers when the cached one is older than
        ``route_refresh_interval_s`` (or ``refresh``). A name server without a route does not
        settle it while another has one (one cut off from the brokers has dropped them).
        When no name server answers, the cached route is kept (RocketMQ keeps its topic
        route table): the brokers may well be healthy, and a client must not stop because
        its name servers are down."""
        cached = self.routes.get(topic)
        if (
            cached is not None
            and not refresh
            and monotonic_s() - cached.fetched_at < self.route_refresh_interval_s
        ):
            return cached
        try:
            frame = await self.invoke_namesrv(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, not_here=TopicNotExist
            )
        except TopicNotExist:
            # Not one name server routes it: its brokers are gone (a dead broker's route
            # disappears for everyone, admin tools included).
            self.routes.pop(topic, None)
            raise
        except HamqError as err:
            if cached is None:
                raise
            log.warning("route of %s not refreshed, keeping the cached one: %s", topic, err.message)
            # Next attempt after another interval, so requests do not each wait on a
            # name server that is down.
            cached = self.routes[topic] = replace(cached, fetched_at=monotonic_s())
            return cached
        route = TopicRoute.from_wire(topic, unpack_body(frame.body))
        self.routes[topic] = route
        return route

    async def invoke_group(
        self,
        topic: str,
        broker_name: str,
        code: int,
        ext: dict | None = None,
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
        timeout_s: float | None = None,
    ) -> Frame:
        """A read-side request to a broker group: the master, or — when it does not answer
        — the next member (RocketMQ's slave read, so consumers survive a master failure)."""
        route = await self.route(topic)
        order = route.read_order(broker_name)
        if not order:
            order = (await self.route(topic, refresh=True)).read_order(broker_name)
        if not order:
            raise BrokerNotFound(f"no live member of broker group {broker_name}")
        order.sort(key=lambda addr: not self.reachable(addr))  # stable: keeps id order
        last: HamqError | None = None
        for addr in order:
            try:
                return await self.invoke(addr, code, ext, ok=ok, timeout_s=timeout_s)
            except (ConnectionLost, RequestTimeout) as err:
                self.mark_unreachable(addr)
                last = err
        assert last is not None
        raise last

    async def heart_beat(self, addrs: Iterable[str], body: bytes) -> None:
        """HEART_BEAT to every address; a broker that does not answer is retried at the
        next period, so a failure is only logged."""

        async def one(addr: str) -> None:
            try:
                await self.invoke(addr, RequestCode.HEART_BEAT, body=body)
            except HamqError as err:
                log.debug("heartbeat to %s failed: %s", addr, err.message)

        await asyncio.gather(*(one(addr) for addr in addrs))

    async def close(self) -> None:
        await self.pool.close()
