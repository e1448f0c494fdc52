"""The name server process: serves the route registry over the wire protocol and expires
silent brokers every ``scan_not_active_broker_interval_ms``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from hamq.clock import monotonic_ms
from hamq.config import NamesrvConfig
from hamq.controller_server.driver import peer_map
from hamq.controller_server.processor import ControllerProcessor
from hamq.controller_server.service import ControllerService
from hamq.errors import NoPermission, RequestCodeNotSupported, TopicNotExist
from hamq.namesrv.requests import member, registration
from hamq.namesrv.routes import RouteInfoManager
from hamq.net.connection import Connection, response_pieces
from hamq.net.metrics import gauge, serve_metrics
from hamq.net.server import Server
from hamq.net.tasks import PeriodicTask
from hamq.protocol.address import address
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, pack_body, require_name
from hamq.protocol.message import validate_topic

if TYPE_CHECKING:
    from hamq.web.server import WebServer

log = logging.getLogger(__name__)


class NamesrvProcessor:
    def __init__(self, config: NamesrvConfig) -> None:
        self.config = config
        self.routes = RouteInfoManager(
            config.broker_not_active_timeout_ms,
            config.max_route_entries,
            config.support_acting_master,
        )
        # The connection each broker last registered or heartbeated on: the way back to it
        # for reverse notifications (as RocketMQ uses the broker's channel).
        self.broker_conns: dict[str, Connection] = {}
        self.started_ms = monotonic_ms()  # see _member_group
        # enable_controller_in_namesrv: the CONTROLLER_* codes go to the embedded peer
        self.controller: ControllerProcessor | None = None
        self._handlers = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.BROKER_HEARTBEAT: self._broker_heartbeat,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_MEMBER_GROUP: self._get_member_group,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
        }

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        handler = self._handlers.get(frame.code)
        if handler is None and self.controller is not None and self.controller.serves(frame.code):
            return self.controller.handle(conn, frame)
        if handler is None:
            raise RequestCodeNotSupported(f"name server does not serve request code {frame.code}")
        return handler(conn, frame)

    def after_batch(self) -> None:
        pass

    def _register_broker(self, conn: Connection, frame: Frame) -> list:
        reg = registration(frame)  # checked in full: a bad registration changes nothing
        who = reg.member
        try:
            changed = self.routes.register_broker(
                reg.cluster_name,
                who.broker_name,
                who.broker_id,
                who.broker_addr,
                reg.topic_configs,
                reg.data_version,
                monotonic_ms(),
                reg.timeout_ms,
                reg.ha_addr,
                reg.enable_acting_master,
            )
        except NoPermission as err:
            log.warning("registration from %s refused: %s", conn.peer, err.message)
            raise
        self.broker_conns[who.broker_addr] = conn
        if changed:
            self.notify_member_group(reg.cluster_name, who.broker_name)
        # the member's lease (broker/registration.py) ends with the timeout it is held by
        timeout_ms = self.routes.live[who.broker_addr].timeout_ms
        return response_pieces(frame, ext={"heartbeat_timeout_ms": timeout_ms})

    def _broker_heartbeat(self, conn: Connection, frame: Frame) -> list | None:
        addr = address(frame.ext.get("broker_addr"), "broker_addr")
        known = self.routes.broker_heartbeat(addr, monotonic_ms())
        if known:
            self.broker_conns[addr] = conn
        if frame.is_oneway:
            return None
        return response_pieces(
            frame,
            ResponseCode.SUCCESS if known else ResponseCode.BROKER_NOT_FOUND,
            remark="" if known else "unknown broker: register first",
        )

    def _unregister_broker(self, conn: Connection, frame: Frame) -> list:
        who = member(frame.ext)
        info = self.routes.live.get(who.broker_addr)
        self.routes.unregister_broker(who.broker_name, who.broker_id, who.broker_addr)
        self.broker_conns.pop(who.broker_addr, None)
        if info is not None:
            self.notify_member_group(info.cluster_name, info.broker_name)
        return response_pieces(frame)

    def scan_not_active_broker(self) -> None:
        live = dict(self.routes.live)
        groups = set()
        for addr in self.routes.scan_not_active_broker(monotonic_ms()):
            log.warning("broker %s silent past the timeout; removed from routes", addr)
            self.broker_conns.pop(addr, None)
            groups.add((live[addr].cluster_name, live[addr].broker_name))
        for cluster_name, broker_name in groups:
            self.notify_member_group(cluster_name, broker_name)

    def notify_member_group(self, cluster_name: str, broker_name: str) -> None:
        """Reverse notification: tell every live member of a group its new membership, so
        quorum writes degrade (seed 000), slaves follow a new master without waiting
        for their next poll, and the smallest-id slave starts or stops acting as master
        (seed 004) when the master leaves or returns."""
        group = self._member_group(cluster_name, broker_name)
        body = pack_body(group)
        for addr in group["broker_addrs"].values():
            conn = self.broker_conns.get(addr)
            if conn is not None and not conn.is_closed:
                conn.oneway(
                    RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, {"broker_name": broker_name}, body
                )

    def _get_route(self, conn: Connection, frame: Frame) -> list:
        topic = validate_topic(frame.ext.get("topic")).decode()
        route = self.routes.get_route(topic)
        if route is None:
            raise TopicNotExist(f"no route info of topic {topic!r} on this name server")
        return response_pieces(frame, body=pack_body(route))

    def _get_member_group(self, conn: Connection, frame: Frame) -> list:
        group = self._member_group(
            require_name(frame.ext, "cluster_name"), require_name(frame.ext, "broker_name")
        )
        return response_pieces(frame, body=pack_body(group))

    def _member_group(self, cluster_name: str, broker_name: str) -> dict:
        """The group, and whether this name server is ``settling``: up for less than the
        liveness timeout, so a master that is alive may not have registered with it yet.
        Its group without a master then says nothing about the master (seed 004: a slave
        must not act on it, ``broker/ha/member_group.py``)."""
        group = self.routes.get_broker_member_group(cluster_name, broker_name)
        group["settling"] = (
            monotonic_ms() - self.started_ms < self.config.broker_not_active_timeout_ms
        )
        return group

    def _cluster_info(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.cluster_info()))

    def _topic_list(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.topic_list()))

    def _delete_topic(self, conn: Connection, frame: Frame) -> list:
        self.routes.delete_topic(validate_topic(frame.ext.get("topic")).decode())
        return response_pieces(frame)


async def _serve_web(config: NamesrvConfig) -> WebServer:
    """The management API and console for this name server's cluster; the controller
    routes go to ``web_controllers`` (standalone peers), else to its embedded controller's
    peers (none without one: they answer 503)."""
    # imported here: a name server without web_listen does not load FastAPI and uvicorn
    from hamq.web.access import ClusterAccess
    from hamq.web.server import start_web

    peers = sorted(peer_map(config, config.listen).items())
    controllers = list(config.web_controllers) or (
        [addr for _, addr in peers] if config.enable_controller_in_namesrv else []
    )
    return await start_web(ClusterAccess([config.listen], controllers), config.web_listen)


async def serve_namesrv(config: NamesrvConfig, stop: asyncio.Event) -> None:
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before serving)
    processor = NamesrvProcessor(config)
    controller = None
    if config.enable_controller_in_namesrv:
        controller = ControllerService(config, config.listen, Path(config.data_dir) / "controller")
        processor.controller = controller.processor
    server = Server(processor, config)
    await server.start(config.listen)
    if controller is not None:
        controller.start()
    metrics = serve_metrics(config.metrics_listen)
    if metrics is not None:
        gauge(
            "hamq_namesrv_live_brokers",
            "Broker members alive in the route table",
            lambda: len(processor.routes.live),
        )
        gauge(
            "hamq_namesrv_topics",
            "Topics with a route",
            lambda: len(processor.routes.topic_queue_table),
        )
        if controller is not None:
            controller.register_metrics()
    web = await _serve_web(config) if config.web_listen else None
    log.info("name server listening on %s", config.listen)
    ready: dict[str, object] = {"event": "ready", "role": "namesrv", "listen": config.listen}
    if controller is not None:
        ready["controller_self_id"] = config.controller_self_id
    if web is not None:
        ready["web"] = {"url": web.url, "listen": web.listen}
    print(json.dumps(ready), flush=True)
    scan = PeriodicTask(
        "scan of silent brokers",
        config.scan_not_active_broker_interval_ms / 1000,
        processor.scan_not_active_broker,
    )
    scan.start()
    await stop.wait()
    await scan.stop()
    if web is not None:
        await web.stop()
    await server.close()
    if controller is not None:
        await controller.stop()
    if metrics is not None:
        metrics.shutdown()
