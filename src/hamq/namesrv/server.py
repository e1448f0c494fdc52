"""The name server process: serves the route registry over the wire protocol and expires
silent brokers every ``scan_not_active_broker_interval_ms``."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from hamq.config import NamesrvConfig
from hamq.errors import InvalidArgument, RequestCodeNotSupported, TopicNotExist
from hamq.net.connection import Connection, response_pieces
from hamq.net.metrics import gauge, serve_metrics
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
        # The connection each broker last registered or heartbeated on: the way back to it
        # for reverse notifications (as RocketMQ uses the broker's channel).
        self.broker_conns: dict[str, Connection] = {}
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
        return handler(conn, frame)

    def after_batch(self) -> None:
        pass

    def _register_broker(self, conn: Connection, frame: Frame) -> list:
        ext = frame.ext
        identity = (require(ext, "cluster_name"), require(ext, "broker_name"),
                    require(ext, "broker_id", int), require(ext, "broker_addr"))
        timeout_ms = ext.get("heartbeat_timeout_ms")
        if timeout_ms is not None and (not isinstance(timeout_ms, int)
                                       or isinstance(timeout_ms, bool) or timeout_ms <= 0):
            raise InvalidArgument("request field 'heartbeat_timeout_ms' must be a positive int")
        body = unpack_body(frame.body) or {}
        if not isinstance(body, dict):
            raise InvalidArgument("register body must be a map")
        # Checked in full before anything is applied: a bad registration changes nothing.
        topic_configs = _topic_configs(body.get("topic_configs") or {})
        data_version = body.get("data_version") or {}
        if not isinstance(data_version, dict):
            raise InvalidArgument("register body 'data_version' must be a map")
        self.broker_conns[identity[3]] = conn
        if self.routes.register_broker(*identity, topic_configs, data_version, _now_ms(),
                                       timeout_ms, ext.get("ha_addr") or ""):
            self.notify_member_group(identity[0], identity[1])
        return response_pieces(frame)

    def _broker_heartbeat(self, conn: Connection, frame: Frame) -> list | None:
        addr = require(frame.ext, "broker_addr")
        known = self.routes.broker_heartbeat(addr, _now_ms())
        if known:
            self.broker_conns[addr] = conn
        if frame.is_oneway:
            return None
        return response_pieces(frame, ResponseCode.SUCCESS if known else
                               ResponseCode.BROKER_NOT_FOUND,
                               remark="" if known else "unknown broker: register first")

    def _unregister_broker(self, conn: Connection, frame: Frame) -> list:
        ext = frame.ext
        addr = require(ext, "broker_addr")
        info = self.routes.live.get(addr)
        self.routes.unregister_broker(require(ext, "broker_name"), require(ext, "broker_id", int),
                                      addr)
        self.broker_conns.pop(addr, None)
        if info is not None:
            self.notify_member_group(info.cluster_name, info.broker_name)
        return response_pieces(frame)

    def scan_not_active_broker(self) -> None:
        live = dict(self.routes.live)
        groups = set()
        for addr in self.routes.scan_not_active_broker(_now_ms()):
            log.warning("broker %s silent past the timeout; removed from routes", addr)
            self.broker_conns.pop(addr, None)
            groups.add((live[addr].cluster_name, live[addr].broker_name))
        for cluster_name, broker_name in groups:
            self.notify_member_group(cluster_name, broker_name)

    def notify_member_group(self, cluster_name: str, broker_name: str) -> None:
        """Reverse notification: tell every live member of a group its new membership, so
        quorum writes degrade (seed 000) and slaves follow a new master without waiting
        for their next poll."""
        group = self.routes.get_broker_member_group(cluster_name, broker_name)
        body = pack_body(group)
        for addr in group["broker_addrs"].values():
            conn = self.broker_conns.get(addr)
            if conn is not None and not conn.is_closed:
                conn.oneway(RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
                            {"broker_name": broker_name}, body)

    def _get_route(self, conn: Connection, frame: Frame) -> list:
        topic = require(frame.ext, "topic")
        route = self.routes.get_route(topic)
        if route is None:
            raise TopicNotExist(f"no route info of topic {topic!r} on this name server")
        return response_pieces(frame, body=pack_body(route))

    def _get_member_group(self, conn: Connection, frame: Frame) -> list:
        group = self.routes.get_broker_member_group(require(frame.ext, "cluster_name"),
                                                    require(frame.ext, "broker_name"))
        return response_pieces(frame, body=pack_body(group))

    def _cluster_info(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.cluster_info()))

    def _topic_list(self, conn: Connection, frame: Frame) -> list:
        return response_pieces(frame, body=pack_body(self.routes.topic_list()))

    def _delete_topic(self, conn: Connection, frame: Frame) -> list:
        self.routes.delete_topic(require(frame.ext, "topic"))
        return response_pieces(frame)


_TOPIC_CONFIG_KEYS = ("read_queue_nums", "write_queue_nums", "perm")


def _topic_configs(raw: object) -> dict[str, dict[str, int]]:
    """``{topic: {read_queue_nums, write_queue_nums, perm}}`` with int values, or
    ``InvalidArgument``."""
    if not isinstance(raw, dict):
        raise InvalidArgument("register body 'topic_configs' must be a map")
    for topic, cfg in raw.items():
        if not isinstance(topic, str) or not isinstance(cfg, dict) or not all(
                isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
                for k in _TOPIC_CONFIG_KEYS):
            raise InvalidArgument(f"register body: topic config of {topic!r} must map "
                                  f"{', '.join(_TOPIC_CONFIG_KEYS)} to integers")
    return raw


async def serve_namesrv(config: NamesrvConfig, stop: asyncio.Event) -> None:
    Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    processor = NamesrvProcessor(config)
    server = Server(processor)
    await server.start(config.listen)
    metrics = serve_metrics(config.metrics_listen)
    if metrics is not None:
        gauge("hamq_namesrv_live_brokers", "Broker members alive in the route table",
              lambda: len(processor.routes.live))
        gauge("hamq_namesrv_topics", "Topics with a route",
              lambda: len(processor.routes.topic_queue_table))
    log.info("name server listening on %s", config.listen)
    print(json.dumps({"event": "ready", "role": "namesrv", "listen": config.listen}), flush=True)
    interval_s = config.scan_not_active_broker_interval_ms / 1000
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            processor.scan_not_active_broker()
    await server.close()
    if metrics is not None:
        metrics.shutdown()
