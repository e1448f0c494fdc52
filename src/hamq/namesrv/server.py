"""The name server process: serves the route registry over the wire protocol and expires
silent brokers every ``scan_not_active_broker_interval_ms``."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from hamq.config import NamesrvConfig
from hamq.errors import RequestCodeNotSupported, TopicNotExist
from hamq.net.connection import Connection, response_pieces
from hamq.net.server import Server
from hamq.namesrv.routes import RouteInfoManager
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, pack_body, require, unpack_body

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class NamesrvProcessor:
    def __init__(self, config: NamesrvConfig) -> None:
        self.config = config
        self.routes = RouteInfoManager(config.broker_not_active_timeout_ms)
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
        if handler is None:
            raise RequestCodeNotSupported(f"name server does not serve request code {frame.code}")
        return handler(frame)

    def after_batch(self) -> None:
        pass

    def _register_broker(self, frame: Frame) -> list:
        ext = frame.ext
        body = unpack_body(frame.body) or {}
        self.routes.register_broker(
            require(ext, "cluster_name"), require(ext, "broker_name"),
            require(ext, "broker_id", int), require(ext, "broker_addr"),
            body.get("topic_configs", {}), body.get("data_version", {}), _now_ms(),
            ext.get("heartbeat_timeout_ms"))
        return response_pieces(frame)

    def _broker_heartbeat(self, frame: Frame) -> list | None:
        known = self.routes.broker_heartbeat(require(frame.ext, "broker_addr"), _now_ms())
        if frame.is_oneway:
            return None
        return response_pieces(frame, ResponseCode.SUCCESS if known else
                               ResponseCode.BROKER_NOT_FOUND,
                               remark="" if known else "unknown broker: register first")

    def _unregister_broker(self, frame: Frame) -> list:
        ext = frame.ext
        self.routes.unregister_broker(require(ext, "broker_name"), require(ext, "broker_id", int),
                                      require(ext, "broker_addr"))
        return response_pieces(frame)

    def _get_route(self, frame: Frame) -> list:
        topic = require(frame.ext, "topic")
        route = self.routes.get_route(topic)
        if route is None:
            raise TopicNotExist(f"no route info of topic {topic!r} on this name server")
        return response_pieces(frame, body=pack_body(route))

    def _get_member_group(self, frame: Frame) -> list:
        group = self.routes.get_broker_member_group(require(frame.ext, "cluster_name"),
                                                    require(frame.ext, "broker_name"))
        return response_pieces(frame, body=pack_body(group))

    def _cluster_info(self, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.cluster_info()))

    def _topic_list(self, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.topic_list()))

    def _delete_topic(self, frame: Frame) -> list:
        self.routes.delete_topic(require(frame.ext, "topic"))
        return response_pieces(frame)


async def serve_namesrv(config: NamesrvConfig, stop: asyncio.Event) -> None:
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    processor = NamesrvProcessor(config)
    server = Server(processor)
    await server.start(config.listen)
    log.info("name server listening on %s", config.listen)
    print(json.dumps({"event": "ready", "role": "namesrv", "listen": config.listen}), flush=True)
    interval_s = config.scan_not_active_broker_interval_ms / 1000
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            for addr in processor.routes.scan_not_active_broker(_now_ms()):
                log.warning("broker %s silent past the timeout; removed from routes", addr)
    await server.close()
