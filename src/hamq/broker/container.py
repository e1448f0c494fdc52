"""A ``BrokerContainer``: several broker members, of different groups, in one process (seed
004's picture for local escape: the master of one group beside a slave of another, so an
acting slave puts its due delay messages into a master in its own process).

What the members share: the event loop, one ``ConnectionPool`` (one connection to each
name server; the name servers' reverse notifications are told apart by broker name,
``broker/namesrv_requests.py``), ``namesrv`` (the container's), and one /metrics whose
member gauges carry ``broker_name`` and ``broker_id`` labels. Each member keeps its own
listen (and HA) address, store directory and services: clients, name servers and the
other members address a broker by HOST:PORT, and RocketMQ's requests do not all name the
broker, so one listener keyed by broker name would need a field every request lacks (and
RocketMQ's BrokerContainer also gives each inner broker its own port). The container's
own ``listen`` serves ADD_BROKER and REMOVE_BROKER, and on a node (``node_name``,
``broker/node.py``) DECLARE_TOPIC and UNDECLARE_TOPIC.

Members are added and removed at runtime, one request at a time. A member that cannot
start (a bad config, a port in use, another member with its name and id) is refused with
a clear error and the container serves on; removing a member stops it as its own process
would on SIGTERM (deregistered, flushed, store unlocked). A member asked for with port 0
(``HOST:0``, as the placement driver asks) gets free ports picked here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from hamq.broker.broker_metadata import BrokerIdTaken, BrokerMetadataFile
from hamq.broker.ha.member_group import MEMBER_GROUP_TIMEOUT_S, GroupAnswer
from hamq.broker.namesrv_requests import NamesrvRequests
from hamq.broker.node import Declare, Node, declared_name
from hamq.broker.server import Broker
from hamq.config import BrokerConfig, ContainerConfig, from_dict, load_config
from hamq.config_check import bad
from hamq.controller.nodes import HostedMember
from hamq.errors import (
    BrokerSystemError,
    ConfigError,
    HamqError,
    InvalidArgument,
    NoPermission,
    RequestCodeNotSupported,
    ServiceNotAvailable,
)
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.metrics import remove_gauges, serve_metrics
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.preflight import check_can_start
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import (
    Frame,
    pack_body,
    require,
    require_int,
    require_name,
    unpack_body,
)
from hamq.store.disk import OS_DISK, atomic_write

log = logging.getLogger(__name__)

MemberKey = tuple[str, int]  # (broker name, broker id): a member's identity
# A broker config is a few KiB. The settings are checked on the event loop every member
# shares: a 16 MiB body (a million name servers, say) held them all up for seconds.
MAX_ADD_BROKER_BYTES = 64 * 1024
ANY_PORT = "0"  # ADD_BROKER's listen / ha_listen "HOST:0": the container picks the port


def member_config(
    values: BrokerConfig | dict[str, Any], source: str, container: ContainerConfig
) -> BrokerConfig:
    """A member's config as the container runs it: its own settings, the container's
    ``namesrv`` and ``member_store``, and no ``metrics_listen`` of its own (the container's
    /metrics shows every member; a member's own server would show the whole process's
    registry again)."""
    config = values if isinstance(values, BrokerConfig) else from_dict(BrokerConfig, values, source)
    if config.metrics_listen:
        raise ConfigError(
            f"{source}: metrics_listen = {config.metrics_listen!r}: must be empty for a "
            "container member (the container's metrics_listen serves every member)"
        )
    return dataclasses.replace(config, namesrv=container.namesrv, **container.member_store)


def load_members(config: ContainerConfig, path: str | Path | None) -> list[BrokerConfig]:
    """The members a container file lists, each checked; relative paths are read from the
    container file's directory."""
    base = Path(path).parent if path is not None else Path()
    members: list[BrokerConfig] = []
    for member in config.brokers:
        source = str(base / member)
        loaded = member_config(load_config(BrokerConfig, source), source, config)
        refuse_duplicate(loaded, members)
        members.append(loaded)
    return members


def refuse_duplicate(config: BrokerConfig, members: Iterable[BrokerConfig]) -> None:
    """One member per (broker name, broker id) and per store directory in a container (the
    second would fail later and less clearly: its store lock, or its name servers' routes).
    Stores are compared as resolved paths, and one inside another is refused too: a member
    whose store_dir is another's ``commitlog`` would put its lock and its files among that
    member's segments (the store lock only sees the very same directory)."""
    store = Path(config.store_dir).resolve()
    for other in members:
        if other.broker_name == config.broker_name and config.enable_controller_mode:
            # its id comes from the controller: one member of a group per node
            raise ConfigError(
                f"a member of group {config.broker_name} is already in this container"
            )
        if (other.broker_name, other.broker_id) == (config.broker_name, config.broker_id):
            raise ConfigError(
                f"broker {config.broker_name} id {config.broker_id} is already a member of "
                "this container"
            )
        other_store = Path(other.store_dir).resolve()
        if store == other_store:
            raise ConfigError(
                f"store_dir = {config.store_dir!r} is already the store of member "
                f"{other.broker_name} id {other.broker_id}"
            )
        if store.is_relative_to(other_store) or other_store.is_relative_to(store):
            raise ConfigError(
                f"store_dir = {config.store_dir!r} overlaps the store of member "
                f"{other.broker_name} id {other.broker_id} ({other.store_dir}): a store "
                "directory holds one member's files only"
            )


def confine_store(config: BrokerConfig, store_root: str) -> None:
    """A member asked for over the network writes only inside the container's
    ``store_root``. ADD_BROKER is not authenticated: without this, anyone who reaches the
    container's port could have it create directories, and create or truncate a file
    named ``lock``, anywhere the process may write."""
    if not store_root:
        raise NoPermission(
            "this container takes no members at runtime: set store_root in its config "
            "(members added with ADD_BROKER keep their store_dir inside it)"
        )
    root, store = Path(store_root).resolve(), Path(config.store_dir).resolve()
    if store == root or not store.is_relative_to(root):
        raise NoPermission(
            f"store_dir = {config.store_dir!r} ({store}) is not inside the container's "
            f"store_root {root}"
        )


# A placed member's settings in its store: the node starts it again when it restarts.
PLACED_MEMBER_FILE = "placed_member.json"


def _saved_placed(store_root: str) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in sorted(Path(store_root).glob(f"*/{PLACED_MEMBER_FILE}"))]


def fill_member(values: dict[str, Any], container: ContainerConfig) -> dict[str, Any]:
    """Settings ADD_BROKER may leave to the container (the placement driver does): listen
    on ``member_host`` at a port picked here, and the store ``<store_root>/<broker_name>``
    (one member of a group per node, so that name is the member's alone)."""
    filled = {"listen": f"{container.member_host}:{ANY_PORT}", **values}
    if "store_dir" not in values and container.store_root:
        name = str(values.get("broker_name", ""))
        filled["store_dir"] = str(Path(container.store_root) / name)
    return filled


def pick_ports(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each ``listen`` / ``ha_listen`` given as ``HOST:0`` on a free port of
    HOST (and ``ha_listen`` too when ``listen`` is ``HOST:0`` and it is unset: listen + 1
    need not be free). Each port is bound, read and let go, all held until every one is
    picked so no two are the same; another process may still take one before the member
    binds it, and then the member does not start and the asker is told (the placement
    driver asks again). RocketMQ's container needs no such step: its members' ports are
    always configured."""
    wanted = [key for key in ("listen", "ha_listen") if _any_port(values.get(key))]
    if "listen" in wanted and not values.get("ha_listen"):
        values = {**values, "ha_listen": values["listen"]}
        wanted.append("ha_listen")
    picked = dict(values)
    with contextlib.ExitStack() as held:
        for key in wanted:
            host = values[key].rpartition(":")[0]
            try:
                family, kind, proto, _, sockaddr = socket.getaddrinfo(
                    host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )[0]
                sock = held.enter_context(socket.socket(family, kind, proto))
                sock.bind(sockaddr)
            except OSError as exc:
                raise bad(key, values[key], f"no free port there: {exc.strerror or exc}") from None
            picked[key] = f"{host}:{sock.getsockname()[1]}"
    return picked


def _any_port(value: object) -> bool:
    return isinstance(value, str) and value.rpartition(":")[2] == ANY_PORT


class BrokerContainer:
    def __init__(self, config: ContainerConfig) -> None:
        self.config = config
        self.pool = ConnectionPool()
        # before any connection opens (the container asks the name servers before a member
        # exists): a connection serves the name server's requests with the pool's handler
        NamesrvRequests.of(self.pool)
        self.brokers: dict[MemberKey, Broker] = {}
        self.node = Node(config, self.heartbeat_members) if config.node_name else None
        processor = _ContainerProcessor(self)
        self.server = Server(processor, config)
        self.server.on_connection_closed.append(processor.connection_closed)
        self.metrics: WSGIServer | None = None
        self._changing = asyncio.Lock()  # one add or remove at a time
        # Set by ``stop``: an add that waited for the lock behind it (an ADD_BROKER read
        # before the port closed) would start a member nothing ever stops.
        self._stopping = False

    async def start(self, members: list[BrokerConfig]) -> None:
        """Serve, then start the configured members in order; if one cannot start, the
        started ones stop again and the error is raised (the operator asked for all)."""
        try:
            await self.server.start(self.config.listen)
        except OSError as exc:
            raise bad(
                "listen", self.config.listen, f"cannot listen there: {exc.strerror}"
            ) from None
        self.metrics = serve_metrics(self.config.metrics_listen)
        if self.node is not None:  # registers while the members start
            self.node.start()
        try:
            for member in members:
                await self.add(member)
        except BaseException:
            await self.stop()
            raise
        await self._resume_placed()

    async def add_placed(self, filled: dict[str, Any], source: str) -> Broker:
        """A member ADD_BROKER asked for (settings ``fill_member`` completed), on ports
        picked now. A node's member in the store the container gave it keeps those
        settings there, and starts again when the node does: a restarted node would
        otherwise come back without the members it hosted, and a group whose only
        synchronised copy was one of them would wait for it forever."""
        config = member_config(pick_ports(filled), source, self.config)
        confine_store(config, self.config.store_root)
        broker = await self.add(config)
        if self._placed_here(config):
            saved = json.dumps(filled).encode()
            path = Path(config.store_dir) / PLACED_MEMBER_FILE
            await asyncio.to_thread(atomic_write, OS_DISK, path, saved)
        return broker

    async def _resume_placed(self) -> None:
        """The placed members this node hosted when it stopped start again (each from its
        store and saved settings, ports picked again); one that cannot start is logged and
        left, its store kept."""
        root = self.config.store_root
        if self.node is None or not root:
            return
        for path, raw in await asyncio.to_thread(_saved_placed, root):
            try:
                filled = json.loads(raw)
                if not isinstance(filled, dict):
                    raise ValueError("not a map of settings")
                await self.add_placed(filled, str(path))
            except (HamqError, OSError, ValueError) as exc:
                why = exc.message if isinstance(exc, HamqError) else str(exc)
                log.warning("container: member in %s not started again: %s", path.parent, why)

    async def add(self, config: BrokerConfig) -> Broker:
        async with self._changing:
            if self._stopping:
                raise ServiceNotAvailable(
                    f"broker {config.broker_name} id {config.broker_id} not started: the "
                    "container is stopping"
                )
            refuse_duplicate(config, (broker.config for broker in self.brokers.values()))
            check_can_start(config)  # ports free, store creatable: ConfigError, nothing opened
            if not config.enable_controller_mode:  # its id is the controller's, fenced there
                await self._refuse_live_twin(config)
            try:
                broker = await self._start(config)
            except BrokerIdTaken as exc:
                if not self._placed_here(config):
                    raise _not_started(config, exc) from None
                # A node back with the store of a member the placement driver replaced
                # while it was away, whose id the controller has since given to another
                # member: cleaned away, its log counts for nothing, and the id on disk
                # would refuse the group this node for good. It joins under a new id
                # (its log copied again from the master), as an operator would make it.
                log.warning("container: %s; joining under a new id", exc.message)
                BrokerMetadataFile(config.store_dir).remove()
                broker = await self._start(config)
            # in controller mode the id is the one the controller gave at start
            broker_id = broker.role.broker_id if config.enable_controller_mode else config.broker_id
            key = (config.broker_name, broker_id)
            self.brokers[key] = broker
            if self.metrics is not None:
                broker.add_gauges(_labels(key))
            log.info(
                "container: member %s/%d started on %s (HA %s)",
                *(*key, config.listen, config.ha_address),
            )
            return broker

    async def _start(self, config: BrokerConfig) -> Broker:
        try:  # (a constructor that fails lets go of the store itself)
            broker = Broker(config, pool=self.pool, siblings=lambda: self._siblings(broker))
        except OSError as exc:
            raise BrokerSystemError(
                f"broker {config.broker_name} id {config.broker_id} cannot open its "
                f"store {config.store_dir}: {exc}"
            ) from None
        try:
            await broker.start()
        except BrokerIdTaken:
            await _stop_quietly(broker)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is the admin's answer
            await _stop_quietly(broker)
            raise _not_started(config, exc) from None
        return broker

    def _placed_here(self, config: BrokerConfig) -> bool:
        """A node's member of a controller-mode group in the store the container gave it
        (``fill_member``): the placement driver's, not one an operator configured."""
        root = self.config.store_root
        return bool(
            self.node is not None
            and config.enable_controller_mode
            and root
            and Path(config.store_dir) == Path(root) / config.broker_name
        )

    async def _refuse_live_twin(self, config: BrokerConfig) -> None:
        """A member whose (broker name, broker id) a name server holds at another address
        is not started: the name server would refuse its registration (a live member's id
        is not taken over), and the container would host a master no route leads to,
        taking sends from whoever knows its address into a store of its own. A name server
        that does not answer is skipped (its refusal, if any, comes at registration)."""
        ext = {"cluster_name": config.cluster_name, "broker_name": config.broker_name}
        for namesrv in config.namesrv:
            try:
                conn = await self.pool.get(namesrv)
                frame = await conn.request(
                    RequestCode.GET_BROKER_MEMBER_GROUP, ext, timeout_s=MEMBER_GROUP_TIMEOUT_S
                )
                if frame.code != ResponseCode.SUCCESS:
                    continue
                holder = GroupAnswer.parse(unpack_body(frame.body) or {}).broker_addrs.get(
                    config.broker_id
                )
            except (HamqError, AttributeError, TypeError, ValueError):
                continue
            if holder not in (None, config.broker_addr):
                raise NoPermission(
                    f"broker {config.broker_name} id {config.broker_id} is registered by live "
                    f"member {holder} (name server {namesrv}): not started here"
                )

    async def remove(self, broker_name: str, broker_id: int, delete_store: bool = False) -> None:
        """Stop the member; with ``delete_store`` its store directory goes too (the
        placement driver's removed mirrors), only inside ``store_root``."""
        async with self._changing:
            key = (broker_name, broker_id)
            if key not in self.brokers:
                raise InvalidArgument(
                    f"broker {broker_name} id {broker_id} is not a member of this container "
                    f"(members: {', '.join(f'{n}/{i}' for n, i in self.brokers) or 'none'})"
                )
            store_dir = self.brokers[key].config.store_dir
            if delete_store:  # refused before anything stops
                confine_store(self.brokers[key].config, self.config.store_root)
            await self._stop_member(key)
            if delete_store:
                await asyncio.to_thread(shutil.rmtree, store_dir)
                log.info("container: store %s of member %s/%d deleted", store_dir, *key)
            else:  # removed on purpose: the store stays, the member does not come back
                (Path(store_dir) / PLACED_MEMBER_FILE).unlink(missing_ok=True)

    async def _stop_member(self, key: MemberKey) -> None:
        """Out of the members first (no sibling escapes into a stopping master), then
        stopped as a broker process stops on SIGTERM."""
        broker = self.brokers.pop(key)
        remove_gauges(_labels(key))
        await broker.stop()
        log.info("container: member %s/%d stopped", *key)

    def _siblings(self, own: Broker) -> list[Broker]:
        """The members beside ``own`` (local escape looks for a master among them)."""
        return [broker for broker in self.brokers.values() if broker is not own]

    def members_info(self) -> list[dict[str, Any]]:
        return [
            {
                "broker_name": name,
                "broker_id": broker_id,
                "listen": broker.config.listen,
                "ha_listen": broker.config.ha_address,
                "role": "master" if broker.role.is_master else "slave",
            }
            for (name, broker_id), broker in self.brokers.items()
        ]

    def heartbeat_members(self) -> list[HostedMember]:
        """The hosted members as a node's heartbeat lists them."""
        return [
            HostedMember(broker.config.cluster_name, name, broker_id, broker.config.broker_addr)
            for (name, broker_id), broker in self.brokers.items()
        ]

    async def stop(self) -> None:
        """No more requests, then every member stops (latest first; a member being added
        finishes starting first), then the shared connections."""
        self._stopping = True
        await self.server.close()
        if self.node is not None:
            await self.node.stop()
        async with self._changing:
            for key in reversed(list(self.brokers)):
                try:
                    await self._stop_member(key)
                except Exception:  # logged: the others still stop
                    log.exception("container: member %s/%d did not stop cleanly", *key)
        if self.metrics is not None:
            self.metrics.shutdown()
        await self.pool.close()


_NODE_CODES = (RequestCode.DECLARE_TOPIC, RequestCode.UNDECLARE_TOPIC, RequestCode.HEART_BEAT)


def _labels(key: MemberKey) -> dict[str, str]:
    return {"broker_name": key[0], "broker_id": str(key[1])}


def _not_started(config: BrokerConfig, exc: Exception) -> BrokerSystemError:
    message = exc.message if isinstance(exc, HamqError) else repr(exc)
    return BrokerSystemError(
        f"broker {config.broker_name} id {config.broker_id} did not start: {message}"
    )


async def _stop_quietly(broker: Broker) -> None:
    """Undo a member's failed start as far as it got (its store lock above all); the start's
    own error is the one to report."""
    try:
        await broker.stop()
    except Exception:  # logged: the start's error is what the caller sees
        log.exception("container: stopping a member that failed to start")


class _ContainerProcessor:
    """ADD_BROKER (body: the member's settings) and REMOVE_BROKER (broker_name, broker_id,
    delete_store) on the container's port. A member starts and stops in the background;
    the answer, with the members after the change, goes out when that is done. A node
    also takes DECLARE_TOPIC and UNDECLARE_TOPIC (answered with the controller's answer)
    and HEART_BEAT, which keeps an exclusive declaration's idle connection open."""

    def __init__(self, container: BrokerContainer) -> None:
        self.container = container
        self._tasks: set[asyncio.Task] = set()
        self._owners: dict[Connection, str] = {}  # a declaring connection's owner id

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code in _NODE_CODES:
            return self._node_request(conn, frame)
        if frame.code == RequestCode.ADD_BROKER:
            if len(frame.body) > MAX_ADD_BROKER_BYTES:
                raise InvalidArgument(
                    f"ADD_BROKER body of {len(frame.body)} bytes: a member's settings take at "
                    f"most {MAX_ADD_BROKER_BYTES}"
                )
            source = str(frame.ext.get("config_path") or "ADD_BROKER body")
            values = unpack_body(frame.body)
            if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
                raise InvalidArgument(
                    "ADD_BROKER body must be a map of broker settings (names to values)"
                )
            change = self.container.add_placed(fill_member(values, self.container.config), source)
        elif frame.code == RequestCode.REMOVE_BROKER:
            change = self.container.remove(
                require_name(frame.ext, "broker_name"),
                require_int(frame.ext, "broker_id"),
                require(frame.ext, "delete_store", bool) if "delete_store" in frame.ext else False,
            )
        else:
            raise RequestCodeNotSupported(
                "a broker container serves ADD_BROKER and REMOVE_BROKER (and a node "
                f"DECLARE_TOPIC and UNDECLARE_TOPIC) only, not {frame.code}"
            )
        self._answer_later(conn, frame, self._members_after(change))
        return None

    def _node_request(self, conn: Connection, frame: Frame) -> list | None:
        node = self.container.node
        if node is None:
            raise RequestCodeNotSupported(
                f"request code {frame.code}: this container is no node (it has no node_name)"
            )
        if frame.code == RequestCode.HEART_BEAT:
            return response_pieces(frame)
        owner = self._owners.get(conn) or self._owners.setdefault(conn, node.new_owner())
        if frame.code == RequestCode.DECLARE_TOPIC:
            answer = node.declare(owner, Declare.from_ext(frame.ext))
        else:
            answer = node.undeclare(owner, *declared_name(frame.ext))
        self._answer_later(conn, frame, answer)
        return None

    def connection_closed(self, conn: Connection) -> None:
        owner = self._owners.pop(conn, None)
        if owner is not None and self.container.node is not None:
            self.container.node.connection_closed(owner)

    async def _members_after(self, change: Any) -> dict[str, Any]:
        await change
        return {"members": self.container.members_info()}

    def _answer_later(self, conn: Connection, frame: Frame, answer: Any) -> None:
        task = asyncio.ensure_future(self._answer(conn, frame, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, conn: Connection, frame: Frame, answer: Any) -> None:
        try:
            body = await answer
        except Exception as exc:  # noqa: BLE001 - every failure is the asker's answer
            err = exc if isinstance(exc, HamqError) else BrokerSystemError(repr(exc))
            log.warning("container: %s", err.message)
            conn.reply(error_pieces(frame, err))
            return
        conn.reply(response_pieces(frame, body=pack_body(body)))

    def after_batch(self) -> None:
        pass


async def serve_container(
    config: ContainerConfig, members: list[BrokerConfig], stop: asyncio.Event
) -> None:
    container = BrokerContainer(config)
    await container.start(members)
    print(
        json.dumps(
            {
                "event": "ready",
                "role": "container",
                "listen": config.listen,
                "brokers": container.members_info(),
                "pid": os.getpid(),
                **({"node": config.node_name} if config.node_name else {}),
            }
        ),
        flush=True,
    )
    await stop.wait()
    await container.stop()
