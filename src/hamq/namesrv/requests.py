"""The fields of name-server requests, checked in full before the route table changes.

A registration is trusted by everyone who reads routes: clients allocate one object per
queue they see, slaves connect to the ``ha_addr`` they are given. So every field is type-
and range-checked here, and a bad one is an ``InvalidArgument`` naming it; nothing of a
refused request is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hamq.errors import InvalidArgument
from hamq.protocol.address import address
from hamq.protocol.frame import Frame, check_int, optional, require_int, require_name, unpack_body
from hamq.protocol.limits import MAX_BROKER_ID, MAX_QUEUE_NUMS
from hamq.protocol.message import validate_topic
from hamq.store.metadata import PERM_READ_WRITE, DataVersion

# A broker may ask for a longer liveness timeout than the name server's default, but not
# one that keeps a dead (or forged) member in the routes for longer than this.
MAX_HEARTBEAT_TIMEOUT_MS = 10 * 60 * 1000
_TOPIC_CONFIG_KEYS = ("read_queue_nums", "write_queue_nums", "perm")
_DATA_VERSION_KEYS = frozenset(DataVersion.__dataclass_fields__)


@dataclass(frozen=True)
class Member:
    """Who a request speaks for: one member of a broker group."""

    broker_name: str
    broker_id: int
    broker_addr: str


@dataclass(frozen=True)
class Registration:
    cluster_name: str
    member: Member
    ha_addr: str
    timeout_ms: int  # 0: the name server's default
    topic_configs: dict[str, dict[str, int]]
    data_version: dict[str, int]
    # the member may act as master while its group has none (seed 004); absent: False
    enable_acting_master: bool = False


def member(ext: dict[str, Any]) -> Member:
    return Member(
        require_name(ext, "broker_name"),
        require_int(ext, "broker_id", 0, MAX_BROKER_ID),
        address(ext.get("broker_addr"), "broker_addr"),
    )


def registration(frame: Frame) -> Registration:
    ext = frame.ext
    cluster_name = require_name(ext, "cluster_name")
    who = member(ext)
    ha_addr = ext.get("ha_addr") or ""
    if ha_addr:
        address(ha_addr, "ha_addr")
    timeout_ms = optional(ext, "heartbeat_timeout_ms", 0, 1, MAX_HEARTBEAT_TIMEOUT_MS)
    body = unpack_body(frame.body) or {}
    if not isinstance(body, dict):
        raise InvalidArgument("register body must be a map")
    acting = body.get("enable_acting_master", False)
    if not isinstance(acting, bool):
        raise InvalidArgument(
            f"register body 'enable_acting_master' must be true or false, not {acting!r}"
        )
    return Registration(
        cluster_name,
        who,
        ha_addr,
        timeout_ms,
        topic_configs(body.get("topic_configs") or {}),
        data_version(body.get("data_version") or {}),
        acting,
    )


def topic_configs(raw: object) -> dict[str, dict[str, int]]:
    """``{topic: {read_queue_nums, write_queue_nums, perm}}``: valid names, queue counts in
    1..MAX_QUEUE_NUMS, a perm made of the read and write bits."""
    if not isinstance(raw, dict):
        raise InvalidArgument("register body 'topic_configs' must be a map")
    for topic, cfg in raw.items():
        validate_topic(topic)
        if not isinstance(cfg, dict) or set(cfg) != set(_TOPIC_CONFIG_KEYS):
            raise InvalidArgument(
                f"register body: topic config of {topic!r} must map "
                f"{', '.join(_TOPIC_CONFIG_KEYS)} to integers"
            )
        for key in ("read_queue_nums", "write_queue_nums"):
            check_int(f"topic_configs[{topic!r}].{key}", cfg[key], 1, MAX_QUEUE_NUMS)
        if check_int(f"topic_configs[{topic!r}].perm", cfg["perm"]) & ~PERM_READ_WRITE:
            raise InvalidArgument(
                f"topic_configs[{topic!r}].perm {cfg['perm']} is not a "
                "combination of read (4) and write (2)"
            )
    return raw


def data_version(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict) or not set(raw) <= _DATA_VERSION_KEYS:
        raise InvalidArgument(
            f"register body 'data_version' must be a map of {', '.join(sorted(_DATA_VERSION_KEYS))}"
        )
    for key, value in raw.items():
        check_int(f"data_version.{key}", value)
    return raw
